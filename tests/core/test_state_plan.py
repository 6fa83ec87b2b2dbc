"""Tests that kill the mutants mutmut found surviving in ``src/hybridkv/core/coordinator.py``
(TESTING.md, "Mutation testing"; the pool's are in ``test_mutants.py``).

Each test names the mutant(s) it guards (``function — the change``). They use only the public
API (``KVCacheManager``, ``Request``, the specs/config, ``lookup`` / ``allocate`` / ``free`` /
``block_ids`` / ``state_blocks`` / ``export_positions`` / ``take_events`` / ``stats`` /
``check_integrity``, ``lookup_external`` / ``commit_external``); expectations are derived by
hand in the docstrings. All are deterministic and fast (mutmut runs them for every mutant).
"""

from __future__ import annotations

import pytest

from hybridkv import BlockStored, KVCacheManager, Request, StateSpec
from tests.support.helpers import FA, SWA, config, prompt
from tests.support.helpers import ST_K2, STATE4


# ---- export_positions -----------------------------------------------------------------------

def _state_manager_with_a_served() -> tuple[KVCacheManager, list[int]]:
    """Full (bs 4) + state (bs 4), retention N = 8: "a" (22 tokens, chunks 5, 5, 5, 7)
    leaves checkpoints at 8 and 16 (multiples of N) and 20 (its replay boundary (22-1)//4*4)."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=200), retention_interval=8)
    A = prompt(100, 22)
    a = Request("a", A)
    hit = kv.lookup(a)
    want = [[], [8], [], [16, 20]]
    for n, w in zip((5, 5, 5, 7), want):
        first = hit if a.num_computed_tokens == 0 else None
        assert kv.export_positions(a, n, first) == w
        assert kv.allocate(a, n, first) is not None
        assert [e.position for e in kv.state_blocks(a)[0].exports] == w
        a.num_computed_tokens += n
    kv.free(a)
    return kv, A


def _last_step_fits(kv: KVCacheManager, r: Request, steps) -> bool:
    """Allocate ``steps`` (token counts) for ``r``, its lookup's hit with the first; every step
    but the last must succeed; the last asks the full sequence to fit (vLLM's admission
    reservation). Whether it did, with the manager's integrity checked after."""
    hit = kv.lookup(r)
    for i, n in enumerate(steps):
        last = i == len(steps) - 1
        got = kv.allocate(r, n, hit if i == 0 else None, full_sequence_must_fit=last)
        if last:
            kv.check_integrity()
            return got is not None
        assert got is not None
        r.num_computed_tokens += n
    raise AssertionError("no steps")


@pytest.mark.parametrize("chunks, want", [((5, 8, 8), ([12], [16, 20], [24])),
                                          ((3, 5, 8), ([], [12, 16], [20, 24]))])
def test_export_positions_predict_every_allocation_after_a_junction_hit(chunks, want) -> None:
    """coordinator: export_positions — the hit's tokens not added to (or subtracted from) the
    computed count, the hit not passed on, or a running request's state ignored (its
    promised junction forgotten): the prediction must equal the exports the allocation asks.

    "b" shares a's first 14 tokens (24 tokens): the full group serves 12, the state group
    only 8 (its checkpoints are 8, 16, 20), so the hit is 8 with junction 12. b's promised
    ends: multiples of 8, the junction 12 (and 12 - 4 = 8), its replay boundary 20 (and 16).
    Chunks 5, 8, 8 from 8: (8, 13] → 12, (13, 21] → 16, 20, (21, 29] ∩ ≤ 24 → 24. Chunks 3, 5,
    8: (8, 11] → none, (11, 16] → 12, 16 (the junction in a running request's step), then 20, 24."""
    kv, A = _state_manager_with_a_served()
    b = Request("b", A[:14] + prompt(500, 10))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (8, 12)
    b.num_computed_tokens = 0
    for i, (n, w) in enumerate(zip(chunks, want)):
        first = hit if i == 0 else None
        assert kv.export_positions(b, n, first) == w
        assert kv.allocate(b, n, first) is not None
        assert [e.position for e in kv.state_blocks(b)[0].exports] == w
        b.num_computed_tokens = (hit.num_tokens if i == 0 else b.num_computed_tokens) + n
        kv.check_integrity()


# ---- compat admission (vLLM 0.33's full_sequence_must_fit count) ----------------------------

@pytest.mark.parametrize("num_blocks, fits", [(11, True), (10, False)])
def test_compat_admission_of_a_running_request_sums_every_group(num_blocks, fits) -> None:
    """coordinator: _vllm_admission_blocks — a running request's count per group
    ``cdiv(num_tokens, bs) - len(table)`` (``held`` lost, ``+=`` → ``=`` / ``-=``, ``- held`` →
    ``+ held``, ``continue`` → ``break``: only the first or last group counted).

    Compat mode, two full groups (bs 4). r (20 tokens) computed 8: 2 blocks per group. A
    4-token step with the full-sequence reservation needs cdiv(20, 4) - 2 = 3 blocks per group,
    6 in all, free before the step: 10 usable - 4 held = 6 fits, 9 - 4 = 5 does not."""
    kv = KVCacheManager(config(FA(4), FA(4), num_blocks=num_blocks), vllm_compat=True)
    r = Request("r", prompt(100, 20))
    assert kv.allocate(r, 8, kv.lookup(r)) is not None
    r.num_computed_tokens = 8
    assert kv.num_free_blocks == num_blocks - 1 - 4
    got = kv.allocate(r, 4, full_sequence_must_fit=True)
    assert (got is not None) == fits
    assert [len(t) for t in kv.block_ids(r)] == ([3, 3] if fits else [2, 2])
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(11, True), (10, False)])
def test_compat_admission_of_a_new_request_without_a_hit(num_blocks, fits) -> None:
    """coordinator: _vllm_admission_blocks — ``hit.block_ids`` read without a hit
    (``hit is not None`` → always true): a new request allocated with ``hit=None``.

    Compat mode, two full groups (bs 4), r of 20 tokens, first step of 8 with the reservation:
    cdiv(20, 4) = 5 blocks per group, 10 in all: 10 usable fits, 9 does not."""
    kv = KVCacheManager(config(FA(4), FA(4), num_blocks=num_blocks), vllm_compat=True)
    r = Request("r", prompt(100, 20))
    got = kv.allocate(r, 8, None, full_sequence_must_fit=True)
    assert (got is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("filler, fits", [(False, True), (True, False)])
def test_compat_admission_counts_the_last_new_block_and_the_touched_hit_blocks(filler, fits) -> None:
    """coordinator: _vllm_admission_blocks — ``new > 0`` → ``new > 1`` (one missing block not
    counted) and ``total += touched[g]`` → ``-=`` (the free hit blocks a touch takes).

    Compat, one full group (bs 4), 3 usable blocks. "a" (9 tokens) caches 2 blocks and is
    freed: 3 free (2 cached, 1 scratch). q (12 tokens) shares a's 8: hit 8 (2 blocks, both
    free). Admitting q with 0 new tokens takes the 2 hit blocks; vLLM's count is cdiv(12, 4)
    - 2 = 1 new block + 2 touched = 3, so it fits 3 free blocks, not 2 (a filler request holds
    the scratch block)."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), vllm_compat=True)
    P = prompt(100, 9)
    a = Request("a", P)
    assert kv.allocate(a, 9, kv.lookup(a)) is not None
    a.num_computed_tokens = 9
    kv.free(a)
    if filler:
        f = Request("f", prompt(700, 3))
        assert kv.allocate(f, 3, kv.lookup(f)) is not None
    q = Request("q", P[:8] + prompt(300, 4))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8
    assert kv.num_free_blocks == (2 if filler else 3)
    got = kv.allocate(q, 0, hit, full_sequence_must_fit=True)
    assert (got is not None) == fits
    kv.check_integrity()


# ---- state_blocks ---------------------------------------------------------------------------

def test_state_blocks_forget_the_restore_and_the_exports_once_computed() -> None:
    """coordinator: state_blocks — ``restore_position`` reported after the request moved past
    its hit (``st.restore_at if restore`` → always), an export at exactly the computed count
    still listed (``t > computed`` → ``>=``), the unknown-request error without its id.

    After a's checkpoints (8, 16, 20), "b" (a's first 17 tokens + 7) hits 16. Its first
    allocation of 4 tokens (16..20) restores from the checkpoint at 16 and exports 20. Before
    the step: restore at 16, export 20 pending. After computing to 20: no restore (position 0,
    no blocks) and no pending export (20 is not > 20)."""
    kv, A = _state_manager_with_a_served()
    b = Request("b", A[:17] + prompt(500, 7))
    hit = kv.lookup(b)
    assert hit.num_tokens == 16
    assert kv.allocate(b, 4, hit) is not None
    b.num_computed_tokens = 16
    (sb,) = kv.state_blocks(b)
    assert (sb.restore_position, [e.position for e in sb.exports]) == (16, [20])
    assert sb.restore_from and sb.restore_from != sb.live
    b.num_computed_tokens = 20
    (sb,) = kv.state_blocks(b)
    assert (sb.restore_position, sb.restore_from, sb.exports) == (0, (), ())
    with pytest.raises(KeyError, match="'nobody' holds no blocks"):
        kv.state_blocks(Request("nobody", [1, 2, 3]))


def test_export_positions_of_a_new_request_start_at_token_one() -> None:
    """coordinator: _export_ends — a new request without a hit starts from ``done = 1``
    instead of 0: with block size 1 (alignment 1) and retention N = 1 every token is a
    promised end, so the first 3 tokens export 1, 2, 3 (as the allocation does)."""
    st1 = StateSpec(block_size=1, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                    state_dtype="float32")
    kv = KVCacheManager(config(FA(1), st1, num_blocks=400), retention_interval=1)
    r = Request("r", prompt(10, 6))
    assert kv.export_positions(r, 3) == [1, 2, 3]
    assert kv.allocate(r, 3, None) is not None
    assert [e.position for e in kv.state_blocks(r)[0].exports] == [1, 2, 3]


def test_compat_admission_caps_the_sequence_at_max_model_len() -> None:
    """coordinator: _vllm_admission_blocks — ``n = num_tokens if num_tokens < len_cap else
    max_model_len`` with the cap dropped: the documented count is ``cdiv(min(num_tokens,
    max_model_len), bs)``. max_model_len 8, bs 4, 3 usable blocks: a 20-token request's
    reservation is cdiv(8, 4) = 2 blocks (not 5), so its first 4 tokens are admitted."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), vllm_compat=True, max_model_len=8)
    r = Request("r", prompt(100, 20))
    got = kv.allocate(r, 4, kv.lookup(r), full_sequence_must_fit=True)
    assert got is not None and len(got[0]) == 1
    kv.check_integrity()


# ---- default-mode full-sequence reservation (plan's reserve_tokens) --------------------------

@pytest.mark.parametrize("use_hit", [True, False])
@pytest.mark.parametrize("num_blocks, fits", [(16, True), (15, False)])
def test_reservation_of_a_new_request_counts_each_groups_peak(num_blocks, fits, use_hit) -> None:
    """coordinator: plan — the default-mode reservation ``reserved += peak - held`` per group,
    ``held`` = the group's non-null hit blocks - released + new blocks.

    Full (bs 4) + sliding (bs 4, W 8), default mode (one held unit, A = 4): a 40-token
    sequence peaks at cdiv(40, 4) = 10 full blocks and min(10, cdiv(8 + 4, 4) + 2) = 5 sliding
    blocks. The first 8 tokens take 2 + 2 blocks and reserve 8 + 3 more: 15 free needed
    (with the lookup's empty hit or with ``hit=None``: the table read for a new request)."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks))
    r = Request("r", prompt(100, 40))
    got = kv.allocate(r, 8, kv.lookup(r) if use_hit else None, full_sequence_must_fit=True)
    assert (got is not None) == fits
    if fits:
        assert [len(x) for x in got] == [2, 2]
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(16, True), (15, False)])
def test_reservation_of_a_running_request_counts_its_table(num_blocks, fits) -> None:
    """coordinator: plan — the running request's ``held`` (its table's non-null blocks) in the
    default-mode reservation.

    Same config; r (40 tokens) takes 8 tokens without a reservation (2 + 2 blocks), then asks
    4 more with it: 1 + 1 new blocks (held 3 and 3), reserving 10 - 3 = 7 full and 5 - 3 = 2
    sliding blocks: 11 of the num_blocks - 1 - 4 free."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks))
    r = Request("r", prompt(100, 40))
    assert kv.allocate(r, 8, kv.lookup(r)) is not None
    r.num_computed_tokens = 8
    got = kv.allocate(r, 4, full_sequence_must_fit=True)
    assert (got is not None) == fits
    assert [len(t) for t in kv.block_ids(r)] == ([3, 3] if fits else [2, 2])
    kv.check_integrity()


@pytest.mark.parametrize("filler, fits", [(4, True), (8, False)])
def test_reservation_is_capped_at_max_model_len(filler, fits) -> None:
    """coordinator: plan — ``reserve_tokens = min(reserve_tokens, max_model_len)`` dropped or
    broken: the reserved sequence (num_tokens + lookahead) is capped at max_model_len.

    Full (bs 4), max_model_len 16, 5 usable blocks; a filler request holds 1 or 2 of them.
    r (16 tokens), first step of 4 tokens with 3 lookahead slots: cdiv(7, 4) = 2 blocks; the
    sequence 16 + 3 = 19 capped at 16 peaks at 4 blocks: 4 free needed (5 without the cap)."""
    kv = KVCacheManager(config(FA(4), num_blocks=6), max_model_len=16)
    f = Request("f", prompt(700, filler))
    assert kv.allocate(f, filler) is not None
    r = Request("r", prompt(100, 16))
    got = kv.allocate(r, 4, kv.lookup(r), num_lookahead_tokens=3, full_sequence_must_fit=True)
    assert (got is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(16, True), (15, False)])
def test_reservation_of_a_new_request_counts_its_hit_blocks(num_blocks, fits) -> None:
    """coordinator: plan — a new request's ``held`` counts its hit's non-null blocks
    (``hit.block_ids[g] if new_request and hit is not None``, mutated to the empty table).

    Full (bs 4) + sliding (bs 4, W 8), default mode. "a" (17 tokens) caches its ends 12 and 16;
    q (a's first 16 tokens + 24) hits 16: 4 full blocks and (null, null, b, b) in the sliding
    group (its window of 8 before 16). A first step to 24 tokens adds 2 + 2 blocks and touches
    the 6 free hit blocks; held 6 full and 4 sliding against peaks 10 and 5 reserves 4 + 1:
    10 + 5 = 15 free needed (all blocks are free)."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks))
    P = prompt(100, 17)
    a = Request("a", P)
    assert kv.allocate(a, 17, kv.lookup(a)) is not None
    a.num_computed_tokens = 17
    kv.free(a)
    q = Request("q", P[:16] + prompt(500, 24))
    hit = kv.lookup(q)
    assert hit.num_tokens == 16 and hit.block_ids[1][:2] == (0, 0) and 0 not in hit.block_ids[0]
    got = kv.allocate(q, 8, hit, full_sequence_must_fit=True)
    assert (got is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("steps", [(8, 16, 4), (8, 16, 4, 4)])
@pytest.mark.parametrize("num_blocks, fits", [(16, True), (15, False)])
def test_reservation_of_a_sliding_request_counts_released_and_null_entries(steps, num_blocks,
                                                                           fits) -> None:
    """coordinator: plan — ``held = non-null entries - released + new``: the window's released
    blocks added instead of subtracted, or the null entries counted as held.

    Full (bs 4) + sliding (bs 4, W 8, one held unit of 4). r (40 tokens) runs 8 and 16 tokens
    (6 + 6 blocks; num_blocks - 13 free). Step 3 (4 tokens, reserved) at 24 computed: the
    sliding group releases 3 blocks (tokens below 24 - 7 - 4 = 13) and adds 1: held 4 of peak 5;
    the full group holds 7 of 10: 2 new + 4 reserved <= free + 3 released iff num_blocks >= 16.
    Step 4 (reserved; step 3 without) at 28: the table has 3 nulls, 1 more block leaves, 1 is
    added: held 4 (reserve 1), full 8 (reserve 2): 2 + 3 <= free + 1, again iff >= 16."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks))
    r = Request("r", prompt(100, 40))
    assert _last_step_fits(kv, r, steps) == fits


@pytest.mark.parametrize("num_blocks, fits", [(21, True), (20, False)])
def test_compat_admission_of_a_new_request_with_a_sliding_group(num_blocks, fits) -> None:
    """coordinator: plan — the computed count given to vLLM's admission count (``None`` or the
    touched list in its place): a sliding group reads it for its out-of-window blocks.

    Compat, full (bs 4) + sliding (bs 4, W 8), no max_model_len nor max_in_flight_tokens (no
    cap): a 40-token request reserves cdiv(40, 4) = 10 blocks per group: 20 free needed."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks), vllm_compat=True)
    r = Request("r", prompt(100, 40))
    got = kv.allocate(r, 8, kv.lookup(r), full_sequence_must_fit=True)
    assert (got is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("filler, fits", [(4, True), (8, False)])
def test_compat_admission_below_the_steps_own_blocks_reserves_nothing(filler, fits) -> None:
    """coordinator: plan — ``reserved = max(0, want + freed - needed)``: a negative value is
    0, not None or 1. Compat, full (bs 4), 3 usable blocks, a filler holding 1 or 2. r (4
    tokens) with 3 lookahead slots: the step needs cdiv(4 + 3, 4) = 2 blocks while vLLM's
    count (no lookahead) is cdiv(4, 4) = 1: it fits 2 free blocks, not 1."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), vllm_compat=True)
    f = Request("f", prompt(700, filler))
    assert kv.allocate(f, filler) is not None
    r = Request("r", prompt(100, 4))
    got = kv.allocate(r, 4, kv.lookup(r), num_lookahead_tokens=3, full_sequence_must_fit=True)
    assert (got is not None) == fits
    kv.check_integrity()


# ---- state groups: the plan's released checkpoints ------------------------------------------

def test_a_running_state_request_releases_each_checkpoint_once_it_is_below_the_hold() -> None:
    """coordinator: _plan_states — which held checkpoints leave the table (``j < nskip`` with
    ``nskip = skipped_tokens(computed, hold) // a``: the held list ignored, ``<`` → ``<=``, ``//``
    → ``/``, the hold or the computed count dropped, the null test inverted) and how many
    block ids they free (``* k``).

    Full (bs 4) + state (a = 4; a 144-byte state over 64-byte pages: extents of k = 2 block
    ids), retention N = 8, default mode (hold 4). r (40 tokens), steps of 8, 8, 2, 6, 8:
    1. 2 full blocks + the live extent + checkpoint 8: 6 ids; 2. 2 + checkpoint 16: 4;
    3. at 16 computed, tokens below 16 - 4 = 12 are skipped (3 entries): checkpoint 8 (entry
       1) leaves (+2), 1 full block (-1); 4. at 18: 14 // 4 = 3 again, nothing leaves; 1 full
       block + checkpoint 24 (-3); 5. at 24: 20 // 4 = 5: checkpoint 16 (entry 3) leaves (+2),
       2 full blocks + checkpoint 32 (-4)."""
    st = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(4, 8),
                   state_dtype="float32")
    cfg = config(FA(4), st, num_blocks=200)
    assert cfg.extent_blocks(1) == 2
    kv = KVCacheManager(cfg, retention_interval=8)
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    free = kv.num_free_blocks
    expect = [(6, [0, 1]), (4, [0, 1, 0, 1]), (1 - 2, [0, 0, 0, 1, 0]),
              (3, [0, 0, 0, 1, 0, 1]), (4 - 2, [0, 0, 0, 0, 0, 1, 0, 1])]
    for i, (n, (taken, held)) in enumerate(zip((8, 8, 2, 6, 8), expect)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert [1 if b else 0 for b in kv.block_ids(r)[1]] == held
        assert free - kv.num_free_blocks == taken
        free = kv.num_free_blocks
        kv.check_integrity()


def test_a_state_step_that_fits_only_with_its_released_checkpoint() -> None:
    """coordinator: _plan_states — the released checkpoints' ids counted as available
    (``freed = count * k`` → ``/ k``, or the ``ref == 1`` test inverted).

    The steps 8, 8 of the test above use all 10 usable ids (6 + 4): the third step (2 tokens)
    needs 1 full block with 0 free, and fits only because checkpoint 8 leaves (2 ids)."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=11), retention_interval=8)
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    for i, n in enumerate((8, 8)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
    assert kv.num_free_blocks == 0
    assert kv.allocate(r, 2) is not None
    assert kv.num_free_blocks == 1
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(7, True), (6, False)])
def test_a_new_state_request_needs_its_live_extent_and_its_exports(num_blocks, fits) -> None:
    """coordinator: _plan_states — a new request's ids ``(1 + exports) * k`` (``1`` → ``2``).
    r's first 8 tokens: 2 full blocks, the live extent (2 ids) and checkpoint 8 (2 ids): 6."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8)
    r = Request("r", prompt(100, 40))
    assert (kv.allocate(r, 8, kv.lookup(r)) is not None) == fits
    kv.check_integrity()


def test_a_new_state_request_touching_its_hit_counts_each_block_once() -> None:
    """coordinator: _plan_states — the paged estimate of a new request's state group removed
    as ``needed -= new - touched`` (the touched hit blocks counted twice more).

    14 usable ids. "a" (17 tokens) caches full blocks 0..3 and checkpoints 8, 12, 16 and is
    freed; a filler (4 tokens: 1 full block + its live extent) takes 3 uncached ids: 11 free.
    q (a's first 16 tokens + 8) hits 16 (4 full blocks + checkpoint 16, all free). Its first 4
    tokens need 1 full block + 4 touched, the touched checkpoint (2), the live extent (2) and
    checkpoint 20 (its replay boundary; 2): exactly 11."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=15), retention_interval=8)
    P = prompt(100, 17)
    a = Request("a", P)
    assert kv.allocate(a, 17, kv.lookup(a)) is not None
    a.num_computed_tokens = 17
    kv.free(a)
    f = Request("f", prompt(700, 4))
    assert kv.allocate(f, 4, kv.lookup(f)) is not None
    q = Request("q", P[:16] + prompt(500, 8))
    hit = kv.lookup(q)
    assert hit.num_tokens == 16 and kv.num_free_blocks == 11
    assert kv.allocate(q, 4, hit) is not None
    assert kv.num_free_blocks == 0
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(19, True), (18, False)])
def test_reservation_of_a_new_state_request_counts_extents(num_blocks, fits) -> None:
    """coordinator: _plan_states — the reservation's swap of the paged estimate for extents
    (``entries`` and ``generic_held`` of a new request).

    Full (bs 4) + state (k = 2), default mode (hold 4), r of 40 tokens, first 8 with the
    reservation. Full: 2 new blocks, peak 10: 8 reserved. State: peak 1 + min(10, 1 + 2) = 4
    entries (the live state, the hold and the one being written); the step takes 2 (live +
    checkpoint 8): 2 more entries = 4 ids reserved. 6 taken + 12 reserved: 18 free needed."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8)
    r = Request("r", prompt(100, 40))
    assert (kv.allocate(r, 8, kv.lookup(r), full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(15, True), (14, False)])
def test_reservation_of_a_new_state_request_with_a_hit_skips_its_null_entries(num_blocks,
                                                                              fits) -> None:
    """coordinator: _plan_states — a new request's held checkpoints are the hit's non-null
    entries (``len(ids) - ids.count(NULL_BLOCK)``, in ``entries`` and ``generic_held``).

    "a" (17 tokens) is served and freed (all num_blocks - 1 ids free). q (a's first 16 + 8)
    hits 16: 4 full blocks and the state entries (null, null, null, checkpoint 16). Its first
    4 tokens with the reservation take 1 + 4 touched full blocks and 2 + 2 + 2 state ids (the
    hit checkpoint, the live extent, checkpoint 20): 11; the full group then holds 5 of its
    peak 6 (1 reserved), the state group 3 of its 1 + min(6, 3) = 4 entries (2 ids): 14."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8)
    P = prompt(100, 17)
    a = Request("a", P)
    assert kv.allocate(a, 17, kv.lookup(a)) is not None
    a.num_computed_tokens = 17
    kv.free(a)
    q = Request("q", P[:16] + prompt(500, 8))
    hit = kv.lookup(q)
    assert hit.num_tokens == 16 and hit.block_ids[1][:3] == (0, 0, 0)
    assert (kv.allocate(q, 4, hit, full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("last", [2, 8, 16])
@pytest.mark.parametrize("num_blocks, fits", [(19, True), (18, False)])
def test_reservation_of_a_running_state_request_counts_its_checkpoints(last, num_blocks,
                                                                       fits) -> None:
    """coordinator: _plan_states — a running request's reservation: ``entries = held -
    released + 1 + exports`` and ``generic_held`` (its table's non-null entries).

    Full (bs 4) + state (k = 2), default mode (hold 4), r of 40 tokens: steps 8 and 8 hold 4
    full blocks and checkpoints 8, 16 plus the live extent (10 ids; num_blocks - 11 free). At
    16 computed, checkpoint 8 leaves (2 ids back). The state peak is 4 entries (8 ids).
    * ``last`` = 2: 1 full block (peak 10: 5 reserved); state entries 2 - 1 + 1 = 2: 4 ids
      reserved; 1 + 9 <= free + 2 iff free >= 8.
    * ``last`` = 8: 2 full blocks (4 reserved) and checkpoint 24 (2 ids); entries 3: 2 ids
      reserved; 4 + 6 <= free + 2 iff free >= 8.
    * ``last`` = 16: 4 full blocks (2 reserved), checkpoints 24 and 32 (4 ids); entries 4 of
      4: nothing reserved, and the paged view's surplus (2 + 4 of 4) is not a reservation
      (``generic > 0`` dropped); 8 + 2 <= free + 2 iff free >= 8."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8)
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    for i, n in enumerate((8, 8)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
    assert kv.num_free_blocks == num_blocks - 11
    assert (kv.allocate(r, last, full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(9, True), (8, False)])
def test_a_state_reservation_for_exactly_the_scheduled_tokens_reserves_nothing(num_blocks,
                                                                               fits) -> None:
    """coordinator: _plan_states — the extents' reservation applies only when the reserved
    sequence is longer than the step (``reserve_tokens > slots`` → ``>=``). r (8 tokens) is
    scheduled whole: it takes 2 full blocks, its live extent and checkpoints 4 (its replay
    boundary (8 - 1) // 4 * 4) and 8 (N): 8 ids, and reserves nothing more."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8)
    r = Request("r", prompt(100, 8))
    assert (kv.allocate(r, 8, kv.lookup(r), full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(19, True), (18, False)])
def test_reservation_of_a_state_request_whose_paged_view_releases_a_checkpoint(num_blocks,
                                                                                fits) -> None:
    """coordinator: _plan_states — the paged estimate it replaces, ``peak - (held - released +
    new)``, with the released entries added instead of subtracted.

    Steps 8, 8, 4 (checkpoint 8 leaves at 16; num_blocks - 10 free), then 4 tokens with the
    reservation at 20 computed: checkpoint 16 (entry 3) leaves (2 ids back), checkpoint 24 is
    written (2 ids), 1 full block (6 of peak 10: 4 reserved). The paged view held 1 - 1 + 1
    of 4 entries (3 reserved, removed); the extents hold 1 - 1 + 1 + 1 = 2 of 4 (4 ids
    reserved). 3 + 8 <= free + 2 iff free >= 9."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8)
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    for i, n in enumerate((8, 8, 4)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
    assert kv.num_free_blocks == num_blocks - 10
    assert (kv.allocate(r, 4, full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


# ---- external loads ---------------------------------------------------------------------------

def test_a_hit_made_before_an_external_load_is_still_verified() -> None:
    """coordinator: commit_external — ``self.epoch += 1`` → ``= 1``: the state version comes
    back to the epoch of an old hit, which is then adopted unverified.

    3 usable blocks, bs 4. "a" (9 tokens) is allocated (epoch 1) and caches 2 blocks; q's
    lookup (a's prompt) hits 8 at epoch 1. a is freed, "z" (9 other tokens) evicts a's blocks,
    "e" loads 8 tokens from an external tier (a tier holding every block; 5 commits so far).
    q's old hit must be refused: its blocks hold other tokens now."""
    kv = KVCacheManager(config(FA(4), num_blocks=4))
    a = Request("a", prompt(100, 9))
    assert kv.allocate(a, 9, kv.lookup(a)) is not None
    a.num_computed_tokens = 9
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8
    kv.free(a)
    z = Request("z", prompt(300, 9))
    assert kv.allocate(z, 9, kv.lookup(z)) is not None
    z.num_computed_tokens = 9
    kv.free(z)
    assert kv.stats().evictions == 2
    e = Request("e", prompt(500, 9))
    local = kv.lookup(e)
    ext = kv.lookup_external(e, local, lambda g, h: True)
    assert ext is not None and ext.num_tokens == 8
    assert kv.allocate(e, 0, local, external=ext) is not None
    assert kv.commit_external(e, ext, True) == 8
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_a_hit_made_just_before_an_external_load_that_evicts_it_is_refused() -> None:
    """coordinator: commit_external — ``self.epoch += 1`` → ``-= 1``: the version returns to
    the one before the load's allocation, when q looked up its (now stale) hit.

    3 usable blocks, bs 4. "a" (9 tokens) caches 2 blocks and is freed; q (a's prompt) hits 8.
    "e" reserves 2 blocks for an 8-token external load, evicting one of a's blocks (3 free:
    the scratch block, then a's tail first). q's hit must be refused."""
    kv = KVCacheManager(config(FA(4), num_blocks=4))
    a = Request("a", prompt(100, 9))
    assert kv.allocate(a, 9, kv.lookup(a)) is not None
    a.num_computed_tokens = 9
    kv.free(a)
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8
    e = Request("e", prompt(500, 9))
    local = kv.lookup(e)
    ext = kv.lookup_external(e, local, lambda g, h: True)
    assert kv.allocate(e, 0, local, external=ext) is not None
    assert kv.stats().evictions == 1
    assert kv.commit_external(e, ext, True) == 8
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()


@pytest.mark.parametrize("steps, num_blocks, fits", [((8,), 13, True), ((8,), 12, False),
                                                     ((8, 8, 8), 15, True), ((8, 8, 8), 14, False)])
def test_compat_admission_with_a_state_group(steps, num_blocks, fits) -> None:
    """coordinator: _plan_states — compat mode's reservation from vLLM's count
    (``_vllm_admission_blocks(state, hit, reserve_tokens, computed)``, arguments dropped or
    swapped), ``max(0, want + freed - needed)``.

    Compat, full (bs 4) + state (k = 2; vLLM's admission cap for a state group: 2 blocks),
    retention N = 8, r of 40 tokens; only the last step reserves.
    * (8,): vLLM's count 10 + 2 = 12; the step takes 2 full blocks, the live extent and
      checkpoint 8 (6 ids): reserved 6, 12 free needed.
    * (8, 8, 8): the third step (at 16) frees checkpoints 8 and 16 (compat keeps no held
      unit: 4 ids) and takes 2 full blocks + checkpoint 24 (4); vLLM's count for a running
      request is 10 - 4 full + 0 state (its table has 4 entries) = 6: reserved 6 + 4 - 4,
      so 4 + 6 <= free + 4 with num_blocks - 9 free before it."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8,
                        vllm_compat=True)
    r = Request("r", prompt(100, 40))
    assert _last_step_fits(kv, r, steps) == fits


@pytest.mark.parametrize("num_blocks, fits", [(16, True), (15, False)])
def test_compat_admission_of_a_state_request_subtracts_a_held_hit(num_blocks, fits) -> None:
    """coordinator: _plan_states — vLLM's count for a new request gets its hit (mutated to
    None: the hit's blocks not subtracted).

    Compat, full (bs 4) + state (k = 2), N = 8. "a" (17 tokens, steps 8 and 9) keeps running:
    5 full blocks, its live extent, checkpoint 16 (checkpoint 8 left at 8 computed): 9 ids,
    num_blocks - 10 free. q (a's first 16 + 24) hits 16 on blocks a holds (none evictable).
    vLLM's count: full 10 - 4 hit blocks = 6, state min(10, 2) - 4 < 0: 6. q's first 4 tokens
    take 1 full block and its live extent (3): reserved 6 - 3, so 6 free are needed (10
    without the hit)."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8,
                        vllm_compat=True)
    P = prompt(100, 17)
    a = Request("a", P)
    assert kv.allocate(a, 8, kv.lookup(a)) is not None
    a.num_computed_tokens = 8
    assert kv.allocate(a, 9) is not None
    a.num_computed_tokens = 17
    assert kv.num_free_blocks == num_blocks - 10
    q = Request("q", P[:16] + prompt(500, 24))
    hit = kv.lookup(q)
    assert hit.num_tokens == 16
    assert (kv.allocate(q, 4, hit, full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(26, True), (25, False)])
def test_a_long_state_prefill_with_a_reservation_is_refused_not_overcommitted(num_blocks,
                                                                              fits) -> None:
    """coordinator: _plan_states — a negative extents' reservation (more entries written in
    this step than the state group's peak) must count as 0, not lower the reservation
    (``extra if extra > 0`` → always ``extra``: the plan then "fits" a pool it overdraws).

    Full (bs 4) + state (k = 2), default mode, N = 8, r of 44 tokens, first step 40 tokens with
    the reservation: checkpoints 8, 16, 24, 32, 40 and 36 (the replay boundary 40 and the unit
    below): 6 + the live extent = 7 entries, 14 ids, above the peak of 4 entries; 10 full
    blocks (peak 11: 1 reserved). 24 + 1 = 25 free needed."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), retention_interval=8)
    r = Request("r", prompt(100, 44))
    assert kv.export_positions(r, 40) == [8, 16, 24, 32, 36, 40]
    assert (kv.allocate(r, 40, kv.lookup(r), full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(15, True), (14, False)])
def test_a_state_reservation_of_one_block_id_counts(num_blocks, fits) -> None:
    """coordinator: _plan_states — ``extra if extra > 0`` → ``> 1``: a reservation of exactly
    one block id (extents of k = 1) dropped.

    Full (bs 4) + state (k = 1), N = 8, r of 40 tokens, first step 16 tokens with the
    reservation: 4 full blocks (peak 10: 6 reserved), the live state and checkpoints 8, 16
    (3 of the peak's 4 entries: 1 reserved). 7 + 7 = 14 free needed."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=num_blocks), retention_interval=8)
    assert kv.config.extent_blocks(1) == 1
    r = Request("r", prompt(100, 40))
    assert (kv.allocate(r, 16, kv.lookup(r), full_sequence_must_fit=True) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, filler, fits", [(11, 1, True), (12, 5, False)])
def test_a_state_step_counts_the_junction_checkpoint(num_blocks, filler, fits) -> None:
    """coordinator: _plan_states — a running request's export count taken from a stateless
    view (``_export_ends(request, None, ...)``): its promised junction is missed, the plan
    counts one extent too few and the commit overdraws the pool.

    As in the export-positions test (state extents of k = 1 here): b hits 8 with junction 12
    and runs 3 tokens; a filler request holds some blocks. b's next 5 tokens (11 → 16) need
    1 full block and checkpoints 12 (the junction) and 16: 3 ids. With 3 free they fit; with
    2 free the allocation is refused (None), nothing is popped."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=num_blocks), retention_interval=8)
    A = prompt(100, 22)
    a = Request("a", A)
    hit = kv.lookup(a)
    for n in (5, 5, 5, 7):
        assert kv.allocate(a, n, hit if a.num_computed_tokens == 0 else None) is not None
        a.num_computed_tokens += n
    kv.free(a)
    b = Request("b", A[:14] + prompt(500, 10))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (8, 12)
    assert kv.allocate(b, 3, hit) is not None
    b.num_computed_tokens = 11
    f = Request("f", prompt(900, filler))
    assert kv.allocate(f, filler, kv.lookup(f)) is not None
    assert kv.num_free_blocks == (3 if fits else 2)
    assert kv.export_positions(b, 5) == [12, 16]
    assert (kv.allocate(b, 5) is not None) == fits
    kv.check_integrity()


# ---- state groups: the final length at free ----------------------------------------------------

@pytest.mark.parametrize("final, hit_after, swa_final_run", [(12, 12, True), (14, 8, False)])
def test_free_keeps_the_live_state_only_at_an_aligned_final_length(final, hit_after,
                                                                   swa_final_run) -> None:
    """coordinator: _free_states — the live state becomes the final-length checkpoint only
    when the computed count is aligned (``and`` → ``or`` in its test: a live state after 14
    tokens filed as the checkpoint at 12), and the final length is promised to the other
    groups only if every state group holds that checkpoint (``servable``: test inverted or
    forced true).

    Full (bs 4) + sliding (bs 4, W 8) + state (k = 1), default mode, retention 0. r (10-token
    prompt: boundaries 8 and 4) decodes to ``final`` tokens and is freed. At 12 the live state
    is the checkpoint at 12, the final length 12 is promised, the sliding group caches its
    window run for 12 (positions 1, 2; 1 was cached for the boundary 8, so block 2, tokens
    8..11, is stored at free): the same tokens + 1 then hit 12. At 14 the aligned end
    12 has no checkpoint: nothing is promised at free (no sliding run stored) and the hit is 8."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), STATE4, num_blocks=100), enable_events=True)
    r = Request("r", prompt(100, 10))
    assert kv.allocate(r, 10, kv.lookup(r)) is not None
    r.num_computed_tokens = 10
    while r.num_tokens < final:
        r.append_tokens([7])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
    kv.take_events()
    kv.free(r)
    stored = [(ev.group_idx, ev.token_ids) for ev in kv.take_events() if isinstance(ev, BlockStored)]
    assert ((1, list(r.token_ids[8:12])) in stored) == swa_final_run
    q = Request("q", list(r.token_ids) + [9])
    assert kv.lookup(q).num_tokens == hit_after
    kv.check_integrity()
