"""Routers that score prefix overlap against load.

* ``kv-aware`` — a :class:`~hybridkv.events.KVEventIndex` fed by the instances' KV events says
  how many leading blocks each instance holds; the router picks the least
  ``queued + overlap_weight * uncached`` (in tokens; Dynamo's cost shape, overlap-weighted
  prefill plus load): ``uncached`` is what this request would still compute there (its prompt
  minus the prefix the index says the instance holds), ``queued`` the instance's outstanding
  prefill. ``overlap_weight`` > 1 values a hit above its own prefill time: a request sent away
  from its prefix also duplicates that prefix there and evicts other blocks. Pure
  longest-prefix routing would send every request that shares block 0 to one instance; the
  queue term spreads them once an instance is busy. (A decode-load term — the KV its running
  requests hold, Dynamo's "active blocks" — was measured too and lowered both hit rate and
  TTFT on the Mooncake trace, so it is not used; under light load, kv-aware therefore keeps
  sessions where their prefix is even when other instances idle.) On top of the score, a
  bound on load skew (``max_skew``, :func:`~hybridkv.sim.cluster.routing.base.within_skew`): an
  instance takes a request only while its routed requests stay within ``max_skew`` times the
  other instances' mean, so sessions that all share a system prompt are not all sent to the
  instance that holds it (SGLang's cache-aware router likewise falls back to the shortest
  queue past a balance threshold; Dynamo's and llm-d's scorers weigh load against overlap).
* ``approximate`` — the same score, but the held prefixes are *predicted* from the router's own
  routing history (no events): each instance gets an LRU of the block hashes routed to it,
  sized to its cache (llm-d's "approximate" / Dynamo's ``--no-kv-events`` mode).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from hybridkv.core.validation import check_int
from hybridkv.events.index import KVEventIndex
from hybridkv.sim.cluster.routing.base import (DEFAULT_MAX_SKEW, DEFAULT_OVERLAP_WEIGHT, ROUTERS,
                                       InstanceLoad, RouteDecision, Router, RouterSetup,
                                       check_max_skew, within_skew)


@ROUTERS.register("kv-aware")
class KVAwareRouter(Router):
    """Scores prefix overlap from a :class:`KVEventIndex` against load (module docstring).

    Args:
        index: the index the instances' events feed (keys are ``(group, hash)``).
        block_size: tokens per hash in ``hashes``.
        group: the KV-cache group whose hashes are scored.
        overlap_weight: weight of the request's own uncached prefill against queued work.
        max_skew: the load-skew bound (:func:`~hybridkv.sim.cluster.routing.base.within_skew`), >= 1;
            None: none (pure score).

    ``routed`` counts the requests this router sent to each instance.
    """

    needs_events = True
    uses_overlap_weight = True
    bounds_skew = True

    def __init__(self, index: KVEventIndex, block_size: int, group: int = 0,
                 overlap_weight: float = DEFAULT_OVERLAP_WEIGHT,
                 max_skew: float | None = DEFAULT_MAX_SKEW) -> None:
        if overlap_weight < 0:
            raise ValueError(f"overlap_weight must be >= 0, got {overlap_weight!r}")
        check_max_skew(max_skew)
        self.index = index
        self.block_size = block_size
        self.group = group
        self.overlap_weight = overlap_weight
        self.max_skew = max_skew
        self.routed: list[int] = []

    @classmethod
    def from_setup(cls, setup: RouterSetup) -> KVAwareRouter:
        index = setup.index if setup.index is not None else KVEventIndex()
        return cls(index, setup.block_size, setup.group, setup.overlap_weight, setup.max_skew)

    def matched_blocks(self, hashes: Sequence[bytes]) -> dict:
        return self.index.prefix_match(hashes, self.group)

    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        cap = max(0, (prompt_len - 1) // self.block_size)  # the last token is always computed
        matched = self.matched_blocks(hashes[:cap])
        w = self.overlap_weight
        if len(self.routed) != len(loads):
            self.routed = [0] * len(loads)
        allowed = set(within_skew(self.routed, self.max_skew))
        best = None
        for ld in loads:
            if ld.index not in allowed:
                continue
            hit = matched.get(ld.index, 0) * self.block_size
            key = (ld.outstanding_tokens + w * (prompt_len - hit), ld.requests, ld.index, hit)
            if best is None or key < best:
                best = key
        self.routed[best[2]] += 1  # type: ignore[index]
        return RouteDecision(best[2], best[3])  # type: ignore[index]


@ROUTERS.register("approximate")
class ApproximateRouter(KVAwareRouter):
    """:class:`KVAwareRouter` over a predicted index: per instance, an LRU of the block hashes
    routed to it, at most ``capacity_blocks`` long (the instance's cache)."""

    needs_events = False

    def __init__(self, num_instances: int, capacity_blocks: int, block_size: int,
                 overlap_weight: float = DEFAULT_OVERLAP_WEIGHT,
                 max_skew: float | None = DEFAULT_MAX_SKEW) -> None:
        check_int("capacity_blocks", capacity_blocks, 1)
        super().__init__(KVEventIndex(), block_size, 0, overlap_weight, max_skew)
        self.capacity = capacity_blocks
        self._lru: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(num_instances)]

    @classmethod
    def from_setup(cls, setup: RouterSetup) -> ApproximateRouter:
        return cls(setup.num_instances, setup.capacity_blocks, setup.block_size, setup.overlap_weight,
                   setup.max_skew)

    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        d = super().route(hashes, prompt_len, loads)
        lru = self._lru[d.instance]
        new = []
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                new.append(h)
        self.index.add(d.instance, 0, new)
        over = len(lru) - self.capacity
        if over > 0:
            gone = [lru.popitem(last=False)[0] for _ in range(over)]
            self.index.remove(d.instance, 0, gone)
        return d
