"""The per-type hit rules (``hybridkv.core.rules``): registry, contract, and the seam a new type
plugs into. Oracles are written here from the attention definitions, not from the rules."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv import (MLA, ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager,
                      Request, SlidingWindow)
from hybridkv.core import rules
from hybridkv.core.rules import ChunkedRule, FullRule, HitRule, SlidingRule, make_rule, rule_class
from hybridkv.core.specs import AttentionSpec


def visible(spec, q: int) -> range:
    """Keys a query at position q reads, from the attention definitions."""
    if isinstance(spec, SlidingWindow):
        return range(max(0, q - spec.window + 1), q + 1)
    if isinstance(spec, ChunkedLocal):
        return range(q - q % spec.chunk_size, q + 1)
    return range(0, q + 1)


@st.composite
def specs(draw):
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    kind = draw(st.sampled_from(["full", "mla", "swa", "chunked"]))
    if kind == "full":
        return FullAttention(bs)
    if kind == "mla":
        return MLA(bs)
    if kind == "swa":
        return SlidingWindow(bs, window=draw(st.integers(1, 70)))
    return ChunkedLocal(bs, chunk_size=bs * draw(st.integers(1, 5)))


def test_registry_maps_each_spec_type_to_its_rule_class() -> None:
    assert rule_class(FullAttention(16)) is FullRule
    assert rule_class(MLA(16)) is FullRule
    assert rule_class(SlidingWindow(16, window=64)) is SlidingRule
    assert rule_class(ChunkedLocal(16, chunk_size=64)) is ChunkedRule
    assert [make_rule(s).kind for s in (FullAttention(4), SlidingWindow(4), ChunkedLocal(4))] == \
        ["full", "sliding", "chunked"]
    assert make_rule(SlidingWindow(16, window=64)).window == 64
    assert make_rule(ChunkedLocal(16, chunk_size=64)).chunk == 64
    assert make_rule(FullAttention(16)).window is None and make_rule(MLA(16)).chunk is None


def test_unregistered_spec_type_is_a_clear_error() -> None:
    @dataclass(frozen=True, slots=True)
    class Odd(AttentionSpec):
        pass

    with pytest.raises(ValueError, match="no hit rule is registered for Odd; registered: "
                                         "FullAttention, MLA, SlidingWindow, ChunkedLocal, StateSpec"):
        make_rule(Odd(4))
    with pytest.raises(ValueError, match="no hit rule"):
        KVCacheManager(KVCacheConfig((KVCacheGroup("o", Odd(4), ("l",)),), num_blocks=8))
    with pytest.raises(ValueError, match="AttentionSpec subclass, got <class 'int'>"):
        rules.RULES.register(int, FullRule)
    with pytest.raises(ValueError, match="HitRule subclass, got <class 'object'>"):
        rules.RULES.register(Odd, object)
    with pytest.raises(ValueError, match="hit rule 'FullAttention' is already registered"):
        rules.RULES.register(FullAttention, FullRule)


def test_a_subclass_of_a_registered_spec_inherits_its_rule_unless_it_registers_its_own(
        monkeypatch) -> None:
    """The registry's promise: the nearest registered base class in the MRO decides."""
    @dataclass(frozen=True, slots=True)
    class WideWindow(SlidingWindow):
        pass

    @dataclass(frozen=True, slots=True)
    class WiderWindow(WideWindow):
        pass

    assert rule_class(WideWindow(16, window=64)) is SlidingRule
    rule = make_rule(WiderWindow(16, window=64))
    assert type(rule) is SlidingRule and rule.window == 64
    monkeypatch.setattr(rules.RULES, "_table", dict(rules.RULES._table))
    rules.RULES.register(WideWindow, ChunkedRule)
    assert rule_class(WiderWindow(16, window=64)) is ChunkedRule     # nearest base wins
    assert rule_class(SlidingWindow(16, window=64)) is SlidingRule   # the parent is untouched


@settings(max_examples=300, deadline=None)
@given(specs(), st.integers(0, 40), st.booleans())
def test_read_mask_is_the_keys_the_next_query_reads(spec, e, proof) -> None:
    """lo(e): the first block holding a key that the query at e*bs (the first recomputed
    token) reads; later queries read no earlier key. span adds the proof block."""
    rule = make_rule(spec, proof)
    bs = spec.block_size
    t = e * bs
    assert rule.lo(e) == visible(spec, t)[0] // bs
    assert rule.span(e) == (rule.lo(e), e + int(proof))
    assert all(visible(spec, q)[0] >= visible(spec, t)[0] for q in range(t, t + 3 * bs))
    assert max(0, rule.first_key(t)) == visible(spec, t)[0]


@settings(max_examples=300, deadline=None)
@given(specs(), st.integers(0, 120), st.sampled_from([0, 1, 4, 8]))
def test_window_release_never_drops_a_key_still_read(spec, c, hold) -> None:
    rule = make_rule(spec)
    bs = spec.block_size
    skipped = rule.skipped_tokens(c, hold)
    # no query at or after c reads a skipped token; with hold, the run of every hit end
    # t <= c - hold stays too (its first key is visible(t)[0]); local rules release all else
    assert skipped <= min(visible(spec, q)[0] for q in range(c, c + 200))
    kept_from = visible(spec, max(0, c - hold))[0]
    assert skipped == (0 if rule.downward_closed else kept_from)
    # next_skip_growth: the first c' > c whose skipped block count grows (brute force)
    growth = rule.next_skip_growth(c, hold)
    first = next((x for x in range(c + 1, c + 400)
                  if rule.skipped_tokens(x, hold) // bs > skipped // bs), None)
    if rule.downward_closed:
        assert skipped == 0 and growth == float("inf")
    else:
        assert growth == first


@settings(max_examples=200, deadline=None)
@given(specs(), st.integers(0, 60), st.integers(0, 80))
def test_cost_formulas_match_the_definitions_on_ints_and_arrays(spec, new, ctx) -> None:
    rule = make_rule(spec)
    queries = range(ctx, ctx + new)
    assert rule.attention_keys(new, ctx) == sum(len(visible(spec, q)) for q in queries)
    if new:
        assert rule.kv_span(new, ctx) == len(set().union(*(visible(spec, q) for q in queries)))
    arr_new = np.array([new, 1, 0], dtype=np.float64)
    arr_ctx = np.array([ctx, ctx + 5, 3], dtype=np.float64)
    want = [rule.attention_keys(n, c) for n, c in [(new, ctx), (1, ctx + 5), (0, 3)]]
    assert rule.attention_keys(arr_new, arr_ctx).tolist() == want
    want = [rule.kv_span(n, c) for n, c in [(new, ctx), (1, ctx + 5), (0, 3)]]
    assert rule.kv_span(arr_new, arr_ctx).tolist() == want


def test_recompute_cost_hint() -> None:
    full, swa = make_rule(FullAttention(4)), make_rule(SlidingWindow(4, window=8))
    assert [full.recompute_cost(j) for j in range(3)] == [10, 26, 42]   # Σ (q + 1), q in block j
    assert swa.recompute_cost(5) == swa.recompute_cost(9) == 4 * 8       # a full window per query
    assert full.recompute_cost(9) > swa.recompute_cost(9)


def test_max_blocks_caps_local_groups() -> None:
    assert make_rule(FullAttention(16)).max_blocks(1000) == 63
    assert make_rule(SlidingWindow(16, window=128)).max_blocks(1000) == 8 + 2
    assert make_rule(SlidingWindow(16, window=128)).max_blocks(1000, hold=16) == 9 + 2
    assert make_rule(SlidingWindow(16, window=128)).max_blocks(40) == 3
    assert make_rule(ChunkedLocal(16, chunk_size=64)).max_blocks(1000) == 4 + 2


# ---- the seam for a new type (issue 13's state groups: "a hit at t needs a checkpoint at t") --
@dataclass(frozen=True, slots=True)
class Checkpointed(AttentionSpec):
    """A toy recurrent layer: its block e-1 stands for the state checkpoint at e*bs."""


class CheckpointRule(HitRule):
    kind = "state"
    __slots__ = ()

    def lo(self, e: int) -> int:
        return e - 1 if e > 0 else 0

    def first_key(self, q):
        return q

    def key_pairs(self, x):
        return x


@pytest.fixture
def checkpoint_type(monkeypatch):
    monkeypatch.setattr(rules.RULES, "_table", dict(rules.RULES._table))
    rules.RULES.register(Checkpointed, CheckpointRule)
    return Checkpointed


def test_a_new_type_is_one_rule_class_and_one_registration(checkpoint_type) -> None:
    """With only the rule class and its registration, the manager looks up, caches and frees a
    checkpoint-style group: retention 0 keeps only the checkpoints a replay needs."""
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(4, num_kv_heads=1, head_dim=4), ("a",)),
                         KVCacheGroup("state", checkpoint_type(4, num_kv_heads=1, head_dim=4), ("b",))),
                        num_blocks=64)
    kv = KVCacheManager(cfg, retention_interval=0)
    prompt = list(range(40))
    r = Request("r", prompt)
    assert kv.allocate(r, 40, kv.lookup(r)) is not None
    r.num_computed_tokens = 40
    kv.free(r)
    kv.check_integrity()
    state_cached = sorted(j for j in range(10)
                          if kv.pool.cached_block(1, r.block_hashes[j]) is not None)
    # replay boundary 36 (= 39 aligned down), its #57610 unit below (32), the final length (40)
    assert state_cached == [7, 8, 9]
    again = Request("again", prompt + [7, 7])
    hit = kv.lookup(again)
    assert hit.num_tokens == 40                     # the checkpoint at the final length
    assert hit.block_ids[1] == (0,) * 9 + (kv.pool.cached_block(1, r.block_hashes[9]),)
    other = Request("other", prompt[:30] + [99] * 10)
    assert kv.lookup(other).num_tokens == 0         # no checkpoint at 28 or below: no hit
