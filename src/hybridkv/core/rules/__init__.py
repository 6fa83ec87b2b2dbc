"""One hit rule per attention type, and the registry that maps a spec type to its rule.

=====================  ==============  ==========================================
spec                   rule            a hit ending at block boundary e needs
=====================  ==============  ==========================================
FullAttention, MLA     ``FullRule``    ``[0, e)``
SlidingWindow          ``SlidingRule`` ``[e - cdiv(W - 1, bs), e)``
ChunkedLocal           ``ChunkedRule`` ``[chunk_start(e), e)``
StateSpec              ``StateRule``   ``[e - 1, e)``: the checkpoint at exactly e
=====================  ==============  ==========================================

The contract is :class:`HitRule` (``base.py``). Lookup, caching, window release, pool
sizing, the cost model, the engine's attention metadata and the connector all ask a rule
made by :func:`make_rule`; none of them switches on a spec's type. A new attention type is
one module here plus one :func:`register` line below.
"""

from __future__ import annotations

from hybridkv.core.rules.base import HitRule
from hybridkv.core.rules.chunked import ChunkedRule
from hybridkv.core.rules.full import FullRule
from hybridkv.core.rules.sliding import SlidingRule
from hybridkv.core.rules.state import StateRule
from hybridkv.core.specs import MLA, AttentionSpec, ChunkedLocal, FullAttention, SlidingWindow, StateSpec

_REGISTRY: dict[type, type[HitRule]] = {}


def register(spec_type: type, rule_type: type[HitRule]) -> None:
    """Make ``rule_type`` the rule of ``spec_type`` (and of its subclasses without their own)."""
    if not (isinstance(spec_type, type) and issubclass(spec_type, AttentionSpec)):
        raise ValueError(f"register needs an AttentionSpec subclass, got {spec_type!r}")
    if not (isinstance(rule_type, type) and issubclass(rule_type, HitRule)):
        raise ValueError(f"register needs a HitRule subclass, got {rule_type!r}")
    _REGISTRY[spec_type] = rule_type


def rule_class(spec: AttentionSpec) -> type[HitRule]:
    """The rule class registered for ``spec``'s type (nearest registered base class)."""
    for cls in type(spec).__mro__:
        rule = _REGISTRY.get(cls)
        if rule is not None:
            return rule
    known = ", ".join(sorted(t.__name__ for t in _REGISTRY))
    raise ValueError(f"no hit rule is registered for {type(spec).__name__}; registered spec types: {known}")


def make_rule(spec: AttentionSpec, proof: bool = False) -> HitRule:
    """The hit rule of a group with this spec (``proof``: a draft group in EAGLE drop mode)."""
    return rule_class(spec)(spec, proof)


register(FullAttention, FullRule)
register(MLA, FullRule)
register(SlidingWindow, SlidingRule)
register(ChunkedLocal, ChunkedRule)
register(StateSpec, StateRule)

__all__ = ["ChunkedRule", "FullRule", "HitRule", "SlidingRule", "StateRule", "make_rule", "register", "rule_class"]
