"""Chain ARC: adaptive replacement (Megiddo & Modha, FAST 2003) whose two lists split *request
chains*, not single blocks.

Assumes conversation-like traffic: a request's prompt is an earlier request's prompt grown by a
turn, and whether a conversation comes back is a property of the conversation, so every block
of a chain (its new tail included) shares one fate. It is built to be no worse than LRU where
recency is all there is to know: when the split does not pay, the adaptive target moves the whole
cache into one list and the order is LRU's (free order, tail first).

Lists (FIFO in free order, so a batch freed together leaves tail first):

* ``t1`` (recency): blocks of chains that are not known to come back — a first turn's new
  blocks. A first turn reuses only content shared by many requests (a system prompt).
* ``t2`` (returning): blocks of a chain whose *deepest reused block* (the last block of the
  batch that was ever reused, by a hit or by recomputing a remembered ghost) has been reused
  between 1 and ``SHARED_REUSES - 1`` times — a conversation's next turn reuses its previous
  turn's last block once — and every block that was itself reused (a chain's prefix, so it does
  not leave before the tails that need it while those sit in ``t2``).
* ``b1`` / ``b2``: ghosts (hash and reuse count) of blocks evicted from ``t1`` / ``t2``, each at
  most ``ghost_ratio`` x the pool's capacity.

Adaptation (ARC's rule): recomputing content remembered in ``b1`` means ``t1`` was too small —
its target ``p`` grows by ``max(1, |b2| / |b1|)``; content remembered in ``b2`` shrinks it by
``max(1, |b1| / |b2|)``. Victims come from ``t1`` while it holds more than ``p`` blocks (or
``t2`` is empty), else from ``t2``. A recomputed ghost keeps its reuse count, so a conversation
that comes back after its blocks were evicted is recognized as returning.

Every operation is O(1) amortized (ordered dicts).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Sequence

from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy, PolicyPool

#: A block reused by this many requests or more is shared content (a system prompt), not a
#: conversation's own history: a chain whose deepest reused block is that popular is a first turn.
SHARED_REUSES = 8


@EVICTION_POLICIES.register("arc")
class ChainARCPolicy(EvictionPolicy):
    """See the module docstring. ``ghost_ratio``: each ghost list's size over the capacity."""

    name = "arc"
    __slots__ = ("t1", "t2", "b1", "b2", "reuses", "p", "ghost_ratio")

    def __init__(self, ghost_ratio: float = 2.0) -> None:
        super().__init__()
        if not isinstance(ghost_ratio, (int, float)) or not ghost_ratio > 0:
            raise ValueError(f"ghost_ratio must be a number > 0, got {ghost_ratio!r}")
        self.ghost_ratio = float(ghost_ratio)
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[object, int] = OrderedDict()    # hash -> reuses
        self.b2: OrderedDict[object, int] = OrderedDict()
        self.reuses: dict[int, int] = {}     # block -> reuses of its content (ghosts included)
        self.p = 0.0

    def attach(self, pool: PolicyPool) -> None:
        super().attach(pool)
        self.p = (pool.num_blocks - 1) / 2

    def _capacity(self) -> int:
        return max(1, self.pool.num_blocks - 1)

    def _ghost_cap(self) -> int:
        return max(1, int(self.ghost_ratio * self._capacity()))

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, b: int) -> bool:
        return b in self.t1 or b in self.t2

    def __iter__(self) -> Iterator[int]:
        yield from self.t1
        yield from self.t2

    def on_free(self, blocks: Sequence[int]) -> None:
        reuses, bh = self.reuses, self.pool.block_hash
        b1, b2 = self.b1, self.b2
        if b1 or b2:
            cap = self._capacity()
            for b in blocks:
                h = bh[b]
                r = b1.pop(h, None)
                if r is not None:                  # t1 gave it up too early: grow t1
                    reuses[b] = r + 1
                    self.p = min(cap, self.p + max(1.0, len(b2) / max(1, len(b1))))
                    continue
                r = b2.pop(h, None)
                if r is not None:                  # t2 gave it up too early: grow t2
                    reuses[b] = r + 1
                    self.p = max(0.0, self.p - max(1.0, len(b1) / max(1, len(b2))))
        deepest = 0
        for b in blocks:                           # tail first: the first reused one is the deepest
            deepest = reuses.get(b, 0)
            if deepest:
                break
        t1, t2 = self.t1, self.t2
        if 0 < deepest < SHARED_REUSES:            # a returning conversation: all of it
            for b in blocks:
                t2[b] = None
        else:
            for b in blocks:
                if reuses.get(b, 0):
                    t2[b] = None
                else:
                    t1[b] = None

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            if b in self.t1:
                del self.t1[b]
            else:
                del self.t2[b]
        self.reuses[b] = self.reuses.get(b, 0) + 1

    def forget(self, blocks: Sequence[int]) -> None:
        reuses = self.reuses
        for b in blocks:
            reuses.pop(b, None)

    def discard(self, b: int) -> None:
        """Block ``b`` (held) is evicted by someone else's choice: drop it and remember its ghost."""
        if b in self.t1:
            del self.t1[b]
            ghost = self.b1
        else:
            del self.t2[b]
            ghost = self.b2
        h = self.pool.block_hash[b]
        if h is not None:
            ghost[h] = self.reuses.get(b, 0)
            if len(ghost) > self._ghost_cap():
                ghost.popitem(last=False)

    def pop(self, n: int) -> list[int]:
        t1, t2, bh, reuses = self.t1, self.t2, self.pool.block_hash, self.reuses
        gcap = self._ghost_cap()
        out: list[int] = []
        while len(out) < n:
            if t1 and (not t2 or len(t1) > self.p):
                b, _ = t1.popitem(last=False)
                ghost = self.b1
            else:
                b, _ = t2.popitem(last=False)
                ghost = self.b2
            h = bh[b]
            if h is not None:
                ghost[h] = reuses.get(b, 0)
                if len(ghost) > gcap:
                    ghost.popitem(last=False)
            out.append(b)
        return out

    def check(self) -> None:
        common = self.t1.keys() & self.t2.keys()
        if common:
            raise AssertionError(f"arc: blocks {sorted(common)[:5]} are in both lists")
        gcap = self._ghost_cap()
        if len(self.b1) > gcap or len(self.b2) > gcap:
            raise AssertionError(f"arc: ghost lists {len(self.b1)}, {len(self.b2)} over {gcap}")
        if not 0.0 <= self.p <= self._capacity():
            raise AssertionError(f"arc: target {self.p} outside [0, {self._capacity()}]")
