# Augments hashing.py when compiled: BlockHasher as an extension type and Request's C layout,
# so update() reads both as C struct members. Every field stays public.
from hybridkv.core.request cimport Request

cdef class BlockHasher:
    cdef public Py_ssize_t block_size
    cdef public object algo
    cdef public object seed
    cdef public Py_ssize_t lookahead
    cdef public object none_hash
    cdef public object _digest
