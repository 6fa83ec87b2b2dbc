# Augments request.py when compiled: Request as an extension type, so compiled code that
# declares a Request local reads its fields as C struct members. Every field stays public
# (Python code reads and sets them as before).

cdef class Request:
    cdef public object request_id
    cdef public object token_ids
    cdef public object num_prompt_tokens
    cdef public object num_computed_tokens
    cdef public object cache_salt
    cdef public object lora
    cdef public object mm_items
    cdef public object skip_prefix_cache
    cdef public list block_hashes
    cdef public object hasher
    cdef public object num_preemptions
    cdef public object retention
    cdef public object hint
    cdef public object checkpoints
    cdef object __weakref__
