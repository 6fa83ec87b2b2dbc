"""Adaptive: exact LRU unless a shadow of chain ARC has been hitting more, then chain ARC.

Assumes nothing about traffic; it is for traffic nobody has measured. Two *shadow caches* of the
pool's capacity run beside the real one on content hashes only (no blocks): an LRU and a chain
ARC (:mod:`hybridkv.core.eviction.arc`). Every batch the pool frees (a request's chain, tail
first) is served to both: each counts its leading hits (from the chain's head), then takes the
batch in as the pool would. Their hit counts halve every ``DECAY_CAPACITIES`` x ``capacity``
blocks freed. The real cache evicts like the shadow that is ahead: chain ARC's choice while its
count exceeds ``(1 + margin)`` x LRU's count + 1, else **exactly LRU's** (one list of the held
blocks in free order: the pool's own LRU order), as it does from the start.

What that guarantees: whenever ARC's shadow is not ahead by that margin, the victims are the
blocks plain LRU would evict from this cache's current contents. A run in which ARC's shadow is never
ahead is identical to plain LRU (a test checks it); one in which it is ahead has switched
because, on the recent past, ARC would have hit more. It cannot guarantee that the past
predicts the future: a workload that changes faster than the decay can make it switch too
late, and the contents ARC left behind are not LRU's.

Cost: three structures per freed block instead of one (about 3-4x LRU's per-operation time in
``bench_policies.py``); memory: two shadows of the pool's capacity plus ARC's ghosts.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterator, Sequence

from hybridkv.core.eviction.arc import ChainARCPolicy
from hybridkv.core.eviction.base import EvictionPolicy


#: The shadows' hit counts halve every this many capacities of blocks freed.
DECAY_CAPACITIES = 8


class _Identity:
    """``block_hash`` of a shadow: the key is the hash."""

    __slots__ = ()

    def __getitem__(self, key):
        return key


class _KeyPool:
    """What a policy reads from its pool, for a shadow whose "blocks" are hashes."""

    __slots__ = ("num_blocks", "block_hash")

    def __init__(self, capacity: int) -> None:
        self.num_blocks = capacity + 1
        self.block_hash = _Identity()


class AdaptivePolicy(EvictionPolicy):
    """See the module docstring. ``margin``: how far (relative) ARC's shadow must be ahead."""

    name = "adaptive"
    __slots__ = ("fifo", "arc", "shadow_lru", "shadow_arc", "score_lru", "score_arc",
                 "margin", "use_arc", "_freed", "_cap")

    def __init__(self, margin: float = 0.1, challenger: Callable[[], EvictionPolicy] = ChainARCPolicy) -> None:
        super().__init__()
        if not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise ValueError(f"margin must be a number in [0, 1), got {margin!r}")
        self.margin = float(margin)
        self.fifo: OrderedDict[int, None] = OrderedDict()     # held blocks in free order (LRU)
        self.arc = challenger()             # the challenger (chain ARC unless told otherwise)
        self.shadow_lru: OrderedDict[object, None] = OrderedDict()
        self.shadow_arc = challenger()
        self.score_lru = 0.0
        self.score_arc = 0.0
        self.use_arc = False
        self._freed = 0
        self._cap = 1

    def attach(self, pool) -> None:
        super().attach(pool)
        self._cap = max(1, pool.num_blocks - 1)
        self.arc.attach(pool)
        self.shadow_arc.attach(_KeyPool(self._cap))

    def __len__(self) -> int:
        return len(self.fifo)

    def __contains__(self, b: int) -> bool:
        return b in self.fifo

    def __iter__(self) -> Iterator[int]:
        return iter(self.fifo)

    # ---- the real cache ---------------------------------------------------------------------
    def on_free(self, blocks: Sequence[int]) -> None:
        fifo = self.fifo
        for b in blocks:
            fifo[b] = None
        self.arc.on_free(blocks)
        pool = self.pool
        bh, bg = pool.block_hash, pool.block_group
        self._shadows([bh[b] if not bg[b] else (bg[b], bh[b]) for b in blocks])

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            del self.fifo[b]
        self.arc.on_hit(b, held)

    def forget(self, blocks: Sequence[int]) -> None:
        self.arc.forget(blocks)

    def pop(self, n: int) -> list[int]:
        fifo = self.fifo
        if self.use_arc:
            out = self.arc.pop(n)
            for b in out:
                del fifo[b]
            return out
        out = [fifo.popitem(last=False)[0] for _ in range(n)]
        discard = self.arc.discard
        for b in out:
            discard(b)
        return out

    # ---- the shadows ------------------------------------------------------------------------
    def _shadows(self, keys: list) -> None:
        """Serve one freed batch (tail first) to both shadows; update the scores and the mode."""
        cap = self._cap
        lru = self.shadow_lru
        hits = 0
        for k in reversed(keys):                   # leading hits, from the chain's head
            if k not in lru:
                break
            hits += 1
        self.score_lru += hits
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
        while len(lru) > cap:
            lru.popitem(last=False)
        arc = self.shadow_arc
        hits = 0
        for k in reversed(keys):
            if k not in arc:
                break
            hits += 1
        self.score_arc += hits
        fresh = []
        for k in keys:
            if k in arc:
                arc.on_hit(k, True)
            else:
                fresh.append(k)
        over = len(arc) + len(keys) - cap
        if over > 0:
            arc.forget(arc.pop(min(over, len(arc))))
        arc.on_free(keys[-cap:] if len(keys) > cap else keys)
        self._freed += len(keys)
        if self._freed >= DECAY_CAPACITIES * cap:
            self._freed = 0
            self.score_lru *= 0.5
            self.score_arc *= 0.5
        self.use_arc = self.score_arc > self.score_lru * (1.0 + self.margin) + 1.0

    def check(self) -> None:
        self.arc.check()
        if len(self.arc) != len(self.fifo) or any(b not in self.arc for b in self.fifo):
            raise AssertionError(f"adaptive: LRU list ({len(self.fifo)}) and ARC lists "
                                 f"({len(self.arc)}) hold different blocks")
        if len(self.shadow_lru) > self._cap or len(self.shadow_arc) > self._cap:
            raise AssertionError("adaptive: a shadow is over the pool's capacity")
