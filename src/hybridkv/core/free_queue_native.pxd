# The compiled build's free queue (free_queue_native.pyx): its C layout, so the compiled pool
# (pool.py) reads its counters as struct members and calls its methods as C functions.

cdef class FreeBlockQueue:
    cdef Py_ssize_t* _prv           # back links: ids 0 .. capacity-1, then the 3 sentinels
    cdef Py_ssize_t* _nxt           # forward links, the same layout
    cdef Py_ssize_t _len[2]         # their lengths (capacity + 3, unless a test rewrote one)
    cdef public Py_ssize_t num_blocks
    cdef public Py_ssize_t next_fresh
    cdef public Py_ssize_t capacity
    cdef public Py_ssize_t num_free
    cdef int _alloc(self, Py_ssize_t n) except -1
    cpdef void _grow(self, Py_ssize_t n) except *
    cpdef list popleft_n(self, Py_ssize_t n)
    cpdef void _link_run(self, list blocks, Py_ssize_t before, Py_ssize_t after) except *
    cpdef void append_n(self, list blocks) except *
    cpdef void prepend_n(self, list blocks) except *
    cpdef void _unlink(self, Py_ssize_t b) except *
    cpdef void _store(self, bint forward, list links) except *
