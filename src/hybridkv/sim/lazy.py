"""The front door of each of the simulator's rooms (``sim/traffic``, ``sim/bounds``, ...): a
package's public names, each loaded from its submodule on first use.

The rooms' submodules import the simulator, which imports some of them, so a package
``__init__`` that imported its submodules eagerly would close a circle; :func:`lazy_exports`
gives it a module ``__getattr__`` instead (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Callable

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``: ``exports`` maps a public name to the
    submodule (relative to ``package``) that defines it; any other name is an AttributeError
    naming the module and the name."""
    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
