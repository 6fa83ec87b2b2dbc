"""Each registered attention type states its facts where it is registered, and every consumer
reads them there (no consumer switches on a spec's class):

* every registered type has every fact, each valid (:mod:`tests.support.registry_checks`);
  a type missing one is named;
* the built-in types' facts, exactly (vLLM 0.33's ``KVCacheSpecKind`` values on the wire);
* a new type registered on a private copy of the registry is timed, sent and trimmed by its
  facts alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from hybridkv.core import rules
from hybridkv.core.rules import RULES, HitRule, attention_types, rule_class
from hybridkv.core.specs import (MLA, AttentionSpec, ChunkedLocal, FullAttention, SlidingWindow,
                                 StateSpec, is_state)
from tests.support.registry_checks import attention_type_problems


def test_every_registered_type_states_every_fact() -> None:
    assert attention_type_problems() == []


def test_the_built_in_types_facts() -> None:
    got = {spec.__name__: (rule.kind, rule.cost_kind, rule.wire_kind, rule.windowed_wire_kind,
                           spec.storage)
           for spec, rule in attention_types().items()}
    builtin = {
        "FullAttention": ("full", "full", "full_attention", "", "kv"),
        "MLA": ("mla", "mla", "mla_attention", "sliding_window_mla", "latent"),
        "SlidingWindow": ("sliding", "sliding", "sliding_window", "", "kv"),
        "ChunkedLocal": ("chunked", "chunked", "chunked_local_attention", "", "kv"),
        "StateSpec": ("state", "state", "mamba", "", "state"),
    }
    assert {k: got[k] for k in builtin} == builtin
    assert list(got)[:5] == list(builtin)                 # registration order: errors list them so
    assert [MLA(16).kv_parts, FullAttention(16).kv_parts, StateSpec(16).kv_parts] == [1, 2, 1]
    assert [is_state(s) for s in (StateSpec(16), MLA(16), ChunkedLocal(16, chunk_size=32))] == \
        [True, False, False]


def _private_registry(monkeypatch) -> None:
    monkeypatch.setattr(RULES, "_table", dict(RULES._table))


def test_a_type_missing_a_fact_is_named(monkeypatch) -> None:
    _private_registry(monkeypatch)

    @dataclass(frozen=True, slots=True)
    class Bare(AttentionSpec):
        storage = "bytes"

    @RULES.register(Bare)
    class BareRule(HitRule):
        kind = "full"                                     # FullRule's name already
        wire_kind = "paged"
        __slots__ = ()

    assert attention_type_problems() == [
        "Bare (BareRule): kind 'full' is also FullRule's",
        "Bare (BareRule): cost_kind '' not in ('full', 'sliding', 'chunked', 'mla', 'state')",
        "Bare (BareRule): wire_kind 'paged' is not a vLLM spec kind",
        "Bare (BareRule): storage 'bytes' not in ('kv', 'latent', 'state')",
    ]


def test_consumers_read_a_new_types_facts(monkeypatch) -> None:
    """A local type with K/V storage, timed as sliding window, sent as vLLM's chunked kind:
    the step-time model, the event wire and the trimmer follow its facts; its parent's
    facts stay its parent's."""
    from hybridkv.events.wire import spec_kind
    from hybridkv.cost.calibrated import attention_kind
    from hybridkv.cost.presets import get_preset
    from hybridkv.cost.shapes import Trim, trimmed_preset
    _private_registry(monkeypatch)

    @dataclass(frozen=True, slots=True)
    class Strided(FullAttention):
        stride: int = 2

    @RULES.register(Strided)
    class StridedRule(rules.FullRule):
        kind = "strided"
        cost_kind = "sliding"
        wire_kind = "chunked_local_attention"
        __slots__ = ()

    spec = Strided(16, num_kv_heads=8, head_dim=128)
    assert rule_class(spec) is StridedRule and attention_type_problems() == []
    assert attention_kind(spec) == "sliding" and attention_kind(FullAttention(16)) == "full"
    assert spec_kind(spec) == ("chunked_local_attention", None)
    assert spec_kind(FullAttention(16)) == ("full_attention", None)
    base = get_preset("llama-3.1-8b")
    preset = dataclasses.replace(base, groups=tuple(dataclasses.replace(g, spec=Strided(16, 8, 128))
                                                    for g in base.groups))
    small = trimmed_preset(preset, Trim(layers_per_group=2, width_divisor=4))
    assert [type(g.spec).__name__ for g in small.groups] == ["Strided"]
    assert (small.groups[0].spec.num_kv_heads, small.groups[0].spec.head_dim) == (2, 64)


def test_a_cost_kind_the_model_lacks_is_refused_naming_it(monkeypatch) -> None:
    from hybridkv.cost.calibrated import attention_kind
    _private_registry(monkeypatch)

    @dataclass(frozen=True, slots=True)
    class Odd(FullAttention):
        pass

    @RULES.register(Odd)
    class OddRule(rules.FullRule):
        kind = "odd"
        cost_kind = "sparse"
        __slots__ = ()

    with pytest.raises(ValueError, match=r"^Odd's rule has cost_kind 'sparse'; valid: full, sliding, "
                                         r"chunked, mla, state$"):
        attention_kind(Odd(16))


def test_windows_reach_the_wire_with_their_kind() -> None:
    from hybridkv.events.wire import spec_kind
    assert spec_kind(SlidingWindow(16, window=128)) == ("sliding_window", 128)
    assert spec_kind(ChunkedLocal(16, chunk_size=64)) == ("chunked_local_attention", None)
    assert spec_kind(StateSpec(16)) == ("mamba", None)
    assert spec_kind(MLA(16)) == ("mla_attention", None)
