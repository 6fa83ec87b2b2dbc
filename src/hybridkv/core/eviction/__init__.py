"""Eviction policies: the order in which the pool reuses cached free blocks.

``lru`` (the default) is the pool's own free queue, bit-identical to vLLM 0.33. The others plug
into the seam of :mod:`hybridkv.core.eviction.base`. :func:`make_policy` is the one place that
maps a name to a policy; :data:`POLICIES` lists the valid names.
"""

from __future__ import annotations

import time
from typing import Callable

from hybridkv.core.eviction.adaptive import AdaptivePolicy
from hybridkv.core.eviction.arc import ChainARCPolicy
from hybridkv.core.eviction.base import EvictionPolicy
from hybridkv.core.eviction.eva import EVAPolicy
from hybridkv.core.eviction.frequency import CostAwarePolicy, LFUPolicy
from hybridkv.core.eviction.priority import PriorityPolicy
from hybridkv.core.eviction.s3fifo import S3FIFOPolicy
from hybridkv.core.eviction.turns import TurnEVAPolicy

#: Valid policy names, ``recommended`` included (it resolves to :data:`RECOMMENDED`).
POLICIES = ("lru", "s3fifo", "lfu", "cost", "eva", "eva-turns", "arc", "adaptive", "adaptive-turns", "priority", "recommended")
#: The policy ``recommended`` resolves to (see BENCHMARKS.md, "Eviction policies", for why).
RECOMMENDED = "adaptive"
#: Depth (tokens of prefix) at which the cost-aware policy values a block's recompute work.
COST_REFERENCE_TOKENS = 16384


def resolve_policy(name: object, vllm_compat: bool = False) -> str:
    """The concrete policy name for ``name`` (``recommended`` resolved): the one check of a
    policy name, for the manager, the engine's config and the command line alike.

    Raises:
        ValueError: ``name`` is unknown (the message lists the valid names), or it is not
            ``lru`` while ``vllm_compat`` pins vLLM's LRU order.
    """
    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"unknown eviction policy {name!r}; valid: {', '.join(POLICIES)}")
    concrete = RECOMMENDED if name == "recommended" else name
    if vllm_compat and concrete != "lru":
        raise ValueError(f"vllm_compat pins vLLM's LRU order; eviction_policy must be 'lru', "
                         f"got {name!r}")
    return concrete


def make_policy(name: str, rules=(), clock: Callable[[], float] = time.monotonic) -> EvictionPolicy | None:
    """The policy object for ``name`` (None for ``lru``: the pool's own list).

    ``rules``: the hit rules of the KV-cache groups, in group order (the cost-aware policy
    weighs groups by their :meth:`recompute_cost`). ``clock``: seconds, for the TTLs of the
    ``priority`` policy."""
    name = resolve_policy(name)
    if name == "lru":
        return None
    if name == "priority":
        return PriorityPolicy(clock)
    if name == "s3fifo":
        return S3FIFOPolicy()
    if name == "lfu":
        return LFUPolicy()
    if name == "eva":
        return EVAPolicy()
    if name == "adaptive-turns":
        return AdaptivePolicy(challengers=(ChainARCPolicy, TurnEVAPolicy))
    if name == "eva-turns":
        return TurnEVAPolicy()
    if name == "arc":
        return ChainARCPolicy()
    if name == "adaptive":
        return AdaptivePolicy()
    weights = [max(1, r.recompute_cost(COST_REFERENCE_TOKENS // r.block_size)) for r in rules]
    return CostAwarePolicy(weights or (1.0,))


__all__ = ["POLICIES", "RECOMMENDED", "EvictionPolicy", "S3FIFOPolicy", "LFUPolicy",
           "CostAwarePolicy", "EVAPolicy", "TurnEVAPolicy", "ChainARCPolicy", "AdaptivePolicy", "PriorityPolicy",
           "make_policy", "resolve_policy"]
