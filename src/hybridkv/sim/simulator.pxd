# Augments simulator.py when compiled: the per-request measurement state as an extension type
# and the scheduler's request type, so the step loop reads their fields as C struct members.
from hybridkv.sched.request cimport EngineRequest

cdef class _Live:
    cdef public object item
    cdef public object index
    cdef public double first_token_t
    cdef public list outputs
