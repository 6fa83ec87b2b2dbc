"""The compiled core (setup.py, Cython) against its own pure-Python source.

Every case of :mod:`tests.support.compiled_trace` (full, full + SWA, EAGLE, compat mode, compat
EAGLE in a small pool, a small pool with preemptions, periodic retention, three non-LRU
policies; and a bare pool, LRU and two policies, through random operation sequences) runs
here, in the compiled build, and in a subprocess with ``HYBRIDKV_PURE_PYTHON=1``; every
observable must be equal: hit lengths, new block ids, free blocks, evictions, events, stats
and final tables; for a bare pool, each operation's result, the evicted hashes in order, the
free queue and the index (both sides check integrity after every operation).

Without a compiled build the test is skipped, except under ``CI=true`` (where ``.ci/run``'s
``pip install -e`` builds one) unless ``HYBRIDKV_NO_COMPILE`` or ``HYBRIDKV_PURE_PYTHON`` says
the pure core is meant: there a missing build fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hybridkv.core
from hybridkv import _purepy

from tests.support.compiled_trace import CASES, run

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2)


def _pure_meant() -> bool:
    return _purepy.requested() or os.environ.get("HYBRIDKV_NO_COMPILE", "") not in ("", "0")


def _require_compiled() -> None:
    if hybridkv.core.COMPILED:
        return
    if os.environ.get("CI") == "true" and not _pure_meant():
        pytest.fail("CI=true but hybridkv.core is not compiled: the build (pip install -e .) "
                    "should have compiled it; pip install -v -e . shows its 'hybridkv: ...' notice")
    pytest.skip("no compiled build of hybridkv.core here (pip install -e . with Cython and a C "
                "compiler makes one; HYBRIDKV_PURE_PYTHON=1 forces the pure source)")


def _pure(case: str, seed: int) -> dict:
    env = dict(os.environ, HYBRIDKV_PURE_PYTHON="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-m", "tests.support.compiled_trace", case, str(seed)],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("case", CASES)
def test_compiled_equals_pure(case: str) -> None:
    _require_compiled()
    for seed in SEEDS:
        pure = _pure(case, seed)
        assert pure["compiled"] is False
        compiled = run(case, seed)
        assert len(compiled) == len(pure["trace"])
        for i, (c, p) in enumerate(zip(compiled, pure["trace"])):
            assert c == p, (f"{case} seed {seed}: operation {i} differs (a compiled build older "
                            "than its .py source differs too: rebuild, pip install -e .)")


def test_pure_python_env_loads_the_source() -> None:
    """HYBRIDKV_PURE_PYTHON=1 loads every core module from its .py file, compiled build or not."""
    code = ("import sys, hybridkv.core, hybridkv.core.eviction.s3fifo; "
            "mods = [m for n, m in sys.modules.items() if n.startswith('hybridkv.core')]; "
            "bad = [m.__name__ for m in mods if not m.__file__.endswith('.py')]; "
            "print(hybridkv.core.COMPILED, bad)")
    env = dict(os.environ, HYBRIDKV_PURE_PYTHON="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["False", "[]"]


def test_a_compiled_core_older_than_its_source_is_stale(tmp_path: Path) -> None:
    """_purepy.stale: nothing compiled -> None; compiled modules matching the manifest -> None;
    a changed .py, a .pxd (C types) added, changed or removed, a native module's changed .pyx,
    or no manifest -> the reason (hybridkv then runs the pure source)."""
    import hashlib
    from importlib.machinery import EXTENSION_SUFFIXES

    core = tmp_path / "core"
    (core / "rules").mkdir(parents=True)
    sources = {"pool.py": b"A = 1\n", "rules/full.py": b"B = 2\n"}
    for rel, text in sources.items():
        (core / rel).write_bytes(text)
    assert _purepy.stale(str(core)) is None                       # pure only: never stale
    for rel in sources:
        (core / rel).with_suffix(EXTENSION_SUFFIXES[0]).write_bytes(b"")
    assert _purepy.stale(str(core)) == f"no {_purepy.MANIFEST} beside it"
    (core / _purepy.MANIFEST).write_text("".join(
        f"{rel} {hashlib.sha256(text).hexdigest()}\n" for rel, text in sources.items()))
    assert _purepy.stale(str(core)) is None
    pxd = b"cdef class P:\n    pass\n"
    (core / "pool.pxd").write_bytes(pxd)                              # C types added since
    assert _purepy.stale(str(core)) == "pool.pxd changed since the build"
    with (core / _purepy.MANIFEST).open("a") as fh:
        fh.write(f"pool.pxd {hashlib.sha256(pxd).hexdigest()}\n")
    assert _purepy.stale(str(core)) is None
    (core / "pool.pxd").write_bytes(b"cdef class Q:\n    pass\n")   # C types changed
    assert _purepy.stale(str(core)) == "pool.pxd changed since the build"
    (core / "pool.pxd").unlink()                                      # C types removed
    assert _purepy.stale(str(core)) == "pool.pxd changed since the build"
    (core / "pool.pxd").write_bytes(pxd)
    (core / "rules/full.py").write_bytes(b"B = 3\n")
    assert _purepy.stale(str(core)) == "rules/full.py changed since the build"
    (core / "rules/full.py").write_bytes(b"B = 2\n")
    native = b"cdef class N:\n    pass\n"                      # a native module: .pyx, no .py
    (core / "native.pyx").write_bytes(native)
    (core / "native").with_suffix(EXTENSION_SUFFIXES[0]).write_bytes(b"")
    assert _purepy.stale(str(core)) == "native.pyx changed since the build"
    with (core / _purepy.MANIFEST).open("a") as fh:
        fh.write(f"native.pyx {hashlib.sha256(native).hexdigest()}\n")
    assert _purepy.stale(str(core)) is None
    (core / "native.pyx").write_bytes(b"cdef class M:\n    pass\n")
    assert _purepy.stale(str(core)) == "native.pyx changed since the build"


def test_this_checkout_is_not_stale() -> None:
    """The build under test is its source (a stale one would run pure and warn)."""
    assert _purepy.stale() is None
