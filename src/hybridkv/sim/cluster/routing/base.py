"""The router contract: what a router sees of a request and of each instance, what it answers,
and the :data:`ROUTERS` registry.

Every router sees the request's block hashes (the key group's, at its block size), its prompt
length and an :class:`InstanceLoad` per instance, and returns a :class:`RouteDecision`. Load
is in tokens: an instance's outstanding prefill is the uncomputed prompt tokens of the requests
routed to it that have not produced their first token (waiting requests count their prompt
minus the hit predicted when they were routed).

A router is built from the cluster's :class:`RouterSetup` by :meth:`Router.from_setup` (the
default takes nothing from it); :func:`~hybridkv.sim.cluster.routing.make_router` builds one by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from hybridkv.core.registry import Registry
from hybridkv.events.index import KVEventIndex

DEFAULT_OVERLAP_WEIGHT = 4.0  # chosen on the Mooncake conversation trace (BENCHMARKS.md)
DEFAULT_MAX_SKEW = 2.0        # the KV-aware routers' load-skew bound (:func:`within_skew`)


@dataclass(frozen=True, slots=True)
class RouterTuning:
    """The KV-aware routers' scoring knobs (routers that do not score overlap ignore them).

    Attributes:
        overlap_weight: >= 0: weight of a request's own uncached prefill against queued work.
        max_skew: the bound on load skew (:func:`within_skew`; a number >= 1); None: no bound.
    """

    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    max_skew: float | None = DEFAULT_MAX_SKEW

    def __post_init__(self) -> None:
        w = self.overlap_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0:
            raise ValueError(f"overlap_weight must be >= 0, got {w!r}")
        check_max_skew(self.max_skew)


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


@dataclass(frozen=True, slots=True)
class RouterSetup:
    """What the cluster offers a router when it is built.

    Attributes:
        num_instances: instances behind the router.
        block_size: tokens per hash in the hashes a router is given.
        capacity_blocks: one instance's cache in those blocks (a predicting router's memory).
        index: the index the instances' KV events feed (keys ``(group, hash)``), for a router
            with ``needs_events``; None: the router makes its own.
        group: the KV-cache group whose hashes are scored.
        overlap_weight: weight of a request's own uncached prefill against queued work.
        max_skew: the KV-aware routers' bound on load skew (:func:`within_skew`); None: no bound.
        tier_holds: ``tier_holds(instance, group, hash)``: whether that instance's KV tiers
            below the GPU hold the block (None: the instances have no tiers).
    """

    num_instances: int
    block_size: int
    capacity_blocks: int
    index: KVEventIndex | None = None
    group: int = 0
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    max_skew: float | None = DEFAULT_MAX_SKEW
    tier_holds: Callable[[int, int, bytes], bool] | None = None


class Router:
    """Picks the instance that serves the next request.

    ``needs_events``: the cluster feeds ``setup.index`` with the instances' KV events.
    ``uses_overlap_weight``: the router reads ``setup.overlap_weight``.
    ``bounds_skew``: the router honours ``setup.max_skew`` (every KV-aware router must: prefix
    affinity alone sends every request that shares a system prompt to one instance).
    """

    needs_events: ClassVar[bool] = False
    uses_overlap_weight: ClassVar[bool] = False
    bounds_skew: ClassVar[bool] = False

    @classmethod
    def from_setup(cls, setup: RouterSetup) -> Router:
        """The router for a cluster (default: built without arguments)."""
        return cls()

    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        raise NotImplementedError


#: Router name -> router class. A new router is one module of this package with its class
#: decorated ``@ROUTERS.register("name")`` plus one import line in ``routing/__init__.py``.
ROUTERS: Registry[type[Router]] = Registry("router", value_base=Router)


def least(costs: Sequence[tuple[float, int, int]]) -> int:
    """Index of the smallest (cost, requests, index) tuple."""
    return min(costs)[2]


def check_max_skew(max_skew: float | None) -> None:
    """ValueError unless ``max_skew`` is None or a number >= 1."""
    if max_skew is not None and (isinstance(max_skew, bool) or not isinstance(max_skew, (int, float))
                                 or not max_skew >= 1):
        raise ValueError(f"max_skew must be None (no bound) or a number >= 1, got {max_skew!r}")


def within_skew(routed: Sequence[int], max_skew: float | None) -> list[int]:
    """The instances that may take the next request under the load-skew bound.

    Load is requests routed so far (``routed[i]`` to instance ``i``). Instance ``i`` may take
    the next one when, with it, its count stays within ``max_skew`` times the mean count of the
    *other* instances (at least 1): ``routed[i] + 1 <= max_skew * max(1, mean_{j != i} routed[j])``.
    The least-routed instances may always take it, so some instance always can. (The mean of
    the others, not of all: with 2 instances "at most 2x the mean of all" bounds nothing.)

    Guarantee: with ``max_skew >= 2``, after every decision each instance holds at most
    ``max_skew * max(1, mean of the others)`` requests (a least-routed instance at ``m`` sees
    the others' mean ``>= m`` and ``m + 1 <= 2 * max(1, m)``; an instance that takes nothing only
    sees the others' mean grow). With 2 instances and the default 2.0, the busier gets at most
    2/3 of the requests (plus one, early on). Below 2 a least-routed instance may exceed the
    bound by one request. None, or a single instance: every instance.
    """
    n = len(routed)
    if max_skew is None or n < 2:
        return list(range(n))
    total, low = sum(routed), min(routed)
    return [i for i, c in enumerate(routed)
            if c == low or c + 1 <= max_skew * max(1.0, (total - c) / (n - 1))]
