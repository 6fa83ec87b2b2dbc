"""Import the pure-Python source of hybridkv even where a compiled build sits next to it.

The optional compiled build (setup.py: Cython, pure-Python mode) turns the very same ``.py``
files of ``hybridkv.core`` into extension modules; Python's path finder prefers an extension
module over the ``.py`` beside it. :func:`install` puts a finder first on ``sys.meta_path``
that loads every ``hybridkv.*`` module from its ``.py`` file instead, so the pure-Python
reference runs. ``hybridkv/__init__.py`` installs it, before anything of the core is imported,
when :func:`requested` is true:

* ``HYBRIDKV_PURE_PYTHON`` is set to anything but ``""`` or ``"0"``;
* or mutmut runs the tests (``MUTANT_UNDER_TEST`` is set): its mutants are ``.py`` files that a
  compiled module would otherwise shadow.

This module is never compiled itself (setup.py compiles ``hybridkv.core`` only).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys


def requested() -> bool:
    """True when the environment asks for the pure-Python modules (see the module docstring)."""
    return os.environ.get("HYBRIDKV_PURE_PYTHON", "") not in ("", "0") \
        or "MUTANT_UNDER_TEST" in os.environ


class PreferSource(importlib.abc.MetaPathFinder):
    """Finds ``hybridkv.*`` submodules as their ``.py`` source; leaves packages and anything
    without a ``.py`` file to the normal finders."""

    def find_spec(self, fullname, path, target=None):
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
