"""One hit rule per attention type, and the registry that maps a spec type to its rule.

=====================  ==============  ==========================================
spec                   rule            a hit ending at block boundary e needs
=====================  ==============  ==========================================
FullAttention          ``FullRule``    ``[0, e)``
MLA, SparseMLA         ``MLARule``     ``[0, e)`` (full attention's rule, its own facts)
SlidingWindow,         ``SlidingRule`` ``[e - cdiv(W - 1, bs), e)``
CompressorState
ChunkedLocal           ``ChunkedRule`` ``[chunk_start(e), e)``
StateSpec              ``StateRule``   ``[e - 1, e)``: the checkpoint at exactly e
=====================  ==============  ==========================================

The contract is :class:`HitRule` (``base.py``). Lookup, caching, window release, pool
sizing, the cost model, the engine's attention metadata and the connector all ask a rule
made by :func:`make_rule`; none of them switches on a spec's type. A new attention type is
one module here (its rule class decorated with ``@RULES.register(ItsSpec)``) plus one import
line below; a subclass of a registered spec inherits its parent's rule.
"""

from __future__ import annotations

from typing import cast

from hybridkv.core.rules.base import RULES, HitRule
# Registration lines, in the order errors list the registered types:
from hybridkv.core.rules.full import FullRule, MLARule  # isort: skip
from hybridkv.core.rules.sliding import SlidingRule  # isort: skip
from hybridkv.core.rules.chunked import ChunkedRule  # isort: skip
from hybridkv.core.rules.state import StateRule  # isort: skip
from hybridkv.core.specs import AttentionSpec


def rule_class(spec: AttentionSpec) -> type[HitRule]:
    """The rule class registered for ``spec``'s type (nearest registered base class)."""
    return RULES.get(type(spec))


def attention_types() -> dict[type[AttentionSpec], type[HitRule]]:
    """Every registered spec type and its rule class (which carries the type's facts), in
    registration order."""
    return {cast("type[AttentionSpec]", spec): rule for spec, rule in RULES.items()}


def make_rule(spec: AttentionSpec, proof: bool = False) -> HitRule:
    """The hit rule of a group with this spec (``proof``: a draft group in EAGLE drop mode)."""
    return rule_class(spec)(spec, proof)


__all__ = ["RULES", "ChunkedRule", "FullRule", "HitRule", "MLARule", "SlidingRule", "StateRule",
           "attention_types", "make_rule", "rule_class"]
