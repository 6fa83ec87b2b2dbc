"""The pool of configs with a state group: :class:`ExtentBlockPool` (docs/state-groups.md).

A recurrent state (or checkpoint) spans an *extent* of block ids; this pool hands extents out,
caches them as one entry and evicts them whole. The manager chooses it only when the config has
a state group, so every other config keeps :class:`~hybridkv.core.pool.BlockPool`'s code path.
"""

from __future__ import annotations

from typing import Callable, Iterable

from hybridkv.core.pool import BlockPool


class ExtentBlockPool(BlockPool):
    """A :class:`BlockPool` that also hands out *extents*: a head id plus ``k - 1`` tail ids
    that hold one recurrent state (or checkpoint) of a state group (docs/state-groups.md §2.2).

    Chosen by the manager only when the config has a state group, so pools without one keep
    :class:`BlockPool`'s code path unchanged. Only the head is ever named by a table, hashed,
    indexed, ref-counted by callers and queued; its tails follow it:

    * head referenced (ref > 0): every tail has ref 1 and is outside the free queue;
    * head free and hashed (a cached checkpoint, in the queue's hashed region): its tails
      have ref 0, stay outside the queue and are *held*: ``num_free`` counts them
      (``queue.num_free + num_held``), so a cached extent counts k free blocks;
    * head freed without a hash: the extent dissolves, head and tails go back as scratch;
    * popping a head from the queue (lazy eviction) evicts the whole checkpoint at once: its
      tails become plain free blocks, used by the same allocation or prepended as scratch.
      A checkpoint is never partially evicted.

    *Siblings* (``siblings[g]``: the other groups looked up together with group g, e.g. one
    model's recurrent layers split into several state groups) serve a hit only together, so
    evicting a group's last copy of a checkpoint also evicts the free copies of the same hash
    in its siblings: no dead part of a checkpoint stays cached.

    Invariants added to :meth:`BlockPool.check`: tails are disjoint, never heads, never
    hashed; a tail's ref is 1 iff its head's ref > 0; ``num_held`` = the tails of free heads.
    """

    __slots__ = ("tails", "num_held", "siblings")

    def __init__(self, num_blocks: int, num_groups: int,
                 on_evict: Callable[[int, bytes], None] | None = None) -> None:
        super().__init__(num_blocks, num_groups, on_evict)
        self.tails: dict[int, tuple[int, ...]] = {}
        self.num_held = 0
        self.siblings: dict[int, tuple[int, ...]] = {}

    @property
    def num_free(self) -> int:
        return self.queue.num_free + self.num_held

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def extent(self, head: int) -> tuple[int, ...]:
        """The block ids of the extent whose head is ``head`` (head first)."""
        return (head,) + self.tails.get(head, ())

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` free blocks (ref 1 each); a popped cached head evicts its whole extent."""
        if n > self.num_free:
            raise ValueError(f"cannot pop {n} blocks, only {self.num_free} are free")
        q, tails = self.queue, self.tails
        bh, group, siblings = self.block_hash, self.block_group, self.siblings
        out: list[int] = []
        spare: list[int] = []
        evictions = self.num_evictions
        while len(out) + len(spare) < n:
            k = min(n - len(out) - len(spare), q.num_free)
            if k <= 0:
                raise AssertionError("free-block count disagrees with the queue and held tails")
            popped = q.popleft_n(k)
            if q.capacity != len(self.ref_cnt):
                self._sync()
            ref = self.ref_cnt
            for b in popped:               # all out of the queue before siblings are evicted
                ref[b] = 1
            for b in popped:
                h = bh[b]
                if h is not None:
                    g = group[b]
                    self._drop(b, h)
                    self.num_evictions += 1
                    if g in siblings and h not in self.index[g]:   # its group's last copy
                        for g2 in siblings[g]:
                            self._evict_free(g2, h, spare)
                t = tails.pop(b, None)
                if t is not None:
                    self.num_held -= len(t)
                    spare.extend(t)
            out.extend(popped)
        surplus = len(out) + len(spare) - n
        if surplus:
            q.prepend_n(spare[len(spare) - surplus:])
            del spare[len(spare) - surplus:]
        ref = self.ref_cnt
        for b in spare:
            ref[b] = 1
        if self.num_evictions != evictions:
            self.free_version += 1
        return out + spare

    def _evict_free(self, g: int, h: bytes, spare: list[int]) -> None:
        """Evict the free blocks holding ``h`` in group ``g`` (whole extents) into ``spare``
        (free, unhashed, out of the queue, ref 0: the caller uses or re-queues them)."""
        v = self.index[g].get(h)
        if v is None:
            return
        ref, tails = self.ref_cnt, self.tails
        for b in ([v] if isinstance(v, int) else list(v)):
            if ref[b] == 0:
                self.queue.remove(b)
                self._drop(b, h)
                self.num_evictions += 1
                spare.append(b)
                t = tails.pop(b, None)
                if t is not None:
                    self.num_held -= len(t)
                    spare.extend(t)

    def allocate_extent(self, k: int) -> int:
        """Pop ``k`` free blocks as one extent (ref 1); returns its head."""
        blocks = self.allocate(k)
        head = blocks[0]
        if k > 1:
            self.tails[head] = tuple(blocks[1:])
        return head

    def touch(self, blocks: Iterable[int]) -> None:
        ref, tails = self.ref_cnt, self.tails
        for b in blocks:
            if b and b < len(ref) and ref[b] == 0:
                t = tails.get(b)
                if t is not None:
                    self.num_held -= len(t)
                    for x in t:
                        ref[x] = 1
            super().touch((b,))

    def _enqueue(self, scratch: list[int], cached: list[int]) -> None:
        """As :meth:`BlockPool._enqueue`; a scratch head dissolves its extent (its tails go
        back as scratch after it), a cached head's tails are held (ref 0, outside the queue)."""
        tails, ref = self.tails, self.ref_cnt
        if tails:
            out: list[int] = []
            for b in scratch:
                out.append(b)
                t = tails.pop(b, None)
                if t is not None:
                    for x in t:
                        ref[x] = 0
                    out.extend(t)
            scratch = out
            for b in cached:
                t = tails.get(b)
                if t is not None:
                    for x in t:
                        ref[x] = 0
                    self.num_held += len(t)
        self.queue.prepend_n(scratch)
        if cached:
            self.queue.append_n(cached)
            self.free_version += 1

    def _check_held(self, in_queue: list[bool]) -> None:
        ref, bh = self.ref_cnt, self.block_hash
        seen: set[int] = set()
        held = 0
        for head, t in self.tails.items():
            if not 0 < head < len(in_queue):
                raise AssertionError(f"extent head {head} has no state")
            for x in t:
                if not 0 < x < len(in_queue) or x in seen or x in self.tails:
                    raise AssertionError(f"extent of head {head}: tail {x} is invalid or shared")
                seen.add(x)
                if bh[x] is not None:
                    raise AssertionError(f"tail {x} of extent {head} is hashed")
                if in_queue[x]:
                    raise AssertionError(f"tail {x} of extent {head} is in the free queue")
                if ref[head] == 0:
                    if ref[x] != 0:
                        raise AssertionError(f"tail {x} of free extent {head} has ref {ref[x]}")
                    in_queue[x] = True                   # held: free, counted in num_held
                    held += 1
                elif ref[x] != 1:
                    raise AssertionError(f"tail {x} of referenced extent {head} has ref {ref[x]}")
        if held != self.num_held:
            raise AssertionError(f"{held} tails of free extents are held but num_held is {self.num_held}")
