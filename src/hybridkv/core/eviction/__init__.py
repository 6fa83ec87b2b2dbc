"""Eviction policies: the order in which the pool reuses cached free blocks.

``lru`` (the default) is the pool's own free queue, bit-identical to vLLM 0.33. Every other
policy is a class registered in :data:`~hybridkv.core.eviction.base.EVICTION_POLICIES` by its
module (the contract and the registration pattern: :mod:`hybridkv.core.eviction.base`); the
lines below import each module once. :func:`resolve_policy` is the one check of a policy name
(the command line, the engine's config and the manager all call it), :func:`make_policy` the
one place that builds a policy from its name.

A new policy: one module here with its class decorated ``@EVICTION_POLICIES.register("name")``,
plus one import line below.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy
# Registration lines, in the order errors list the names (a module's imports register first):
from hybridkv.core.eviction.s3fifo import S3FIFOPolicy  # isort: skip
from hybridkv.core.eviction.frequency import COST_REFERENCE_TOKENS, CostAwarePolicy, LFUPolicy  # isort: skip
from hybridkv.core.eviction.eva import EVAPolicy  # isort: skip
from hybridkv.core.eviction.turns import TurnEVAPolicy  # isort: skip
from hybridkv.core.eviction.arc import ChainARCPolicy  # isort: skip
from hybridkv.core.eviction.adaptive import AdaptivePolicy, TurnAdaptivePolicy  # isort: skip
from hybridkv.core.eviction.priority import PriorityPolicy  # isort: skip
from hybridkv.core.eviction.lru import LRUPolicy  # isort: skip  (not registered: see lru.py)
from hybridkv.core.eviction.hint_layer import HintLayer  # isort: skip  (wraps a policy)
from hybridkv.core.eviction.hit_points import HitPointLayer  # isort: skip  (wraps a policy)

if TYPE_CHECKING:
    from hybridkv.core.rules import HitRule

#: The policy ``recommended`` resolves to (see BENCHMARKS.md, "Eviction policies", for why) ...
RECOMMENDED = "adaptive"
#: ... and on a hybrid config, where it ranks hit points behind the hit-point layer (never below
#: LRU on the four hybrid presets at 1M, 3M and 10M: BENCHMARKS.md, "Eviction policies").
RECOMMENDED_HYBRID = "lfu"


def policy_names() -> tuple[str, ...]:
    """Every valid policy name, in order: ``lru``, the registered policies, ``recommended``."""
    return ("lru", *EVICTION_POLICIES.names(), "recommended")


def __getattr__(name: str) -> tuple[str, ...]:
    """``POLICIES``: the valid policy names now (:func:`policy_names`), so a policy
    registered after this package was imported is listed too."""
    if name == "POLICIES":
        return policy_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_policy(name: object, vllm_compat: bool = False, hybrid: bool = False) -> str:
    """The concrete policy name for ``name`` (``recommended`` resolved: :data:`RECOMMENDED`,
    or :data:`RECOMMENDED_HYBRID` for a ``hybrid`` config, one :func:`key_group` finds a key
    group in): the one check of an eviction-policy name, wherever it comes from.

    Raises:
        ValueError: ``name`` is not a valid policy name (the message names every valid one),
            or ``vllm_compat`` is set and the policy is not ``lru`` (compat mode pins vLLM's
            LRU order).
    """
    if not isinstance(name, str) or (name not in ("lru", "recommended") and name not in EVICTION_POLICIES):
        raise ValueError(f"unknown eviction policy {name!r}; valid: {', '.join(policy_names())}")
    resolved = (RECOMMENDED_HYBRID if hybrid else RECOMMENDED) if name == "recommended" else name
    if vllm_compat and resolved != "lru":
        raise ValueError(f"vllm_compat pins vLLM's LRU order; eviction_policy must be 'lru', "
                         f"got {name!r}")
    return resolved


def make_policy(name: str, rules: Sequence[HitRule] = (), clock: Callable[[], float] = time.monotonic,
                hints: bool | str = False) -> EvictionPolicy | None:
    """The policy object for ``name`` (None for ``lru``: the pool's own list), built through
    :meth:`EvictionPolicy.create`; with ``hints``, that policy (``lru``: the exact-LRU object
    :class:`LRUPolicy`) behind a :class:`HintLayer` (``hints="force"``: one that follows every
    hint untested); on a hybrid config (a group whose rule is
    not downward closed beside one that is), all of it behind a :class:`HitPointLayer` keyed
    on the first downward-closed group (:func:`key_group`).

    ``rules``: the hit rules of the KV-cache groups, in group order (the cost-aware policy
    weighs groups by their :meth:`recompute_cost`). ``clock``: seconds, for the TTLs of the
    ``priority`` policy and of hint pins."""
    rules = tuple(rules)
    key = key_group(rules)
    name = resolve_policy(name, hybrid=key is not None)
    if name == "lru" and not hints:
        return None
    inner = LRUPolicy() if name == "lru" else EVICTION_POLICIES.get(name).create(rules, clock)
    if hints:
        inner = HintLayer(inner, clock, force=hints == "force")
    if key is None:
        return inner
    return HitPointLayer(inner, key, [g for g, r in enumerate(rules) if r.downward_closed and g != key])


def key_group(rules: Sequence[HitRule]) -> int | None:
    """The group whose blocks anchor hit points on a hybrid config: the first one whose rule
    is downward closed (full attention, MLA), or None when every group's rule is (a dense
    config: no companions) or none is (nothing to anchor to)."""
    closed = [g for g, r in enumerate(rules) if r.downward_closed]
    return closed[0] if closed and len(closed) < len(rules) else None


__all__ = ["COST_REFERENCE_TOKENS", "EVICTION_POLICIES", "POLICIES", "RECOMMENDED", "RECOMMENDED_HYBRID",
           "EvictionPolicy",
           "S3FIFOPolicy", "LFUPolicy", "CostAwarePolicy", "EVAPolicy", "TurnEVAPolicy", "ChainARCPolicy",
           "AdaptivePolicy", "TurnAdaptivePolicy", "PriorityPolicy", "LRUPolicy", "HintLayer", "HitPointLayer",
           "key_group", "make_policy", "policy_names",
           "resolve_policy"]
