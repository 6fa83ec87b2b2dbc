"""Optional compiled build of ``hybridkv.core``, ``hybridkv.sched`` and the simulator's step loop,
token expansion and step-time models (everything else is in pyproject.toml).

The modules of ``src/hybridkv/core`` and ``src/hybridkv/sched`` (``__init__`` files excepted),
``src/hybridkv/sim/{simulator,traffic/token_ids}.py`` and
``src/hybridkv/cost/{comm,costmodel,calibrated}.py``
(:data:`PACKAGES`) are compiled with Cython in pure-Python mode: the same ``.py`` files, no
``.pyx`` copy, so the source stays the one reference (BENCHMARKS.md, "Compiled core", says why
and what it gains; the scheduler's and the simulator's per-step loops run once per step, next
to the core). Two modules have no ``.py`` twin: ``core/hash_index_native.pyx`` and
``core/free_queue_native.pyx``, the compiled pool's hash index and free queue (their pure-Python
references: ``core/hash_index.py``, a dict, and ``core/free_queue.py``, two lists). The build
never fails for the compiled part: without Cython, without a C compiler, or on a compile error
it prints one line and installs the pure-Python package.
``HYBRIDKV_NO_COMPILE=1`` skips compiling; ``HYBRIDKV_PURE_PYTHON=1`` at run time loads the
``.py`` files even where compiled ones are installed (src/hybridkv/_purepy.py).
"""

from __future__ import annotations

import hashlib
import os
import re
from glob import glob

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Directives: annotations stay hints (a Cython type check would reject values the pure code
# accepts, e.g. numpy integers), so the compiled module behaves exactly like its source.
DIRECTIVES = {"language_level": 3, "annotation_typing": False}
# Cython 3.0-3.3 turn `[obj and not x and y is not None for ...]` into a C int cast to an
# object pointer (a crash); a generated file with such a cast is not compiled.
MISCOMPILE = re.compile(r"= \(\(PyObject \*\)__pyx_t_\d+\);")


def notice(why: str) -> None:
    print(f"hybridkv: {why}; installing the pure-Python package (same behaviour, slower)",
          flush=True)


#: The packages compiled, each with its own manifest (:data:`MANIFEST`): every module of a
#: package mapped to None, the listed modules only otherwise: the simulator's step loop, the
#: pseudo-token expansion of each Mooncake request and the step-time models it calls once per
#: step, not the rest of ``hybridkv.sim`` and ``.cost``.
PACKAGES: dict[str, tuple[str, ...] | None] = {
    "core": None, "sched": None, "sim": ("simulator.py", "traffic/token_ids.py"),
    "cost": ("comm.py", "costmodel.py", "calibrated.py")}      # the step-time models


def package_modules(package: str) -> list[str]:
    only = PACKAGES[package]
    if only is not None:
        return [f"src/hybridkv/{package}/{name}" for name in only]
    return sorted(p for p in glob(f"src/hybridkv/{package}/**/*.py", recursive=True)
                  if os.path.basename(p) != "__init__.py") \
        + sorted(glob(f"src/hybridkv/{package}/**/*.pyx", recursive=True))   # native modules


def compiled_modules() -> list[str]:
    return [p for package in PACKAGES for p in package_modules(package)]


def extensions() -> list:
    if os.environ.get("HYBRIDKV_NO_COMPILE", "") not in ("", "0"):
        notice("HYBRIDKV_NO_COMPILE is set, not compiling")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        notice("Cython is not installed, not compiling")
        return []
    try:
        exts = cythonize(compiled_modules(), compiler_directives=DIRECTIVES, quiet=True,
                         nthreads=os.cpu_count() or 1)
    except Exception as exc:                 # noqa: BLE001 - any failure: pure Python
        notice(f"Cython failed ({type(exc).__name__}: {exc})")
        return []
    for ext in exts:
        for c_file in ext.sources:
            with open(c_file, encoding="utf-8", errors="replace") as fh:
                if MISCOMPILE.search(fh.read()):
                    notice(f"Cython cast a C int to an object in {c_file} (a known miscompile of "
                           "'obj and not x and ...'; write bool(obj)), not compiling")
                    return []
    write_manifest()
    return exts


#: The source each compiled module was built from (``path sha256`` per line, paths relative to
#: its package, one file in each of :data:`PACKAGES`; the ``.py`` and ``.pyx`` files and the
#: ``.pxd`` files beside them): at import, a compiled build whose
#: sources changed since is stale and the pure-Python source runs instead
#: (src/hybridkv/_purepy.py, :func:`stale`).
MANIFEST = "_compiled_sources.txt"


def write_manifest() -> None:
    for package in PACKAGES:
        root = f"src/hybridkv/{package}"
        lines = []
        modules = package_modules(package)
        pxds = [os.path.splitext(p)[0] + ".pxd" for p in modules
                if os.path.exists(os.path.splitext(p)[0] + ".pxd")]
        for path in modules + pxds:
            with open(path, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            lines.append(f"{os.path.relpath(path, root)} {digest}\n")
        with open(os.path.join(root, MANIFEST), "w", encoding="utf-8") as fh:
            fh.writelines(lines)


class OptionalBuildExt(build_ext):
    """``build_ext`` that drops the compiled modules, all of them, when any fails to build:
    a partly compiled build would mix two builds."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.parallel = os.cpu_count() or 1

    def build_extension(self, ext) -> None:
        if self.compiler.compiler_type == "unix":
            # no debug info (a tenth of the size); no fused multiply-adds, which round
            # differently from Python's floats (the compiled step times equal the source's)
            ext.extra_compile_args = [*ext.extra_compile_args, "-g0", "-ffp-contract=off"]
        super().build_extension(ext)

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:             # noqa: BLE001 - no compiler, compile error, ...
            for ext in self.extensions:      # remove what was built before the failure
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
            notice(f"compiling failed ({type(exc).__name__}: {exc})")


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
