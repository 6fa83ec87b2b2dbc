"""Frequency with aging (LFU-DA) and its cost-aware form (GreedyDual-Size-Frequency).

Both keep the held blocks in a binary heap keyed by ``(priority, seq)`` with lazy deletion
(a hit leaves a stale entry behind; the heap is rebuilt when stale entries outnumber live ones),
so every operation is O(log n) amortized.

Tail before prefix: ``seq`` grows in free order, so among equal priorities the block freed first
(a chain's tail) goes first. In a full-attention group a hit on a block is a hit on its whole
prefix, so when a request releases its chain in one call (same age) the prefix's priority is never
below its tail's. Blocks a sliding window released earlier carry their own (older) age, as they
sit older in LRU; a local group's hit does not need them.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy

if TYPE_CHECKING:
    from hybridkv.core.rules import HitRule

#: Depth (tokens of prefix) at which the cost-aware policy values a block's recompute work.
COST_REFERENCE_TOKENS = 16384


@EVICTION_POLICIES.register("lfu")
class LFUPolicy(EvictionPolicy):
    """LFU with dynamic aging (Arlitt et al., 2000): priority = ``L + hits``, where ``hits``
    counts the references taken on the block since it got its content and ``L`` (the age) is
    the priority of the last victim.

    Assumes traffic whose popular prefixes stay popular for a while (shared system prompts,
    few-shot templates, documents asked about repeatedly). Aging makes a block that was popular
    long ago lose to a recent one once the cache has turned over about ``hits`` times, so stale
    popularity does not pin the cache forever (plain LFU's failure).
    """

    name = "lfu"
    __slots__ = ("heap", "seq_of", "hits", "age", "_seq")

    def __init__(self) -> None:
        super().__init__()
        self.heap: list[tuple[float, int, int]] = []
        self.seq_of: dict[int, int] = {}          # held block -> seq of its live heap entry
        self.hits: dict[int, int] = {}
        self.age = 0.0
        self._seq = 0

    def __len__(self) -> int:
        return len(self.seq_of)

    def __contains__(self, b: int) -> bool:
        return b in self.seq_of

    def __iter__(self) -> Iterator[int]:
        return iter(self.seq_of)

    def priority(self, b: int) -> float:
        return self.age + 1 + self.hits.get(b, 0)

    def on_free(self, blocks: Sequence[int]) -> None:
        heap, seq_of, prio = self.heap, self.seq_of, self.priority
        s = self._seq
        for b in blocks:
            s += 1
            seq_of[b] = s
            heapq.heappush(heap, (prio(b), s, b))
        self._seq = s

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            del self.seq_of[b]
            if len(self.heap) > 2 * len(self.seq_of) + 64:
                self._rebuild()
        self.hits[b] = self.hits.get(b, 0) + 1

    def _rebuild(self) -> None:
        seq_of = self.seq_of
        self.heap = [e for e in self.heap if seq_of.get(e[2]) == e[1]]
        heapq.heapify(self.heap)

    def pop(self, n: int) -> list[int]:
        heap, seq_of = self.heap, self.seq_of
        out: list[int] = []
        while len(out) < n:
            p, s, b = heapq.heappop(heap)
            if seq_of.get(b) == s:
                del seq_of[b]
                self.age = p
                out.append(b)
        return out

    def forget(self, blocks: Sequence[int]) -> None:
        hits = self.hits
        for b in blocks:
            hits.pop(b, None)

    def check(self) -> None:
        live = sum(1 for _, s, b in self.heap if self.seq_of.get(b) == s)
        if live != len(self.seq_of):
            raise AssertionError(f"{self.name}: {len(self.seq_of)} held blocks but {live} live heap entries")


@EVICTION_POLICIES.register("cost")
class CostAwarePolicy(LFUPolicy):
    """GreedyDual-Size-Frequency (Cherkasova, 1998) on recompute cost: priority =
    ``L + hits x cost(group) / bytes(group)``, the recompute work a block saves per byte it holds.

    ``cost(group)`` is the group's rule's :meth:`recompute_cost` hint (attention (query, key)
    pairs) plus the per-token linear work, at a reference block position (the pool does not know
    a block's position in its chain, so a full-attention block is valued at the reference depth);
    a sliding-window block's attention work is capped by its window, so with equal hits a
    full-attention block outlives it. Assumes hybrid models under reuse patterns like LFU's; on
    a single-group model it orders exactly like :class:`LFUPolicy`.

    Args:
        weights: per group, ``cost / bytes`` (any positive scale; only ratios matter).
    """

    name = "cost"
    __slots__ = ("weights",)

    @classmethod
    def create(cls, rules: Sequence[HitRule], clock: Callable[[], float]) -> CostAwarePolicy:
        """Weights from the groups' rules: each one's :meth:`recompute_cost` at
        :data:`COST_REFERENCE_TOKENS` of prefix (at least 1); no rules: one group."""
        weights = [max(1, r.recompute_cost(COST_REFERENCE_TOKENS // r.block_size)) for r in rules]
        return cls(weights or (1.0,))

    def __init__(self, weights: Sequence[float] = (1.0,)) -> None:
        super().__init__()
        if not weights or any(not w > 0 for w in weights):
            raise ValueError(f"cost weights must be positive, got {list(weights)!r}")
        top = max(weights)
        self.weights = [w / top for w in weights]

    def priority(self, b: int) -> float:
        return self.age + (1 + self.hits.get(b, 0)) * self.weights[self.pool.block_group[b]]
