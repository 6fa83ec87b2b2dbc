"""The router contract: what a router sees of a request and of each instance, what it answers,
and the :data:`ROUTERS` registry.

Every router sees the request's block hashes (the key group's, at its block size), its prompt
length and an :class:`InstanceLoad` per instance, and returns a :class:`RouteDecision`. Load
is in tokens: an instance's outstanding prefill is the uncomputed prompt tokens of the requests
routed to it that have not produced their first token (waiting requests count their prompt
minus the hit predicted when they were routed).

A router is built from the cluster's :class:`RouterSetup` by :meth:`Router.from_setup` (the
default takes nothing from it); :func:`~hybridkv.sim.routing.make_router` builds one by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

from hybridkv.core.registry import Registry
from hybridkv.events.index import KVEventIndex

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
    """

    num_instances: int
    block_size: int
    capacity_blocks: int
    index: KVEventIndex | None = None
    group: int = 0
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT


class Router:
    """Picks the instance that serves the next request.

    ``needs_events``: the cluster feeds ``setup.index`` with the instances' KV events.
    ``uses_overlap_weight``: the router reads ``setup.overlap_weight``.
    """

    needs_events: ClassVar[bool] = False
    uses_overlap_weight: ClassVar[bool] = False

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
