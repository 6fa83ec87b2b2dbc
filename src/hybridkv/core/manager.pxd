# Augments manager.py when compiled: the fields a running request's step reads, as an
# extension type KVCacheManager derives from (public: Python code reads and sets them as before).

cdef class _ManagerFields:
    cdef public object coordinator
    cdef public object lookahead_slots
    cdef public object hasher
    cdef public object enable_caching
    cdef public object max_model_len
    cdef public object vllm_compat
    cdef public object config
    cdef public dict _requests
    cdef public tuple _block_sizes
