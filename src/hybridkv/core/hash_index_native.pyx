# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled build's hash -> block index: :class:`HashIndex`, a native open-addressing table.

The block pool keeps one index per KV-cache group, ``hash -> block id`` (or a dict of ids,
:mod:`hybridkv.core.pool`). Its reference is :class:`hybridkv.core.hash_index.HashIndex`, a
``dict``; this is the same mapping (the same keys, values and errors; any order of iteration)
in a table of slots ``(hash, key, value)``, linear probing, at most half full, deletion by
backward shift (no tombstones), so a probe reads one or two neighbouring slots (and the key
object only when its hash matches and it is another object).
:meth:`HashIndex.prefetch` asks the CPU for the slots of a batch of keys before they are
used, so the misses of a request's run of inserts, or an eviction batch's pops, overlap
instead of following each other: what makes it faster than the dict (ARCHITECTURE.md,
"The hash index").

Keys are any hashable objects (block hashes: ``bytes``); the table holds a reference to each
key and value. It does not take part in garbage collection: its values are block ids and dicts
of them, which refer to nothing.
"""

from collections.abc import KeysView, Mapping, MutableMapping

from cpython.object cimport Py_EQ, PyObject, PyObject_Hash, PyObject_RichCompareBool
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.mem cimport PyMem_Calloc, PyMem_Free


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define HYBRIDKV_PREFETCH(p) __builtin_prefetch(p)
    #else
    #define HYBRIDKV_PREFETCH(p) ((void)(p))
    #endif
    """
    void HYBRIDKV_PREFETCH(const void* p) nogil


cdef object _MISSING = object()
cdef Py_ssize_t _MIN_SLOTS = 8


cdef _Slot* _new_slots(Py_ssize_t n) except NULL:
    cdef _Slot* s = <_Slot*> PyMem_Calloc(n, sizeof(_Slot))   # traced (tracemalloc)
    if s == NULL:
        raise MemoryError(f"a hash index of {n} slots")
    return s


cdef class HashIndex:
    """A ``dict``'s mapping API over a native table (module docstring), plus :meth:`prefetch`.

    ``HashIndex()``, ``HashIndex(mapping)`` or ``HashIndex(pairs)`` as for ``dict``; equal to
    any mapping with the same items; iterates in table order (not insertion order), over a
    snapshot of the keys; ``values()`` and ``items()`` are lists (snapshots)."""

    def __cinit__(self, *args, **kwargs):
        self.slots = _new_slots(_MIN_SLOTS)
        self.mask = _MIN_SLOTS - 1
        self.used = 0

    def __init__(self, other=(), **kwargs):
        self.update(other, **kwargs)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.slots != NULL:
            for i in range(self.mask + 1):
                if self.slots[i].key != NULL:
                    Py_XDECREF(self.slots[i].key)
                    Py_XDECREF(self.slots[i].value)
            PyMem_Free(self.slots)
            self.slots = NULL

    # ---- the table ----------------------------------------------------------------------------
    cdef Py_ssize_t _find(self, object key, Py_hash_t h) except? -2:
        """The slot holding ``key`` (>= 0), or ``-1 - i`` with ``i`` the empty slot that ends
        its probe (where it would go). A key comparison that changes the table (it may run
        code) starts the probe again."""
        cdef Py_ssize_t i, mask
        cdef _Slot* s
        cdef _Slot* table
        cdef object other
        cdef int eq
        cdef bint again = True
        while again:
            again = False
            i = <Py_ssize_t>(<size_t>h & <size_t>self.mask)
            while True:
                s = &self.slots[i]
                if s.key == NULL:
                    return -1 - i
                if s.hash == h:
                    if s.key == <PyObject*>key:
                        return i
                    table, mask = self.slots, self.mask
                    other = <object>s.key      # held across the comparison
                    eq = PyObject_RichCompareBool(other, key, Py_EQ)
                    if self.slots != table or self.mask != mask \
                            or self.slots[i].key != <PyObject*>other:
                        again = True
                        break
                    if eq:
                        return i
                i = (i + 1) & self.mask
        return -1                              # not reached

    cdef Py_ssize_t _slot_for(self, object key, Py_hash_t h) except? -2:
        """:meth:`_find`, with room made for an absent key first (the table grown to stay at
        most half full), so the caller writes ``-1 - i`` at once."""
        cdef Py_ssize_t i
        while True:
            i = self._find(key, h)
            if i >= 0 or 2 * (self.used + 1) <= self.mask + 1:
                return i
            self._grow()

    cdef int _grow(self) except -1:
        """Double the slots (every key rehomed by its stored hash)."""
        cdef Py_ssize_t n_old = self.mask + 1, n = 2 * n_old, i, j
        cdef _Slot* old = self.slots
        cdef _Slot* new = _new_slots(n)
        for i in range(n_old):
            if old[i].key != NULL:
                j = <Py_ssize_t>(<size_t>old[i].hash & <size_t>(n - 1))
                while new[j].key != NULL:
                    j = (j + 1) & (n - 1)
                new[j] = old[i]
        self.slots = new
        self.mask = n - 1
        PyMem_Free(old)
        return 0

    cdef int _put(self, object key, object value) except -1:
        """``self[key] = value``."""
        cdef Py_hash_t h = PyObject_Hash(key)
        cdef Py_ssize_t i = self._slot_for(key, h)
        cdef PyObject* old
        if i >= 0:
            old = self.slots[i].value
            Py_INCREF(value)
            self.slots[i].value = <PyObject*>value
            Py_XDECREF(old)
            return 0
        self._fill(-1 - i, h, key, value)
        return 0

    cdef inline void _fill(self, Py_ssize_t i, Py_hash_t h, object key, object value) noexcept:
        """Put ``key -> value`` into the empty slot ``i`` (from :meth:`_slot_for`)."""
        Py_INCREF(key)
        Py_INCREF(value)
        self.slots[i].hash = h
        self.slots[i].key = <PyObject*>key
        self.slots[i].value = <PyObject*>value
        self.used += 1

    cdef void _remove_at(self, Py_ssize_t i) noexcept:
        """Empty slot ``i``: the later slots of its probe run move back (backward shift), so
        every key stays reachable from its home slot with no tombstone."""
        cdef _Slot* s = self.slots
        cdef PyObject* key = s[i].key
        cdef PyObject* value = s[i].value
        cdef Py_ssize_t j = i, k
        while True:
            j = (j + 1) & self.mask
            if s[j].key == NULL:
                break
            k = <Py_ssize_t>(<size_t>s[j].hash & <size_t>self.mask)
            # s[j] may move to the hole i unless its home k lies cyclically in (i, j]
            if (i < j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                s[i] = s[j]
                i = j
        s[i].key = NULL
        s[i].value = NULL
        self.used -= 1
        Py_XDECREF(key)                        # last: a release may run code
        Py_XDECREF(value)

    cdef list _keys(self):
        cdef list out = []
        cdef Py_ssize_t i
        for i in range(self.mask + 1):
            if self.slots[i].key != NULL:
                out.append(<object>self.slots[i].key)
        return out

    # ---- the dict API -------------------------------------------------------------------------
    cpdef object get(self, object key, object default=None):
        cdef Py_ssize_t i = self._find(key, PyObject_Hash(key))
        if i < 0:
            return default
        return <object>self.slots[i].value

    cpdef object setdefault(self, object key, object default=None):
        cdef Py_hash_t h = PyObject_Hash(key)
        cdef Py_ssize_t i = self._slot_for(key, h)
        if i >= 0:
            return <object>self.slots[i].value
        self._fill(-1 - i, h, key, default)
        return default

    cpdef object pop(self, object key, object default=_MISSING):
        cdef Py_ssize_t i = self._find(key, PyObject_Hash(key))
        if i < 0:
            if default is _MISSING:
                raise KeyError(key)
            return default
        value = <object>self.slots[i].value
        self._remove_at(i)
        return value

    cpdef void prefetch(self, list keys) except *:
        """Bring the cache line of each of ``keys``' home slot, and the next line (where a probe
        or a backward shift goes on), toward the CPU (no change, no effect on any result): call
        before a batch of operations on them."""
        cdef Py_hash_t h
        cdef size_t i, mask = <size_t>self.mask
        for key in keys:
            h = PyObject_Hash(key)
            i = <size_t>h & mask
            HYBRIDKV_PREFETCH(&self.slots[i])
            # 64 bytes on lies in slot i + 2 (slots are 24 bytes): the next line, in the table
            HYBRIDKV_PREFETCH((<char*>&self.slots[i]) + 64 if i + 2 <= mask else <char*>self.slots)

    cpdef void clear(self) except *:
        cdef _Slot* old = self.slots
        cdef Py_ssize_t i, n = self.mask + 1
        self.slots = _new_slots(_MIN_SLOTS)
        self.mask = _MIN_SLOTS - 1
        self.used = 0
        for i in range(n):
            if old[i].key != NULL:
                Py_XDECREF(old[i].key)
                Py_XDECREF(old[i].value)
        PyMem_Free(old)

    def update(self, other=(), **kwargs):
        if isinstance(other, Mapping):
            for key in other.keys():
                self._put(key, other[key])
        elif hasattr(other, "keys"):
            for key in other.keys():
                self._put(key, other[key])
        else:
            for key, value in other:
                self._put(key, value)
        for key, value in kwargs.items():
            self._put(key, value)

    def __len__(self):
        return self.used

    def __contains__(self, key):
        return self._find(key, PyObject_Hash(key)) >= 0

    def __getitem__(self, key):
        cdef Py_ssize_t i = self._find(key, PyObject_Hash(key))
        if i < 0:
            raise KeyError(key)
        return <object>self.slots[i].value

    def __setitem__(self, key, value):
        self._put(key, value)

    def __delitem__(self, key):
        cdef Py_ssize_t i = self._find(key, PyObject_Hash(key))
        if i < 0:
            raise KeyError(key)
        self._remove_at(i)

    def __iter__(self):
        return iter(self._keys())

    def keys(self):
        return KeysView(self)

    def values(self):
        """The values, as a list (a snapshot, not a live view)."""
        cdef list out = []
        cdef Py_ssize_t i
        for i in range(self.mask + 1):
            if self.slots[i].key != NULL:
                out.append(<object>self.slots[i].value)
        return out

    def items(self):
        """The ``(key, value)`` pairs, as a list (a snapshot, not a live view)."""
        cdef list out = []
        cdef Py_ssize_t i
        for i in range(self.mask + 1):
            if self.slots[i].key != NULL:
                out.append((<object>self.slots[i].key, <object>self.slots[i].value))
        return out

    def copy(self):
        return type(self)(self)

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        if len(other) != self.used:
            return False
        for key in self._keys():
            if key not in other:
                return False
            mine, theirs = self[key], other[key]
            if not (mine is theirs or mine == theirs):      # as a dict compares its values
                return False
        return True

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __reduce__(self):
        return (type(self), (dict(self.items()),))

    def __repr__(self):
        return f"HashIndex({dict(self.items())!r})"


MutableMapping.register(HashIndex)
