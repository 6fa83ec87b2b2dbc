""".ci/mutation.py's copy of the checkout: ``@cython.locals`` decorators of the mutated files
become blank lines (so mutmut, which skips decorated functions, mutates them), nothing else
changes, and an unchanged file is not rewritten (mutmut keeps its verdicts); ``export`` turns
mutmut's per-file verdicts into one JSON record."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("ci_mutation", ROOT / ".ci" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = textwrap.dedent('''\
    import functools
    from hybridkv import _cython_shim as cython

    class A:
        @cython.locals(i=cython.Py_ssize_t,
                       n=cython.Py_ssize_t)   # two lines
        def f(self, n):
            return sum(i for i in range(n))

        @staticmethod
        @cython.locals(x=int)
        def g(x):
            @cython.locals(y=int)
            def inner(y):
                return y + 1
            return inner(x)

    @functools.lru_cache(maxsize=None)
    def h(k):
        return cython.locals(k=int)(abs)(k)   # a call, not a decorator
    ''')


def test_only_the_cython_locals_decorators_become_blank_lines() -> None:
    out = _script().strip_cython_locals(SOURCE)
    before, after = SOURCE.splitlines(), out.splitlines()
    assert len(after) == len(before)
    changed = [k + 1 for k, (a, b) in enumerate(zip(before, after)) if a != b]
    assert changed == [5, 6, 11, 13]
    assert all(after[k - 1] == "" for k in changed)
    decorators = [ast.unparse(d) for node in ast.walk(ast.parse(out))
                  for d in getattr(node, "decorator_list", ())]
    assert sorted(decorators) == ["functools.lru_cache(maxsize=None)", "staticmethod"]
    space: dict = {}
    exec(compile(out, "stripped", "exec"), space)      # still valid, and behaves the same
    assert space["A"]().f(4) == 6 and space["A"].g(2) == 3 and space["h"](-5) == 5


def test_source_without_the_decorator_or_unparsable_is_unchanged() -> None:
    strip = _script().strip_cython_locals
    plain = "@property\ndef f(self):\n    return 1\r\n"
    assert strip(plain) == plain
    assert strip("def (:\n") == "def (:\n"
    assert strip("@cython.locals(i=int)\r\ndef f(i):\r\n    return i\r\n") == "\r\ndef f(i):\r\n    return i\r\n"


def test_the_scheduler_copy_has_no_decorated_function() -> None:
    """The sched target's hot functions (``update``, ``_schedule_batched``) lose their only
    decorator in the mutation copy; every line number stays."""
    source = (ROOT / "src" / "hybridkv" / "sched" / "scheduler.py").read_text()
    out = _script().strip_cython_locals(source)
    assert "cython.locals" in source and "@cython" not in out
    assert len(out.splitlines()) == len(source.splitlines())
    decorated = {n.name for n in ast.walk(ast.parse(out))
                 if isinstance(n, ast.FunctionDef) and n.decorator_list}
    assert not decorated & {"update", "_schedule_batched"}


def test_sync_rewrites_only_what_changed(tmp_path: Path, monkeypatch) -> None:
    repo, dest = tmp_path / "repo", tmp_path / "copy"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "m.py").write_text("@cython.locals(i=int)\ndef f(i):\n    return i\n")
    (repo / "src" / "other.py").write_text("@cython.locals(i=int)\ndef g(i):\n    return i\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    script = _script()
    monkeypatch.setattr(script, "ROOT", repo)
    script.sync(dest, ["src/m.py"])
    assert (dest / "src" / "m.py").read_text() == "\ndef f(i):\n    return i\n"
    assert (dest / "src" / "other.py").read_text().startswith("@cython.locals")  # not mutated
    copies = list((dest / "src").iterdir())
    for p in copies:
        os.utime(p, (1_000_000, 1_000_000))            # a copy rewritten would get a new mtime
    script.sync(dest, ["src/m.py"])                    # nothing changed: nothing rewritten
    assert [p.stat().st_mtime for p in copies] == [1_000_000, 1_000_000]
    (repo / "src" / "m.py").write_text("@cython.locals(i=int)\ndef f(i):\n    return -i\n")
    script.sync(dest, ["src/m.py"])
    assert (dest / "src" / "m.py").read_text() == "\ndef f(i):\n    return -i\n"


def _fake_state(state: Path) -> None:
    """A mutmut 3.8 state directory as ``.ci/mutation.py`` leaves it: the copy's sources and, per
    mutated source, ``mutants/PATH.meta`` (JSON; ``exit_code_by_key`` maps each mutant to its
    worker's exit code, null while not checked)."""
    def meta(path: str, codes: dict) -> None:
        (state / path).parent.mkdir(parents=True, exist_ok=True)
        (state / path).write_text("x = 1\n")
        target = state / "mutants" / (path + ".meta")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": {},
                                      "type_check_error_by_key": {}, "durations_by_key": {},
                                      "estimated_durations_by_key": {}}, indent=4))
    f = "hybridkv.a.x_f__mutmut_"
    meta("src/hybridkv/a.py", {f + "10": 0, f + "9": 0, f + "1": 1, f + "2": 3, f + "3": 36,
                               f + "4": 152, f + "5": 33, f + "6": None, f + "7": 35, f + "8": -11,
                               "hybridkv.a.xǁCǁg__mutmut_1": 0})
    meta("src/hybridkv/b/__init__.py",
         {"hybridkv.b.x_h__mutmut_1": 1, "hybridkv.b.x_h__mutmut_2": 5})
    meta("src/hybridkv/other.py", {"hybridkv.other.x_k__mutmut_1": 0})    # not in the target
    meta("src/hybridkv/gone.py", {"hybridkv.gone.x_k__mutmut_1": 0})
    (state / "src" / "hybridkv" / "gone.py").unlink()                     # a module that left


TARGET = {"mutate": ["src/hybridkv/a.py", "src/hybridkv/b/*", "src/hybridkv/gone.py"],
          "tests": ["tests/a"]}
EXPECTED = {
    "target": "t", "mutate": TARGET["mutate"], "tests": ["tests/a"], "mutmut": "3.8.1",
    "commit": "c0ffee", "dirty": False,
    "total": {"mutants": 13, "killed": 3, "timeout": 2, "survived": 3, "no tests": 2,
              "not checked": 1, "other": 2},
    "modules": {
        "src/hybridkv/a.py": {
            "mutants": 11, "killed": 2, "timeout": 2, "survived": 3, "no tests": 1,
            "not checked": 1, "other": 2,
            "names": {"survived": ["hybridkv.a.x_f__mutmut_9", "hybridkv.a.x_f__mutmut_10",
                                   "hybridkv.a.xǁCǁg__mutmut_1"],
                      "timeout": ["hybridkv.a.x_f__mutmut_3", "hybridkv.a.x_f__mutmut_4"],
                      "no tests": ["hybridkv.a.x_f__mutmut_5"],
                      "other": {"hybridkv.a.x_f__mutmut_7": "suspicious",
                                "hybridkv.a.x_f__mutmut_8": "segfault"}}},
        "src/hybridkv/b/__init__.py": {
            "mutants": 2, "killed": 1, "timeout": 0, "survived": 0, "no tests": 1,
            "not checked": 0, "other": 0,
            "names": {"survived": [], "timeout": [], "no tests": ["hybridkv.b.x_h__mutmut_2"],
                      "other": {}}}},
}


def test_export_reads_mutmuts_meta_files(tmp_path: Path) -> None:
    _fake_state(tmp_path)
    record = _script().export(tmp_path, "t", TARGET, mutmut_version="3.8.1", commit="c0ffee",
                              dirty=False)
    assert record == EXPECTED
    assert list(record["modules"]) == ["src/hybridkv/a.py", "src/hybridkv/b/__init__.py"]


def test_export_command_writes_the_json_and_refuses_a_target_never_run(tmp_path: Path, monkeypatch,
                                                                       capsys) -> None:
    script = _script()
    _fake_state(tmp_path / ".mutation" / "t")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "targets", lambda: {"t": TARGET, "u": TARGET})
    monkeypatch.setattr(script, "checkout_commit", lambda: ("c0ffee", True))
    monkeypatch.setattr(script, "installed_mutmut", lambda: "3.8.1")
    assert script.main(["t", "export", str(tmp_path / "out.json")]) == 0
    written = (tmp_path / "out.json").read_text(encoding="utf-8")
    assert json.loads(written) == {**EXPECTED, "dirty": True}
    assert script.main(["t", "export"]) == 0
    assert capsys.readouterr().out == written                   # no path: the same JSON on stdout
    assert not (tmp_path / ".mutation" / "t" / "pyproject.toml").exists()   # nothing copied
    with pytest.raises(SystemExit, match=r"no mutmut state in .*u/mutants: run `python3 "
                                         r"\.ci/mutation\.py u` first"):
        script.main(["u", "export"])
    with pytest.raises(SystemExit, match="export takes at most one path, got 2: a b"):
        script.main(["t", "export", "a", "b"])
