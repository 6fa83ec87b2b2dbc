"""Routers that ignore the cache: ``round-robin`` (instances in turn) and ``least-loaded``
(the fewest outstanding prefill tokens, then the fewest requests)."""

from __future__ import annotations

from typing import Sequence

from hybridkv.sim.cluster.routing.base import ROUTERS, InstanceLoad, RouteDecision, Router, least


@ROUTERS.register("round-robin")
class RoundRobinRouter(Router):
    def __init__(self) -> None:
        self._next = 0

    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        i = self._next % len(loads)
        self._next += 1
        return RouteDecision(i, 0)


@ROUTERS.register("least-loaded")
class LeastLoadedRouter(Router):
    def route(self, hashes: Sequence[bytes], prompt_len: int,
              loads: Sequence[InstanceLoad]) -> RouteDecision:
        return RouteDecision(least([(ld.outstanding_tokens, ld.requests, ld.index) for ld in loads]), 0)
