# Augments base.py when compiled (Cython pure-Python mode): the per-request bookkeeping as an
# extension type, so compiled code that declares a _ReqBlocks local reads its fields as C
# struct members. Every field stays public (Python code reads and sets them); the three
# thresholds are C doubles (they hold token counts well below 2**53, or inf).

cdef class _ReqBlocks:
    cdef public object owner
    cdef public list tables
    cdef public list cached_hi
    cdef public list done_t
    cdef public tuple boundaries
    cdef public list mask_ends
    cdef public double quiet_until
    cdef public double slots
    cdef public double slide_until
    cdef public dict states

cdef class _Fields:
    cdef public dict reqs
    cdef public object len_cap
    cdef public object hasher
    cdef public bint caching
    cdef public list state_groups
    cdef public object pool
    cdef public list rules
    cdef public list block_sizes
    cdef public list scales
    cdef public list dense_step
    cdef public bint compat
    cdef public object epoch
    cdef public list _limit_facts
    cdef public list _write_facts
    cdef public object retention
    cdef public object on_stored
    cdef public bint hinted
    cdef public object anchor_key
    cdef public object alignment
    cdef public list units
    cdef public object hold
    cdef public dict _lookups
    cdef public dict _evictable
    cdef public object max_model_len
    cdef public list dense
    cdef public object _index_changes
    cdef public list admission_caps
    cdef public list releasing
