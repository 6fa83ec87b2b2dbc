"""The pool's free queue: an intrusive doubly linked list of block ids (:class:`FreeBlockQueue`).

The links are two lists indexed by block id; three sentinel slots (head, gap, tail) sit after
the ids. The region order and why it is vLLM's are :mod:`hybridkv.core.pool`'s docstring. This
is the reference; the compiled pool uses ``free_queue_native.FreeBlockQueue``, the same queue
with its links in C arrays (ARCHITECTURE.md, "The free queue").
"""

from __future__ import annotations

from typing import Iterable, Iterator

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

# Sentinel node ids of the free queue: the last three slots of the link lists. Negative ids
# keep naming the same slots while the lists grow (fresh ids are inserted before them).
HEAD, GAP, TAIL = -3, -2, -1


class FreeBlockQueue:
    """Doubly linked list of block ids with O(1) popleft/append/prepend/remove per block.

    Ids ``next_fresh .. num_blocks-1`` are implicit: they sit, in id order, where the gap
    node is (between the prepended and the appended blocks) and need no link slot. The gap is
    linked exactly while fresh ids remain. Two sentinels (head, tail) make every operation
    branch-free except a pop that reaches the gap.

    Args:
        num_blocks: ids are ``< num_blocks``.
        initial: None (the default): the queue holds ``1 .. num_blocks-1``, all implicit.
            Otherwise exactly these blocks, in order, all explicit (``next_fresh`` is
            ``num_blocks``; link memory is O(num_blocks)).
    """

    __slots__ = ("_prev", "_next", "num_blocks", "next_fresh", "capacity", "num_free")

    def __init__(self, num_blocks: int, initial: Iterable[int] | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"a free queue needs num_blocks >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.next_fresh = self.capacity = 1 if initial is None else num_blocks
        self._prev = [0] * (self.capacity + 3)    # ids 0 .. capacity-1, then the sentinels
        self._next = [0] * (self.capacity + 3)
        self.num_free = num_blocks - self.next_fresh
        if self.num_free > 0:                     # the gap is linked while fresh ids remain
            self._next[HEAD] = GAP
            self._prev[GAP] = HEAD
            self._next[GAP] = TAIL
            self._prev[TAIL] = GAP
        else:
            self._next[HEAD] = TAIL
            self._prev[TAIL] = HEAD
            self.num_free = 0
        if initial is not None:
            self.append_n(list(initial))

    def __len__(self) -> int:
        return self.num_free

    def __iter__(self) -> Iterator[int]:
        """The queue in pop order (fresh ids included: O(num_free))."""
        nxt = self._next
        b = nxt[HEAD]
        while b != TAIL:
            if b == GAP:
                yield from range(self.next_fresh, self.num_blocks)
            else:
                yield b
            b = nxt[b]

    def _grow(self, n: int) -> None:
        """Hand the next ``n`` fresh ids out of the implicit region (not linked); their link
        slots exist afterwards (capacity doubles, at most to ``num_blocks``)."""
        self.next_fresh += n
        if self.next_fresh > self.capacity:
            cap = min(self.num_blocks, max(self.next_fresh, 2 * self.capacity, 64))
            more = [0] * (cap - self.capacity)
            self._next[HEAD:HEAD] = more
            self._prev[HEAD:HEAD] = more
            self.capacity = cap

    def materialize(self, end: int) -> None:
        """Make fresh ids ``next_fresh .. end-1`` explicit, linked just before the gap
        (their place in the queue order does not change)."""
        start = self.next_fresh
        if end <= start:
            return
        if end > self.num_blocks:
            raise ValueError(f"block id {end - 1} out of range [1, {self.num_blocks})")
        self._grow(end - start)
        self.num_free -= end - start          # _link_run counts them again
        self._link_run(list(range(start, end)), self._prev[GAP], GAP)
        if end == self.num_blocks:            # no fresh id left: the gap leaves the list
            p, n = self._prev[GAP], self._next[GAP]
            self._next[p] = n
            self._prev[n] = p

    @cython.locals(nxt=list, out=list, i=cython.Py_ssize_t, k=cython.Py_ssize_t,
                   bi=cython.Py_ssize_t)
    def popleft_n(self, n: int) -> list[int]:
        """Remove and return the first ``n`` blocks (``n <= num_free``)."""
        if n > self.num_free:
            raise ValueError(f"cannot pop {n} blocks, only {self.num_free} are free")
        nxt = self._next
        out = []
        b = nxt[HEAD]
        k = n
        for i in range(k):
            bi = b
            if bi < 0:         # reached the gap: the unhashed region is used up
                break
            out.append(b)
            b = nxt[bi]
        else:
            nxt[HEAD] = b
            self._prev[b] = HEAD
            self.num_free -= n
            return out
        # b is the gap: the unhashed region is used up; fresh ids come next, in id order
        prv = self._prev
        k = n - len(out)
        start = self.next_fresh
        left = self.num_blocks - start            # > 0 while the gap is linked
        if k < left:
            out.extend(range(start, start + k))
            self._grow(k)
            nxt[HEAD] = GAP
            prv[GAP] = HEAD
        else:                                     # the last fresh ids: the gap leaves the list
            out.extend(range(start, start + left))
            self._grow(left)
            b = nxt[GAP]
            for _ in range(k - left):             # then the hashed region, LRU first
                out.append(b)
                b = nxt[b]
            nxt[HEAD] = b
            prv[b] = HEAD
        self.num_free -= n
        return out

    @cython.locals(prev=list, nxt=list, pi=cython.Py_ssize_t, bi=cython.Py_ssize_t)
    def _link_run(self, blocks: list[int], before: int, after: int) -> None:
        prev, nxt = self._prev, self._next
        p = before
        pi = p
        for b in blocks:
            bi = b
            nxt[pi] = b
            prev[bi] = p
            p = b
            pi = bi
        nxt[pi] = after
        prev[after] = p
        self.num_free += len(blocks)

    def append_n(self, blocks: list[int]) -> None:
        """Insert ``blocks`` (explicit ids, not in the queue) at the tail, in order."""
        if blocks:
            self._link_run(blocks, self._prev[TAIL], TAIL)

    def prepend_n(self, blocks: list[int]) -> None:
        """Insert ``blocks`` (explicit ids, not in the queue) at the head, in order
        (``blocks[0]`` becomes the head)."""
        if blocks:
            self._link_run(blocks, HEAD, self._next[HEAD])

    def _unlink(self, b: int) -> None:
        """Unlink explicit id ``b`` (in the queue); ``num_free`` is the caller's to count."""
        p = self._prev[b]
        n = self._next[b]
        self._next[p] = n
        self._prev[n] = p

    def remove(self, b: int) -> None:
        """Unlink block ``b`` (which must be in the queue; a fresh id is made explicit first)."""
        if b >= self.next_fresh:
            self.materialize(b + 1)
        self._unlink(b)
        self.num_free -= 1
