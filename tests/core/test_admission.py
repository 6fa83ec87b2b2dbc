"""Admission: the reservation a request must fit before it is admitted
(``allocate(..., full_sequence_must_fit=True)``, ``core/coordinator/allocate.py``).

* Compat mode reserves vLLM 0.33's count, worked by hand from its formula
  (``kv_cache_manager.allocate_slots``, ``single_type_kv_cache_manager
  .get_num_blocks_to_allocate`` with ``apply_admission_cap=True``): per group
  ``cdiv(min(num_tokens, max_model_len), bs)`` blocks, capped for a window group at
  ``cdiv(min(W - 1 + max_in_flight_tokens, max_model_len), bs) + 1``, minus the hit blocks or
  the out-of-window blocks (whichever is more), plus the hit blocks in the free queue; the
  admission fails iff that exceeds the free blocks.
* Default mode reserves each group's peak over the sequence (plus lookahead slots) minus what
  the request already holds; state groups count extents and checkpoints.
* The reservation is checked on every step (the fast path too), and the free hit blocks are
  recounted whenever the free queue changes.
"""

from __future__ import annotations

import pytest

from hybridkv import CacheHit, KVCacheManager, Request, SpecDecode
from hybridkv.sched import EngineRequest, Scheduler, SchedulerConfig
from tests.support.helpers import FA, STATE4, ST_K2, SWA, admit, config, prompt
from hybridkv.core.cache_options import CacheOptions


def _kv(num_blocks: int, compat: bool = True, **kw) -> KVCacheManager:
    return KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=num_blocks), CacheOptions(
        retention_interval=0, vllm_compat=compat, max_in_flight_tokens=32, **kw))


def test_compat_admission_count_is_vllms() -> None:
    # 400 tokens: full 25 blocks; window cap cdiv(63 + 32, 16) + 1 = 7 -> 32
    for free, admitted in ((32, True), (31, False)):
        kv = _kv(free + 1)
        assert kv.num_free_blocks == free
        r = Request("r", list(range(400)))
        got = kv.allocate(r, 64, kv.lookup(r), full_sequence_must_fit=True)
        assert (got is not None) == admitted, free
        if not admitted:
            assert kv.num_free_blocks == free and not kv.coordinator.holds(r)
        kv.check_integrity()


def test_compat_admission_subtracts_the_hit_and_adds_its_evictable_blocks() -> None:
    kv = _kv(200)
    a = Request("a", list(range(400)))
    assert kv.allocate(a, 400, kv.lookup(a)) is not None
    a.num_computed_tokens = 400
    kv.free(a)                                        # a's cached blocks are evictable now
    b = Request("b", list(range(400)) + [9999] * 100)  # 500 tokens, shares a's prompt
    hit = kv.lookup(b)
    assert hit.num_tokens > 0
    t = hit.num_tokens
    evictable = sum(1 for ids in hit.block_ids for x in ids if x and kv.pool.ref_cnt[x] == 0)
    skipped = max(0, t - 63) // 16
    want = (32 - t // 16) + max(7 - max(skipped, t // 16), 0) + evictable
    assert kv.coordinator._vllm_admission_blocks(None, hit, 500, t) == want
    plan = kv.coordinator.plan(b, 500 - t, hit, 0, reserve_tokens=500)
    assert max(plan.num_needed, want) == plan.num_needed + plan.num_reserved


def test_scheduler_reserves_the_full_sequence_by_default() -> None:
    assert SchedulerConfig().reserve_full_sequence is True
    with pytest.raises(ValueError, match="reserve_full_sequence"):
        SchedulerConfig(reserve_full_sequence=1)
    calls = []

    class Spy(KVCacheManager):
        def allocate(self, request, num_new_tokens, hit=None, *a, **k):
            calls.append((hit is not None, k.get("full_sequence_must_fit", False)))
            return super().allocate(request, num_new_tokens, hit, *a, **k)

    for flag in (True, False):
        calls.clear()
        kv = Spy(config(FA(16), num_blocks=64))
        sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64,
                                              reserve_full_sequence=flag))
        sched.add_request(EngineRequest(Request("a", list(range(100))), 4))
        sched.schedule()
        assert calls and all(fs == flag for admit, fs in calls if admit)


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


@pytest.mark.parametrize("num_blocks, fits", [(11, True), (10, False)])
def test_compat_admission_of_a_running_request_sums_every_group(num_blocks, fits) -> None:
    """coordinator: _vllm_admission_blocks — a running request's count per group
    ``cdiv(num_tokens, bs) - len(table)`` (``held`` lost, ``+=`` → ``=`` / ``-=``, ``- held`` →
    ``+ held``, ``continue`` → ``break``: only the first or last group counted).

    Compat mode, two full groups (bs 4). r (20 tokens) computed 8: 2 blocks per group. A
    4-token step with the full-sequence reservation needs cdiv(20, 4) - 2 = 3 blocks per group,
    6 in all, free before the step: 10 usable - 4 held = 6 fits, 9 - 4 = 5 does not."""
    kv = KVCacheManager(config(FA(4), FA(4), num_blocks=num_blocks), CacheOptions(vllm_compat=True))
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
    kv = KVCacheManager(config(FA(4), FA(4), num_blocks=num_blocks), CacheOptions(vllm_compat=True))
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
    kv = KVCacheManager(config(FA(4), num_blocks=4), CacheOptions(vllm_compat=True))
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


def test_compat_admission_caps_the_sequence_at_max_model_len() -> None:
    """coordinator: _vllm_admission_blocks — ``n = num_tokens if num_tokens < len_cap else
    max_model_len`` with the cap dropped: the documented count is ``cdiv(min(num_tokens,
    max_model_len), bs)``. max_model_len 8, bs 4, 3 usable blocks: a 20-token request's
    reservation is cdiv(8, 4) = 2 blocks (not 5), so its first 4 tokens are admitted."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), CacheOptions(vllm_compat=True, max_model_len=8))
    r = Request("r", prompt(100, 20))
    got = kv.allocate(r, 4, kv.lookup(r), full_sequence_must_fit=True)
    assert got is not None and len(got[0]) == 1
    kv.check_integrity()


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
    kv = KVCacheManager(config(FA(4), num_blocks=6), CacheOptions(max_model_len=16))
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
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks), CacheOptions(vllm_compat=True))
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
    kv = KVCacheManager(config(FA(4), num_blocks=4), CacheOptions(vllm_compat=True))
    f = Request("f", prompt(700, filler))
    assert kv.allocate(f, filler) is not None
    r = Request("r", prompt(100, 4))
    got = kv.allocate(r, 4, kv.lookup(r), num_lookahead_tokens=3, full_sequence_must_fit=True)
    assert (got is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(19, True), (18, False)])
def test_reservation_of_a_new_state_request_counts_extents(num_blocks, fits) -> None:
    """coordinator: _plan_states — the reservation's swap of the paged estimate for extents
    (``entries`` and ``generic_held`` of a new request).

    Full (bs 4) + state (k = 2), default mode (hold 4), r of 40 tokens, first 8 with the
    reservation. Full: 2 new blocks, peak 10: 8 reserved. State: peak 1 + min(10, 1 + 2) = 4
    entries (the live state, the hold and the one being written); the step takes 2 (live +
    checkpoint 8): 2 more entries = 4 ids reserved. 6 taken + 12 reserved: 18 free needed."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(retention_interval=8))
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
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(retention_interval=8))
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
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(retention_interval=8))
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
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(retention_interval=8))
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
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(retention_interval=8))
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    for i, n in enumerate((8, 8, 4)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
    assert kv.num_free_blocks == num_blocks - 10
    assert (kv.allocate(r, 4, full_sequence_must_fit=True) is not None) == fits
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
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(
        retention_interval=8, vllm_compat=True))
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
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(
        retention_interval=8, vllm_compat=True))
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
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(retention_interval=8))
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
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=num_blocks), CacheOptions(retention_interval=8))
    assert kv.config.extent_blocks(1) == 1
    r = Request("r", prompt(100, 40))
    assert (kv.allocate(r, 16, kv.lookup(r), full_sequence_must_fit=True) is not None) == fits
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
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=num_blocks), CacheOptions(vllm_compat=True))
    r = Request("r", prompt(100, 16))
    admit(kv, r, 8)
    assert kv.num_free_blocks == num_blocks - 3
    got = kv.allocate(r, 4, full_sequence_must_fit=True)
    assert (got is not None) == fits
    table = kv.block_ids(r)[0]
    assert len(table) == (3 if fits else 2) and table[0] == 0
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


def test_compat_state_admission_that_reserves_nothing_fits_the_free_blocks_exactly() -> None:
    """coordinator: _plan_states — in compat mode the reservation is ``max(0, want + freed -
    needed)``: when vLLM's full-sequence count is no more than the step's own blocks it
    adds nothing (``max(1, ...)`` would ask for a block more).

    Compat, full (bs 4) + state (bs 4, extents of 1 id), 4 usable blocks. f (4 tokens)
    takes 2 (1 full block + its live extent). r (4 tokens) with the full-sequence
    reservation needs 1 full block + its live extent = 2; vLLM's count is cdiv(4, 4) +
    min(cdiv(4, 4), 2) = 2: nothing reserved beyond, so it fits the 2 free blocks."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=5), CacheOptions(vllm_compat=True))
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


def test_full_sequence_reservation_is_checked_on_a_quiet_step() -> None:
    """allocate — the fast path taken with ``full_sequence_must_fit`` (it answers without the
    reservation).

    Pool of 4 usable blocks (bs 4, compat: full blocks cached as they fill); "x" holds 2.
    "r" has a 16-token prompt (4 blocks): chunks of 1 token, then 1 (the slow path), then
    one more token stays inside its first block without filling it (a quiet step), but the
    whole sequence needs 3 more blocks and only 1 is free: refused (None), while the same
    step without the reservation succeeds with no new block."""
    kv = KVCacheManager(config(FA(4), num_blocks=5), CacheOptions(vllm_compat=True))
    assert kv.allocate(Request("x", prompt(500, 8)), 8) is not None
    r = Request("r", prompt(0, 16))
    assert kv.allocate(r, 1) is not None
    r.num_computed_tokens = 1
    assert kv.allocate(r, 1) == [[]]
    r.num_computed_tokens = 2
    assert kv.num_free_blocks == 1
    assert kv.allocate(r, 1, full_sequence_must_fit=True) is None
    assert kv.allocate(r, 1) == [[]]


def test_full_sequence_reservation_counts_the_lookahead_slots() -> None:
    """allocate — default mode reserves ``num_tokens + lookahead`` (not minus).

    FA (bs 4), EAGLE k = 3, 2 usable blocks. A new 8-token request computing 4 tokens takes
    ceil((4 + 3) / 4) = 2 blocks now; its whole sequence, 8 + 3 = 11 tokens, needs 3 blocks,
    more than the pool: refused with the reservation (8 - 3 = 5 tokens would need only the 2
    it takes), allowed without it."""
    kv = KVCacheManager(config(FA(4), num_blocks=3), CacheOptions(spec_decode=SpecDecode("eagle", 3)))
    r = Request("r", prompt(0, 8))
    assert kv.allocate(r, 4, full_sequence_must_fit=True) is None
    assert [len(x) for x in kv.allocate(r, 4)] == [2]


def test_reserve_tokens_counts_the_peak_without_allocating_it() -> None:
    """The admission seam: the same plan plus the blocks a longer sequence would peak at."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=40), CacheOptions(retention_interval=None))
    r = Request("r", list(range(20)))
    kv.lookup(r)
    now = kv.coordinator.plan(r, 20, None, 0)
    whole = kv.coordinator.plan(r, 20, None, 0, reserve_tokens=60)
    assert [g.new_blocks for g in now.groups] == [5, 5] and now.num_reserved == 0
    assert [g.new_blocks for g in whole.groups] == [5, 5]
    # full: 15 blocks for 60 tokens; sliding: its window (2 blocks) + 2 in flight = 4 <= 5 held
    assert whole.num_reserved == 10 and whole.fits
    assert not kv.coordinator.plan(r, 20, None, 0, reserve_tokens=140).fits   # 35 + 5 > 39
    assert kv.num_free_blocks == 39


@pytest.mark.parametrize("retention", [None, 0])
def test_full_sequence_must_fit(retention) -> None:
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=21), CacheOptions(retention_interval=retention))
    long = Request("long", list(range(72)))             # full group alone needs 18 blocks
    hit = kv.lookup(long)
    before = (kv.num_free_blocks, kv.stats())
    assert kv.allocate(long, 16, hit, full_sequence_must_fit=True) is None
    assert (kv.num_free_blocks, kv.stats()) == before and "long" not in kv.coordinator.reqs
    assert kv.coordinator.plan(long, 16, hit, 0).fits    # without the reservation it fits
    short = Request("short", list(range(40)))           # 10 full blocks + a few sliding ones
    new = kv.allocate(short, 16, kv.lookup(short), full_sequence_must_fit=True)
    assert new is not None and [len(ids) for ids in new] == [4, 4]   # only this chunk's blocks
    short.num_computed_tokens = 16
    assert kv.allocate(short, 16, full_sequence_must_fit=True) is not None
    kv.check_integrity()
