# Types of the few names of Cython's pure-Python-mode module that hybridkv uses (Cython ships
# no stubs; the checker reads this file, never Python). The same names as src/hybridkv/_cython_shim.py,
# and the few that only code under ``if cython.compiled:`` reads (never run as Python).
from typing import Callable, TypeVar

_F = TypeVar("_F", bound=Callable[..., object])
_T = TypeVar("_T")

compiled: bool
Py_ssize_t = int
bint = bool
double = float
p_char = bytes

# only under ``if cython.compiled:``
ulonglong = int

class p_ulonglong:          # C's unsigned long long *
    def __getitem__(self, i: int) -> int: ...
    def __setitem__(self, i: int, v: int) -> None: ...

def cast(t: type[_T], v: object) -> _T: ...

def locals(**types: object) -> Callable[[_F], _F]: ...

def cfunc(func: _F) -> _F: ...

def cpow(flag: bool) -> Callable[[_F], _F]: ...
