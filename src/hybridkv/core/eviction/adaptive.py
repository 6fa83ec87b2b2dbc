"""Adaptive: exact LRU unless a shadow of chain ARC has been hitting more, then chain ARC.

Assumes nothing about traffic; it is for traffic nobody has measured. Two *shadow caches* of the
pool's capacity run beside the real one on content hashes only (no blocks): an LRU and a chain
ARC (:mod:`hybridkv.core.eviction.arc`). Every batch the pool frees (a request's chain, tail
first) is served to both: each counts its leading hits (from the chain's head), then takes the
whole batch in, refreshing every key it already holds. That is exactly what a pool of that
capacity would hit when every chain is one block long; with longer chains it is an estimate (a
real pool reuses a chain only up to its first miss and recomputes the rest). Their hit counts
halve every ``DECAY_CAPACITIES`` x ``capacity`` blocks freed. The real cache evicts like the
shadow that is ahead: chain ARC's choice while its count exceeds ``(1 + margin)`` x LRU's
count + 1, else **exactly LRU's** (one list of the held blocks in free order: the pool's own
LRU order), as it does from the start.

What that guarantees: whenever ARC's shadow is not ahead by that margin, the victims are the
blocks plain LRU would evict from this cache's current contents. A run in which ARC's shadow is never
ahead is identical to plain LRU (a test checks it); one in which it is ahead has switched
because, on the recent past, ARC would have hit more. It cannot guarantee that the past
predicts the future: a workload that changes faster than the decay can make it switch too
late, and the contents ARC left behind are not LRU's.

Challengers: chain ARC is the default (``adaptive``); ``adaptive-turns`` runs chain ARC *and*
:mod:`~hybridkv.core.eviction.turns` (``eva-turns``) as challengers, each with its shadow and
its copy over the real blocks, and evicts like the one whose shadow leads when it is ahead of
LRU's by the margin (assumes, beyond ``adaptive``, that multi-turn traffic may want
``eva-turns``' dead-time ages, and pays a third copy for it). Every challenger sees every
freed block and drops (``discard``) the victims another one chose, so a switch finds each
one's lists complete.

Cost: three structures per freed block instead of one (about 3-4x LRU's per-operation time in
``bench_policies.py``); memory: two shadows of the pool's capacity plus ARC's ghosts.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, cast

from hybridkv.core.eviction.arc import ChainARCPolicy
from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy, PolicyPool
from hybridkv.core.eviction.turns import TurnEVAPolicy

if TYPE_CHECKING:
    class _Challenger(Protocol):
        """What a challenger implements beyond :class:`EvictionPolicy`."""

        def discard(self, b: int) -> None:
            """Drop free block ``b`` (another policy evicted it)."""


#: The shadows' hit counts halve every this many capacities of blocks freed.
DECAY_CAPACITIES = 8


class _Identity:
    """``block_hash`` of a shadow: the key is the hash."""

    __slots__ = ()

    def __getitem__(self, key: object) -> object:
        return key


class _KeyPool:
    """What a policy reads from its pool, for a shadow whose "blocks" are hashes."""

    __slots__ = ("num_blocks", "block_hash")

    def __init__(self, capacity: int) -> None:
        self.num_blocks = capacity + 1
        self.block_hash = _Identity()


@EVICTION_POLICIES.register("adaptive")
class AdaptivePolicy(EvictionPolicy):
    """See the module docstring. ``margin``: how far (relative) a challenger's shadow must be
    ahead of LRU's; ``challengers``: factories of the challenger policies (chain ARC alone by
    default), each of which must implement ``discard``."""

    name = "adaptive"
    __slots__ = ("fifo", "alts", "shadow_lru", "shadows", "score_lru", "scores",
                 "margin", "mode", "_freed", "_cap")

    def __init__(self, margin: float = 0.1,
                 challengers: Sequence[Callable[[], EvictionPolicy]] = (ChainARCPolicy,)) -> None:
        super().__init__()
        if not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise ValueError(f"margin must be a number in [0, 1), got {margin!r}")
        if not challengers:
            raise ValueError("challengers must name at least one policy factory")
        self.margin = float(margin)
        self.fifo: OrderedDict[int, None] = OrderedDict()     # held blocks in free order (LRU)
        self.alts = [make() for make in challengers]          # the challengers on the real blocks
        self.shadow_lru: OrderedDict[object, None] = OrderedDict()
        self.shadows = [make() for make in challengers]       # the challengers on hashes
        self.score_lru = 0.0
        self.scores = [0.0] * len(challengers)
        self.mode = -1                      # the challenger evicting now; -1: LRU
        self._freed = 0
        self._cap = 1

    @property
    def use_arc(self) -> bool:
        """Whether a challenger (not LRU) chooses the victims now."""
        return self.mode >= 0

    def attach(self, pool: PolicyPool) -> None:
        super().attach(pool)
        self._cap = max(1, pool.num_blocks - 1)
        for alt, shadow in zip(self.alts, self.shadows):
            alt.attach(pool)
            # a shadow's policies read num_blocks and block_hash only (no groups on hashes)
            shadow.attach(_KeyPool(self._cap))  # type: ignore[arg-type]

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
        for alt in self.alts:
            alt.on_free(blocks)
        pool = self.pool
        bh, bg = pool.block_hash, pool.block_group
        self._shadows([bh[b] if not bg[b] else (bg[b], bh[b]) for b in blocks])

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            del self.fifo[b]
        for alt in self.alts:
            alt.on_hit(b, held)

    def forget(self, blocks: Sequence[int]) -> None:
        for alt in self.alts:
            alt.forget(blocks)

    def pop(self, n: int) -> list[int]:
        fifo = self.fifo
        if self.mode >= 0:
            out = self.alts[self.mode].pop(n)
            for b in out:
                del fifo[b]
        else:
            out = [fifo.popitem(last=False)[0] for _ in range(n)]
        for i, alt in enumerate(self.alts):
            if i != self.mode:
                discard = cast("_Challenger", alt).discard
                for b in out:
                    discard(b)
        return out

    # ---- the shadows ------------------------------------------------------------------------
    @staticmethod
    def _leading_hits(keys: list[Any], cache: OrderedDict[Any, None] | EvictionPolicy) -> int:
        hits = 0
        for k in reversed(keys):                   # leading hits, from the chain's head
            if k not in cache:
                break
            hits += 1
        return hits

    def _shadows(self, keys: list[Any]) -> None:
        """Serve one freed batch (tail first) to every shadow; update the scores and the mode.
        ``keys``: the blocks' hashes (with their group past group 0), a shadow's block ids."""
        cap = self._cap
        lru = self.shadow_lru
        self.score_lru += self._leading_hits(keys, lru)
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
        while len(lru) > cap:
            lru.popitem(last=False)
        for i, shadow in enumerate(self.shadows):
            self.scores[i] += self._leading_hits(keys, shadow)
            for k in keys:
                if k in shadow:
                    shadow.on_hit(k, True)
            over = len(shadow) + len(keys) - cap
            if over > 0:
                shadow.forget(shadow.pop(min(over, len(shadow))))
            shadow.on_free(keys[-cap:] if len(keys) > cap else keys)
        self._freed += len(keys)
        if self._freed >= DECAY_CAPACITIES * cap:
            self._freed = 0
            self.score_lru *= 0.5
            self.scores = [x * 0.5 for x in self.scores]
        best = max(range(len(self.scores)), key=self.scores.__getitem__)
        self.mode = best if self.scores[best] > self.score_lru * (1.0 + self.margin) + 1.0 else -1

    def check(self) -> None:
        for alt in self.alts:
            alt.check()
            if len(alt) != len(self.fifo) or any(b not in alt for b in self.fifo):
                raise AssertionError(f"adaptive: LRU list ({len(self.fifo)}) and {alt.name} "
                                     f"({len(alt)}) hold different blocks")
        if len(self.shadow_lru) > self._cap or any(len(s) > self._cap for s in self.shadows):
            raise AssertionError("adaptive: a shadow is over the pool's capacity")


@EVICTION_POLICIES.register("adaptive-turns")
class TurnAdaptivePolicy(AdaptivePolicy):
    """``adaptive`` with chain ARC and ``eva-turns`` as challengers (see the module docstring)."""

    name = "adaptive-turns"
    __slots__ = ()

    def __init__(self, margin: float = 0.1,
                 challengers: Sequence[Callable[[], EvictionPolicy]] = (ChainARCPolicy, TurnEVAPolicy)) -> None:
        super().__init__(margin, challengers)
