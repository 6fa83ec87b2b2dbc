# Augments pool.py when compiled: BlockPool as an extension type, so its methods read its
# fields as C struct members. Every field stays public (Python code and the subclasses read
# and set them as before); the counters are C integers.

from hybridkv.core.free_queue_native cimport FreeBlockQueue
from hybridkv.core.hash_index_native cimport HashIndex

cdef class BlockPool:
    cdef public object num_blocks
    cdef public list ref_cnt
    cdef public list block_hash
    cdef public list block_group
    cdef public FreeBlockQueue queue
    cdef public list index
    cdef public object on_evict
    cdef public Py_ssize_t num_evictions
    cdef public Py_ssize_t index_version
    cdef public list _changes
    cdef public Py_ssize_t _changes_base
    cdef public Py_ssize_t free_version
