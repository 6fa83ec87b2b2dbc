"""The retention rule (``hybridkv.core.retention``): which aligned ends a request promises to
cache, as pure functions with hand-derived expectations.

* ``validate_retention_interval``: each refusal with its reason; the valid intervals;
* ``replay_boundaries`` (the resend ``(P - 1) // A * A``; EAGLE drop mode's pair) and the
  promised ends of dense, 0 and N retention;
* compat mode's write mask (vLLM's ``reachable_block_mask``, written here from its
  definition) against ``next_masked_run`` / ``next_masked_block``.
What the manager then caches at those ends: ``test_write_path.py``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from hybridkv import KVCacheManager
from hybridkv.core.retention import Retention, replay_boundaries
from hybridkv.core.rules import make_rule
from tests.support.helpers import FA, QWEN3_NEXT, SWA, config, state_hybrid
from tests.support.random_ops import ATTENTION_SPECS
from hybridkv.core.cache_options import CacheOptions


@pytest.mark.parametrize("interval, specs, message", [
    ("8", (SWA(4, 8),), "retention_interval must be None or an integer, got '8'"),
    (True, (SWA(4, 8),), "retention_interval must be None or an integer, got True"),
    (-4, (SWA(4, 8),), "retention_interval must be non-negative and a multiple of the scheduler "
                       "block size (4), got -4"),
    (8, (FA(4),), "retention_interval=8 needs a sliding-window or chunked-local KV-cache group, "
                  "and this config has none; set it to 0 or None"),
    (1, (FA(1),), "retention_interval=1 needs a sliding-window or chunked-local KV-cache group, "
                  "and this config has none; set it to 0 or None"),
    (6, (FA(4), SWA(4, 8)), "retention_interval must be non-negative and a multiple of the "
                            "scheduler block size (4, the LCM of the group block sizes), got 6"),
])
def test_bad_retention_interval_is_refused_with_its_reason(interval, specs, message) -> None:
    """retention: validate_retention_interval — each check and its message."""
    with pytest.raises(ValueError) as exc:
        KVCacheManager(config(*specs, num_blocks=16), CacheOptions(retention_interval=interval))
    assert str(exc.value) == message


@pytest.mark.parametrize("interval, specs", [(None, (FA(4),)), (0, (FA(4),)), (0, (SWA(4, 8),)),
                                             (8, (FA(4), SWA(4, 8))), (4, (SWA(4, 8),))])
def test_valid_retention_intervals_are_accepted(interval, specs) -> None:
    """retention: validate_retention_interval — a valid interval is not refused (0 without a
    local group; N a multiple of the alignment with one)."""
    kv = KVCacheManager(config(*specs, num_blocks=16), CacheOptions(retention_interval=interval))
    assert kv.retention_interval == interval


def test_replay_boundaries_by_hand() -> None:
    """retention: replay_boundaries — the resend ``(P - 1) // A * A``; drop mode's pair
    ``{resend - A, extension - A}`` (extension = ``P // A * A``); one unit below each; 0
    dropped. A = 4."""
    assert replay_boundaries(9, 4, False, False) == (8,)
    assert replay_boundaries(9, 4, False, True) == (4, 8)
    assert replay_boundaries(4, 4, False, True) == ()            # resend 0: nothing
    assert replay_boundaries(5, 4, False, True) == (4,)          # 4 - 4 = 0 is dropped
    assert replay_boundaries(13, 4, True, False) == (8,)         # resend 12, extension 12
    assert replay_boundaries(12, 4, True, False) == (4, 8)       # resend 8, extension 12
    assert replay_boundaries(13, 4, True, True) == (4, 8)
    assert replay_boundaries(12, 4, True, True) == (4, 8)        # 0 dropped
    assert replay_boundaries(4, 4, True, False) == ()            # resend 0, extension 4: both 0
    assert replay_boundaries(17, 8, False, True) == (8, 16)


def test_promised_ends_by_hand() -> None:
    """retention: Retention.ends_between / next_end — dense (every multiple of A), 0 (only the
    request's own boundaries) and N (every multiple of N plus them); ``after < t <= upto``."""
    dense, sparse, every8 = Retention(None, 4), Retention(0, 4), Retention(8, 4)
    assert dense.dense and not sparse.dense and not every8.dense
    assert dense.ends_between(0, 20, (6,)) == [4, 6, 8, 12, 16, 20]
    assert dense.ends_between(4, 12, (4, 13)) == [8, 12]
    assert sparse.ends_between(0, 20, (6, 21, 0)) == [6]
    assert sparse.ends_between(6, 20, (6, 20)) == [20]
    assert every8.ends_between(0, 24, (12, 24)) == [8, 12, 16, 24]
    assert every8.ends_between(8, 15, ()) == []
    assert dense.next_end(5, ()) == 8 and dense.next_end(8, ()) == 12
    assert dense.next_end(5, (6,)) == 6
    assert sparse.next_end(5, ()) == math.inf
    assert sparse.next_end(5, (7, 3, 9)) == 7
    assert sparse.next_end(7, (7, 9)) == 9          # an end at `after` is not after it
    assert every8.next_end(8, (20,)) == 16 and every8.next_end(16, (20,)) == 20


def masked_blocks(rule, interval: int | None, ends: tuple[int, ...], limit: int) -> set[int]:
    """vLLM's write mask from its definition: the union of ``span(e)`` over every multiple
    of the interval (in the rule's blocks, k >= 1) and every boundary end."""
    out: set[int] = set()
    all_ends = set(ends)
    if interval:
        per = interval // rule.block_size
        all_ends |= set(range(per, limit + 1, per))
    for e in all_ends:
        lo, hi = rule.span(e)
        out |= set(range(lo, hi))
    return out


@pytest.mark.parametrize("interval", [0, 8, 16])
@pytest.mark.parametrize("proof", [False, True])
def test_masked_runs_cover_the_write_mask(interval, proof) -> None:
    """retention: Retention.next_masked_run / next_masked_block — the interval's first end
    (``k`` off by two, ``k / per``), the start clamp ``max(lo, j)`` dropped, a span ending at
    ``j`` taken as covering it, the stop of an empty answer (0) and which ``stop`` wins for
    equal starts. Brute force over j: the first masked block >= j, and ``[i, stop)`` all
    masked (W = 9, bs 4: a hit at e needs blocks ``[e - 2, e + proof)``)."""
    from hybridkv.core.rules import make_rule

    rule = make_rule(SWA(4, 9), proof=proof)
    ret = Retention(interval, 4)
    for ends in [(), (5,), (3, 7), (7, 3), (5, 4), (2, 6, 9)]:
        mask = masked_blocks(rule, interval, ends, 40)
        for j in range(0, 20):
            i, stop = ret.next_masked_run(rule, j, ends)
            want = min((b for b in mask if b >= j), default=math.inf)
            assert i == want and ret.next_masked_block(rule, j, ends) == want
            if i == math.inf:
                assert stop == 0
            else:
                assert stop > i and all(b in mask for b in range(i, stop))


def test_masked_run_stop_is_the_longest_span_from_its_start() -> None:
    """retention: next_masked_run — ``i <= best`` let a later end with the same start and a
    shorter span replace the stop. Sparse (interval 0), W = 9, bs 4: from j = 3 the ends 5
    (span [3, 5)) and 4 (span [2, 4), clamped to [3, 4)) both start at 3; stop is 5."""
    from hybridkv.core.rules import make_rule

    rule = make_rule(SWA(4, 9))
    assert Retention(0, 4).next_masked_run(rule, 3, (5, 4)) == (3, 5)
    assert Retention(0, 4).next_masked_run(rule, 3, (4, 5)) == (3, 5)
    assert Retention(0, 4).next_masked_run(rule, 5, (5,)) == (math.inf, 0)   # [3, 5) ends at j


@settings(max_examples=400, deadline=None)
@given(ATTENTION_SPECS, st.booleans(), st.sampled_from([0, 32, 64, 256]),
       st.lists(st.integers(0, 40), max_size=4), st.integers(0, 30), st.integers(0, 60))
def test_masked_runs_cover_the_masked_blocks(spec, proof, interval, ends, j, hi) -> None:
    rule = make_rule(spec, proof)
    interval = interval // rule.block_size * rule.block_size if interval else 0
    ret = Retention(interval, rule.block_size)
    ends = tuple(sorted(set(ends)))
    walked = []
    i = ret.next_masked_block(rule, j, ends)
    while i < hi:
        walked.append(i)
        i = ret.next_masked_block(rule, i + 1, ends)
    runs = []
    k = j
    while True:
        i, stop = ret.next_masked_run(rule, k, ends)
        if i >= hi:
            break
        assert stop > i
        runs.extend(range(i, min(stop, hi)))
        k = stop
    assert runs == walked


def test_retention_interval_not_a_multiple_of_the_alignment_is_a_clear_error() -> None:
    cfg = state_hybrid(QWEN3_NEXT)
    with pytest.raises(ValueError, match=r"multiple of the scheduler block size \(16, the LCM of "
                                         r"the group block sizes\), got 50"):
        KVCacheManager(cfg, CacheOptions(retention_interval=50))
    for n in (0, 16, 64, 1024, None):
        KVCacheManager(cfg, CacheOptions(retention_interval=n))
