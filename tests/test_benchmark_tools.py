"""The measuring parts of the benchmark scripts: ``profile_functions.py``'s reading of perf's
output (Cython symbols to names, samples to functions), ``bench_manager.py``'s decode-step
figure and ``bench_simulate_speed.py``'s copy of the working tree."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cython_symbols_read_as_module_class_and_function() -> None:
    """Length-prefixed module path read against the package's files, a capitalized class, the
    function after its index (an index that looks like a length is not taken as one)."""
    readable = _script("profile_functions").readable
    cases = {
        "__pyx_pw_8hybridkv_4core_4pool_9BlockPool_15insert_run": "hybridkv.core.pool.BlockPool.insert_run",
        "__pyx_pf_8hybridkv_4core_7hashing_11BlockHasher_5update.constprop.0":
            "hybridkv.core.hashing.BlockHasher.update",
        "__pyx_pw_8hybridkv_4core_11coordinator_6lookup_6Lookup_5_find_longest_hit":
            "hybridkv.core.coordinator.lookup.Lookup._find_longest_hit",
        "__pyx_f_8hybridkv_4core_11coordinator_8allocate__quiet":
            "hybridkv.core.coordinator.allocate._quiet",
        "__pyx_pw_8hybridkv_4core_11coordinator_4base_10_ReqBlocks_1__init__":
            "hybridkv.core.coordinator.base._ReqBlocks.__init__",
        "__pyx_pw_8hybridkv_4core_5hints_3_as_x": "hybridkv.core.hints._as_x",
        "_PyEval_EvalFrameDefault": None,
        "__pyx_pw_8hybridkv_4core_7nowhere_3f": None,            # no such module
    }
    assert {s: readable(s) for s in cases} == cases


def test_each_sample_counts_for_its_innermost_compiled_function() -> None:
    mod = _script("profile_functions")
    script = (
        "\t7f01 _Py_dict_lookup\n\t7f02 __pyx_pw_8hybridkv_4core_4pool_9BlockPool_7_forget\n"
        "\t7f03 __pyx_pw_8hybridkv_4core_4pool_9BlockPool_5allocate\n\n"
        "\t7f04 __pyx_pw_8hybridkv_4core_4pool_9BlockPool_5allocate\n\n"
        "\t7f05 _PyEval_EvalFrameDefault\n\t7f06 main\n\n"
        "\t7f07 __pyx_pw_8hybridkv_4core_4pool_9BlockPool_7_forget\n")
    assert mod.attribute(script) == {"hybridkv.core.pool.BlockPool._forget": 2,
                                     "hybridkv.core.pool.BlockPool.allocate": 1,
                                     mod.NOT_COMPILED: 1}


def test_the_decode_figure_counts_every_decode_step_and_only_the_manager() -> None:
    """bench_manager.run on a small chat trace: the steps are the answers' tokens, exactly; the
    decode figure (the decode loops less the same loops without the manager) is positive and
    below the whole run's time."""
    bm = _script("bench_manager")
    trace = bm.multi_turn_chat(bm.ChatWorkload(
        num_conversations=4, turns=3, system_tokens=64, user_tokens=(16, 32),
        answer_tokens=(40, 60), concurrency=2, arrival_rate=None), seed=4)
    ans = bm.answers(trace)
    groups = (bm.KVCacheGroup("full", bm.FullAttention(16, num_kv_heads=8, head_dim=128), ("l0",)),)
    dt, rate, steps, decode = bm.run(groups, 500, trace, ans, clock=time.perf_counter)
    assert steps == sum(len(ans.get(r.request_id, [1] * r.output_len)) for r in trace)
    assert steps == sum(r.output_len for r in trace)
    assert 0 < rate < 1 and 0 < decode < dt


def test_a_copied_tree_keeps_the_builds_of_its_sources_only(tmp_path: Path, monkeypatch) -> None:
    """``bench_simulate_speed.export_current`` copies the working tree's sources over an earlier
    copy: a compiled module whose source (``.py``, or ``.pyx`` for a native one) is still there
    keeps its build, one whose source is gone loses it; ``.py`` files gone go too."""
    from importlib.machinery import EXTENSION_SUFFIXES
    mod = _script("bench_simulate_speed")
    repo, dest = tmp_path / "repo", tmp_path / "dest"
    (repo / "src" / "pkg").mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        (repo / name).write_text("")
    (repo / "src" / "pkg" / "a.py").write_text("A = 1\n")
    (repo / "src" / "pkg" / "n.pyx").write_text("N = 1\n")
    (dest / "src" / "pkg").mkdir(parents=True)
    (dest / "src" / "pkg" / "gone.py").write_text("")
    ext = EXTENSION_SUFFIXES[0]
    for stem in ("a", "n", "gone"):
        (dest / "src" / "pkg" / f"{stem}{ext}").write_bytes(b"")
    monkeypatch.setattr(mod, "REPO", repo)
    mod.export_current(dest)
    left = sorted(p.name for p in (dest / "src" / "pkg").iterdir())
    assert left == sorted(["a.py", "n.pyx", f"a{ext}", f"n{ext}"])
