# Types of the few names of Cython's pure-Python-mode module that hybridkv uses (Cython ships
# no stubs; the checker reads this file, never Python). The same names as src/hybridkv/_cython_shim.py.
from typing import Callable, TypeVar

_F = TypeVar("_F", bound=Callable[..., object])

compiled: bool
Py_ssize_t = int
bint = bool
double = float
p_char = bytes

def locals(**types: object) -> Callable[[_F], _F]: ...

def cfunc(func: _F) -> _F: ...

def cpow(flag: bool) -> Callable[[_F], _F]: ...
