"""The compiled scheduler, simulator step loop and step-time models (setup.py compiles
``hybridkv.sched``, ``hybridkv.sim.simulator`` and three modules of ``hybridkv.cost`` with the
core) against their own pure-Python source, and the stale-build guard over every compiled package.

A simulation that exercises every scheduler path (speculative decoding with drafts, preemption
in a small pool, chunked prefill, batched and per-request steps) runs in this process and in
a subprocess with ``HYBRIDKV_PURE_PYTHON=1``; their results must be equal. Skipped without a
compiled build, except under ``CI=true`` (see tests/core/test_compiled.py) where a missing
build fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import hybridkv.sched
from hybridkv import _purepy

ROOT = Path(__file__).resolve().parents[2]

SIMULATE = """
import json, sys
import hybridkv.sched
from hybridkv.core.spec_decode import SpecDecode
from hybridkv.sched import SchedulerConfig
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.simulator import TIMING_KEYS
from hybridkv.sim.traffic.workloads import get_workload

import hybridkv.cost.calibrated as calibrated
import hybridkv.cost.comm as comm
import hybridkv.cost.costmodel as costmodel
import hybridkv.sim.simulator as simulator
items = items_from_trace(get_workload("chat", num_conversations=12, turns=3, seed=3))
out = {"compiled": hybridkv.sched.COMPILED,
       "loop compiled": [not m.__file__.endswith(".py")
                         for m in (simulator, calibrated, comm, costmodel)]}
for batched in (True, False):
    cfg = SimConfig(get_preset("llama-3.1-8b"), get_gpu("h100"), num_blocks=300,
                    spec=SpecDecode("eagle", 3), optimum=False, seed=2,
                    sched=SchedulerConfig(max_num_batched_tokens=512, batched=batched))
    d = Simulator(cfg).run(items).to_json()
    out[str(batched)] = {k: v for k, v in d.items() if k not in TIMING_KEYS}
print(json.dumps(out))
"""


def _simulate(pure: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("HYBRIDKV_PURE_PYTHON", None)
    if pure:
        env["HYBRIDKV_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", SIMULATE], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def test_compiled_scheduler_equals_pure() -> None:
    if not hybridkv.sched.COMPILED:
        if os.environ.get("CI") == "true" and not (
                _purepy.requested() or os.environ.get("HYBRIDKV_NO_COMPILE", "") not in ("", "0")):
            pytest.fail("CI=true but hybridkv.sched is not compiled: pip install -e . should have "
                        "compiled it with the core")
        pytest.skip("no compiled build of hybridkv.sched here (pip install -e . with Cython)")
    compiled, pure = _simulate(False), _simulate(True)
    assert compiled["compiled"] is True and pure["compiled"] is False
    assert compiled["loop compiled"] == [True] * 4 and pure["loop compiled"] == [False] * 4
    assert compiled["True"] == compiled["False"] == pure["True"] == pure["False"]
    assert compiled["True"]["preemptions"] > 0


def test_the_stale_guard_covers_every_compiled_package(tmp_path: Path, monkeypatch) -> None:
    """_purepy.stale() checks the core, the scheduler and the packages of the simulator's step
    loop and step-time models: a changed scheduler source makes the build stale too, and the
    reason names the package."""
    import hashlib

    assert [os.path.basename(p) for p in _purepy.COMPILED_PACKAGES] == ["core", "sched", "sim",
                                                                         "cost"]
    dirs = []
    for name in ("core", "sched"):
        d = tmp_path / name
        d.mkdir()
        (d / "m.py").write_bytes(b"A = 1\n")
        (d / ("m" + EXTENSION_SUFFIXES[0])).write_bytes(b"")
        digest = hashlib.sha256(b"A = 1\n").hexdigest()
        (d / _purepy.MANIFEST).write_text(f"m.py {digest}\n")
        dirs.append(str(d))
    monkeypatch.setattr(_purepy, "COMPILED_PACKAGES", tuple(dirs))
    assert _purepy.stale() is None
    (tmp_path / "sched" / "m.py").write_bytes(b"A = 2\n")
    assert _purepy.stale() == "sched: m.py changed since the build"


def test_setup_and_the_stale_guard_name_the_same_compiled_modules() -> None:
    """setup.py's PACKAGES (what is compiled) and _purepy.COMPILED_PACKAGES (what the stale
    guard checks) name the same packages in the same order; every module setup.py lists
    exists; every .pxd of the package sits beside a module setup.py compiles (its manifest
    hashes the .pxd beside each compiled module only)."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    (packages,) = [ast.literal_eval(n.value) for n in tree.body
                   if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "PACKAGES"]
    assert list(packages) == [os.path.basename(p) for p in _purepy.COMPILED_PACKAGES]
    assert packages["sim"] == ("simulator.py", "traffic/token_ids.py") and packages["core"] is None
    src = ROOT / "src" / "hybridkv"
    compiled = set()
    for package, only in packages.items():
        root = src / package
        if only is None:                       # every module, native ones (.pyx) included
            compiled |= {p for p in root.rglob("*.py") if p.name != "__init__.py"}
            compiled |= set(root.rglob("*.pyx"))
        else:
            assert all((root / name).is_file() for name in only), (package, only)
            compiled |= {root / name for name in only}
    pxds = sorted(src.rglob("*.pxd"))
    assert len(pxds) >= 10
    assert [p for p in pxds if p.with_suffix(".py") not in compiled
            and p.with_suffix(".pyx") not in compiled] == []
    assert src / "core" / "hash_index_native.pyx" in compiled
    assert src / "core" / "free_queue_native.pyx" in compiled
