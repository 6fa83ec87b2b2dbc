"""Routers of a simulated cluster: which instance serves the next request.

Every router sees the request's block hashes (the key group's, at its block size), its prompt
length and a :class:`InstanceLoad` per instance, and returns a :class:`RouteDecision`.

* ``round-robin`` — instances in turn.
* ``least-loaded`` — the fewest outstanding prefill tokens (then the fewest requests).
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
  sessions where their prefix is even when other instances idle.)
* ``approximate`` — the same score, but the held prefixes are *predicted* from the router's own
  routing history (no events): each instance gets an LRU of the block hashes routed to it,
  sized to its cache (llm-d's "approximate" / Dynamo's ``--no-kv-events`` mode).

Load is in tokens: an instance's outstanding prefill is the uncomputed prompt tokens of the
requests routed to it that have not produced their first token (waiting requests count their
prompt minus the hit predicted when they were routed).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from hybridkv.core.validation import check_int
from hybridkv.events.index import KVEventIndex

ROUTERS = ("round-robin", "least-loaded", "kv-aware", "approximate")
DEFAULT_OVERLAP_WEIGHT = 4.0  # chosen on the Mooncake conversation trace (BENCHMARKS.md)


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """What a router knows of one instance when a request arrives."""

    index: int
    outstanding_tokens: int
    requests: int


@dataclass(frozen=True, slots=True)
class RouteDecision:
    instance: int
    predicted_hit_tokens: int


def _least(costs: Sequence[tuple[float, int, int]]) -> int:
    """Index of the smallest (cost, requests, index) tuple."""
    return min(costs)[2]


class RoundRobinRouter:
    name = "round-robin"
    needs_events = False

    def __init__(self) -> None:
        self._next = 0

    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        i = self._next % len(loads)
        self._next += 1
        return RouteDecision(i, 0)


class LeastLoadedRouter:
    name = "least-loaded"
    needs_events = False

    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        return RouteDecision(_least([(ld.outstanding_tokens, ld.requests, ld.index) for ld in loads]), 0)


class KVAwareRouter:
    """Scores prefix overlap from a :class:`KVEventIndex` against load (module docstring).

    Args:
        index: the index the instances' events feed (keys are ``(group, hash)``).
        block_size: tokens per hash in ``hashes``.
        group: the KV-cache group whose hashes are scored.
        overlap_weight: weight of the request's own uncached prefill against queued work.
    """

    name = "kv-aware"
    needs_events = True

    def __init__(self, index: KVEventIndex, block_size: int, group: int = 0,
                 overlap_weight: float = DEFAULT_OVERLAP_WEIGHT) -> None:
        if overlap_weight < 0:
            raise ValueError(f"overlap_weight must be >= 0, got {overlap_weight!r}")
        self.index = index
        self.block_size = block_size
        self.group = group
        self.overlap_weight = overlap_weight

    def matched_blocks(self, hashes: Sequence[bytes]) -> dict:
        return self.index.prefix_match(hashes, self.group)

    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        cap = max(0, (prompt_len - 1) // self.block_size)  # the last token is always computed
        matched = self.matched_blocks(hashes[:cap])
        w = self.overlap_weight
        best = None
        for ld in loads:
            hit = matched.get(ld.index, 0) * self.block_size
            key = (ld.outstanding_tokens + w * (prompt_len - hit), ld.requests, ld.index, hit)
            if best is None or key < best:
                best = key
        return RouteDecision(best[2], best[3])  # type: ignore[index]


class ApproximateRouter(KVAwareRouter):
    """:class:`KVAwareRouter` over a predicted index: per instance, an LRU of the block hashes
    routed to it, at most ``capacity_blocks`` long (the instance's cache)."""

    name = "approximate"
    needs_events = False

    def __init__(self, num_instances: int, capacity_blocks: int, block_size: int,
                 overlap_weight: float = DEFAULT_OVERLAP_WEIGHT) -> None:
        check_int("capacity_blocks", capacity_blocks, 1)
        super().__init__(KVEventIndex(), block_size, 0, overlap_weight)
        self.capacity = capacity_blocks
        self._lru: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(num_instances)]

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


def make_router(name: str, *, num_instances: int, block_size: int, capacity_blocks: int,
                index: KVEventIndex | None = None, group: int = 0,
                overlap_weight: float = DEFAULT_OVERLAP_WEIGHT):
    """A router by name; ValueError naming the valid ones otherwise."""
    if name == "round-robin":
        return RoundRobinRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name == "kv-aware":
        return KVAwareRouter(index if index is not None else KVEventIndex(), block_size, group,
                             overlap_weight)
    if name == "approximate":
        return ApproximateRouter(num_instances, capacity_blocks, block_size, overlap_weight)
    raise ValueError(f"unknown router {name!r}; valid: {', '.join(ROUTERS)}")
