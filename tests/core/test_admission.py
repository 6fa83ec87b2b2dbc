"""vLLM 0.33's admission reservation (``full_sequence_must_fit``) and failed allocations.

Counts are worked by hand from vLLM's formula (kv_cache_manager.allocate_slots,
single_type_kv_cache_manager.get_num_blocks_to_allocate with apply_admission_cap=True):
per group ``cdiv(min(num_tokens, max_model_len), bs)`` blocks, capped for a window group at
``cdiv(min(W - 1 + max_in_flight_tokens, max_model_len), bs) + 1``, minus the hit blocks or
the out-of-window blocks (whichever is more), plus the hit blocks in the free queue; the
admission fails iff that exceeds the free blocks.
"""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request
from hybridkv.sched import EngineRequest, Scheduler, SchedulerConfig

from tests.support.helpers import FA, SWA, config


def _kv(num_blocks: int, compat: bool = True, **kw) -> KVCacheManager:
    return KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=num_blocks),
                          retention_interval=0, vllm_compat=compat,
                          max_in_flight_tokens=32, **kw)


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


def _running_swa(compat: bool) -> tuple[KVCacheManager, Request, Request]:
    """A running request whose next step releases out-of-window blocks, in a pool too full
    for that step's new block."""
    kv = KVCacheManager(config(SWA(16, 32), num_blocks=13), retention_interval=0,
                        vllm_compat=compat)
    r = Request("r", list(range(160)))
    assert kv.allocate(r, 160, kv.lookup(r)) is not None
    r.num_computed_tokens = 160
    hog = Request("hog", list(range(1000, 1032)))
    assert kv.allocate(hog, 32, kv.lookup(hog)) is not None
    r.append_tokens([5] * 200)
    return kv, r, hog


@pytest.mark.parametrize("compat", [False, True])
def test_failed_allocation(compat: bool) -> None:
    """Default mode: a failed allocation changes nothing a caller can see. Compat mode: as
    vLLM (remove_skipped_blocks runs before the capacity check), the blocks that left the
    window are freed even though the allocation fails."""
    kv, r, _ = _running_swa(compat)
    before = (kv.block_ids(r), kv.num_free_blocks, kv.stats())
    plan = kv.coordinator.plan(r, 200, None, 0)
    released = sum(len(g.released) for g in plan.groups)
    assert released > 0 and not plan.fits
    assert kv.allocate(r, 200) is None
    if compat:
        assert kv.num_free_blocks == before[1] + released
        assert sum(1 for b in kv.block_ids(r)[0] if b == 0) == released
    else:
        assert (kv.block_ids(r), kv.num_free_blocks, kv.stats()) == before
    kv.check_integrity()


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


@pytest.mark.parametrize("compat", [False, True])
def test_lookup_memo_follows_the_index(compat: bool) -> None:
    """A repeated lookup of a waiting request is served from a memo while the pool's index
    is unchanged; any insert or eviction makes it look again, and the hit it returns is
    always adoptable (stamped with the current epoch)."""
    kv = KVCacheManager(config(FA(16), SWA(16, 32), num_blocks=40), retention_interval=None,
                        vllm_compat=compat)
    a = Request("a", list(range(100)))
    w = Request("w", list(range(100)) + [7] * 30)
    assert kv.lookup(w).num_tokens == 0
    assert kv.allocate(a, 100, kv.lookup(a)) is not None     # caches a's blocks
    first = kv.lookup(w)
    assert first.num_tokens > 0
    other = Request("o", [5] * 20)
    assert kv.allocate(other, 20, kv.lookup(other)) is not None  # epoch moves, index too
    again = kv.lookup(w)
    assert (again.num_tokens, again.block_ids) == (first.num_tokens, first.block_ids)
    assert again.epoch == kv.coordinator.epoch
    kv.free(a)
    hog = Request("hog", [9] * 16 * 15)                        # evicts some of a's blocks
    assert kv.allocate(hog, len(hog.token_ids), kv.lookup(hog)) is not None
    fresh = kv.coordinator._find_longest_hit(w, 129)           # no memo
    got = kv.lookup(w)
    assert (got.num_tokens, got.block_ids) == (fresh.num_tokens, fresh.block_ids)
    assert got.num_tokens < first.num_tokens
    kv.free(hog)
    got = kv.lookup(w)
    assert kv.allocate(w, 130 - got.num_tokens, got) is not None
    kv.check_integrity()
