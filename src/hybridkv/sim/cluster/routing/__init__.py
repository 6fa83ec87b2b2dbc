"""Routers of a simulated cluster: which instance serves the next request.

=================  ==============================================================
name               picks
=================  ==============================================================
``round-robin``    instances in turn
``least-loaded``   the fewest outstanding prefill tokens (then the fewest requests)
``kv-aware``       the least ``queued + overlap_weight * uncached``, the held prefix
                   read from the instances' KV events, within the load-skew bound
                   (``max_skew``: :func:`~hybridkv.sim.cluster.routing.base.within_skew`)
``approximate``    the same score over prefixes predicted from its own routing history
``tier-aware``     the ``kv-aware`` score over the prefix an instance's GPU *or* its
                   KV tiers hold (``--cpu-cache-tokens`` with ``--instances``)
=================  ==============================================================

The contract is :class:`Router` (``base.py``: what a router sees and answers, and the
:data:`ROUTERS` registry). A new router is one module here (its class decorated with
``@ROUTERS.register("name")``) plus one import line below; ``simulate --router`` and
:class:`~hybridkv.sim.cluster.loop.ClusterSimulator` then know its name.
"""

from __future__ import annotations

from hybridkv.sim.cluster.routing.base import (DEFAULT_MAX_SKEW, DEFAULT_OVERLAP_WEIGHT, ROUTERS,
                                       InstanceLoad, RouteDecision, Router, RouterSetup,
                                       RouterTuning,
                                       check_max_skew, within_skew)
# Registration lines, in the order --router lists the routers:
from hybridkv.sim.cluster.routing.simple import LeastLoadedRouter, RoundRobinRouter  # isort: skip
from hybridkv.sim.cluster.routing.kv_aware import ApproximateRouter, KVAwareRouter  # isort: skip
from hybridkv.sim.cluster.routing.tier_aware import TierAwareRouter  # isort: skip


def make_router(name: str, setup: RouterSetup) -> Router:
    """The router registered as ``name``, built for ``setup``; ValueError naming the valid
    routers otherwise."""
    return ROUTERS.get(name).from_setup(setup)


__all__ = ["DEFAULT_MAX_SKEW", "DEFAULT_OVERLAP_WEIGHT", "ROUTERS", "ApproximateRouter", "InstanceLoad", "KVAwareRouter",
           "LeastLoadedRouter", "RoundRobinRouter", "RouteDecision", "Router", "RouterSetup",
           "RouterTuning", "TierAwareRouter", "check_max_skew", "make_router", "within_skew"]
