"""Tests that kill the mutants mutmut found surviving in ``src/hybridkv/core/rules`` (TESTING.md,
"Mutation testing").

The rules are pure functions with a documented contract (``rules/base.py``), so these tests call
them directly through :func:`~hybridkv.core.rules.make_rule`. Each expectation is computed by
hand from the contract (named in the test), not from the implementation.
"""

from __future__ import annotations

import math

import pytest

from hybridkv import ChunkedLocal, FullAttention, SlidingWindow
from hybridkv.core.rules import ChunkedRule, FullRule, SlidingRule, StateRule, make_rule
from hybridkv.core.specs import MLA, StateSpec


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
    """chunked: ChunkedRule.admission_cap — the in-flight branch dropped, ``C - in_flight``,
    a sign or ``/`` slip in the ceiling division (no test used a chunked group in compat
    admission). vLLM 0.33 (``max_admission_blocks_per_request``, kv_cache_interface.py):
    chunked local caps a request at ``cdiv(min(C + in_flight, max_len), bs)`` blocks; sliding at
    ``cdiv(min(W - 1 + in_flight, max_len), bs) + 1``; None when nothing bounds it."""
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
