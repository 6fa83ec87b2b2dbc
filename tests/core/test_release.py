"""Tests that kill the allocation-side mutants of ``src/hybridkv/core/coordinator.py`` that
a mutmut run left surviving (docs/mutation-survivors.md, ``core/coordinator.py``, "Allocation,
release and the fast paths"): ``plan``, ``commit``, ``allocate``, ``free`` and their helpers.

Public API only (``KVCacheManager``, ``Request``, the specs/config, ``lookup`` / ``allocate`` /
``free`` / ``block_ids`` / ``state_blocks`` / ``export_positions`` / ``take_events`` /
``lookup_external`` / ``commit_external`` / ``stats`` / ``check_integrity``, retention configs
with the ``priority`` policy, one hand-made ``CacheHit``); each docstring names the mutants
(``function — the change``) and derives the expectation by hand from the documented contract
or vLLM 0.33's semantics. Deterministic and fast (mutmut runs them for every mutant).
"""

from __future__ import annotations

import pytest

from hybridkv import (BlockRemoved, BlockStored, CacheHit, ChunkedLocal, KVCacheManager, Request,
                     SpecDecode, StateSpec)
from hybridkv.core.retention_config import RetentionConfig, TokenRange
from tests.support.helpers import FA, SWA, admit, config, prompt
from tests.support.helpers import ST_K2, STATE4

STATE1 = StateSpec(block_size=1, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                   state_dtype="float32")


# ---- free: the final length of a state request ---------------------------------------------

@pytest.mark.parametrize("computed, hit_after", [(1, 1), (2, 2), (3, 3)])
def test_a_state_request_freed_after_its_first_tokens_serves_them(computed, hit_after) -> None:
    """coordinator: _free_states — at free the live state is re-tagged as the checkpoint at
    the final aligned length whenever that length is > 0 (``computed > 0``) and the length is
    then promised to the other groups (``servable = end > 0``); with ``> 1`` a request freed
    after exactly one token would drop its state and serve nothing.

    Full (bs 1) + state (bs 1): alignment 1. Retention N = 8 and a 20-token prompt (replay
    boundaries 19, 18): no promised end below 8, so no checkpoint is exported during the
    first ``computed`` tokens. Freed then, the final length ``computed`` is promised: the
    full group caches its blocks, the state group keeps its live state there, so a new
    request with the same first tokens hits ``computed``."""
    kv = KVCacheManager(config(FA(1), STATE1, num_blocks=100), retention_interval=8)
    P = prompt(100, 20)
    r = Request("r", P)
    assert kv.allocate(r, computed, kv.lookup(r)) is not None
    assert kv.state_blocks(r)[0].exports == ()
    r.num_computed_tokens = computed
    kv.free(r)
    kv.check_integrity()
    q = Request("q", P[:computed] + prompt(500, 5))
    assert kv.lookup(q).num_tokens == hit_after


# ---- plan: a running request ------------------------------------------------------------------

def test_a_running_request_given_its_empty_hit_again_grows_as_without_it() -> None:
    """coordinator: plan — the hit's tokens are added to the computed count
    (``computed += hit.num_tokens``; ``=`` would restart a running request at 0 tokens).

    A running request may be passed an empty hit (the manager refuses only a non-empty one).
    Full (bs 4), nothing cached: r's lookup hits 0. Allocated 8 tokens (2 blocks) and
    computed, its next 4 tokens with that empty hit need a third block, exactly as without
    it (slots 12 → 3 blocks)."""
    kv = KVCacheManager(config(FA(4), num_blocks=10))
    r = Request("r", prompt(100, 12))
    hit = admit(kv, r, 8)
    got = kv.allocate(r, 4, hit)
    assert got is not None and len(got[0]) == 1
    assert len(kv.block_ids(r)[0]) == 3
    kv.check_integrity()


def test_the_blocks_two_windows_release_in_one_step_are_all_available() -> None:
    """coordinator: plan — ``freed_total += freed`` summed over the groups (``=`` keeps only
    the last group's): the blocks every window releases before the step's new blocks are
    popped count as available.

    Two sliding groups (bs 4, W 5), dense retention (no hold), 4 usable blocks. r (20 tokens)
    takes 2 blocks per group for its first 8 tokens: the pool is empty. At 8 computed each
    window skips 8 - 5 + 1 = 4 tokens, so each group releases block 0 (last reference) and
    needs 1 new block for tokens 8..11: 2 needed, 0 free + 2 released available → it fits."""
    kv = KVCacheManager(config(SWA(4, 5), SWA(4, 5), num_blocks=5), retention_interval=None)
    r = Request("r", prompt(100, 20))
    admit(kv, r, 8)
    assert kv.num_free_blocks == 0
    got = kv.allocate(r, 4)
    assert got is not None and [len(g) for g in got] == [1, 1]
    assert [t[0] for t in kv.block_ids(r)] == [0, 0]
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(5, True), (4, False)])
def test_compat_admission_of_a_sliding_request_counts_the_free_blocks_before_the_release(
        num_blocks, fits) -> None:
    """coordinator: plan — compat reservation ``want + freed_total - needed``: vLLM 0.33's
    full-sequence count must fit the free blocks as they are before the window frees (its
    ``get_num_blocks_to_allocate`` runs before ``remove_skipped_blocks`` frees them);
    ``want - freed_total`` would let the blocks the step releases count twice.

    Compat, one sliding group (bs 4, W 5): no hold. r (16 tokens) holds 2 blocks after 8
    tokens; num_blocks - 3 are free. Its next 4 tokens with the reservation: the window
    skips 8 - 5 + 1 = 4 tokens (block 0 released, last reference), 1 new block. vLLM's
    count: cdiv(16, 4) - 2 table entries = 2 must be free before the release: fits with 2
    free, not with 1 (then, as in vLLM, block 0 is still released)."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=num_blocks), vllm_compat=True)
    r = Request("r", prompt(100, 16))
    admit(kv, r, 8)
    assert kv.num_free_blocks == num_blocks - 3
    got = kv.allocate(r, 4, full_sequence_must_fit=True)
    assert (got is not None) == fits
    table = kv.block_ids(r)[0]
    assert len(table) == (3 if fits else 2) and table[0] == 0
    kv.check_integrity()


# ---- commit: adopting a hit ---------------------------------------------------------------------

def test_compat_eagle_request_caches_its_copy_of_the_dropped_hit_block_once_full() -> None:
    """coordinator: commit — in compat mode a new request adopting a hit starts its write path
    at ``hit - cache_delay`` (``done_t``): EAGLE dropped the hit's last matched block, so the
    request's own copy of it is cached, as in vLLM, in the step that fills it (``hit +
    delay`` or ``hit`` would wait for one more block).

    Compat, one full group (bs 4), EAGLE-3 without hash lookahead (a proof group: delay 4).
    "a" (13 tokens) caches blocks 0-2. "b" shares a's first 8 tokens (10 tokens): the match
    is 8, EAGLE drops its last block, the hit is 4. b computes tokens 4..9: its block 1
    (tokens 4..7) is full, so vLLM caches it now (2 full blocks of 10 tokens): one
    BlockStored with a's tokens 4..7."""
    kv = KVCacheManager(config(FA(4), num_blocks=20), vllm_compat=True, enable_events=True,
                        spec_decode=SpecDecode("eagle3", 3, hash_lookahead=False))
    A = prompt(100, 13)
    a = Request("a", A)
    admit(kv, a, 13)
    kv.take_events()
    b = Request("b", A[:8] + [500, 501])
    hit = kv.lookup(b)
    assert hit.num_tokens == 4
    assert kv.allocate(b, 6, hit) is not None
    stored = [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)]
    assert stored == [A[4:8]]
    kv.check_integrity()


# ---- allocate: every state change moves the epoch on --------------------------------------------

def test_a_hit_made_before_cache_only_steps_and_an_eviction_is_refused() -> None:
    """coordinator: allocate — the cache-only fast path (a step that completes a block the
    table already holds) bumps the epoch (``+= 1``; ``= 1`` or ``-= 1`` brings it back to
    the epoch of an old hit, which is then adopted unverified).

    Full (bs 4), 4 usable blocks. "a" (5 tokens) caches block 0; q's lookup (a's prompt)
    hits 4 then (1 commit so far). a is freed; r (16 tokens) is admitted with 4 tokens and 12
    lookahead slots (4 blocks: a's block 0 is evicted), steps 1 token (slow path), then 3, 4
    and 4 tokens, each completing a block its table already holds (cache-only steps). q's
    old hit must be refused: its block holds r's tokens now."""
    kv = KVCacheManager(config(FA(4), num_blocks=5))
    a = Request("a", prompt(100, 5))
    admit(kv, a, 5)
    q = Request("q", prompt(100, 5))
    hit = kv.lookup(q)
    assert hit.num_tokens == 4
    kv.free(a)
    r = Request("r", prompt(300, 16))
    admit(kv, r, 4, num_lookahead_tokens=12)
    assert kv.stats().evictions == 1
    for n in (1, 3, 4, 4):
        assert kv.allocate(r, n, num_lookahead_tokens=0) == [[]]
        r.num_computed_tokens += n
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_a_hit_made_before_a_failed_compat_step_that_releases_is_refused() -> None:
    """coordinator: allocate — a failed compat allocation that still frees the blocks that
    left the window (vLLM frees them before its capacity check) bumps the epoch (``+= 1``;
    ``= 1`` or ``-= 1`` brings it back to the epoch of an old hit, adopted unverified).

    Compat, one sliding group (bs 4, W 5), 3 usable blocks. "a" (5 tokens) caches block 0;
    q1 looks it up (hit 4) before a is freed, q2 after. r (20 tokens) is admitted with 12
    tokens (3 blocks: a's block 0 is evicted); its next 4 tokens with the full-sequence
    reservation fail (vLLM's count: cdiv(20, 4) - 3 = 2 > 0 free) but release blocks 0 and 1
    (the window skips 12 - 5 + 1 = 8 tokens). Both old hits must be refused."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=4), vllm_compat=True)
    a = Request("a", prompt(100, 5))
    admit(kv, a, 5)
    q1 = Request("q1", prompt(100, 5))
    hit1 = kv.lookup(q1)
    kv.free(a)
    q2 = Request("q2", prompt(100, 5))
    hit2 = kv.lookup(q2)
    assert hit1.num_tokens == hit2.num_tokens == 4
    r = Request("r", prompt(300, 20))
    admit(kv, r, 12)
    assert kv.stats().evictions == 1
    assert kv.allocate(r, 4, full_sequence_must_fit=True) is None
    assert kv.block_ids(r)[0][:2] == [0, 0]
    for q, hit in ((q1, hit1), (q2, hit2)):
        with pytest.raises(ValueError, match="no longer holds"):
            kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_the_slots_of_a_step_are_capped_at_max_model_len() -> None:
    """coordinator: plan — ``slots`` (scheduled tokens + lookahead slots) capped at
    max_model_len (``slots = len_cap``; ``None`` crashes): the table never covers a position
    past the model's length.

    Full (bs 4), EAGLE with 2 speculative tokens (2 lookahead slots), max_model_len 20. A
    20-token prompt allocated at once: min(20 + 2, 20) = 20 slots, 5 blocks (not 6)."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), spec_decode=SpecDecode("eagle", 2),
                        max_model_len=20)
    r = Request("r", prompt(100, 20))
    got = kv.allocate(r, 20, kv.lookup(r))
    assert got is not None and len(got[0]) == 5
    kv.check_integrity()


# ---- state groups: the commit's extents ----------------------------------------------------

def test_a_new_state_request_gets_its_live_extent_and_checkpoint_heads() -> None:
    """coordinator: _commit_states — the new extents' heads are returned per state group (the
    live extent's head, then one per export; ``None`` instead of a head).

    Full (bs 4) + state (a = 4, extents of 2 ids), retention N = 8. r's first 8 tokens: 2
    full blocks, and for the state group its live extent and the checkpoint at 8: the
    allocation returns their heads, the ones ``state_blocks`` reports."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=100), retention_interval=8)
    r = Request("r", prompt(100, 40))
    got = kv.allocate(r, 8, kv.lookup(r))
    assert got is not None and len(got[0]) == 2
    (sb,) = kv.state_blocks(r)
    assert [e.position for e in sb.exports] == [8]
    assert got[1] == [sb.live[0], sb.exports[0].blocks[0]]
    kv.check_integrity()


def test_the_hit_checkpoint_leaves_the_table_once_below_the_hold() -> None:
    """coordinator: _commit_states — the adopted hit's checkpoint is held at table entry
    ``e - 1`` (e = hit // a), so it is released like the request's own checkpoints once the
    request has moved a hold past it (``e + 1`` / ``e - 2``: it would stay until free).

    Full (bs 4) + state (a = 4, k = 2), retention N = 8, default mode (hold 4). "a" (40
    tokens, computed in steps of 8) leaves checkpoints at 8, 16, 24, 32. "b" shares a's first
    17 tokens: hit 16 (checkpoint 16, entry 3). b computes 4 tokens (16..20), then at 20
    computed 20 - 4 = 16 tokens are skipped: entry 3 leaves the table in b's next step."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=200), retention_interval=8)
    A = prompt(100, 40)
    a = Request("a", A)
    hit = kv.lookup(a)
    for i in range(5):
        assert kv.allocate(a, 8, hit if i == 0 else None) is not None
        a.num_computed_tokens += 8
    kv.free(a)
    b = Request("b", A[:17] + prompt(500, 15))
    admit(kv, b, 4, expect_hit=16)
    assert kv.block_ids(b)[1][3] != 0
    assert kv.allocate(b, 4) is not None
    b.num_computed_tokens = 24
    assert kv.block_ids(b)[1][3] == 0
    kv.check_integrity()


def test_a_new_request_allocated_without_a_lookup() -> None:
    """coordinator: allocate / commit / plan — a new request with no hit and no lookup before
    (no memo entry to drop, no hit to verify, no fast path): 3 blocks for 9 tokens, the full
    blocks cached (a later lookup of the same prompt hits 8)."""
    kv = KVCacheManager(config(FA(4), num_blocks=10))
    r = Request("r", prompt(100, 9))
    got = kv.allocate(r, 9)
    assert got is not None and len(got[0]) == 3
    r.num_computed_tokens = 9
    assert kv.lookup(Request("q", prompt(100, 9))).num_tokens == 8
    kv.check_integrity()


def test_a_reservation_is_checked_even_when_the_step_needs_no_new_block() -> None:
    """coordinator: allocate — the cache-only fast path is taken only without a reservation
    (``not reserve_tokens``): a step whose blocks the table already holds must still refuse
    a full sequence that cannot fit.

    Full (bs 4), 4 usable blocks. r (40 tokens) is admitted with 4 tokens + 4 lookahead
    slots (2 blocks), steps 1 token (slow path). Its next token fits its table, but the full
    sequence needs cdiv(40, 4) = 10 blocks: 2 held + 2 free < 10, refused; without the
    reservation the step succeeds with no new block."""
    kv = KVCacheManager(config(FA(4), num_blocks=5))
    r = Request("r", prompt(100, 40))
    admit(kv, r, 4, num_lookahead_tokens=4)
    assert kv.allocate(r, 1, num_lookahead_tokens=0) == [[]]
    r.num_computed_tokens = 5
    assert kv.allocate(r, 1, num_lookahead_tokens=0, full_sequence_must_fit=True) is None
    assert kv.allocate(r, 1, num_lookahead_tokens=0) == [[]]
    kv.check_integrity()


def test_a_failed_default_mode_step_changes_nothing_even_when_the_window_slides() -> None:
    """coordinator: allocate — only compat mode frees the blocks that left the window when an
    allocation fails (vLLM's order); in default mode a failed allocation changes nothing
    (``and`` → ``or`` would release them in default mode too).

    One sliding group (bs 4, W 5), dense retention (no hold), 3 usable blocks. r (16 tokens)
    holds 2 blocks after 8 tokens (1 free). Its next 4 tokens with the full-sequence
    reservation: block 0 leaves the window, 1 new block, and the peak is min(cdiv(16, 4),
    cdiv(5, 4) + 2) = 4 blocks, 2 held after the step: 1 + 2 reserved > 1 free + 1 released.
    Refused, r keeps block 0 and the free count is unchanged."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=4), retention_interval=None)
    r = Request("r", prompt(100, 16))
    admit(kv, r, 8)
    before = kv.block_ids(r)
    assert kv.num_free_blocks == 1 and before[0][0] != 0
    assert kv.allocate(r, 4, full_sequence_must_fit=True) is None
    assert kv.block_ids(r) == before and kv.num_free_blocks == 1
    kv.check_integrity()


def test_a_compat_step_after_a_failed_one_that_released_blocks() -> None:
    """coordinator: allocate — after a failed compat allocation that released the blocks
    that left the window, the request's window threshold is reset (``slide_until = 0``:
    the next step is planned, never answered from stale thresholds).

    Compat, one sliding group (bs 4, W 5), 3 usable blocks. r (20 tokens) is admitted with
    8 tokens + 4 lookahead slots (3 blocks). At 8 computed its next 4 tokens fit the table,
    but the full sequence does not (vLLM's count cdiv(20, 4) - 3 = 2 > 0 free): refused,
    block 0 (skipped 8 - 5 + 1 = 4 tokens) is released. The same step without the
    reservation then succeeds with no new block."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=4), vllm_compat=True)
    r = Request("r", prompt(100, 20))
    admit(kv, r, 8, num_lookahead_tokens=4)
    assert kv.num_free_blocks == 0
    assert kv.allocate(r, 4, num_lookahead_tokens=0, full_sequence_must_fit=True) is None
    assert kv.block_ids(r)[0][0] == 0 and kv.num_free_blocks == 1
    assert kv.allocate(r, 4, num_lookahead_tokens=0) == [[]]
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(12, True), (11, False)])
def test_a_new_state_request_counts_the_checkpoint_at_its_junction(num_blocks, fits) -> None:
    """coordinator: _plan_states — a new request's exports are counted with its hit (its
    junction is one of its promised ends; without the hit the plan misses that checkpoint
    and the commit overdraws the pool).

    Full (bs 4) + state (bs 4, extents of 1 id), retention N = 8. "a" (22 tokens, chunks 5,
    5, 5, 7) leaves checkpoints at 8, 16 and 20 (its replay boundary), 10 ids in all, then
    is freed; f (4 tokens: 1 full block + its live extent) takes 2 of the free ids. "b"
    shares a's first 14 tokens: the full group serves 12, the state group 8, so the hit is
    8 with junction 12. b's first 9 tokens (8..17) need 5 - 2 = 3 full blocks, the 3 free
    hit blocks (touched), and for the state group the live extent and checkpoints 12 and 16:
    9 ids. Free: num_blocks - 1 - 2, so 9 fit with 12 blocks, 8 do not."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=num_blocks), retention_interval=8)
    A = prompt(100, 22)
    a = Request("a", A)
    hit = kv.lookup(a)
    for n in (5, 5, 5, 7):
        assert kv.allocate(a, n, hit if a.num_computed_tokens == 0 else None) is not None
        a.num_computed_tokens += n
    kv.free(a)
    f = Request("f", prompt(900, 4))
    assert kv.allocate(f, 4, kv.lookup(f)) is not None
    b = Request("b", A[:14] + prompt(500, 10))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (8, 12)
    assert kv.num_free_blocks == num_blocks - 3
    assert kv.export_positions(b, 9, hit) == [12, 16]
    assert (kv.allocate(b, 9, hit) is not None) == fits
    kv.check_integrity()


def test_a_step_caches_its_pending_block_before_it_pops_and_evicts() -> None:
    """coordinator: _release — a running request's commit first caches the ends its last step
    left pending (``n >= quiet_until``: exactly at the threshold too), then pops the new
    blocks (the commit's documented order; vLLM's ``update_from_output`` likewise caches a
    spec-decode request's finished blocks before the next step allocates).

    Full (bs 4), MTP (hash lookahead: a block's hash needs the token after it), 3 usable
    blocks. "a" (5 tokens) is freed with block 0 cached. r (8 tokens, no lookahead slots)
    takes the 2 other blocks; its block 1 cannot be hashed yet (token 8 unknown). With
    token 8 appended, r's next token needs a third block: the commit stores block 1 (tokens
    304..307), then the pop evicts a's cached block: events Stored, then Removed."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), spec_decode=SpecDecode("mtp", 1),
                        enable_events=True)
    a = Request("a", prompt(100, 5))
    admit(kv, a, 5, num_lookahead_tokens=0)
    kv.free(a)
    r = Request("r", prompt(300, 8))
    admit(kv, r, 8, num_lookahead_tokens=0)
    assert kv.num_free_blocks == 1
    kv.take_events()
    r.append_tokens([400])
    assert kv.allocate(r, 1, num_lookahead_tokens=0) is not None
    events = kv.take_events()
    assert [type(e) for e in events] == [BlockStored, BlockRemoved]
    assert list(events[0].token_ids) == prompt(304, 4)
    kv.check_integrity()


def test_the_decode_fast_path_stops_at_the_nearest_window_release() -> None:
    """coordinator: _slide_until — the threshold below which no block leaves a window is the
    smallest over all window groups (the first group's alone lets a quiet step skip the
    second group's release).

    Sliding (bs 4, W 16) + sliding (bs 4, W 7), dense retention (no hold). r (20 tokens) is
    admitted with 9 tokens (3 blocks per group), steps to 10. At 10 computed the W 7 window
    skips 10 - 7 + 1 = 4 tokens (its block 0 leaves) while the W 16 one skips none: the step
    10 → 11 needs no block and caches nothing, but it must release group 1's block 0."""
    kv = KVCacheManager(config(SWA(4, 16), SWA(4, 7), num_blocks=20), retention_interval=None)
    r = Request("r", prompt(100, 20))
    admit(kv, r, 9)
    assert kv.allocate(r, 1) is not None
    r.num_computed_tokens = 10
    assert [t[0] != 0 for t in kv.block_ids(r)] == [True, True]
    free = kv.num_free_blocks
    assert kv.allocate(r, 1) == [[], []]
    assert [t[0] != 0 for t in kv.block_ids(r)] == [True, False]
    assert kv.num_free_blocks == free + 1
    kv.check_integrity()


CHUNKED8 = ChunkedLocal(block_size=4, num_kv_heads=1, head_dim=8, chunk_size=8)


@pytest.mark.parametrize("specs", [(FA(4), CHUNKED8), (FA(4), CHUNKED8, SWA(4, 32))],
                         ids=["chunked", "chunked+sliding"])
def test_the_decode_fast_path_threshold_counts_the_hold(specs) -> None:
    """coordinator: _slide_until — each window's next release is computed with the hold (the
    alignment unit a default-mode window keeps for the final-length promise); without it a
    chunked window's threshold comes out too late and a quiet step skips the release (with
    one window group or with several).

    Full (bs 4) + chunked local (bs 4, chunk 8) [+ sliding (bs 4, W 32), which releases
    nothing here],
    default mode, retention 0: hold 4. r (30 tokens: promised ends 24 and 28 only) is
    admitted with 10 tokens + 6 lookahead slots (4 blocks), then steps one token at a time.
    The chunk [0, 8) leaves once 8 tokens lie below computed - hold, i.e. at 12 computed:
    the step 12 → 13 must release blocks 0 and 1 (with the hold dropped, the next release
    would be computed as 16)."""
    kv = KVCacheManager(config(*specs, num_blocks=40))
    r = Request("r", prompt(100, 30))
    admit(kv, r, 10, num_lookahead_tokens=6)
    for computed, kept in ((10, True), (11, True), (12, False)):
        assert kv.allocate(r, 1, num_lookahead_tokens=0) == [[]] * len(specs)
        r.num_computed_tokens = computed + 1
        assert (kv.block_ids(r)[1][:2] != [0, 0]) == kept
    kv.check_integrity()


def test_a_default_mode_eagle_hit_end_is_not_cached_again() -> None:
    """coordinator: commit — in default mode a new request adopting a hit of h tokens starts
    its write path at ``done_t = h`` (the hit's end was processed by the request that cached
    it); ``h - cache_delay`` or ``h - 1`` would cache the hit's end again, storing the
    request's copy of its proof block one end early.

    Default mode, one full group (bs 4), EAGLE-3 without hash lookahead (drop mode: an end t
    is cached with the proof block after it, once t + 4 tokens are computed). "a" (17
    tokens) caches 4 blocks. "b" shares a's first 13 tokens: the match is 12 and the hit 8
    (its proof block 2 is cached). b's step to 12 stores nothing; its step to 16 reaches end
    12 and stores blocks 2 and 3 (tokens 108..111 and 112, 500..502)."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), enable_events=True,
                        spec_decode=SpecDecode("eagle3", 3, hash_lookahead=False))
    A = prompt(100, 17)
    a = Request("a", A)
    admit(kv, a, 17, num_lookahead_tokens=0)
    b = Request("b", A[:13] + prompt(500, 7))
    hit = kv.lookup(b)
    assert hit.num_tokens == 8
    kv.take_events()
    assert kv.allocate(b, 4, hit, num_lookahead_tokens=0) is not None
    b.num_computed_tokens = 12
    assert kv.take_events() == []
    assert kv.allocate(b, 4, num_lookahead_tokens=0) is not None
    b.num_computed_tokens = 16
    stored = [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)]
    assert stored == [A[8:13] + prompt(500, 3)]
    kv.check_integrity()


@pytest.mark.parametrize("priority, hits", [(100, (4, 0)), (0, (0, 4))])
def test_a_block_leaving_the_window_keeps_its_retention_marks(priority, hits) -> None:
    """coordinator: _release — a block that leaves the window of a request carrying a
    retention config gets the request's marks before it is freed (the ``priority`` policy
    then evicts by them); without them it would go in LRU order.

    One sliding group (bs 4, W 5), dense retention (no hold), ``priority`` eviction, 4
    usable blocks. r (16 tokens) marks tokens 0..3 with ``priority``; at 8 computed its
    step to 12 releases block 0 (cached). y (4 tokens) is then served and freed (a cached
    block, default priority, freed later). z needs one block with none fresh left: it
    evicts y's block if r's block is pinned (100), else r's older, lower-priority one. A
    lookup of r's first 4 tokens (+1) then hits 4 or 0, one of y's the other way round."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=5), eviction_policy="priority",
                        retention_interval=None)
    r = Request("r", prompt(100, 16), retention=RetentionConfig((TokenRange(0, 4, priority),)))
    admit(kv, r, 8)
    assert kv.allocate(r, 4) is not None
    r.num_computed_tokens = 12
    assert kv.block_ids(r)[0][0] == 0
    y = Request("y", prompt(700, 4))
    admit(kv, y, 4)
    kv.free(y)
    z = Request("z", prompt(900, 3))
    assert kv.allocate(z, 3, kv.lookup(z)) is not None
    assert (kv.lookup(Request("q", prompt(100, 5))).num_tokens,
            kv.lookup(Request("q2", prompt(700, 5))).num_tokens) == hits
    kv.check_integrity()


def test_a_decode_step_at_max_model_len_with_lookahead_slots() -> None:
    """coordinator: allocate — the cache-only fast path caps the step's slots at
    max_model_len too (``slots = len_cap``; ``None`` crashes the comparison).

    Full (bs 4), EAGLE with 2 speculative tokens (2 lookahead slots), max_model_len 20. r
    (18-token prompt) takes 5 blocks (min(18 + 2, 20) = 20 slots) and caches 16 tokens; its
    next end (20) makes cache() wait until 20 tokens. The decode step to 19 is quiet; the
    step to 20 reaches that threshold, so it goes through the coordinator's cache-only path:
    no new block (20 + 2 slots capped at 20)."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), spec_decode=SpecDecode("eagle", 2),
                        max_model_len=20)
    r = Request("r", prompt(100, 18))
    got = kv.allocate(r, 18, kv.lookup(r))
    assert got is not None and len(got[0]) == 5
    r.num_computed_tokens = 18
    for t in (18, 19):
        r.append_tokens([500 + t])
        assert kv.allocate(r, 1) == [[]]
        r.num_computed_tokens += 1
    assert len(kv.block_ids(r)[0]) == 5
    kv.check_integrity()


@pytest.mark.parametrize("compat, retention, kept_at_12",
                         [(True, 0, False), (False, 0, True), (False, None, True)])
def test_only_default_mode_windows_keep_a_hold(compat, retention, kept_at_12) -> None:
    """coordinator: __init__ — the hold (tokens a window keeps past its edge) is 0 in compat
    mode, as in vLLM, even for a drafter's proof block; in default mode it is the proof
    block (drop mode), and at least one alignment unit with sparse retention.

    One sliding group (bs 4, W 5), EAGLE without hash lookahead (drop mode: the group
    carries the proof; alignment 4). r (20 tokens) steps 8, 4, 4. At 8 computed vLLM skips
    8 - 5 + 1 = 4 tokens (block 0 leaves at the step from 8); with a hold of 4 the skip
    reaches 4 tokens at 12 computed (block 0 leaves at the step from 12)."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=30), vllm_compat=compat,
                        retention_interval=retention,
                        spec_decode=SpecDecode("eagle", 1, hash_lookahead=False))
    r = Request("r", prompt(100, 20))
    admit(kv, r, 8, num_lookahead_tokens=0)
    assert kv.allocate(r, 4, num_lookahead_tokens=0) is not None
    r.num_computed_tokens = 12
    assert (kv.block_ids(r)[0][0] != 0) == kept_at_12
    assert kv.allocate(r, 4, num_lookahead_tokens=0) is not None
    r.num_computed_tokens = 16
    assert kv.block_ids(r)[0][0] == 0
    kv.check_integrity()


def test_a_full_group_caches_every_block_whatever_the_window_retention() -> None:
    """coordinator: __init__ — a downward-closed (full-attention) group uses the dense write
    path (every aligned end) even with sparse retention (``retention.dense or
    downward_closed``; ``and`` would cache only the promised ends).

    Full (bs 4), retention 0 (promised ends: the replay boundaries 12 and 8 of a 13-token
    prompt, and the final length at free). "a" decodes to 20 tokens, still running: its
    blocks 3 and 4 (ends 16, 20) are cached, so a request sharing a's first 17 tokens hits
    16."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), retention_interval=0)
    a = Request("a", prompt(100, 13))
    admit(kv, a, 13)
    for t in range(7):
        a.append_tokens([500 + t])
        assert kv.allocate(a, 1) is not None
        a.num_computed_tokens += 1
    probe = Request("b", list(a.token_ids)[:17] + [1, 2])
    assert kv.lookup(probe).num_tokens == 16
    kv.check_integrity()


def test_compat_sliding_group_caches_each_reachable_block_when_it_fills() -> None:
    """coordinator: __init__ — in compat mode with sparse retention a window group writes
    vLLM's per-block mask (``masked``: compat, not dense, a window), so each block a
    promised end will read is cached in the step that fills it, not when the end is reached.

    Compat, one sliding group (bs 4, W 8), retention 0: r (13 tokens) has the replay
    boundary 12, whose window run is blocks 1 and 2 (cdiv(7, 4) = 2 blocks before 12). Its
    first 8 tokens fill blocks 0 and 1: vLLM's mask caches block 1 now (tokens 104..107);
    the next 4 fill block 2 (tokens 108..111)."""
    kv = KVCacheManager(config(SWA(4, 8), num_blocks=30), vllm_compat=True, retention_interval=0,
                        enable_events=True)
    r = Request("r", prompt(100, 13))
    want = [[prompt(104, 4)], [prompt(108, 4)]]
    for i, n in enumerate((8, 4)):
        assert kv.allocate(r, n, kv.lookup(r) if i == 0 else None) is not None
        r.num_computed_tokens += n
        stored = [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)]
        assert stored == want[i]
    kv.check_integrity()


def test_an_external_load_commits_without_an_event_listener() -> None:
    """coordinator: __init__ — ``on_adopted`` is None until the manager enables events (a
    placeholder other than None would be called when a load is committed and crash).

    Full (bs 4), events disabled. A tier holds every block hash; q (9 tokens, nothing local)
    loads 8 tokens (2 blocks) and commits the load: the loaded blocks are cached, so another
    request with the same prompt then hits 8 locally."""
    kv = KVCacheManager(config(FA(4), num_blocks=20))
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    ext = kv.lookup_external(q, hit, lambda g, h: True)
    assert ext is not None and ext.num_tokens == 8
    assert kv.allocate(q, 0, hit, external=ext) is not None
    kv.commit_external(q, ext, True)
    assert kv.lookup(Request("p", prompt(100, 9))).num_tokens == 8
    kv.check_integrity()


def test_compat_hybrid_caches_each_group_up_to_the_aligned_prefix() -> None:
    """coordinator: __init__ — compat mode with two or more groups uses vLLM's hybrid
    coordinator limit (``get_num_cacheable_tokens``: a group caches only up to align(n),
    the alignment being the groups' LCM block size); one group alone caches all n.

    Compat, full (bs 4) + sliding (bs 8, W 16): alignment 8. r's first 12 tokens: align(12)
    = 8, so each group stores its blocks for tokens 0..7 only (the full group's block 2,
    tokens 8..11, waits for the next aligned prefix)."""
    kv = KVCacheManager(config(FA(4), SWA(8, 16), num_blocks=30), vllm_compat=True,
                        enable_events=True)
    r = Request("r", prompt(100, 20))
    assert kv.allocate(r, 12, kv.lookup(r)) is not None
    stored = [(e.group_idx, list(e.token_ids)) for e in kv.take_events()
              if isinstance(e, BlockStored)]
    assert stored == [(0, prompt(100, 8)), (1, prompt(100, 8))]
    kv.check_integrity()


def test_a_decode_step_whose_lookahead_slots_need_a_block_is_not_quiet() -> None:
    """coordinator: step_is_quiet — the fast path's slot count includes the lookahead slots
    (``computed + new + lookahead``): a step whose draft slots cross into a block the table
    lacks must allocate it.

    Full (bs 4), EAGLE with 2 speculative tokens (2 lookahead slots). r (5-token prompt)
    takes 2 blocks (7 slots) and steps to 6 (no new block). The step 6 → 7 needs 7 + 2 = 9
    slots: a third block."""
    kv = KVCacheManager(config(FA(4), num_blocks=20), spec_decode=SpecDecode("eagle", 2))
    r = Request("r", prompt(100, 5))
    admit(kv, r, 5)
    r.append_tokens([7])
    assert kv.allocate(r, 1) == [[]]
    r.num_computed_tokens = 6
    r.append_tokens([8])
    got = kv.allocate(r, 1)
    assert got is not None and len(got[0]) == 1
    assert len(kv.block_ids(r)[0]) == 3
    kv.check_integrity()


def test_compat_eagle_groups_are_not_clamped_to_the_aligned_prefix() -> None:
    """coordinator: __init__ — in compat mode vLLM's hybrid limit clamps only the groups
    without proof to align(n); an EAGLE group caches up to min(n, align(n) + block_size)
    (``aligned_limit = hybrid and not proof``; clamping the EAGLE groups too would make the
    decode fast path wait for the next aligned prefix).

    Compat, full (bs 4) + full (bs 8), EAGLE-3 without hash lookahead (both groups carry
    the proof: an end is cached with the block after it). Alignment 8. r (5-token prompt)
    decodes one token at a time to 16. Group 0 caches up to min(n, align(n) + 4) tokens:
    at 8 its blocks 0-1 (end 4 and its proof block), at 12 block 2, at 16 block 3; group 1
    (bs 8) caches blocks 0-1 at 16."""
    kv = KVCacheManager(config(FA(4), FA(8), num_blocks=40), vllm_compat=True,
                        enable_events=True,
                        spec_decode=SpecDecode("eagle3", 3, hash_lookahead=False))
    r = Request("r", prompt(100, 5))
    admit(kv, r, 5, num_lookahead_tokens=0)
    stored = {}
    for t in range(5, 16):
        r.append_tokens([200 + t])
        assert kv.allocate(r, 1, num_lookahead_tokens=0) is not None
        r.num_computed_tokens += 1
        ev = [(e.group_idx, len(e.token_ids)) for e in kv.take_events()
              if isinstance(e, BlockStored)]
        if ev:
            stored[r.num_computed_tokens] = ev
    assert stored == {8: [(0, 8)], 12: [(0, 4)], 16: [(0, 4), (1, 16)]}
    kv.check_integrity()


def test_an_empty_cache_reports_no_junction_whatever_the_group_order() -> None:
    """coordinator: __init__ — lookup units are ordered full attention first (``sorted`` by
    ``not downward_closed``): a chunked group alone answers a chunk boundary from an empty
    cache (it needs no block before a boundary), which must not become a junction.

    Chunked local (bs 4, chunk 12) listed before full attention (bs 4), nothing cached: a
    30-token request hits 0 with no shared-prefix boundary (nothing is cached anywhere)."""
    chunked = ChunkedLocal(block_size=4, num_kv_heads=1, head_dim=8, chunk_size=12)
    kv = KVCacheManager(config(chunked, FA(4), num_blocks=40))
    hit = kv.lookup(Request("r", prompt(100, 30)))
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 0)


def test_the_first_step_after_admission_releases_the_hit_checkpoint() -> None:
    """coordinator: commit — only a running request's commit sets its window threshold
    (``slide_until``); a new request keeps 0, so its next step is planned (with the
    threshold set at admission, a quiet step would keep the adopted checkpoint).

    Full (bs 4) + state (bs 4, extents of 1 id), dense retention (no hold): a state group
    keeps only the checkpoint its live state starts from. "a" (21 tokens, steps 8, 8, 5) is
    freed; "b" shares a's first 17 tokens: hit 16 (checkpoint 16, entry 3). b computes 1
    token (to 17); its next token needs no block and caches nothing, but at 17 computed the
    checkpoint at 16 is no longer needed: that step releases it (table entry 3 null, one
    more free block)."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=60), retention_interval=None)
    A = prompt(100, 21)
    a = Request("a", A)
    hit = kv.lookup(a)
    for i, n in enumerate((8, 8, 5)):
        assert kv.allocate(a, n, hit if i == 0 else None) is not None
        a.num_computed_tokens += n
    kv.free(a)
    b = Request("b", A[:17] + prompt(500, 10))
    admit(kv, b, 1, expect_hit=16)
    assert kv.block_ids(b)[1][3] != 0
    free = kv.num_free_blocks
    assert kv.allocate(b, 1) == [[], []]
    assert kv.block_ids(b)[1][3] == 0 and kv.num_free_blocks == free + 1
    kv.check_integrity()


def _refused_hit_on_the_only_free_blocks() -> tuple[KVCacheManager, Request, CacheHit]:
    """Full (bs 4), 4 usable blocks. "a" (9 tokens) caches blocks X0, X1 and is freed; f (8
    tokens) takes the 2 uncached free blocks, so X0 and X1 are the only free ones. r (a's
    prompt) looks up a hit of 8 (X0, X1); its first allocation, 1 token with that hit (1 new
    block + 2 touched > 2 free), is refused. Returns ``(kv, r, hit)``."""
    kv = KVCacheManager(config(FA(4), num_blocks=5))
    a = Request("a", prompt(100, 9))
    admit(kv, a, 9)
    kv.free(a)
    f = Request("f", prompt(900, 8))
    assert kv.allocate(f, 8, kv.lookup(f)) is not None
    r = Request("r", prompt(100, 9))
    hit = kv.lookup(r)
    assert hit.num_tokens == 8 and kv.num_free_blocks == 2
    assert kv.allocate(r, 1, hit) is None
    return kv, r, hit


def test_the_free_hit_blocks_are_counted_for_the_hit_given() -> None:
    """coordinator: _evictable_counts — the count of free hit blocks a touch takes is
    memoized per request only for the same hit (``memo[0] is hit.block_ids``): another hit
    for the same waiting request is counted afresh.

    Full (bs 4), 4 usable blocks. "a" (9 tokens) caches blocks X0, X1 and is freed; f (8
    tokens) takes the 2 uncached free blocks, so X0 and X1 are the only free ones. r (a's
    prompt) looked up hits 8: 1 new block + 2 touched = 3 > 2 free, refused. A hand-made
    hit of 4 tokens (X0 only, verified) for 1 token: 1 new block + 1 touched = 2, fits."""
    kv, r, hit = _refused_hit_on_the_only_free_blocks()
    small = CacheHit(4, (hit.block_ids[0][:1],))
    got = kv.allocate(r, 1, small)
    assert got is not None and kv.block_ids(r)[0][0] == hit.block_ids[0][0]
    kv.check_integrity()


@pytest.mark.parametrize("priority, hits", [(100, (4, 0)), (0, (0, 4))])
def test_a_freed_request_gives_its_blocks_its_retention_marks(priority, hits) -> None:
    """coordinator: free — every table of a request carrying a retention config gives its
    blocks the request's marks when it is freed (the ``priority`` policy then evicts by
    them).

    Full (bs 4), ``priority`` eviction, 3 usable blocks. r (5 tokens) marks tokens 0..3
    with ``priority`` and is freed (block 0 cached). y (4 tokens) is then served and freed
    (default priority, freed later); r's scratch block went back too. z (8 tokens) needs 2
    blocks: the scratch one and one cached block, y's if r's is pinned (100), else r's
    older, lower-priority one. Lookups of r's and y's prompts (+1) then hit 4 or 0."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), eviction_policy="priority")
    r = Request("r", prompt(100, 5), retention=RetentionConfig((TokenRange(0, 4, priority),)))
    admit(kv, r, 5)
    kv.free(r)
    y = Request("y", prompt(700, 4))
    admit(kv, y, 4)
    kv.free(y)
    z = Request("z", prompt(900, 8))
    assert kv.allocate(z, 8, kv.lookup(z)) is not None
    assert (kv.lookup(Request("q", prompt(100, 5))).num_tokens,
            kv.lookup(Request("q2", prompt(700, 5))).num_tokens) == hits
    kv.check_integrity()


def test_compat_free_caches_nothing() -> None:
    """coordinator: free — only default mode caches at free (the final-length promise); in
    compat mode, as vLLM's ``free``, freeing only releases blocks (``caching and not
    compat``).

    Compat, full (bs 4), EAGLE with hash lookahead (a block's hash needs the token after
    it). r (8-token prompt) computes 8 tokens: block 0 is stored, block 1 cannot be hashed
    yet. Its next token is appended (block 1 now hashable) and r is freed: nothing is
    stored at free."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), vllm_compat=True, enable_events=True,
                        spec_decode=SpecDecode("eagle", 1))
    r = Request("r", prompt(100, 8))
    admit(kv, r, 8)
    assert [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)] == \
        [prompt(100, 4)]
    r.append_tokens([500])
    kv.free(r)
    assert [e for e in kv.take_events() if isinstance(e, BlockStored)] == []
    kv.check_integrity()


def test_default_mode_caches_every_group_at_aligned_ends() -> None:
    """coordinator: __init__ — in default mode the dense write path steps by the alignment
    for every group (only compat full groups end on any block boundary), so an end is
    cached for all groups at once, at a multiple of the alignment.

    Default mode, dense retention, full (bs 4) + sliding (bs 6, W 12): alignment 12. At 9
    computed tokens the groups' common limit is 6 (the sliding group's full blocks): no
    aligned end is reached, nothing is stored (a block-size step would store the full
    group's block 0 and the sliding group's run for 6). At 13 the aligned end 12 is
    stored for both groups."""
    kv = KVCacheManager(config(FA(4), SWA(6, 12), num_blocks=30), retention_interval=None,
                        enable_events=True)
    r = Request("r", prompt(100, 30))
    want = [[], [(0, prompt(100, 12)), (1, prompt(100, 12))]]
    for i, n in enumerate((9, 4)):
        assert kv.allocate(r, n, kv.lookup(r) if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert [(e.group_idx, list(e.token_ids)) for e in kv.take_events()
                if isinstance(e, BlockStored)] == want[i]
    kv.check_integrity()


def test_compat_state_admission_that_reserves_nothing_fits_the_free_blocks_exactly() -> None:
    """coordinator: _plan_states — in compat mode the reservation is ``max(0, want + freed -
    needed)``: when vLLM's full-sequence count is no more than the step's own blocks it
    adds nothing (``max(1, ...)`` would ask for a block more).

    Compat, full (bs 4) + state (bs 4, extents of 1 id), 4 usable blocks. f (4 tokens)
    takes 2 (1 full block + its live extent). r (4 tokens) with the full-sequence
    reservation needs 1 full block + its live extent = 2; vLLM's count is cdiv(4, 4) +
    min(cdiv(4, 4), 2) = 2: nothing reserved beyond, so it fits the 2 free blocks."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=5), vllm_compat=True)
    f = Request("f", prompt(900, 4))
    assert kv.allocate(f, 4, kv.lookup(f)) is not None
    assert kv.num_free_blocks == 2
    r = Request("r", prompt(100, 4))
    assert kv.allocate(r, 4, kv.lookup(r), full_sequence_must_fit=True) is not None
    assert kv.num_free_blocks == 0
    kv.check_integrity()


def test_a_waiting_request_recounts_its_hit_once_another_request_holds_it() -> None:
    """coordinator: _evictable_counts — the touched-block memo is used only while no cached
    block entered or left the free queue (``memo[1] == version``): once another request
    holds the hit's blocks, touching them takes nothing out of the free queue.

    Full (bs 4), 4 usable blocks. "a" (9 tokens) caches X0, X1 and is freed; f (8 tokens)
    takes the 2 uncached free blocks, so X0 and X1 are the only free ones. r (a's prompt,
    hit 8) asks for 1 token: 1 new + 2 touched > 2 free, refused. q (a's prompt) adopts its
    hit with 0 new tokens (2 touched: fits), so q holds X0 and X1 and nothing is free. r's
    hit with 0 new tokens now touches no free block: 0 needed, it fits and shares q's
    blocks."""
    kv, r, hit = _refused_hit_on_the_only_free_blocks()
    q = Request("q", prompt(100, 9))
    assert kv.allocate(q, 0, kv.lookup(q)) is not None
    assert kv.num_free_blocks == 0
    assert kv.allocate(r, 0, hit) is not None
    assert kv.block_ids(r) == kv.block_ids(q)
    kv.check_integrity()


def test_a_quiet_step_never_reaches_the_next_checkpoint() -> None:
    """coordinator: commit — with state groups the fast path's slot bound is lowered to one
    token below the next checkpoint (``slots = nxt - 1`` when ``nxt - 1 < slots``): the step
    that reaches a checkpoint position is planned, so its extent is allocated and exported.

    Full (bs 4) + state (bs 4, extents of 1 id), retention N = 8, EAGLE without hash
    lookahead (drop mode: an end is cached 4 tokens after it, so the cache pass alone would
    let the step to 8 be quiet). r (20 tokens) is admitted with 5 tokens + 3 lookahead slots
    (tables cover 8), then steps one token at a time without lookahead: the step 7 → 8
    allocates the checkpoint extent for 8 and exports it."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=60), retention_interval=8,
                        spec_decode=SpecDecode("eagle", 1, hash_lookahead=False))
    r = Request("r", prompt(100, 20))
    admit(kv, r, 5, num_lookahead_tokens=3)
    for t in (5, 6):
        assert kv.allocate(r, 1, num_lookahead_tokens=0) == [[], []]
        r.num_computed_tokens += 1
    got = kv.allocate(r, 1, num_lookahead_tokens=0)
    assert got is not None and got[0] == [] and len(got[1]) == 1
    assert [e.position for e in kv.state_blocks(r)[0].exports] == [8]
    kv.check_integrity()
