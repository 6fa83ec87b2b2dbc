"""Cython's ``cython`` module where Cython is not installed: the few names hybridkv uses, as
no-ops, so the pure-Python source runs unchanged.

The compiled packages (setup.py: ``hybridkv.core``, ``hybridkv.sched``) declare C types for
some hot loops in Cython's pure-Python mode, written as::

    try:
        import cython
    except ImportError:
        from hybridkv import _cython_shim as cython

    @cython.locals(i=cython.Py_ssize_t, table=list)
    def f(table): ...

Compiled, Cython reads the decorator and types ``i`` and ``table``; run as Python (this shim,
or Cython's own module where it is installed), the decorator returns the function unchanged.
The types are chosen so the compiled code behaves exactly like the source (containers that
are always of that type, indices that always fit a C integer). This module is never compiled.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

_F = TypeVar("_F", bound=Callable[..., object])

#: False: this is the source running as Python (Cython's compiled modules see True).
compiled = False

#: C's signed size type (list indices, lengths); a Python ``int`` here.
Py_ssize_t = int

#: A C int used as a truth value; a Python ``bool`` here.
bint = bool


def locals(**types: Any) -> Callable[[_F], _F]:  # noqa: A001 - Cython's name
    """Cython's ``@cython.locals(name=type, ...)``: declares local variable types when
    compiled; here it returns the function unchanged."""
    return lambda func: func


#: C integer types (Python ints here); ``ulonglong[:]`` names a typed memoryview.
class _CType:
    def __getitem__(self, item: Any) -> "_CType":
        return self


int = _CType()  # noqa: A001 - Cython's name (the builtin stays reachable as builtins.int)
longlong = ulonglong = _CType()
p_char = p_ulonglong = _CType()


def declare(type: Any = None, value: Any = None, **kwargs: Any) -> Any:  # noqa: A002
    """``cython.declare``: a typed attribute or variable when compiled; ``value`` here."""
    return value


def cast(type: Any, value: Any) -> Any:  # noqa: A002
    """``cython.cast``: a C cast when compiled; only reached compiled (guarded by ``compiled``)."""
    raise NotImplementedError("cython.cast runs only in the compiled build")


def cclass(cls: _F) -> _F:
    """``@cython.cclass``: an extension type when compiled; the class unchanged here."""
    return cls


def cfunc(func: _F) -> _F:
    """``@cython.cfunc``: a C-level function when compiled; unchanged here."""
    return func


inline = cfunc


def returns(type: Any) -> Callable[[_F], _F]:  # noqa: A002
    """``@cython.returns(type)``: the C return type when compiled; a no-op here."""
    return lambda func: func


def boundscheck(flag: bool) -> Callable[[_F], _F]:
    """``@cython.boundscheck(flag)``: a compiler directive; a no-op here."""
    return lambda func: func


wraparound = boundscheck


def exceptval(value: Any = None, check: bool = True) -> Callable[[_F], _F]:
    """``@cython.exceptval(...)``: a C function's error signalling; a no-op here."""
    return lambda func: func
