"""S3-FIFO (Yang et al., SOSP 2023), adapted to a pool whose hits take blocks out of the cache.

Assumes traffic where many cached blocks are never read again (one-off prompts, long unique
tails) while a smaller set is read repeatedly (system prompts, conversation histories): it is
*scan-resistant* — a burst of blocks computed once cannot flush the blocks that were hit.

Three FIFO queues:

* ``small`` (target 10% of the held blocks): blocks freed without ever being hit;
* ``main``: blocks that were hit (or whose content was evicted from ``small`` recently and
  computed again: its hash was in ``ghost``);
* ``ghost``: hashes (not blocks) evicted from ``small``, as many as the pool has blocks.

A hit takes a block out of the free set (the pool references it); its hit count (capped at 3)
survives until the block's id is reallocated, so when it is freed again it goes to ``main``.
Victims come from ``small`` while it is over its target (or ``main`` is empty), else from
``main``, where a block with hits left gets its count decremented and goes back to the end
(CLOCK-like second chance). Every step is O(1) amortized.

Tail before prefix: each queue is FIFO in free order, so among blocks of one queue a chain's
tail goes first. In a full-attention group a hit on a block is also a hit on its whole prefix, so
a prefix never has fewer hits than its tail and is not in ``small`` while its tail is in ``main``
(a ghost re-admission can put a recomputed tail in ``main`` first: not guaranteed there).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Sequence

from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy

_MAX_FREQ = 3


@EVICTION_POLICIES.register("s3fifo")
class S3FIFOPolicy(EvictionPolicy):
    name = "s3fifo"
    __slots__ = ("small", "main", "ghost", "freq", "small_ratio")

    def __init__(self, small_ratio: float = 0.1) -> None:
        super().__init__()
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio!r}")
        self.small_ratio = small_ratio
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[bytes, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def __contains__(self, b: int) -> bool:
        return b in self.small or b in self.main

    def __iter__(self) -> Iterator[int]:
        yield from self.small
        yield from self.main

    def on_free(self, blocks: Sequence[int]) -> None:
        freq, ghost, bh = self.freq, self.ghost, self.pool.block_hash
        for b in blocks:
            if freq.get(b, 0) > 0:
                self.main[b] = None
            else:
                h: bytes = bh[b]  # type: ignore[assignment]  # a freed cached block: a hash
                if h in ghost:
                    del ghost[h]
                    self.main[b] = None
                else:
                    self.small[b] = None

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            if b in self.small:
                del self.small[b]
            else:
                del self.main[b]
        f = self.freq.get(b, 0)
        if f < _MAX_FREQ:
            self.freq[b] = f + 1

    def pop(self, n: int) -> list[int]:
        small, main, freq, ghost = self.small, self.main, self.freq, self.ghost
        bh = self.pool.block_hash
        ghost_cap = max(1, self.pool.num_blocks - 1)
        out: list[int] = []
        while len(out) < n:
            if small and (not main or len(small) > self.small_ratio * (len(small) + len(main))):
                b, _ = small.popitem(last=False)
                h = bh[b]
                if h is not None:
                    ghost[h] = None
                    if len(ghost) > ghost_cap:
                        ghost.popitem(last=False)
                out.append(b)
            else:
                b, _ = main.popitem(last=False)
                f = freq.get(b, 0)
                if f > 0:                      # second chance: one hit spent
                    freq[b] = f - 1
                    main[b] = None
                else:
                    out.append(b)
        return out

    def forget(self, blocks: Sequence[int]) -> None:
        freq = self.freq
        for b in blocks:
            freq.pop(b, None)

    def check(self) -> None:
        common = self.small.keys() & self.main.keys()
        if common:
            raise AssertionError(f"s3fifo: blocks {sorted(common)[:5]} are in both queues")
        if len(self.ghost) > max(1, self.pool.num_blocks - 1):
            raise AssertionError("s3fifo: ghost queue over its capacity")
