"""Tests that kill the mutants mutmut found surviving in the lookup and caching side of
``src/hybridkv/core/coordinator.py`` (docs/mutation-survivors.md, ``core/coordinator.py``,
"Lookup and write path"): ``find_longest_hit`` and its fixed point, ``find_external_hit``,
the write path (``cache``, ``_cache_prefix``, ``_cache_ends``, ``_insert_span``), vLLM's
write mask in compat mode (``_write_mask``, ``_mask_ends``, ``_compat_limits``) and the
promised boundaries (``_boundaries``).

Public API only (``KVCacheManager``, ``Request``, the specs, ``lookup`` / ``allocate`` /
``free`` / ``block_ids`` / ``take_events`` / ``lookup_external`` / ``check_integrity``; the
cached positions are read with ``tests.support.helpers.cached_positions``, which compares a
table's blocks with the request's hashes). Expectations are derived by hand from the
documented contract (docstrings, ARCHITECTURE.md, vLLM 0.33's
``SlidingWindowManager.reachable_block_mask`` and ``HybridKVCacheCoordinator
.get_num_cacheable_tokens``) in each docstring. All deterministic and fast: mutmut runs them for every mutant.
"""

from __future__ import annotations

import re

import pytest

from hybridkv import BlockStored, KVCacheManager, Request, SlidingWindow, SpecDecode, StateSpec
from tests.support.helpers import (FA, SWA, admit, cached_positions, config, evict, manager,
                                prompt, run_prompt)
from tests.support.helpers import EAGLE_DROP


# ---- compat mode, retention 0: vLLM's write mask ----------------------------------------------

def _vllm_mask(p: int, a: int, bs: int, window: int, proof: int, drop: bool,
               junction: int = 0) -> set[int]:
    """vLLM 0.33's SWA write mask for retention 0 (``SlidingWindowManager
    .reachable_block_mask``), written from vLLM's definition, not from hybridkv: the reachable
    boundaries are the replay boundaries (``P - 1``; EAGLE drop mode: ``max((P-1)//A*A - A, 0)``
    and ``max(P//A*A - A, 0)``), the junction and (EAGLE groups) ``junction - block_size``; each
    aligned down to A keeps the ``need = cdiv(W - 1, bs)`` blocks before it, plus the block
    after it in an EAGLE group (the proof block), never below block 0."""
    need = -(-(window - 1) // bs)
    ends = [max((p - 1) // a * a - a, 0), max(p // a * a - a, 0)] if drop else [p - 1]
    if junction:
        ends.append(junction)
        if proof:
            ends.append(junction - bs)
    out: set[int] = set()
    for b in ends:
        if b < 0:
            continue
        e = b // a * a // bs
        out |= set(range(max(e - need, 0), e + proof))
    return out


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("p", [5, 8, 9, 12, 13, 16, 17, 20, 23, 24, 25])
def test_compat_mask_of_one_sliding_group_keeps_the_replay_windows(drop, p) -> None:
    """coordinator: _mask_ends / _write_mask — vLLM's replay boundaries (``p - 1``; EAGLE
    drop mode's ``{resend - A, extension - A}`` pair, 0 kept) moved by one token or one
    unit, ``max(.., 0)`` → ``max(.., 1)``, end 0 dropped: other blocks cached.

    Compat mode, retention 0, one SWA group (bs 4, W 8: need 2; A 4), drop mode with the
    group as the drafter (proof block). A one-shot prefill of p tokens: the unitary coordinator
    caches up to p // 4 blocks (all hashed), exactly the masked ones (:func:`_vllm_mask`)."""
    spec = EAGLE_DROP if drop else None
    kv = manager(SWA(4, 8), num_blocks=40, retention=0, spec_decode=spec,
                 drafts=(0,) if drop else ())
    r, _ = run_prompt(kv, "r", prompt(100, p))
    want = {j for j in _vllm_mask(p, 4, 4, 8, int(drop), drop) if j < p // 4}
    assert cached_positions(kv, r, 0) == want
    kv.check_integrity()


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("p", [6, 9, 16, 17, 20, 24, 25, 31, 32, 33, 40])
def test_compat_mask_of_a_hybrid_aligns_the_replay_windows(drop, p) -> None:
    """coordinator: _mask_ends / _compat_limits — the boundaries aligned down to A = 8 in the
    group's 4-token blocks; the hybrid coordinator's cacheable prefix (``align(n)``; an EAGLE
    group ``min(n, align(n) + bs)``).

    Compat mode, retention 0, full (bs 8) + SWA (bs 4, W 8: need 2); drop mode with the SWA
    group as the only drafter. After a one-shot prefill of p tokens the SWA group has cached
    the masked blocks below its cacheable prefix: ``align8(p) // 4`` blocks, or with the proof
    block ``min(p, align8(p) + 4) // 4`` — but nothing while ``align8(p)`` is 0 (p = 6: the
    EAGLE pair is {0, 0}, block 0 is masked, and still not cached)."""
    spec = EAGLE_DROP if drop else None
    kv = manager(FA(8), SWA(4, 8), num_blocks=60, retention=0, spec_decode=spec,
                 drafts=(1,) if drop else ())
    r, _ = run_prompt(kv, "r", prompt(100, p))
    aligned = p // 8 * 8
    limit = min(p, aligned + 4) // 4 if drop and aligned else aligned // 4
    want = {j for j in _vllm_mask(p, 8, 4, 8, int(drop), drop) if j < limit}
    assert cached_positions(kv, r, 1) == want
    assert cached_positions(kv, r, 0) == set(range(aligned // 8))   # full: every block
    kv.check_integrity()


def test_compat_mask_without_a_hit_pins_no_junction() -> None:
    """coordinator: _mask_ends — a new request allocated with ``hit=None`` given junction 1
    instead of 0 (its end 0 then masks block 0 of an EAGLE group).

    Compat mode, retention 0, drop mode, SWA (bs 4, W 8) drafter; 40 tokens allocated without
    a lookup: the replay ends are 32 and 36 (blocks 8 and 9), masked [6, 9) ∪ [7, 10) = 6..9;
    block 0 is not among them."""
    kv = manager(SWA(4, 8), num_blocks=40, retention=0, spec_decode=EAGLE_DROP, drafts=(0,))
    r = Request("r", prompt(100, 40))
    assert kv.allocate(r, 40, None) is not None
    r.num_computed_tokens = 40
    assert cached_positions(kv, r, 0) == {6, 7, 8, 9}


def test_compat_mask_of_a_one_token_prompt_in_drop_mode() -> None:
    """coordinator: _mask_ends — ``max(.., 0)`` → ``max(.., 1)`` for either end of the EAGLE
    pair (visible only with alignment 1).

    Compat mode, retention 0, drop mode, SWA (bs 1, W 9: need 8) drafter, A = 1. A one-token
    prompt's pair is ``{max(0 - 1, 0), max(1 - 1, 0)} = {0}``: only span(0) = [0, 1) is
    masked. Three decode steps later (4 tokens computed and hashed, nothing out of the window
    yet) block 0 is still the only cached block; an end 1 would have masked block 1 too."""
    kv = manager(SWA(1, 9), num_blocks=40, retention=0, spec_decode=EAGLE_DROP, drafts=(0,))
    r, _ = run_prompt(kv, "r", [7])
    for tok in (8, 9, 10):
        r.append_tokens([tok])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
    assert 0 not in kv.block_ids(r)[0]
    assert cached_positions(kv, r, 0) == {0}


@pytest.mark.parametrize("drop", [False, True])
def test_compat_mask_pins_the_junction_and_in_eagle_groups_the_block_below(drop) -> None:
    """coordinator: _mask_ends — ``junction - block_size`` added for every group (``and`` →
    ``or``), not only EAGLE groups; the junction itself lost.

    Compat mode, retention 0, full (bs 16) + SWA (bs 16, W 32: need 2), as vLLM's
    ``test_swa_shared_prefix_reuse_under_zero_retention``.
    r0 (64 shared + 20 tokens) leaves the SWA group only the window of its replay end, so r1
    (the same 64 + 20 others) gets a hit of 0 with junction 64 (the full group's answer).
    r1's SWA mask: its replay ends, the junction 64 (blocks [2, 4)) and, in an EAGLE group
    only, 64 - 16 = 48 (blocks [1, 3) + its proof block)."""
    spec = EAGLE_DROP if drop else None
    kv = manager(FA(16), SWA(16, 32), num_blocks=80, retention=0, spec_decode=spec,
                 drafts=(1,) if drop else ())
    shared = prompt(1000, 64)
    run_prompt(kv, "r0", shared + [100] * 20)
    r1 = Request("r1", shared + [200] * 20)
    hit = kv.lookup(r1)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 64)
    assert kv.allocate(r1, 84, hit) is not None
    r1.num_computed_tokens = 84
    limit = min(84, 80 + 16) // 16 if drop else 80 // 16
    want = {j for j in _vllm_mask(84, 16, 16, 32, int(drop), drop, junction=64) if j < limit}
    assert cached_positions(kv, r1, 1) == want
    assert (1 in want) == drop


@pytest.mark.parametrize("drop", [False, True])
def test_compat_mask_of_a_chunked_prefill_waits_for_the_cacheable_prefix(drop) -> None:
    """coordinator: _compat_limits — an EAGLE group's cacheable prefix ``min(n, align(n) +
    bs)`` taken as ``align(n) + bs`` (a block not yet computed cached) or as ``n`` (uncapped).

    Compat mode, retention 0, full (bs 8) + SWA (bs 2, W 8: need 4), a 40-token prompt in
    chunks 5, 9, 7, 11, 8 (computed 5, 14, 21, 32, 40). The SWA group's stored blocks after
    each chunk are the masked ones below its cacheable prefix, in blocks: ``align8(n) // 2``,
    with the proof block (EAGLE drafter) ``min(n, align8(n) + 2) // 2`` (0 while align8(n) is
    0): with the proof block 5 → 0, 14 → 5 (uncapped: 7), 21 → 9 (uncapped: 10), 32 → 16,
    40 → 20. Read from the KV events."""
    spec = EAGLE_DROP if drop else None
    kv = manager(FA(8), SWA(2, 8), num_blocks=80, retention=0, spec_decode=spec,
                 drafts=(1,) if drop else (), enable_events=True)
    r = Request("r", prompt(100, 40))
    mask = _vllm_mask(40, 8, 2, 8, int(drop), drop)
    hit = kv.lookup(r)
    stored: set[int] = set()
    for i, n in enumerate((5, 9, 7, 11, 8)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        c = r.num_computed_tokens
        stored |= {r.block_hashes.index(h) for e in kv.take_events()
                   if isinstance(e, BlockStored) and e.group_idx == 1 for h in e.block_hashes}
        aligned = c // 8 * 8
        limit = (min(c, aligned + 2) if drop and aligned else aligned) // 2
        assert stored == {j for j in mask if j < limit}, c
    kv.check_integrity()


# ---- default mode: promised boundaries --------------------------------------------------------

def test_a_new_request_without_a_hit_promises_only_its_replay_boundaries() -> None:
    """coordinator: _boundaries — a new request allocated with ``hit=None`` read as a hit
    (``hit.shared_prefix_boundary`` of None) or given junction 1 (an end at token 1, whose run
    in an EAGLE group is block 0).

    Default mode, retention 0, drop mode, SWA (bs 4, W 8: need 2) drafter; 40 tokens in one
    step. Promised ends (ARCHITECTURE, replay boundaries with the unit below): the EAGLE pair
    {36 - 4, 40 - 4} and one unit below each: 28, 32, 36 (blocks 7, 8, 9); their runs with
    the proof block: [5, 8), [6, 9), [7, 10). The same with the lookup's zero hit."""
    for use_hit in (False, True):
        kv = manager(SWA(4, 8), num_blocks=40, compat=False, retention=0, spec_decode=EAGLE_DROP,
                     drafts=(0,))
        r = Request("r", prompt(100, 40))
        hit = kv.lookup(r) if use_hit else None
        assert kv.allocate(r, 40, hit) is not None
        r.num_computed_tokens = 40
        assert cached_positions(kv, r, 0) == {5, 6, 7, 8, 9}
        kv.check_integrity()


# ---- lookup with alignment 1 (block size 1) -------------------------------------------------

def test_a_hit_of_one_token_is_returned() -> None:
    """coordinator: _find_longest_hit — a hit of exactly one token taken for "no hit" (``t ==
    1`` for ``t == 0``; only alignment 1 has such hits).

    Full (bs 1) + MLA-free simplest case: two full groups of block size 1. "a" = [5, 6, 7] is
    served; "b" = [5, 9, 9] shares one token: its hit is 1 token, one block per group."""
    kv = KVCacheManager(config(FA(1), FA(1, dtype="float16"), num_blocks=20))
    a, _ = run_prompt(kv, "a", [5, 6, 7])
    hit = kv.lookup(Request("b", [5, 9, 9]))
    assert hit.num_tokens == 1
    assert hit.block_ids == (tuple(kv.block_ids(a)[0][:1]), tuple(kv.block_ids(a)[1][:1]))


def test_lookup_checks_every_group_at_a_one_token_candidate() -> None:
    """coordinator: _fixed_point — the unit loop stops at a candidate of 1 token (``t <= 0``
    → ``t <= 1``) without asking the later groups: a 1-token hit the window group cannot serve
    (then its missing block is read: KeyError).

    Compat mode, retention 0, full (bs 1) + SWA (bs 1, W 3: need 2). "a" (10 tokens) leaves the
    SWA group only the window of its replay end 9: blocks 7, 8. "b" shares a's first token:
    the full group answers 1, the SWA group needs block 0 for it: no hit."""
    kv = manager(FA(1), SWA(1, 3), num_blocks=40, retention=0)
    a, _ = run_prompt(kv, "a", prompt(100, 10))
    assert cached_positions(kv, a, 1) == {7, 8}
    hit = kv.lookup(Request("b", [100, 7, 7, 7]))
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 1)


def _sliding_b(window: int) -> SlidingWindow:
    """A sliding spec unequal to ``SWA(1, window)`` (another head_dim): its own lookup unit."""
    return SlidingWindow(block_size=1, num_kv_heads=1, head_dim=4, window=window)


def test_lookup_repeats_the_pass_that_ends_at_one_token() -> None:
    """coordinator: _fixed_point — the fixed point stopped after a pass that lowered the
    candidate to 1 (``t <= 0`` → ``t <= 1`` at the end of a pass, or at the start of a unit):
    a group that served the pass's larger candidate is not asked about 1 token.

    Compat mode, retention 0, full (bs 1) + two unequal SWA groups A and B (bs 1, W 2: need 1).
    "x" = [1, 2, 3] caches full 0..2 and (replay end 2) the window block 1 in A and B; "y" =
    [1, 4] caches block 0 in A and B. Then A's block 0 and B's block 1 are evicted. "q" = [1,
    2, 9, 9]: the full group answers 2; A serves 2 (its block 1); B does not serve 2 (block 1
    gone) but serves 1 (block 0). Next pass: A does not serve 1 (block 0 gone): no hit."""
    kv = manager(_sliding_b(2), SWA(1, 2), FA(1), num_blocks=40, retention=0)
    x, _ = run_prompt(kv, "x", [1, 2, 3])
    y, _ = run_prompt(kv, "y", [1, 4])
    assert cached_positions(kv, x, 0) == cached_positions(kv, x, 1) == {1}
    assert cached_positions(kv, y, 0) == cached_positions(kv, y, 1) == {0}
    kv.free(x)
    kv.free(y)
    evict(kv, y, 0, 0)        # A's block 0
    evict(kv, x, 1, 1)        # B's block 1
    hit = kv.lookup(Request("q", [1, 2, 9, 9]))
    assert hit.num_tokens == 0
    kv.check_integrity()


# ---- hits name their request ------------------------------------------------------------------

def test_a_hit_names_the_request_it_was_looked_up_for() -> None:
    """coordinator: _find_longest_hit / find_longest_hit — the junction set to the hit's own
    end (``longest > t`` → ``>=`` / ``or True``); the hit's ``request_id`` lost
    (None: any request could adopt it) for a zero hit, a non-zero hit, or a memoized hit
    refreshed after the state changed.

    Default mode, full (bs 4). "a" (12 tokens) is served: "b" (its 12 tokens + 1) hits 12,
    "c" (other tokens) hits 0. Each hit names its request, and another request adopting it is
    refused (CacheHit docstring: only that request can adopt it). After an unrelated
    allocation (the epoch moves; b's hashes untouched) b's lookup is answered from the memo:
    the same hit, still b's. A hit every group serves in full has no junction
    (``shared_prefix_boundary`` 0, not the hit's own end)."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    run_prompt(kv, "a", prompt(100, 12))
    b = Request("b", prompt(100, 13))
    c = Request("c", prompt(500, 13))
    hits = {"b": kv.lookup(b), "c": kv.lookup(c)}
    assert (hits["b"].num_tokens, hits["c"].num_tokens) == (12, 0)
    # one group: nothing longer is cached anywhere, so no junction (not even the hit's end)
    assert (hits["b"].shared_prefix_boundary, hits["c"].shared_prefix_boundary) == (0, 0)
    run_prompt(kv, "z", prompt(900, 9))
    hits["b2"] = kv.lookup(b)
    assert hits["b2"].num_tokens == 12 and hits["b2"].block_ids == hits["b"].block_ids
    for name, hit in hits.items():
        assert hit.request_id == name[0]
        with pytest.raises(ValueError, match=f"looked up for request '{name[0]}'"):
            kv.allocate(Request("other", prompt(100, 13)), 1, hit)
    assert kv.allocate(b, 1, hits["b2"]) is not None
    kv.check_integrity()


# ---- the write path's bulk insert -------------------------------------------------------------

@pytest.mark.parametrize("second", ["full", "sliding"])
def test_a_long_run_of_a_larger_block_group_is_cached_under_its_own_hashes(second) -> None:
    """coordinator: _insert_span — a run of 12 or more blocks (one bulk insert) given the
    hashes one hash block too early (``(j + 1) * scale - 2``: with scale 2 the slice has the
    right length and the wrong hashes).

    Default mode, full (bs 4) + a second group of bs 8 (scale 2 over the hash block 4): full,
    or SWA with W 100 (need 13 blocks). "a" = 100 tokens in one step: the bs-8 group caches
    its 12 full blocks in one run (the SWA group: the run of its replay end 96 = blocks
    [0, 12)). A resend hits 96 (99 aligned down to 8) with a's blocks in both groups."""
    spec = FA(8) if second == "full" else SWA(8, 100)
    kv = manager(FA(4), spec, num_blocks=80, compat=False)
    a, _ = run_prompt(kv, "a", prompt(100, 100))
    assert cached_positions(kv, a, 1) == set(range(12))
    kv.check_integrity()
    hit = kv.lookup(Request("b", prompt(100, 100)))
    assert hit.num_tokens == 96
    assert hit.block_ids == (tuple(kv.block_ids(a)[0][:24]), tuple(kv.block_ids(a)[1][:12]))


# ---- identical siblings ------------------------------------------------------------------------

def test_identical_sibling_groups_serve_a_block_only_together() -> None:
    """coordinator: _find_longest_hit — a unit of identical sibling groups probed with the
    first group's answers only (``groups[1:]`` → ``groups[2:]``): a block one sibling lost
    counted as cached (its id is then read from that sibling's index: KeyError).

    Default mode, dense retention, full (bs 4) + two identical SWA groups (bs 4, W 8: need 2),
    one lookup unit. "a" (24 tokens) is served and freed; the second sibling's block 4 is
    evicted. A resend of a's 24 tokens (candidate 20, run [3, 5)) falls back to 16 (run
    [2, 4)), served by both siblings."""
    kv = manager(FA(4), SWA(4, 8), SWA(4, 8), num_blocks=60, compat=False, retention=None)
    a, _ = run_prompt(kv, "a", prompt(100, 24))
    ids = kv.block_ids(a)
    kv.free(a)
    evict(kv, a, 2, 4)
    hit = kv.lookup(Request("b", prompt(100, 24)))
    assert hit.num_tokens == 16
    assert hit.block_ids == (tuple(ids[0][:4]), (0, 0) + tuple(ids[1][2:4]),
                             (0, 0) + tuple(ids[2][2:4]))
    kv.check_integrity()


# ---- request ownership -------------------------------------------------------------------------

def test_a_different_request_object_with_a_held_id_is_refused_by_name() -> None:
    """coordinator: holds / _state — the owner check inverted or skipped, or its message lost:
    a second Request object reusing a running request's id must get the documented error
    (allocate with or without a hit, free), and freeing an id nobody holds is a no-op.

    Default mode, full (bs 4). "x" (12 tokens) runs; another object "x" with the same tokens
    looks up a hit of 8 (x's cached blocks)."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    x, _ = run_prompt(kv, "x", prompt(100, 12))
    other = Request("x", prompt(100, 12))
    hit = kv.lookup(other)
    assert hit.num_tokens == 8
    msg = re.escape("request id 'x' already holds blocks for a different Request object; "
                    "free that request first or use a unique id")
    with pytest.raises(ValueError, match=msg):
        kv.allocate(other, 4, hit)
    with pytest.raises(ValueError, match=msg):
        kv.allocate(other, 4)
    with pytest.raises(ValueError, match=msg):
        kv.free(other)
    kv.free(Request("nobody", [1, 2, 3]))
    kv.free(x)
    assert kv.num_free_blocks == 39
    kv.check_integrity()


def test_a_run_whose_first_block_left_the_window_caches_only_the_rest() -> None:
    """coordinator: _insert_span — the per-block path's null check made ``or`` (the null
    block 0 inserted under the hash of a position that left the window).

    Compat mode, dense retention, drop mode, one SWA group (bs 8, W 3: need 1) as the
    drafter: end t's run is [t/8 - 1, t/8 + 1), cached once the proof block t/8 is computed.
    A 40-token prompt in chunks of 10: at 20 computed, end 8's run is [0, 2), but block 0 left
    the window at 10 (skipped 10 - 3 + 1 = 8 tokens) and is null: only block 1 is cached. No
    stored event names a hash twice, and a resend hits 24 (the unitary coordinator's cap: the
    proof block below 39 tokens, so e <= 3) with a real block at position 2 (run [2, 4))."""
    kv = manager(SWA(8, 3), num_blocks=40, retention=None, spec_decode=EAGLE_DROP, drafts=(0,),
                 enable_events=True)
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    for i in range(4):
        assert kv.allocate(r, 10, hit if i == 0 else None) is not None
        r.num_computed_tokens += 10
        kv.check_integrity()
        if i == 1:
            assert kv.block_ids(r)[0][0] == 0 and cached_positions(kv, r, 0) == {1}
    stored = [b for e in kv.take_events() if isinstance(e, BlockStored) for b in e.block_hashes]
    assert len(stored) == len(set(stored))
    kv.free(r)
    hit = kv.lookup(Request("s", prompt(100, 40)))
    assert hit.num_tokens == 24 and hit.block_ids[0][:2] == (0, 0) and hit.block_ids[0][2] != 0
    kv.check_integrity()


# ---- more lookup cases -----------------------------------------------------------------------

def test_a_hash_cached_twice_is_served_by_its_first_block() -> None:
    """coordinator: _find_longest_hit — a duplicated hash (two requests computed the same
    block) read as ``None`` instead of its first block id.

    Default mode, full (bs 4). "a" and "b" (the same 9 tokens) are both looked up before
    either is allocated (no hit), then both run: each caches its own blocks 0 and 1 under the
    same hashes. "c" (the same 9 tokens) hits 8 with a's blocks, the first cached."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    a, b = Request("a", prompt(100, 9)), Request("b", prompt(100, 9))
    ha, hb = kv.lookup(a), kv.lookup(b)
    for r, h in ((a, ha), (b, hb)):
        assert h.num_tokens == 0 and kv.allocate(r, 9, h) is not None
        r.num_computed_tokens = 9
    assert kv.block_ids(a)[0][:2] != kv.block_ids(b)[0][:2]
    hit = kv.lookup(Request("c", prompt(100, 9)))
    assert hit.num_tokens == 8 and hit.block_ids == (tuple(kv.block_ids(a)[0][:2]),)
    kv.check_integrity()


@pytest.mark.parametrize("compat", [False, True])
def test_drop_mode_hit_needs_the_proof_block_hash(compat) -> None:
    """coordinator: _fixed_point — the largest end ``n_fine // scale - proof`` (``+ proof``:
    a hit whose proof block has no hash), and the single-group cap of compat mode (``and``
    → ``or``: applied in default mode or to a compat hybrid).

    EAGLE drop mode, every group a drafter (proof block). "a" (20 tokens) is served. A
    request of a's first 16 tokens: its candidate is 12 (15 aligned down), whose proof block
    3 has a hash (4 hashed blocks) and is cached by a: the hit is 12 — in default mode with
    one full group (bs 4) and in compat mode with two (vLLM's hybrid coordinator keeps the
    proof margin; only its single-group coordinator caps the proof block below max_tokens).
    A request of a's first 13 tokens has 3 hashed blocks: 12 would need block 3's hash, so 8."""
    specs = (FA(4), FA(4, dtype="float16")) if compat else (FA(4),)
    kv = manager(*specs, num_blocks=60, compat=compat, spec_decode=EAGLE_DROP)
    run_prompt(kv, "a", prompt(100, 20))
    assert kv.lookup(Request("b", prompt(100, 16))).num_tokens == 12
    assert kv.lookup(Request("c", prompt(100, 13))).num_tokens == 8


def test_a_running_request_is_counted_once_and_may_schedule_zero_tokens() -> None:
    """coordinator: holds — the request's state not found (looked up as None or under id
    None): a running request taken for a new one (counted again in the stats; refused a
    0-token step as a new request without a hit).

    Default mode, full (bs 4). r (12 tokens) runs in chunks 4, 4, 4, then a 0-token step
    (allowed for a running request: no new block). The stats count one request of 12 query
    tokens."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    r = Request("r", prompt(100, 12))
    hit = kv.lookup(r)
    for i in range(3):
        assert kv.allocate(r, 4, hit if i == 0 else None) is not None
        r.num_computed_tokens += 4
    assert kv.allocate(r, 0) == [[]]
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (1, 12, 0)


# ---- promised junction ends -------------------------------------------------------------------

def test_allocating_a_junction_hit_promises_the_junction_and_the_unit_below() -> None:
    """coordinator: _boundaries — the junction lost (None / never read), ``junction - a``
    not promised in default mode (``or`` → ``and``, ``not compat`` dropped) or moved to
    ``junction + a``.

    Default mode, retention 0, full (bs 4) + SWA (bs 4, W 5: need 1). r0 = 12 shared + 12
    other tokens caches the SWA windows of its ends 20, 16 (replay 23 → 20 and the unit
    below): blocks 3, 4. r1 = the 12 shared + 12 others: the full group serves 12; the SWA
    group would need block 2 for 12, block 1 for 8, block 0 for 4, none cached: hit 0,
    junction 12. r1's promised ends: 20, 16 (its replay pair), 12 (junction),
    8 (the unit below): SWA runs [4, 5), [3, 4), [2, 3), [1, 2)."""
    kv = manager(FA(4), SWA(4, 5), num_blocks=60, compat=False, retention=0)
    shared = prompt(1000, 12)
    r0, _ = run_prompt(kv, "r0", shared + prompt(100, 12))
    assert cached_positions(kv, r0, 1) == {3, 4}
    r1 = Request("r1", shared + prompt(200, 12))
    hit = kv.lookup(r1)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 12)
    assert kv.allocate(r1, 24, hit) is not None
    r1.num_computed_tokens = 24
    assert cached_positions(kv, r1, 1) == {1, 2, 3, 4}
    kv.check_integrity()


def test_compat_state_group_exports_the_junction_without_the_unit_below() -> None:
    """coordinator: _boundaries — compat mode without drop mode given ``junction - a`` too
    (``and`` → ``or``): vLLM pins only the junction (and ``junction - block_size`` under EAGLE).

    Compat mode, retention 0, full (bs 4) + a state group (bs 4). r0 = 12 shared + 12 other
    tokens; r1 = the 12 shared + 12 others: the full group serves 12, the state group has no
    checkpoint at 12: hit 0, junction 12. r1's promised ends (compat: no unit below): its
    replay boundary 20 and the junction 12 — the checkpoints its 24-token step exports."""
    state = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                      state_dtype="float32")
    kv = KVCacheManager(config(FA(4), state, num_blocks=200), vllm_compat=True)
    shared = prompt(1000, 12)
    run_prompt(kv, "r0", shared + prompt(100, 12))
    r1 = Request("r1", shared + prompt(200, 12))
    hit = kv.lookup(r1)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 12)
    assert kv.export_positions(r1, 24, hit) == [12, 20]
    assert kv.allocate(r1, 24, hit) is not None
    assert [e.position for e in kv.state_blocks(r1)[0].exports] == [12, 20]


# ---- the write path's timing -----------------------------------------------------------------

def test_the_final_length_is_promised_at_free() -> None:
    """coordinator: cache — the final length not promised at free in default mode (``not
    compat`` inverted), its end made None or a float, or the free's cache pass skipped below
    ``quiet_until`` (``not final`` → ``final``).

    Default mode, retention 0, full (bs 4) + SWA (bs 4, W 8: need 2). r's prompt (10 tokens)
    promises 8 and 4; r decodes to 21 tokens and is freed: the final length 21 → 20 is
    promised, its SWA run [3, 5) cached. The same 21 tokens + 1 then hit 20 (else 8)."""
    kv = manager(FA(4), SWA(4, 8), num_blocks=60, compat=False, retention=0)
    r, _ = run_prompt(kv, "r", prompt(100, 10))
    while r.num_tokens < 21:
        r.append_tokens([7])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
    kv.free(r)
    assert kv.lookup(Request("q", list(r.token_ids) + [9])).num_tokens == 20
    kv.check_integrity()


def test_drop_mode_caches_an_end_once_its_proof_block_is_computed() -> None:
    """coordinator: cache / _cache_prefix — the limit ``(blocks - proof) * bs`` given ``+
    proof`` (ends whose proof block is not computed yet), an end's run cached without its
    proof block (``+ proof`` → ``- proof``).

    Default mode, drop mode, one full group (bs 4, the drafter). A 30-token prompt in chunks
    12, 8, 10: an end t is cached with its proof block once t + 4 tokens are computed, so the
    cached blocks are [0, 3), [0, 5), [0, 7) (at 30: 7 hashed blocks, end 24 + block 6)."""
    kv = manager(FA(4), num_blocks=40, compat=False, spec_decode=EAGLE_DROP)
    r = Request("r", prompt(100, 30))
    hit = kv.lookup(r)
    for i, (n, want) in enumerate(((12, 3), (8, 5), (10, 7))):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert cached_positions(kv, r, 0) == set(range(want))


def test_a_step_that_completes_a_proof_block_caches_at_once() -> None:
    """coordinator: cache — ``quiet_until`` (the fewest tokens at which cache() has work
    again) rounded up to the alignment for every group (``and`` → ``or``: only the compat
    hybrid's groups without a proof block cache up to align(n)), or a step that reaches it
    exactly skipped (``<`` → ``<=``).

    Default mode, drop mode, full bs 4 (the drafter) + full bs 8: A = 8, the delay is the
    drafter's block (4). Chunks 12, 8: at 12 the end 8 is cached (bs-4 blocks [0, 3)); the
    next end 16 is due at 16 + 4 = 20, reached exactly by the second chunk: [0, 5)."""
    kv = manager(FA(4), FA(8), num_blocks=60, compat=False, spec_decode=EAGLE_DROP, drafts=(0,))
    r = Request("r", prompt(100, 30))
    hit = kv.lookup(r)
    for i, (n, want) in enumerate(((12, 3), (8, 5))):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert cached_positions(kv, r, 0) == set(range(want))
        assert cached_positions(kv, r, 1) == set(range(want // 2))


def test_compat_mask_with_retention_caches_each_masked_block_when_it_fills() -> None:
    """coordinator: cache — the masked groups' ``quiet_until`` one block late (``+ 1`` →
    ``+ 2``: a masked block cached a block after it filled).

    Compat mode, retention 16, one SWA group (bs 4, W 8: need 2). A 5-token prompt, then one
    token per step to 40. The mask: the replay end 4 (block 1: [0, 1)) and every multiple of
    16 tokens (blocks [4k - 2, 4k)): 0, 2, 3, 6, 7. vLLM caches a masked block as soon as it is
    full (blocks are registered when scheduled): after c tokens, the masked j with
    (j + 1) * 4 <= c. Read from the KV events (the window frees the blocks)."""
    kv = manager(SWA(4, 8), num_blocks=40, retention=16, enable_events=True)
    r, _ = run_prompt(kv, "r", prompt(100, 5))
    stored: set[int] = set()
    while r.num_tokens < 40:
        r.append_tokens([7])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
        stored |= {r.block_hashes.index(h) for e in kv.take_events()
                   if isinstance(e, BlockStored) for h in e.block_hashes}
        c = r.num_computed_tokens
        assert stored == {j for j in (0, 2, 3, 6, 7) if (j + 1) * 4 <= c}, c


def test_compat_hit_writes_its_own_copy_of_the_proof_block() -> None:
    """coordinator: cache — the first end after an adopted hit computed with ``/`` (``done //
    step`` → ``done / step``: the next end overshoots when ``done`` is not a multiple).

    Compat mode, dense retention, full (bs 8) + SWA (bs 4, W 8: need 2) as the drafter. "a"
    (32 tokens) is served; "b" (a's first 28 + 2 others) hits 24 (SWA run [4, 7) with its
    proof block 6, tokens 24..27, shared). In compat mode the hit's proof block was dropped: b's end 24 stays open
    (done 24 - 4 = 20) and b's own block 6 is cached as soon as it is full (b computes 30:
    the EAGLE group's cacheable prefix min(30, 24 + 4) = 28 tokens, 7 blocks)."""
    kv = manager(FA(8), SWA(4, 8), num_blocks=60, retention=None, spec_decode=EAGLE_DROP,
                 drafts=(1,))
    run_prompt(kv, "a", prompt(100, 32))
    b = Request("b", prompt(100, 28) + prompt(500, 2))
    admit(kv, b, 6, expect_hit=24)
    assert 6 in cached_positions(kv, b, 1)


def test_lookahead_hashing_caches_a_block_once_the_next_token_exists() -> None:
    """coordinator: cache — the hashed-block count divided with ``/`` (a float limit: the
    single-block write then indexes the hashes with a float).

    Default mode, EAGLE with hash lookahead, full (bs 4). An 8-token prompt: block 1's hash
    needs token 8, so only block 0 is cached; one more token caches block 1."""
    kv = manager(FA(4), num_blocks=40, compat=False, spec_decode=SpecDecode("eagle", 1))
    r, _ = run_prompt(kv, "r", prompt(100, 8))
    assert cached_positions(kv, r, 0) == {0}
    r.append_tokens([7])
    assert kv.allocate(r, 1) is not None
    r.num_computed_tokens += 1
    assert cached_positions(kv, r, 0) == {0, 1}


def test_events_of_a_long_run_not_starting_at_block_zero() -> None:
    """coordinator: _insert_span — a bulk insert (12+ blocks) reporting positions from 0
    (``range(j, hi)`` → ``range(hi)``) or only below j (``range(j)``).

    Default mode, full (bs 4), events on. Chunks 8 then 56: the second step caches blocks
    [2, 16) in one run; its stored event names exactly their hashes and tokens."""
    kv = manager(FA(4), num_blocks=40, compat=False, enable_events=True)
    r = Request("r", prompt(100, 64))
    admit(kv, r, 8)
    kv.take_events()
    assert kv.allocate(r, 56) is not None
    stored = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == r.block_hashes[2:16]
    assert [t for e in stored for t in e.token_ids] == prompt(108, 56)
