"""Cython's ``cython`` module where Cython is not installed: the few names hybridkv uses, as
no-ops, so the pure-Python source runs unchanged.

The compiled modules (setup.py's ``PACKAGES``: ``hybridkv.core``, ``hybridkv.sched``, the
simulator's step loop and step-time models) declare C types for some hot loops in Cython's pure-Python mode, written as::

    try:
        import cython
    except ImportError:
        from hybridkv import _cython_shim as cython

    @cython.locals(i=cython.Py_ssize_t, table=list)
    def f(table): ...

Compiled, Cython reads the decorator and types ``i`` and ``table``; run as Python (this shim,
or Cython's own module where it is installed), the decorator returns the function unchanged.
The types are chosen so the compiled code behaves exactly like the source (containers that
are always of that type, indices that always fit a C integer, extension-type locals assigned
only after an ``isinstance`` check or from a field that always holds that type). This module
is never compiled.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

_F = TypeVar("_F", bound=Callable[..., object])

#: False: this is the source running as Python (Cython's compiled modules see True).
compiled = False

#: C's signed size type (list indices, lengths); a Python ``int`` here.
Py_ssize_t = int

#: C's double (a float that also holds inf); a Python ``float`` here.
double = float

#: A C int used as a truth value; a Python ``bool`` here.
bint = bool

#: C's ``char *``; here the ``bytes`` it points into (slicing either gives the same bytes).
p_char = bytes


def locals(**types: Any) -> Callable[[_F], _F]:  # noqa: A001 - Cython's name
    """Cython's ``@cython.locals(name=type, ...)``: declares local variable types when
    compiled; here it returns the function unchanged."""
    return lambda func: func


def cfunc(func: _F) -> _F:
    """Cython's ``@cython.cfunc``: a module-level function called from C only when compiled
    (no Python-level call); here the function unchanged."""
    return func


def cpow(flag: bool) -> Callable[[_F], _F]:
    """Cython's ``@cython.cpow(True)``: C doubles' ``**`` is C's ``pow`` (a float, as Python's
    float ``**`` gives for the positive bases it is used on) instead of a complex power; here
    it returns the function unchanged."""
    return lambda func: func
