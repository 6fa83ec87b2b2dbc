"""Import the pure-Python source of hybridkv even where a compiled build sits next to it.

The optional compiled build (setup.py: Cython, pure-Python mode) turns the very same ``.py``
files of ``hybridkv.core``, ``hybridkv.sched``, the simulator's step loop, its trace token
expansion and its step-time models into extension modules; Python's path finder prefers an extension module over the
``.py`` beside it. :func:`install` puts a finder first on
``sys.meta_path`` that loads every ``hybridkv.*`` module from its ``.py`` file instead, so the
pure-Python reference runs. ``hybridkv/__init__.py`` installs it, before anything of the core
is imported, when :func:`requested` is true:

* ``HYBRIDKV_PURE_PYTHON`` is set to anything but ``""`` or ``"0"``;
* or mutmut runs the tests (``MUTANT_UNDER_TEST`` is set): its mutants are ``.py`` files that a
  compiled module would otherwise shadow.
* or the compiled build is stale (:func:`stale`): a ``.py`` file of a compiled package (or
  the ``.pxd`` beside one, or a native module's ``.pyx``) changed since the build (an edited
  checkout of an editable install), so the compiled module no longer is its source. A one-line warning says so and
  how to rebuild; the whole package then runs from source (never a mix of the two builds).

This module is never compiled itself (setup.py's ``PACKAGES`` says what is).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from types import ModuleType
from typing import Sequence

#: Written by setup.py in each compiled package: ``path sha256`` of each compiled source.
MANIFEST = "_compiled_sources.txt"
CORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "core")
#: The packages setup.py compiles (its ``PACKAGES``), each checked by :func:`stale`.
COMPILED_PACKAGES = tuple(os.path.join(os.path.dirname(CORE), name)
                          for name in ("core", "sched", "sim", "cost"))


def requested() -> bool:
    """True when the environment asks for the pure-Python modules (see the module docstring)."""
    return os.environ.get("HYBRIDKV_PURE_PYTHON", "") not in ("", "0") \
        or "MUTANT_UNDER_TEST" in os.environ


def stale(core: str | None = None) -> str | None:
    """Why the compiled package ``core`` (a directory; default: each of
    :data:`COMPILED_PACKAGES`, the reason then prefixed with its name) is not its source, or
    None when it is, or when nothing is compiled. Stale: a compiled module whose ``.py`` (a
    native module's ``.pyx``), or the ``.pxd`` beside it (its C types), differs from the one
    it was built from (its sha256 in :data:`MANIFEST`; a ``.pxd`` added or removed since
    counts), or no manifest."""
    if core is None:
        for package in COMPILED_PACKAGES:
            why = stale(package)
            if why is not None:
                return f"{os.path.basename(package)}: {why}"
        return None
    compiled = []
    for folder, _, files in os.walk(core):
        for name in files:
            for suffix in EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    compiled.append(os.path.relpath(os.path.join(folder, name[:-len(suffix)] + ".py"), core))
    if not compiled:
        return None
    try:
        with open(os.path.join(core, MANIFEST), encoding="utf-8") as fh:
            built = dict(line.split() for line in fh if line.strip())
    except OSError:
        return f"no {MANIFEST} beside it"
    for rel in sorted(compiled):
        if not os.path.exists(os.path.join(core, rel)) and os.path.exists(os.path.join(core, rel + "x")):
            rel += "x"                            # a native module (.pyx): no .py twin
        try:
            with open(os.path.join(core, rel), "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            continue                              # a compiled module without its source
        if built.get(rel) != digest:
            return f"{rel} changed since the build"
        pxd = os.path.splitext(rel)[0] + ".pxd"   # the C types that augment it, if any
        try:
            with open(os.path.join(core, pxd), "rb") as fh:
                pxd_digest: str | None = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            pxd_digest = None
        if built.get(pxd) != pxd_digest:
            return f"{pxd} changed since the build"
    return None


class PreferSource(importlib.abc.MetaPathFinder):
    """Finds ``hybridkv.*`` submodules as their ``.py`` source; leaves packages and anything
    without a ``.py`` file to the normal finders."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if not fullname.startswith("hybridkv.") or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def install() -> None:
    """Put :class:`PreferSource` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, PreferSource) for f in sys.meta_path):
        sys.meta_path.insert(0, PreferSource())
