"""The per-type hit rules (``hybridkv.core.rules``): the registry, the contract of
``rules/base.py`` and the seam a new attention type plugs into.

The rules are pure functions, so these tests call them directly (through
:func:`~hybridkv.core.rules.make_rule`) and compare with oracles written here from the
attention definitions, not from the rules: the keys a query reads, block-by-block probes, the
cost formulas, vLLM's admission caps, and the state rule (a checkpoint at exactly an aligned
end) against a brute force. A toy checkpoint type runs through the manager with only its rule
class and one registration line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import rule

from hybridkv import (MLA, ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager,
                      Request, SlidingWindow)
from hybridkv.core import rules
from hybridkv.core.rules import (ChunkedRule, FullRule, HitRule, MLARule, SlidingRule, StateRule, make_rule,
                                 rule_class)
from hybridkv.core.specs import AttentionSpec, StateSpec
from tests.support.helpers import QWEN3_NEXT
from tests.support.oracle import needed_blocks
from tests.support.random_ops import ATTENTION_SPECS
from hybridkv.core.cache_options import CacheOptions


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
    assert rule_class(MLA(16)) is MLARule and issubclass(MLARule, FullRule)
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


@settings(max_examples=200, deadline=None)
@given(specs(), st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 10**7)), max_size=40))
def test_batch_cost_sums_are_the_sums_of_the_per_request_terms(spec, work) -> None:
    """attention_keys_sum / kv_span_sum / span_sum_max (the cost models' decode batches;
    FullRule's in one C loop when compiled) equal the per-request terms summed (and their
    largest), exactly."""
    rule = make_rule(spec)
    new, ctx = [n for n, _ in work], [c for _, c in work]
    assert rule.attention_keys_sum(new, ctx) == sum(rule.attention_keys(n, c) for n, c in work)
    assert rule.kv_span_sum(new, ctx) == sum(rule.kv_span(n, c) for n, c in work)
    if work:
        spans = [rule.kv_span(n, c) + n for n, c in work]
        assert rule.span_sum_max(new, ctx) == (sum(spans), max(spans))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_full_rule_cost_terms_are_the_base_formulas(new, ctx) -> None:
    """FullRule's own attention_keys and kv_span (the cost models call them per request per
    step) give what the base class's formulas give, on ints and on float arrays."""
    rule = make_rule(FullAttention(16))
    assert rule.attention_keys(new, ctx) == HitRule.attention_keys(rule, new, ctx)
    assert rule.kv_span(new, ctx) == HitRule.kv_span(rule, new, ctx)
    arr_new = np.array([new, 1, 0], dtype=np.float64)
    arr_ctx = np.array([ctx, ctx, 7], dtype=np.float64)
    assert rule.attention_keys(arr_new, arr_ctx).tolist() == HitRule.attention_keys(rule, arr_new, arr_ctx).tolist()
    assert rule.kv_span(arr_new, arr_ctx).tolist() == HitRule.kv_span(rule, arr_new, arr_ctx).tolist()


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
    kv = KVCacheManager(cfg, CacheOptions(retention_interval=0))
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


def state(bs: int = 4) -> StateSpec:
    return StateSpec(block_size=bs, conv_shape=(3, 8), state_shape=(2, 4, 4))


def test_repr_names_the_rule_class_and_the_proof_flag() -> None:
    """base: HitRule.__repr__ — ``type(None).__name__`` ("NoneType") and ``bool(None)`` (proof
    always False) instead of the rule's class and its proof flag."""
    spec = FullAttention(4)
    assert repr(make_rule(spec)) == f"FullRule({spec!r}, proof=False)"
    assert repr(make_rule(SlidingWindow(4, window=8), proof=True)).startswith("SlidingRule(")
    assert repr(make_rule(SlidingWindow(4, window=8), proof=True)).endswith(", proof=True)")


def test_state_rule_hit_at_zero_needs_no_block() -> None:
    """state: StateRule.lo — ``e - 1 if e >= 0`` / ``if True`` (lo(0) = -1, a negative block
    index) or ``else 1`` (lo(0) = 1 > lo(1), not non-decreasing). Contract: lo(e) is a block
    index, non-decreasing in e, and a hit at e needs the checkpoint ``e - 1`` (e >= 1)."""
    rule = make_rule(state())
    assert [rule.lo(e) for e in range(5)] == [0, 0, 1, 2, 3]
    assert rule.span(0) == (0, 0)                     # an empty hit needs nothing


def test_state_rule_skips_nothing_before_any_token() -> None:
    """state: StateRule.skipped_tokens — ``max(1, c - hold)``: with nothing computed (or all of
    it held back) no token is skipped, and with block size 1 that one token is a block."""
    for bs in (1, 4):
        rule = make_rule(state(bs))
        assert rule.skipped_tokens(0) == 0
        assert rule.skipped_tokens(3, hold=5) == 0
        assert rule.skipped_tokens(7, hold=2) == 5
        assert rule.skipped_tokens(7) == 7


def test_state_rule_defaults_hold_nothing() -> None:
    """state: StateRule.next_skip_growth / max_blocks — the default ``hold`` 0 became 1.

    next_skip_growth(c) with bs 4: the next c whose ``c // 4`` grows: 4 after 0..3, 8 after 4.
    max_blocks(length): the live state + min(cdiv(length, 4), cdiv(hold, 4) + 2) entries; with
    hold 0: 1 + min(cdiv(length, 4), 2)."""
    rule = make_rule(state(4))
    assert [rule.next_skip_growth(c) for c in (0, 3, 4)] == [4, 4, 8]
    assert rule.max_blocks(100) == 3
    assert rule.max_blocks(1) == 2


def test_max_blocks_are_whole_blocks() -> None:
    """state/sliding/chunked: max_blocks — ``/`` for ``//`` in a ceiling division (a float
    count: 1.25 blocks), chunked ``C - hold`` for ``C + hold``. Contract: a local rule holds at
    most cdiv(reach + hold, bs) + 2 blocks, a state rule 1 + min(cdiv(length, bs), cdiv(hold,
    bs) + 2) entries, and never more than cdiv(length, bs) (+ 1 for a state group's live one)."""
    st = make_rule(state(4))
    assert st.max_blocks(5, hold=100) == 1 + 2          # cdiv(5, 4) = 2 entries
    assert st.max_blocks(1000, hold=5) == 1 + 4         # cdiv(5, 4) + 2 = 4 entries
    ch = make_rule(ChunkedLocal(4, chunk_size=64))
    assert ch.max_blocks(5) == 2                       # cdiv(5, 4), below the chunk's reach
    assert ch.max_blocks(1000, hold=1) == 17 + 2       # cdiv(64 + 1, 4) + 2
    ch8 = make_rule(ChunkedLocal(4, chunk_size=8))
    assert ch8.max_blocks(1000, hold=1) == 3 + 2       # cdiv(8 + 1, 4) + 2
    sw = make_rule(SlidingWindow(4, window=8))
    assert sw.max_blocks(1000, hold=1) == 3 + 2        # cdiv(8 + 1, 4) + 2
    for rule in (st, ch, ch8, sw):
        for length in range(1, 40):
            for hold in range(0, 9):
                assert isinstance(rule.max_blocks(length, hold), int)


def test_state_rule_admission_cap_is_two_entries() -> None:
    """state: StateRule.admission_cap — 3 instead of 2. A state group admits the live state and
    the checkpoint being written (vLLM's Mamba align mode: 2 pages without speculative or
    prefill-checkpoint blocks), whatever the request's length."""
    rule = make_rule(state(4))
    assert rule.admission_cap(None, math.inf) == 2
    assert rule.admission_cap(64, 4096) == 2


@pytest.mark.parametrize("spec", [FullAttention(4), MLA(4), SlidingWindow(4, window=6),
                                  ChunkedLocal(4, chunk_size=8)], ids=["full", "mla", "swa", "chunked"])
def test_key_pairs_are_exact_integers(spec) -> None:
    """full/sliding/chunked: key_pairs — ``/ 2`` for ``// 2`` (a float: inexact past 2**53).
    Contract: Σ_{q<x} (q + 1 - max(0, first_key(q))), ints exact. Checked against the sum for
    small x, and at x = 2**31 + 1 where x(x+1)/2 needs 62 bits."""
    rule = make_rule(spec)
    for x in range(0, 40):
        want = sum(q + 1 - max(0, rule.first_key(q)) for q in range(x))
        got = rule.key_pairs(x)
        assert type(got) is int and got == want
    x = 2**31 + 1
    got = rule.key_pairs(x)
    assert type(got) is int
    if isinstance(spec, (FullAttention, MLA)):
        assert got == x * (x + 1) // 2
    elif isinstance(spec, SlidingWindow):
        assert got == 6 * 7 // 2 + (x - 6) * 6        # min(q + 1, W) summed
    else:
        n, r = divmod(x, 8)
        assert got == n * 36 + r * (r + 1) // 2        # Σ (q mod C + 1)


def test_local_admission_caps_follow_vllm() -> None:
    """chunked: ChunkedRule.admission_cap — the in-flight branch dropped, ``C - in_flight``, a
    sign or ``/`` slip in the ceiling division. vLLM 0.33 (``max_admission_blocks_per_request``,
    kv_cache_interface.py): chunked local caps a request at ``cdiv(min(C + in_flight, max_len),
    bs)`` blocks; sliding at ``cdiv(min(W - 1 + in_flight, max_len), bs) + 1``; None when
    nothing bounds it."""
    ch = make_rule(ChunkedLocal(4, chunk_size=8))
    assert ch.admission_cap(3, 1000) == 3              # cdiv(11, 4)
    assert ch.admission_cap(5, 1000) == 4              # cdiv(13, 4)
    assert ch.admission_cap(100, 50) == 13             # cdiv(50, 4): max_len caps it
    assert ch.admission_cap(None, 100) == 25           # only max_len
    assert ch.admission_cap(None, math.inf) is None
    sw = make_rule(SlidingWindow(4, window=8))
    assert sw.admission_cap(3, 1000) == 3 + 1          # cdiv(10, 4) + 1
    assert sw.admission_cap(100, 50) == 13 + 1
    assert sw.admission_cap(None, math.inf) is None
    for f in range(0, 20):
        assert ch.admission_cap(f, 1000) == -(-(8 + f) // 4)
        assert sw.admission_cap(f, 1000) == -(-(8 - 1 + f) // 4) + 1
        assert type(ch.admission_cap(f, 1000)) is int and type(sw.admission_cap(f, 1000)) is int


@pytest.mark.parametrize("cls, spec", [(FullRule, FullAttention(4)), (SlidingRule, SlidingWindow(4, window=8)),
                                       (ChunkedRule, ChunkedLocal(4, chunk_size=8)), (StateRule, state(4))],
                         ids=["full", "swa", "chunked", "state"])
def test_rule_defaults_no_proof_and_no_hold(cls, spec) -> None:
    """chunked (and every rule): ``__init__``'s default ``proof`` became True; ``skipped_tokens``
    / ``next_skip_growth``'s default ``hold`` became 1. Built without ``proof`` a rule needs no
    block after a hit (span(e) ends at e), and without ``hold`` it holds nothing back."""
    rule = cls(spec)
    assert rule.proof == 0 and rule.span(4) == (rule.lo(4), 4)
    for c in range(0, 30):
        assert rule.skipped_tokens(c) == rule.skipped_tokens(c, 0)
        assert rule.next_skip_growth(c) == rule.next_skip_growth(c, 0)
        assert rule.max_blocks(c + 1) == rule.max_blocks(c + 1, 0)
    ch = make_rule(ChunkedLocal(4, chunk_size=8))
    assert [ch.skipped_tokens(c) for c in (7, 8, 15, 16)] == [0, 8, 8, 16]
    assert [ch.next_skip_growth(c) for c in (0, 7, 8)] == [8, 8, 16]


class StrictProbe:
    """A probe that is not a list (the rules' scan path for any callable): answers from
    ``cached``, and fails on an index outside ``[0, n)`` or probed twice (the contract: each
    block is probed at most once)."""

    def __init__(self, cached: list[bool]) -> None:
        self.cached = cached
        self.seen: set[int] = set()

    def __call__(self, i: int) -> bool:
        assert 0 <= i < len(self.cached), f"probed block {i} outside [0, {len(self.cached)})"
        assert i not in self.seen, f"block {i} probed twice"
        self.seen.add(i)
        return self.cached[i]


@pytest.mark.parametrize("spec", [FullAttention(4), SlidingWindow(4, window=9),
                                  ChunkedLocal(4, chunk_size=8)], ids=["full", "swa", "chunked"])
@pytest.mark.parametrize("proof", [False, True])
def test_longest_hit_with_any_probe(spec, proof) -> None:
    """full: FullRule.longest_hit — the left-to-right scan's ``j += 1`` became ``j = 1`` / ``j -=
    1`` (an endless loop or a probe below 0), and ``e if e > 0 else 0`` lost its guard (a
    negative hit when block 0 misses with a proof block); base: probe_flags took the object
    behind any bound method (not only a list's) for the flag list. Every 7-block cached pattern,
    probed through a callable (not a list); the answer is the largest e <= e_max, a multiple
    of step, whose run ``[lo(e), e + proof)`` is cached (the contract, brute force)."""
    rule = make_rule(spec, proof=proof)
    n = 7
    for bits in range(1 << n):
        cached = [bool(bits >> i & 1) for i in range(n)]
        for step in (1, 2):
            e_max = n - rule.proof
            want = max((e for e in range(step, e_max + 1, step)
                        if all(cached[rule.lo(e):e + rule.proof])), default=0)
            assert rule.longest_hit(StrictProbe(cached), e_max, step) == want
            assert rule.longest_hit(StrictProbe(cached).__call__, e_max, step) == want
            assert rule.longest_hit(cached.__getitem__, e_max, step) == want


@settings(max_examples=400, deadline=None)
@given(ATTENTION_SPECS, st.booleans(), st.lists(st.booleans(), min_size=0, max_size=60),
       st.integers(1, 4), st.data())
def test_list_probe_scan_matches_block_by_block(spec, proof, flags, step, data) -> None:
    rule = make_rule(spec, proof)
    e_max = data.draw(st.integers(0, max(len(flags) - rule.proof, 0)))
    calls = []

    def probe(j: int) -> bool:
        calls.append(j)
        return flags[j]

    assert rule.longest_hit(flags.__getitem__, e_max, step) == rule.longest_hit(probe, e_max, step)


def test_state_spec_is_registered_to_the_state_rule() -> None:
    rule = make_rule(QWEN3_NEXT)
    assert isinstance(rule, StateRule) and rule.kind == "state" and not rule.downward_closed
    assert [rule.lo(e) for e in (1, 2, 9)] == [0, 1, 8]
    assert rule.window is None and rule.chunk is None


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.sets(st.integers(0, 40)), st.integers(0, 41),
       st.sampled_from([1, 2, 3, 4]))
def test_longest_hit_is_the_largest_checkpoint_at_an_aligned_end(bs, checkpoints, e_max, step):
    """Brute force from the definition: the largest e <= e_max, a multiple of step, with a
    checkpoint at exactly e * bs tokens (= block e - 1), each block probed at most once."""
    spec = StateSpec(bs, conv_shape=(1, 4), state_shape=(2, 2))
    rule = make_rule(spec)
    probed: list[int] = []

    def probe(j: int) -> bool:
        probed.append(j)
        return j in checkpoints

    want = max((e for e in range(step, e_max + 1, step) if e - 1 in checkpoints), default=0)
    assert rule.longest_hit(probe, e_max, step) == want
    assert len(probed) == len(set(probed))
    # the independent oracle's statement of the rule agrees (one block: t / a - 1)
    cfg = KVCacheConfig((KVCacheGroup("s", spec, ("l",)),), num_blocks=64)
    for e in range(1, 6):
        assert list(needed_blocks(cfg, 0, e * bs, False)) == [e - 1] == list(range(*rule.span(e)))


def test_release_and_sizing() -> None:
    rule = make_rule(StateSpec(16))
    assert rule.skipped_tokens(100) == 100 and rule.skipped_tokens(100, hold=16) == 84
    # brute force: the first c' > c whose skipped block count grows
    for c in range(0, 80):
        for hold in (0, 16, 32):
            first = next(x for x in range(c + 1, c + 200)
                         if rule.skipped_tokens(x, hold) // 16 > rule.skipped_tokens(c, hold) // 16)
            assert rule.next_skip_growth(c, hold) == first
    assert rule.max_blocks(1000, hold=16) == 1 + 3     # live + (hold window + 2) checkpoints
    assert rule.recompute_cost(5) == 16                # the tokens since the previous checkpoint
    assert rule.attention_keys(10, 500) == 10          # one state update per token
