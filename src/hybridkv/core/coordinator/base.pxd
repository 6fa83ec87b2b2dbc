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
