# Augments request.py when compiled: EngineRequest as an extension type, so the scheduler's
# compiled loops that declare an EngineRequest local read its fields as C struct members.
# Every field stays public (Python code reads and sets them as before).

cdef class EngineRequest:
    cdef public object request
    cdef public object max_tokens
    cdef public object priority
    cdef public object arrival_time
    cdef public object stop_token_ids
    cdef public object status
    cdef public object spec_token_ids
    cdef public object num_cached_tokens
    cdef public object num_external_tokens
    cdef public object pending_external
    cdef public object first_token_step
    cdef public object user_data
    cdef public object _seq
