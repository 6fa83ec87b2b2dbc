# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled build's free queue: :class:`FreeBlockQueue` with its links in two C arrays.

Its reference is :class:`hybridkv.core.free_queue.FreeBlockQueue` (two lists of ids): the same
queue, methods, errors and ids for valid calls, the sentinels ``HEAD, GAP, TAIL = -3, -2, -1``
included (a link holds a block id or a sentinel's id; a sentinel's slot is ``capacity + 3 + id``,
after the ids). A list's link is a pointer to an int object somewhere in memory, so following
one costs two cache misses (the slot, then the object); a C array's one: a popleft of a long run
of evicted blocks is a chase along the links. An id without a link slot (negative, or past the
capacity) is refused with IndexError, never written outside the arrays. ``_prev`` and ``_next``
read as lists (snapshots; an item written is written back: the integrity tests corrupt the
queue that way); the pool unlinks with :meth:`FreeBlockQueue._unlink`.
"""

from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Realloc
from libc.string cimport memset

cdef enum:                   # the sentinels' ids (free_queue.HEAD, GAP, TAIL)
    _HEAD = -3
    _GAP = -2
    _TAIL = -1


cdef inline Py_ssize_t _at(Py_ssize_t b, Py_ssize_t capacity) noexcept:
    """The slot of id ``b`` (a sentinel's: after the ``capacity`` ids)."""
    return b if b >= 0 else capacity + 3 + b


class _Links(list):
    """One link array of a :class:`FreeBlockQueue` as a list (a snapshot); an item or slice
    written is written back to the queue, the array's length included."""

    def __init__(self, queue, forward, links):
        list.__init__(self, links)
        self._queue, self._forward = queue, forward

    def __setitem__(self, key, value):
        list.__setitem__(self, key, value)
        self._queue._store(self._forward, list(self))


cdef void _move_sentinels(Py_ssize_t* a, Py_ssize_t old, Py_ssize_t cap) noexcept:
    """In ``a`` (room for ``cap`` ids and 3 sentinels): the sentinel slots from after ``old``
    ids to after ``cap``; the new ids' slots zero."""
    cdef Py_ssize_t k
    for k in range(2, -1, -1):                    # last first: the ranges may overlap
        a[cap + k] = a[old + k]
    memset(&a[old], 0, (cap - old) * sizeof(Py_ssize_t))


cdef class FreeBlockQueue:
    """Doubly linked list of block ids with O(1) popleft/append/prepend/remove per block
    (:class:`hybridkv.core.free_queue.FreeBlockQueue`, whose docstring holds the contract).

    Args:
        num_blocks: ids are ``< num_blocks``.
        initial: None (the default): the queue holds ``1 .. num_blocks-1``, all implicit.
            Otherwise exactly these blocks, in order, all explicit.
    """

    def __cinit__(self, *args, **kwargs):
        self._prv = NULL
        self._nxt = NULL

    def __init__(self, num_blocks, initial=None):
        if num_blocks < 1:
            raise ValueError(f"a free queue needs num_blocks >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.next_fresh = self.capacity = 1 if initial is None else num_blocks
        self._alloc(self.capacity + 3)
        self.num_free = self.num_blocks - self.next_fresh
        if self.num_free > 0:                     # the gap is linked while fresh ids remain
            self._nxt[_at(_HEAD, self.capacity)] = _GAP
            self._prv[_at(_GAP, self.capacity)] = _HEAD
            self._nxt[_at(_GAP, self.capacity)] = _TAIL
            self._prv[_at(_TAIL, self.capacity)] = _GAP
        else:
            self._nxt[_at(_HEAD, self.capacity)] = _TAIL
            self._prv[_at(_TAIL, self.capacity)] = _HEAD
            self.num_free = 0
        if initial is not None:
            self.append_n(list(initial))

    def __dealloc__(self):
        PyMem_Free(self._prv)
        PyMem_Free(self._nxt)

    cdef int _alloc(self, Py_ssize_t n) except -1:
        """Fresh zeroed arrays of ``n`` slots (traced by tracemalloc)."""
        PyMem_Free(self._prv)
        PyMem_Free(self._nxt)
        self._prv = <Py_ssize_t*>PyMem_Calloc(n, sizeof(Py_ssize_t))
        self._nxt = <Py_ssize_t*>PyMem_Calloc(n, sizeof(Py_ssize_t))
        if self._prv == NULL or self._nxt == NULL:
            raise MemoryError(f"free queue links of {n} slots")
        self._len[0] = self._len[1] = n
        return 0

    # ---- the links -----------------------------------------------------------------------------
    @property
    def _prev(self):
        """The back links as a list (ids ``0 .. capacity-1``, then the sentinels): a snapshot
        whose writes are written back (the integrity tests corrupt the queue that way)."""
        return _Links(self, False, [self._prv[i] for i in range(self._len[0])])

    @property
    def _next(self):
        """The forward links as a list, as :attr:`_prev`."""
        return _Links(self, True, [self._nxt[i] for i in range(self._len[1])])

    cpdef void _store(self, bint forward, list links) except *:
        """Replace one link array by ``links`` (its length too): :class:`_Links`' write-back."""
        cdef Py_ssize_t n = len(links), i
        cdef Py_ssize_t* a = <Py_ssize_t*>PyMem_Calloc(max(n, 1), sizeof(Py_ssize_t))
        if a == NULL:
            raise MemoryError(f"free queue links of {n} slots")
        try:
            for i in range(n):
                a[i] = links[i]
        except BaseException:
            PyMem_Free(a)
            raise
        if forward:
            PyMem_Free(self._nxt)
            self._nxt = a
        else:
            PyMem_Free(self._prv)
            self._prv = a
        self._len[1 if forward else 0] = n

    # ---- the queue ------------------------------------------------------------------------------
    def __len__(self):
        return self.num_free

    def __iter__(self):
        """The queue in pop order (fresh ids included: O(num_free))."""
        cdef Py_ssize_t b = self._nxt[_at(_HEAD, self.capacity)]
        while b != _TAIL:
            if b == _GAP:
                yield from range(self.next_fresh, self.num_blocks)
            else:
                yield b
            b = self._nxt[_at(b, self.capacity)]

    cpdef void _grow(self, Py_ssize_t n) except *:
        """Hand the next ``n`` fresh ids out of the implicit region (not linked); their link
        slots exist afterwards (capacity doubles, at most to ``num_blocks``)."""
        cdef Py_ssize_t old = self.capacity, cap
        cdef Py_ssize_t* a
        self.next_fresh += n
        if self.next_fresh <= old:
            return
        cap = min(self.num_blocks, max(self.next_fresh, 2 * old, 64))
        # both arrays grow first (a failure leaves the queue as it was, only longer arrays)
        a = <Py_ssize_t*>PyMem_Realloc(self._prv, (cap + 3) * sizeof(Py_ssize_t))
        if a == NULL:
            raise MemoryError(f"free queue links of {cap + 3} slots")
        self._prv = a
        a = <Py_ssize_t*>PyMem_Realloc(self._nxt, (cap + 3) * sizeof(Py_ssize_t))
        if a == NULL:
            raise MemoryError(f"free queue links of {cap + 3} slots")
        self._nxt = a
        _move_sentinels(self._prv, old, cap)
        _move_sentinels(self._nxt, old, cap)
        self._len[0] = self._len[1] = cap + 3
        self.capacity = cap

    def materialize(self, Py_ssize_t end):
        """Make fresh ids ``next_fresh .. end-1`` explicit, linked just before the gap
        (their place in the queue order does not change)."""
        cdef Py_ssize_t start = self.next_fresh, p, n
        if end <= start:
            return
        if end > self.num_blocks:
            raise ValueError(f"block id {end - 1} out of range [1, {self.num_blocks})")
        self._grow(end - start)
        self.num_free -= end - start          # _link_run counts them again
        self._link_run(list(range(start, end)), self._prv[_at(_GAP, self.capacity)], _GAP)
        if end == self.num_blocks:            # no fresh id left: the gap leaves the list
            p, n = self._prv[_at(_GAP, self.capacity)], self._nxt[_at(_GAP, self.capacity)]
            self._nxt[_at(p, self.capacity)] = n
            self._prv[_at(n, self.capacity)] = p

    cpdef list popleft_n(self, Py_ssize_t n):
        """Remove and return the first ``n`` blocks (``n <= num_free``)."""
        cdef list out = []
        cdef Py_ssize_t b, k, i, start, left
        if n > self.num_free:
            raise ValueError(f"cannot pop {n} blocks, only {self.num_free} are free")
        b = self._nxt[_at(_HEAD, self.capacity)]
        for i in range(n):
            if b < 0:          # reached the gap: the unhashed region is used up
                break
            out.append(b)
            b = self._nxt[b]
        else:
            self._nxt[_at(_HEAD, self.capacity)] = b
            self._prv[_at(b, self.capacity)] = _HEAD
            self.num_free -= n
            return out
        # b is the gap: the unhashed region is used up; fresh ids come next, in id order
        k = n - len(out)
        start = self.next_fresh
        left = self.num_blocks - start            # > 0 while the gap is linked
        if k < left:
            out.extend(range(start, start + k))
            self._grow(k)
            self._nxt[_at(_HEAD, self.capacity)] = _GAP
            self._prv[_at(_GAP, self.capacity)] = _HEAD
        else:                                     # the last fresh ids: the gap leaves the list
            out.extend(range(start, start + left))
            self._grow(left)
            b = self._nxt[_at(_GAP, self.capacity)]
            for i in range(k - left):             # then the hashed region, LRU first
                out.append(b)
                b = self._nxt[b]
            self._nxt[_at(_HEAD, self.capacity)] = b
            self._prv[_at(b, self.capacity)] = _HEAD
        self.num_free -= n
        return out

    cpdef void _link_run(self, list blocks, Py_ssize_t before, Py_ssize_t after) except *:
        cdef Py_ssize_t p = before, b
        for x in blocks:
            b = x
            if <size_t>b >= <size_t>self.capacity:
                raise IndexError(f"block id {b} has no link slot (explicit ids < {self.capacity})")
            self._nxt[_at(p, self.capacity)] = b
            self._prv[b] = p
            p = b
        self._nxt[_at(p, self.capacity)] = after
        self._prv[_at(after, self.capacity)] = p
        self.num_free += len(blocks)

    cpdef void append_n(self, list blocks) except *:
        """Insert ``blocks`` (explicit ids, not in the queue) at the tail, in order."""
        if blocks:
            self._link_run(blocks, self._prv[_at(_TAIL, self.capacity)], _TAIL)

    cpdef void prepend_n(self, list blocks) except *:
        """Insert ``blocks`` (explicit ids, not in the queue) at the head, in order
        (``blocks[0]`` becomes the head)."""
        if blocks:
            self._link_run(blocks, _HEAD, self._nxt[_at(_HEAD, self.capacity)])

    cpdef void _unlink(self, Py_ssize_t b) except *:
        """Unlink explicit id ``b`` (in the queue); ``num_free`` is the caller's to count."""
        cdef Py_ssize_t p, n
        if <size_t>b >= <size_t>self.capacity:
            raise IndexError(f"block id {b} has no link slot (explicit ids < {self.capacity})")
        p, n = self._prv[b], self._nxt[b]
        self._nxt[_at(p, self.capacity)] = n
        self._prv[_at(n, self.capacity)] = p

    def remove(self, Py_ssize_t b):
        """Unlink block ``b`` (which must be in the queue; a fresh id is made explicit first)."""
        if b >= self.next_fresh:
            self.materialize(b + 1)
        self._unlink(b)
        self.num_free -= 1
