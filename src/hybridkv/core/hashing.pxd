# Augments hashing.py when compiled: BlockHasher as an extension type and Request's C layout,
# so update() reads both as C struct members. Every field stays public.
from hybridkv.core.request cimport Request

cdef class BlockHasher:
    cdef public object block_size
    cdef public object algo
    cdef public object seed
    cdef public object lookahead
    cdef public object none_hash
    cdef public object _digest
