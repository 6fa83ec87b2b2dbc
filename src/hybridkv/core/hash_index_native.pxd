# The compiled build's hash index (hash_index_native.pyx): its C layout, so compiled callers
# (pool.py, coordinator/lookup.py) call its methods as C functions.
from cpython.object cimport PyObject

cdef struct _Slot:
    Py_hash_t hash
    PyObject* key          # NULL: an empty slot
    PyObject* value

cdef class HashIndex:
    cdef _Slot* slots
    cdef Py_ssize_t mask   # slots - 1 (a power of two minus one)
    cdef Py_ssize_t used
    cdef Py_ssize_t _find(self, object key, Py_hash_t h) except? -2
    cdef Py_ssize_t _slot_for(self, object key, Py_hash_t h) except? -2
    cdef int _grow(self) except -1
    cdef int _put(self, object key, object value) except -1
    cdef void _fill(self, Py_ssize_t i, Py_hash_t h, object key, object value) noexcept
    cdef void _remove_at(self, Py_ssize_t i) noexcept
    cdef list _keys(self)
    cpdef object get(self, object key, object default=*)
    cpdef object setdefault(self, object key, object default=*)
    cpdef object pop(self, object key, object default=*)
    cpdef void prefetch(self, list keys) except *
    cpdef void clear(self) except *
