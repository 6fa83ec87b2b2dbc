"""vLLM 0.33's own unit tests, replayed through hybridkv's public API in compat mode.

Each test names the vLLM test it follows (``tests/v1/core/test_prefix_caching.py``,
``test_single_type_kv_cache_manager.py``, ``test_kv_cache_utils.py``, the fine-grained hit
tests under ``tests/v1/core/prefix_cache/``). Block ids, hit lengths, cached indices and
free-queue orders are vLLM's; Mamba and DCP scenarios are out of scope. Where vLLM's test calls
an internal unit function with hand-made inputs, the port drives the same situation through
the public API.
"""

from __future__ import annotations

import pytest

from hybridkv import MLA, BlockStored, ChunkedLocal, KVCacheManager, Request, SpecDecode
from hybridkv.core.rules import HitRule, make_rule
from tests.support.helpers import (C3, EAGLE_DROP, FA, SWA, cached_positions, config, evict,
                                   hash_cached, manager, run_prompt, serve)
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def queue(kv):
    return list(kv.pool.queue)


def test_prefill_queue_order():  # vLLM: test_prefill
    kv = manager(FA(16), num_blocks=11)
    r0 = Request("r0", C3 + [3] * 7)
    assert kv.lookup(r0).num_tokens == 0
    assert len(r0.block_hashes) == 3
    assert kv.allocate(r0, 55, kv.lookup(r0)) == [[1, 2, 3, 4]]
    assert [kv.pool.block_hash[b] is not None for b in (1, 2, 3, 4)] == [True, True, True, False]
    r0.num_computed_tokens = 55
    r1 = Request("r1", C3 + [3] * 5)
    hit = kv.lookup(r1)
    assert (hit.num_tokens, hit.block_ids) == (48, ((1, 2, 3),))
    assert kv.allocate(r1, 5, hit) == [[5]]
    assert [kv.pool.ref_cnt[b] for b in (1, 2, 3)] == [2, 2, 2]
    assert kv.num_free_blocks == 5
    r1.num_computed_tokens = 53
    kv.free(r0)
    kv.free(r1)
    assert kv.num_free_blocks == 10
    assert queue(kv) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    r2 = Request("r2", C3 + [3] * 6)
    hit = kv.lookup(r2)
    assert hit.block_ids == ((1, 2, 3),)
    assert kv.allocate(r2, 6, hit) == [[5]]
    assert kv.num_free_blocks == 6
    kv.free(r2)
    r3 = Request("r3", [99] * 160)
    assert kv.allocate(r3, 160, kv.lookup(r3)) == [[5, 4, 6, 7, 8, 9, 10, 3, 2, 1]]
    assert kv.num_free_blocks == 0 and queue(kv) == []
    kv.check_integrity()


def test_prefill_skip_reading_duplicates_blocks():  # vLLM: test_prefill_plp
    kv = manager(FA(16), num_blocks=11)
    r0, _ = run_prompt(kv, "r0", C3 + [3] * 7, skip_prefix_cache=True)
    r2 = Request("r2", C3 + [3] * 6, RequestCacheParams(skip_prefix_cache=True))
    hit = kv.lookup(r2)
    assert hit.num_tokens == 0
    new = kv.allocate(r2, r2.num_tokens, hit)[0]
    for j in range(3):
        assert kv.pool.block_hash[new[j]] == kv.pool.block_hash[kv.block_ids(r0)[0][j]]
        assert kv.pool.ref_cnt[new[j]] == 1
    kv.check_integrity()


def test_decode_hashes_filled_block():  # vLLM: test_decode
    kv = manager(FA(16), num_blocks=11)
    r0, _ = run_prompt(kv, "r0", C3 + [3] * 7)
    assert kv.block_ids(r0)[0] == [1, 2, 3, 4]
    r0.append_tokens([8] * 4)
    assert kv.allocate(r0, 4) == [[]]
    r0.num_computed_tokens = 59
    assert kv.pool.block_hash[4] is None
    r0.append_tokens([7] * 19)
    assert len(kv.allocate(r0, 19)[0]) == 1
    table = kv.block_ids(r0)[0]
    assert kv.pool.block_hash[table[-2]] is not None and kv.pool.block_hash[table[-1]] is None


def test_evict_order():  # vLLM: test_evict
    kv = manager(FA(16), num_blocks=11)
    r0, _ = run_prompt(kv, "r0", list(range(87)))
    r1, _ = run_prompt(kv, "r1", list(range(87, 135)))
    assert kv.num_free_blocks == 1
    kv.free(r0)
    assert queue(kv) == [6, 10, 5, 4, 3, 2, 1]
    kv.free(r1)
    assert queue(kv) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    r2 = Request("r2", list(range(35)))
    hit = kv.lookup(r2)
    assert hit.block_ids == ((1, 2),) and hit.num_tokens == 32
    assert kv.allocate(r2, 3, hit) == [[6]]
    assert kv.num_free_blocks == 7


def test_reused_cached_block_loses_hash():  # vLLM: test_hash_block_correct_reuse
    kv = manager(FA(16), num_blocks=2)
    r0, _ = run_prompt(kv, "r0", list(range(16)))
    kv.free(r0)
    r1 = Request("r1", list(range(100, 115)))
    (b,), = kv.allocate(r1, 15, kv.lookup(r1))
    assert kv.pool.block_hash[b] is None


def test_hit_block_not_evicted_for_same_request():  # vLLM: test_computed_blocks_not_evicted
    kv = manager(FA(16), num_blocks=3)
    r0, _ = run_prompt(kv, "r0", list(range(16)))
    r1, _ = run_prompt(kv, "r1", list(range(16, 32)))
    assert kv.block_ids(r0) == ([1],) and kv.block_ids(r1) == ([2],)
    kv.free(r0)
    kv.free(r1)
    r2 = Request("r2", list(range(32)))
    hit = kv.lookup(r2)
    assert hit.block_ids == ((1,),) and hit.num_tokens == 16
    assert kv.allocate(r2, 16, hit) == [[2]]


# vLLM: test_prefill_not_enough_free_blocks_with_computed_blocks
def test_failed_allocation_changes_nothing():
    kv = manager(FA(16), num_blocks=11)
    run_prompt(kv, "r0", C3)
    r1, _ = run_prompt(kv, "r1", C3 * 2)
    kv.free(r1)
    refs = list(kv.pool.ref_cnt)
    run_prompt(kv, "r2", [7] * 32)
    assert kv.num_free_blocks == 5
    refs = list(kv.pool.ref_cnt)
    q = queue(kv)
    r3 = Request("r3", C3 * 3)
    hit = kv.lookup(r3)
    assert hit.num_tokens == 96
    assert kv.allocate(r3, 48, hit) is None
    assert kv.pool.ref_cnt == refs and queue(kv) == q
    kv.check_integrity()


def test_reset_prefix_cache():  # vLLM: test_reset_prefix_cache
    kv = manager(FA(16), num_blocks=11)
    r0, _ = run_prompt(kv, "r0", C3 + [1])
    assert kv.reset_prefix_cache() is False
    assert any(kv.pool.index)
    kv.free(r0)
    assert kv.reset_prefix_cache() is True
    assert not any(kv.pool.index) and all(h is None for h in kv.pool.block_hash)


@pytest.mark.parametrize("n", [2, 3, 10])
def test_kv_cache_events(n):  # vLLM: test_kv_cache_events
    from hybridkv import AllBlocksCleared, BlockRemoved, BlockStored
    kv = manager(FA(16), num_blocks=n + 1, enable_events=True)
    r0 = Request("r0", list(range(n * 16)))
    kv.allocate(r0, n * 16, kv.lookup(r0))
    ev = kv.take_events()
    assert isinstance(ev[-1], BlockStored)
    assert len(ev[-1].block_hashes) == n and len(ev[-1].token_ids) == 16 * n
    r0.num_computed_tokens = n * 16
    kv.free(r0)
    r1 = Request("r1", list(range(n * 16)))
    kv.allocate(r1, n * 16)  # no lookup: recompute and evict
    ev = kv.take_events()
    assert [type(e) for e in ev] == [BlockRemoved] * n + [BlockStored]
    r1.num_computed_tokens = n * 16
    kv.free(r1)
    assert kv.reset_prefix_cache()
    assert isinstance(kv.take_events()[-1], AllBlocksCleared)


def test_caching_disabled():  # vLLM: test_basic_prefix_caching_disabled
    kv = manager(FA(4), num_blocks=5, enable_caching=False)
    r0 = Request("r0", list(range(10)))
    assert len(kv.allocate(r0, 10, kv.lookup(r0))[0]) == 3
    kv.free(r0)
    r1 = Request("r1", list(range(16)))
    hit = kv.lookup(r1)
    assert hit.num_tokens == 0
    assert len(kv.allocate(r1, 16, hit)[0]) == 4
    assert kv.allocate(Request("r2", [1, 2, 3, 4]), 4) is None


def test_allocate_with_lookahead():  # vLLM: test_allocate_with_lookahead
    kv = manager(FA(4), num_blocks=11)
    assert len(kv.allocate(Request("a", [1, 2, 3]), 3, num_lookahead_tokens=2)[0]) == 2
    assert len(kv.allocate(Request("b", [1, 2, 3]), 3, num_lookahead_tokens=4)[0]) == 2


@pytest.mark.parametrize("p", [48, 37])
def test_eagle_identical_prompt(p):  # vLLM: test_eagle_identical_prompt_hit
    drop = manager(FA(16), num_blocks=20, spec_decode=EAGLE_DROP)
    run_prompt(drop, "a", [0] * p)
    assert drop.lookup(Request("b", [0] * p)).num_tokens == 16
    la = manager(FA(16), num_blocks=20, spec_decode=SpecDecode("eagle", 1))
    run_prompt(la, "a", [0] * p)
    assert la.lookup(Request("b", [0] * p)).num_tokens == 32


def _pattern_hit(rule: HitRule, pattern, max_blocks: int, step: int = 1) -> int:
    return rule.longest_hit(lambda j: pattern[j] if j < len(pattern) else False, max_blocks, step)


@pytest.mark.parametrize("pattern,expected", [
    ([False] * 10, 0), ([True], 1), ([True, False], 1), ([True, True], 2), ([True, True, False], 2),
    ([True] * 3, 3), ([True, True, True, False], 3),
    ([1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 1], 12), ([1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0], 8),
    ([1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1], 8),
])
# vLLM: test_sliding_window_possible_cached_prefix
def test_sliding_window_lookup_patterns(pattern, expected):
    rule = make_rule(SWA(2, 4))
    assert _pattern_hit(rule, [bool(x) for x in pattern], len(pattern)) == expected


@pytest.mark.parametrize("tail_pattern,tail,expected", [
    ([1], 0, 1), ([1], 1, 1), ([1, 0], 0, 2), ([1, 0], 1, 2), ([1, 1], 0, 2), ([1, 1, 0], 1, 2),
    ([1, 1, 1], 0, 3), ([1, 1, 1, 0], 1, 4),
    ([9] * 8 + [1], 1, 9), ([9] * 8 + [0], 1, 8), ([9] * 8 + [1, 1], 1, 10),
    ([9] * 8 + [1, 0], 0, 10), ([9] * 8 + [0, 1], 1, 10), ([9] * 8 + [0, 0], 0, 10),
])
# vLLM: test_chunked_local_attention_possible_cached_prefix
def test_chunked_local_lookup_patterns(tail_pattern, tail, expected):
    import random
    from hybridkv import ChunkedLocal
    rng = random.Random(len(tail_pattern) * 7 + tail)
    pattern = [rng.random() < 0.5 if x == 9 else bool(x) for x in tail_pattern]
    rule = make_rule(ChunkedLocal(block_size=2, chunk_size=4, num_kv_heads=1, head_dim=8))
    max_len = len(pattern) * 2 + tail
    assert _pattern_hit(rule, pattern, max_len // 2) == expected


# vLLM: test_sliding_window_remove_skipped_blocks
def test_sliding_window_frees_out_of_window_blocks():
    kv = manager(SWA(2, 4), num_blocks=40)
    r = Request("r", list(range(22)))
    kv.allocate(r, 22)
    base = kv.block_ids(r)[0]
    for n, nulls in [(0, 0), (4, 0), (5, 1), (6, 1), (7, 2)]:
        r.num_computed_tokens = n
        kv.allocate(r, 0)
        assert kv.block_ids(r)[0][:nulls + 1] == [0] * nulls + [base[nulls]]
    r.num_computed_tokens = 11
    kv.allocate(r, 0)
    assert kv.block_ids(r)[0] == [0] * 4 + base[4:]
    assert queue(kv)[-2:] == [base[3], base[2]]  # freed back to front (hashed: LRU tail)
    kv.check_integrity()


# vLLM: test_chunked_local_attention_remove_skipped_blocks
def test_chunked_local_frees_previous_chunks():
    from hybridkv import ChunkedLocal
    kv = manager(ChunkedLocal(block_size=2, chunk_size=4, num_kv_heads=1, head_dim=8), num_blocks=40)
    r = Request("r", list(range(22)))
    kv.allocate(r, 22)
    base = kv.block_ids(r)[0]
    for n, nulls in [(4, 2), (6, 2), (12, 6)]:
        r.num_computed_tokens = n
        kv.allocate(r, 0)
        assert kv.block_ids(r)[0] == [0] * nulls + base[nulls:]


def test_evictable_hit_counted_once():  # vLLM: test_evictable_cached_blocks_not_double_allocated
    kv = manager(SWA(2, 4), num_blocks=4)
    r0, _ = run_prompt(kv, "r0", [1, 2, 3])
    kv.free(r0)
    r1 = Request("r1", [1, 2, 3, 4])
    hit = kv.lookup(r1)
    assert hit.num_tokens == 2
    new = kv.allocate(r1, 2, hit)
    assert len(new[0]) == 1 and len(kv.block_ids(r1)[0]) == 2


def test_prefill_hybrid_model():  # vLLM: test_prefill_hybrid_model
    kv = manager(FA(16), SWA(16, 32), SWA(16, 32), num_blocks=21)
    r0 = Request("r0", C3 + [3] * 7)
    assert kv.allocate(r0, 55, kv.lookup(r0)) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    r0.num_computed_tokens = 55
    r1 = Request("r1", C3 + [3] * 5)
    hit = kv.lookup(r1)
    assert hit.num_tokens == 48 and hit.block_ids == ((1, 2, 3), (0, 6, 7), (0, 10, 11))
    assert kv.allocate(r1, 5, hit) == [[13], [14], [15]]
    r1.num_computed_tokens = 53
    kv.free(r0)
    kv.free(r1)
    probe = Request("p", C3 + [3] * 5)
    kv.lookup(probe)
    cases = [
        ([(1, 0), (2, 0)], 3), ([(0, 0)], 0), ([(0, 2), (1, 2), (2, 2)], 2), ([(0, 2)], 2),
        ([(1, 2)], 2), ([(2, 2)], 2), ([(0, 2), (1, 0), (2, 0)], 0),
    ]
    for evictions, blocks in cases:
        k2 = manager(FA(16), SWA(16, 32), SWA(16, 32), num_blocks=21)
        held = [run_prompt(k2, rid, C3 + [3] * (7 if rid == "r0" else 5))[0] for rid in ("r0", "r1")]
        for req in held:
            k2.free(req)
        q = Request("q", C3 + [3] * 5)
        k2.lookup(q)
        for g, j in evictions:
            evict(k2, q, g, j)
        assert k2.lookup(q).num_tokens == blocks * 16, evictions


def test_prefill_hybrid_model_eagle():  # vLLM: test_prefill_hybrid_model_eagle
    prompt0 = [i for i in range(6) for _ in range(16)] + [6] * 7
    prompt1 = prompt0[:96] + [6] * 5

    def fresh():
        kv = manager(FA(16), SWA(16, 48), SWA(16, 48), num_blocks=31, spec_decode=EAGLE_DROP)
        r0 = Request("r0", prompt0)
        assert kv.allocate(r0, len(prompt0), kv.lookup(r0)) == [
            list(range(1, 8)), list(range(8, 15)), list(range(15, 22))]
        r0.num_computed_tokens = len(prompt0)
        return kv, r0

    kv, r0 = fresh()
    r1 = Request("r1", prompt1)
    hit = kv.lookup(r1)
    assert hit.num_tokens == 80
    assert hit.block_ids == ((1, 2, 3, 4, 5), (0, 0, 10, 11, 12), (0, 0, 17, 18, 19))
    assert kv.allocate(r1, 21, hit) == [[22, 23], [24, 25], [26, 27]]
    cases = [([(1, 0), (2, 0)], 5), ([(0, 0)], 0), ([(0, 5), (1, 5), (2, 5)], 4), ([(0, 5)], 4),
             ([(1, 4)], 3), ([(2, 4)], 3), ([(0, 5), (1, 0), (2, 0)], 4)]
    for evictions, blocks in cases:
        kv, r0 = fresh()
        kv.free(r0)
        q = Request("q", prompt1)
        kv.lookup(q)
        for g, j in evictions:
            evict(kv, q, g, j)
        assert kv.lookup(q).num_tokens == blocks * 16, evictions


def test_hybrid_eagle_combination():  # vLLM: test_prefill_hybrid_model_combinations_eagle
    kv = manager(FA(16), SWA(16, 32), num_blocks=40, spec_decode=EAGLE_DROP)
    common = list(range(64))
    run_prompt(kv, "r0", common + [4] * 7)
    hit = kv.lookup(Request("r1", common + [6] * 5))
    assert hit.num_tokens == 48 and [len(b) for b in hit.block_ids] == [3, 3]


def test_different_block_sizes():  # vLLM: test_different_block_size
    kv = manager(FA(32, dtype="float16"), SWA(16, 32, dtype="float32"), num_blocks=30)
    assert kv.config.hash_block_size == 16 and kv.config.alignment == 32
    tokens = [i for i in range(10) for _ in range(16)]
    r0 = Request("r0", tokens)
    assert kv.allocate(r0, 112, kv.lookup(r0)) == [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11]]
    for n in (113, 97):
        hit = kv.lookup(Request(f"r{n}", tokens[:n]))
        assert hit.num_tokens == 96 and [len(b) for b in hit.block_ids] == [3, 6]
    q = Request("q", tokens[:113])
    kv.lookup(q)
    assert not hash_cached(kv, q, 1, 6)
    evict(kv, q, 1, 5)
    hit = kv.lookup(q)
    assert hit.num_tokens == 64 and [len(b) for b in hit.block_ids] == [2, 4]


def test_swa_tail_window_only():  # vLLM: test_hybrid_cache_blocks_swa_tail_window_only
    kv = manager(FA(32), SWA(8, 8), num_blocks=30)
    r, _ = run_prompt(kv, "r", list(range(64)))
    assert cached_positions(kv, r, 1) == {3, 7}


def test_cache_clamped_to_lcm():  # vLLM: test_hybrid_cache_blocks_clamped_to_lcm
    kv = manager(FA(32), SWA(16, 32), num_blocks=30)
    r, _ = run_prompt(kv, "r", list(range(112)))
    assert cached_positions(kv, r, 1) == set(range(6))
    assert cached_positions(kv, r, 0) == {0, 1, 2}


def test_eagle_swa_alignment():  # vLLM: test_eagle_swa_alignment_caches_extra_block
    kv = manager(FA(32), SWA(8, 8), num_blocks=60, drafts=(1,), spec_decode=EAGLE_DROP)
    run_prompt(kv, "r", list(range(128)))
    hit = kv.lookup(Request("q", list(range(128))))
    assert hit.num_tokens > 0 and hit.num_tokens % 32 == 0


# vLLM: test_eagle_swa_boundary_caches_post_boundary_block
def test_eagle_swa_post_boundary_block():
    kv = manager(FA(32), SWA(8, 8), num_blocks=60, drafts=(1,), spec_decode=EAGLE_DROP)
    r, _ = run_prompt(kv, "r", list(range(40)))
    assert {3, 4} <= cached_positions(kv, r, 1)
    assert kv.lookup(Request("q", list(range(40)) + [7])).num_tokens == 32


# vLLM: test_eagle_grouped_swa_siblings_use_same_cache_mask
def test_grouped_swa_siblings_share_mask():
    kv = manager(FA(32), SWA(8, 8), SWA(8, 8), num_blocks=60, drafts=(2,), spec_decode=EAGLE_DROP)
    r, _ = run_prompt(kv, "r", list(range(72)))
    for g in (1, 2):
        assert {4, 8} <= cached_positions(kv, r, g)
    assert cached_positions(kv, r, 1) == cached_positions(kv, r, 2)
    assert kv.lookup(Request("q", list(range(72)) + [1])).num_tokens == 64


# vLLM: test_hybrid_local_kv_retention_interval_rejects_invalid
@pytest.mark.parametrize("interval,match", [(33, "multiple of"), (-32, "non-negative")])
def test_retention_validation(interval, match):
    with pytest.raises(ValueError, match=match):
        manager(FA(32), SWA(8, 8), num_blocks=30, retention=interval)


def test_retention_full_attention_only():  # vLLM: test_zero_retention_is_ignored_for_full_attention
    assert manager(FA(32), num_blocks=30, retention=0).retention_interval == 0
    with pytest.raises(ValueError, match="sliding-window"):
        manager(FA(32), num_blocks=30, retention=16)


def test_retention_interval_64():  # vLLM: test_hybrid_local_kv_retention_interval_aligns_in_manager
    kv = manager(FA(32), SWA(8, 8), num_blocks=60, retention=64)
    r, _ = run_prompt(kv, "r", list(range(128)))
    assert cached_positions(kv, r, 1) == {7, 11, 15}


# vLLM: test_hybrid_local_kv_retention_interval_latest_only_reuses_replay_boundary
def test_retention_zero_latest_only():
    kv = manager(FA(32), SWA(8, 8), num_blocks=60, retention=0)
    r, _ = run_prompt(kv, "r", list(range(128)))
    assert cached_positions(kv, r, 1) == {11}
    b11 = kv.block_ids(r)[1][11]
    kv.free(r)
    assert kv.pool.ref_cnt[b11] == 0
    hit = kv.lookup(Request("q", list(range(128))))
    assert hit.num_tokens == 96 and len(hit.block_ids[1]) == 12
    assert kv.lookup(Request("q2", list(range(96)))).num_tokens == 0


# vLLM: test_hybrid_local_kv_retention_interval_mtp_reuses_latest_boundary
def test_retention_zero_mtp_drop():
    kv = manager(FA(32), SWA(8, 8), num_blocks=60, retention=0, drafts=(1,), spec_decode=EAGLE_DROP)
    r, _ = run_prompt(kv, "r", list(range(127)))
    assert cached_positions(kv, r, 1) == {7, 8}
    hit = kv.lookup(Request("q", list(range(127))))
    assert hit.num_tokens == 64 and [len(b) for b in hit.block_ids] == [2, 8]


def _dsv4_like(num_blocks):
    from hybridkv import MLA
    return manager(MLA(block_size=256, compress_ratio=4), SWA(64, 512), SWA(8, 128), SWA(4, 8),
                   num_blocks=num_blocks, retention=1024)


def _fill(kv, rid, tokens, chunk=512):
    """Prefill in chunks; returns the block ids it allocated."""
    req = Request(rid, tokens)
    got = []
    hit = kv.lookup(req)
    while req.num_computed_tokens + hit.num_tokens < len(tokens):
        n = min(chunk, len(tokens) - req.num_computed_tokens - hit.num_tokens)
        new = kv.allocate(req, n, hit if not req.num_computed_tokens else None)
        assert new is not None
        got += [b for g in new for b in g]
        req.num_computed_tokens += n + (hit.num_tokens if not req.num_computed_tokens else 0)
    return req, got


# vLLM: test_hybrid_local_kv_retention_interval_survives_recycling
def test_retention_survives_recycling():
    kv = _dsv4_like(num_blocks=600)
    assert kv.config.hash_block_size == 4 and kv.config.alignment == 256
    first = list(range(4096))
    r, used1 = _fill(kv, "fill1", first)
    kv.free(r)
    retained = {b for b, h in enumerate(kv.pool.block_hash) if h is not None}
    hit = kv.lookup(Request("replay", first[:1800]))
    assert hit.num_tokens == 1024 and [len(b) for b in hit.block_ids] == [4, 16, 128, 256]
    r2, used2 = _fill(kv, "fill2", list(range(10**6, 10**6 + 4096)))
    kv.free(r2)
    assert set(used2) & (set(used1) - retained), "the second fill recycled scratch blocks"
    assert not set(used2) & retained and kv.pool.num_evictions == 0
    hit = kv.lookup(Request("replay2", first[:1800]))
    assert hit.num_tokens == 1024 and [len(b) for b in hit.block_ids] == [4, 16, 128, 256]
    kv.check_integrity()


@pytest.mark.parametrize("interval,cached", [(64, {3, 7, 11, 14, 15}), (0, {14}), (None, set(range(16)))])
def test_pure_swa_retention(interval, cached):  # vLLM: test_pure_swa_retention_*
    kv = manager(SWA(16, 16), num_blocks=40, retention=interval)
    r, _ = run_prompt(kv, "r", list(range(256)))
    assert cached_positions(kv, r, 0) == cached
    kv.free(r)
    assert kv.lookup(Request("q", list(range(256)))).num_tokens == 240


# vLLM: test_swa_shared_prefix_reuse_under_zero_retention
@pytest.mark.parametrize("pin,drop,expected", [(True, False, 64), (False, False, 0), (True, True, 48)])
def test_shared_prefix_junction_under_zero_retention(pin, drop, expected):
    kv = manager(FA(16), SWA(16, 32), num_blocks=80, retention=0, drafts=(1,) if drop else (),
                 spec_decode=EAGLE_DROP if drop else None)
    shared = list(range(64))
    run_prompt(kv, "r0", shared + [100] * 20)
    r1 = Request("r1", shared + [200] * 20)
    hit = kv.lookup(r1)
    if not pin:
        hit = type(hit)(hit.num_tokens, hit.block_ids, 0)
    kv.allocate(r1, r1.num_tokens - hit.num_tokens, hit)
    r1.num_computed_tokens = r1.num_tokens
    assert kv.lookup(Request("r2", shared + [300] * 20)).num_tokens == expected


# vLLM: test_swa_free_split_keeps_cached_tail_ahead_of_scratch
def test_swa_scratch_before_cached_tails():
    kv = manager(FA(32), SWA(8, 8), num_blocks=60)
    r, _ = run_prompt(kv, "r", list(range(128)))
    swa = kv.block_ids(r)[1]
    kv.free(r)
    order = {b: i for i, b in enumerate(queue(kv))}
    scratch = [b for b in swa if b and kv.pool.block_hash[b] is None]
    cached = [b for b in swa if b and kv.pool.block_hash[b] is not None]
    assert scratch and cached
    assert max(order[b] for b in scratch) < min(order[b] for b in cached)
    assert kv.lookup(Request("q", list(range(128)))).num_tokens == 96


def test_sliding_window_with_finer_hash_keys_each_block_by_its_last_fine_hash() -> None:
    """vLLM's test_sliding_window_cache_hit_with_finer_hash_alignment: hash block 2 (a FA(2) group
    sets the GCD), SWA(4, W=8). The SWA group's blocks are keyed by fine hashes h1 and h3, and a hit
    of 8 tokens returns exactly those two SWA blocks."""
    kv = KVCacheManager(config(FA(2), SWA(4, 8), num_blocks=30), CacheOptions(
        vllm_compat=True, retention_interval=None, enable_events=True))
    req = Request("r", [11, 12, 13, 14, 15, 16, 17, 18, 19])
    assert kv.allocate(req, 9, kv.lookup(req)) is not None
    req.num_computed_tokens = 9
    swa_blocks = kv.block_ids(req)[1][:2]
    stored = [ev for ev in kv.take_events() if isinstance(ev, BlockStored) and ev.group_idx == 1]
    assert [h for ev in stored for h in ev.block_hashes] == [req.block_hashes[1], req.block_hashes[3]]
    kv.free(req)
    hit = kv.lookup(Request("again", [11, 12, 13, 14, 15, 16, 17, 18, 99]))
    assert hit.num_tokens == 8
    assert list(hit.block_ids[1]) == swa_blocks


@pytest.mark.parametrize("spec, taken", [
    (FA(2), 20),                           # 10 non-null hit blocks: 10 new + 10 hits touched
    (SWA(2, 10), 15),                      # need = cdiv(9, 2) = 5: [null]*5 + 5 hits -> 10 + 5
    (SWA(2, 4), 12),                       # need = 2: [null]*8 + 2 hits -> 10 + 2
])
def test_allocation_counts_new_blocks_and_free_hit_blocks(spec, taken) -> None:
    """vLLM's test_get_num_blocks_to_allocate: a 40-token request with a 20-token hit whose blocks
    are all free (cached, ref 0). It needs cdiv(40, 2) - 10 = 10 new blocks plus every non-null hit
    block, which leaves the free queue when touched; null entries cost nothing. With one block fewer
    free the allocation returns None and changes nothing."""
    kv = KVCacheManager(config(spec, num_blocks=1 + taken + 11), CacheOptions(
        vllm_compat=True, retention_interval=None))
    prompt = list(range(100, 121))                      # 21 tokens: blocks 0..9 cached
    serve(kv, "a", prompt)
    assert kv.num_free_blocks == taken + 11
    # two holders take 12 blocks from the head of the free queue (a's scratch tail block and
    # never-used blocks; a's cached blocks sit behind them) and leave taken - 1 free
    hold_a, hold_b = Request("hold-a", [7] * 22), Request("hold-b", [8, 8])
    assert kv.allocate(hold_a, 22) is not None and kv.allocate(hold_b, 2) is not None
    req = Request("b", prompt[:20] + list(range(500, 520)))
    hit = kv.lookup(req)
    assert hit.num_tokens == 20
    assert kv.num_free_blocks == taken - 1
    assert kv.allocate(req, 20, hit) is None
    assert kv.num_free_blocks == taken - 1
    kv.free(hold_b)
    hit = kv.lookup(req)
    assert hit.num_tokens == 20 and kv.num_free_blocks == taken
    assert kv.allocate(req, 20, hit) is not None
    assert kv.num_free_blocks == 0
    kv.check_integrity()


def test_blocks_pulled_match_the_hand_prediction_while_the_window_slides() -> None:
    """vLLM's test_predictor_matches_allocator_blocks_calculation_with_admission_cap (SWA(2, W=8),
    chunks of 4 up to 16 tokens, vLLM compat): each allocation pulls cdiv(computed + new, 2) -
    len(table) blocks and releases the blocks that left the window: skipped = computed - 8 + 1
    tokens, whole blocks below it. The free count moves by exactly pulled - released."""
    kv = KVCacheManager(config(SWA(2, 8), num_blocks=40), CacheOptions(
        vllm_compat=True, retention_interval=None))
    req = Request("r", list(range(16)))
    kv.lookup(req)
    table_len, nulls = 0, 0
    for computed in (0, 4, 8, 12):
        before = kv.num_free_blocks
        new = kv.allocate(req, 4)
        want_new = -(-(computed + 4) // 2) - table_len
        released = max(0, computed - 8 + 1) // 2 - nulls
        assert len(new[0]) == want_new
        assert before - kv.num_free_blocks == want_new - released
        table_len += want_new
        nulls += released
        assert kv.block_ids(req)[0].count(0) == nulls
        req.num_computed_tokens = computed + 4
        kv.check_integrity()
    assert (table_len, nulls) == (8, 2)


COMBOS = {
    "full+sw": (FA(16), SWA(16, 32)),
    "sw+sw_large": (SWA(16, 32), SWA(16, 64)),
    "full+sw+sw_large": (FA(16), SWA(16, 32), SWA(16, 64)),
    "sw+full (interleaved order)": (SWA(16, 32), FA(16)),
    "full+sw+full+sw": (FA(16), SWA(16, 32), MLA(block_size=16), SWA(16, 48)),
    "full+chunked": (FA(16), ChunkedLocal(block_size=16, num_kv_heads=1, head_dim=8, chunk_size=32)),
    "full(16)+sw(8)": (FA(16), SWA(8, 32)),
}


@pytest.mark.parametrize("compat", [True, False], ids=["compat", "default"])
@pytest.mark.parametrize("name", list(COMBOS))
def test_hybrid_combinations_hit_the_shared_prefix(name: str, compat: bool) -> None:
    """vLLM's test_prefill_hybrid_model_combinations: prefill C3 + [3]*7 in two chunks (48, then 7);
    while it runs, a request C3 + [4]*5 hits 48 in every combination (dense retention as in vLLM's
    unit tests, and the default retention 0 where 48 is the first request's replay boundary)."""
    kv = KVCacheManager(config(*COMBOS[name], num_blocks=60), CacheOptions(
        vllm_compat=compat, retention_interval=None if compat else 0))
    serve(kv, "r0", C3 + [3] * 7, chunk=48, free=False)
    assert kv.lookup(Request("r1", C3 + [4] * 5)).num_tokens == 48


@pytest.mark.parametrize("groups", [2, 3])
def test_local_and_external_hit_allocate_unique_referenced_blocks(groups: int) -> None:
    """vLLM's test_cache_hit_local_and_external*: a request with 5 local hit blocks per group plus 2
    external blocks. Every block id in its tables is unique, every referenced block's ref count
    matches (check_integrity); the same after commit, free and a second allocation. The pool is
    exactly full, so allocating new blocks before touching the hits would evict them."""
    specs = (FA(4), SWA(4, 32), MLA(block_size=4))[:groups]
    tokens = list(range(1, 30))                         # 29 tokens: hits end at 20 and 28
    producer = KVCacheManager(config(*specs, num_blocks=100), CacheOptions(
        hash_seed="s", vllm_compat=True, retention_interval=None))
    tier: set = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    serve(producer, "p", tokens)
    consumer = KVCacheManager(config(*specs, num_blocks=1 + 8 * groups), CacheOptions(
        hash_seed="s", vllm_compat=True, retention_interval=None))
    serve(consumer, "local", tokens[:21])              # 5 cached blocks per group
    for round_ in range(2):
        req = Request(f"b{round_}", tokens)
        hit = consumer.lookup(req)
        assert hit.num_tokens == 20 + 8 * round_
        ext = consumer.lookup_external(req, hit, lambda g, h: (g, h) in tier)
        if round_ == 0:
            assert ext is not None and ext.num_tokens == 28
        assert consumer.allocate(req, 0 if ext else 1, hit, external=ext) is not None
        req.num_computed_tokens = hit.num_tokens
        consumer.check_integrity()
        ids = [b for table in consumer.block_ids(req) for b in table if b]
        assert len(ids) == len(set(ids))
        if ext:
            assert consumer.commit_external(req, ext, ok=True) == 28
            assert consumer.allocate(req, 1) is not None
            consumer.check_integrity()
        req.num_computed_tokens = len(tokens)
        consumer.check_integrity()
        consumer.free(req)
        consumer.check_integrity()
    assert consumer.num_free_blocks == 8 * groups


def test_sliding_window_frees_five_blocks_at_the_first_decode_allocation() -> None:
    """vLLM's test_swa_inflight_window_free.py (synchronous scheduling): prompt 100, block 16, W=16.
    While the prefill is being computed nothing is freed; at the first decode allocation 100 - 16 +
    1 = 85 tokens are skipped: 5 blocks become null and return to the free queue; no double free
    later."""
    kv = KVCacheManager(config(SWA(16, 16), num_blocks=20), CacheOptions(
        vllm_compat=True, retention_interval=None))
    req = Request("r", list(range(100)))
    assert kv.allocate(req, 100, kv.lookup(req)) == [[1, 2, 3, 4, 5, 6, 7]]
    assert kv.block_ids(req)[0].count(0) == 0
    free_before = kv.num_free_blocks
    req.num_computed_tokens = 100
    req.append_tokens([1])
    assert kv.allocate(req, 1) == [[]]
    assert kv.block_ids(req)[0][:6] == [0, 0, 0, 0, 0, 6]
    assert kv.num_free_blocks == free_before + 5
    for _ in range(20):                                 # one block leaves per 16 tokens
        req.num_computed_tokens += 1
        req.append_tokens([1])
        assert kv.allocate(req, 1) is not None
        kv.check_integrity()
    assert kv.block_ids(req)[0].count(0) == (req.num_computed_tokens - 15) // 16


@pytest.mark.parametrize("compat, swa_peak", [(True, 12), (False, 13)])
def test_sliding_window_admission_holds_a_window_not_the_sequence(compat: bool, swa_peak: int) -> None:
    """vLLM's test_can_fit_full_sequence_swa_cap_admits_long_prompt: FA(16) + SWA(16, W=64), a
    512-token prompt in chunks of 128 with a pool of 64 + 13 + 1 blocks is admitted and runs. By
    hand, before the chunk at c the window frees floor((c - 63 - hold) / 16) blocks and the table
    grows to cdiv(c + 128, 16): the SWA group peaks at 32 - 20 = 12 blocks (vLLM compat) or 13
    (default mode keeps one alignment unit more for the final-length promise, hold = 16), against
    vLLM's reservation cap of 13. A 256-token prompt does not fit a 5-block pool and changes
    nothing."""
    kv = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=64 + 13 + 1), CacheOptions(
        vllm_compat=compat, retention_interval=None if compat else 0))
    usable = kv.num_free_blocks
    req = Request("r", list(range(512)))
    kv.lookup(req)
    peak = 0
    for c in range(0, 512, 128):
        assert kv.allocate(req, 128) is not None
        req.num_computed_tokens = c + 128
        swa_held = sum(1 for b in kv.block_ids(req)[1] if b)
        peak = max(peak, swa_held)
        assert usable - kv.num_free_blocks == len(kv.block_ids(req)[0]) + swa_held
    assert peak == swa_peak
    small = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=5), CacheOptions(vllm_compat=compat))
    big = Request("big", list(range(256)))
    assert small.allocate(big, 256, small.lookup(big)) is None
    assert small.num_free_blocks == 4


def test_eagle_drop_of_one_unit() -> None:
    """vLLM's fine-grained hit tests (``tests/v1/core/prefix_cache/``): tokens [0,0,1,1,2,2,3,3],
    two full FA(4) blocks cached. Without the drop the resend hits 8 (2 blocks). vLLM with
    fine-grained (hash 2) partial hits drops one hash unit -> 6. hybridkv has no sub-block hits
    (every hit is a multiple of the LCM, like vLLM with partial hits off), so the drop is one
    block: 4, what ``FullAttentionManager.find_longest_cache_hit`` gives with ``alignment ==
    block_size`` (``hit -= min(alignment, block_size)``). Lookahead hashing needs no drop: 8."""
    tokens = [0, 0, 1, 1, 2, 2, 3, 3]
    for compat in (True, False):
        for spec, want in ((None, 8), (SpecDecode("eagle", 1, hash_lookahead=False), 4)):
            kv = KVCacheManager(config(FA(4), num_blocks=10), CacheOptions(
                spec_decode=spec, vllm_compat=compat, retention_interval=None))
            serve(kv, "a", tokens + [4])
            hit = kv.lookup(Request("b", tokens + [4]))
            assert (hit.num_tokens, len(hit.block_ids[0])) == (want, want // 4), (compat, spec)
    # hash unit 2 (a FA(2) group sets the GCD): still a whole alignment unit (4) is dropped
    kv = KVCacheManager(config(FA(4), FA(2), num_blocks=20), CacheOptions(
        spec_decode=SpecDecode("eagle", 1, hash_lookahead=False), retention_interval=None))
    serve(kv, "a", tokens + [4])
    assert kv.lookup(Request("b", tokens + [4])).num_tokens == 4
    kv = KVCacheManager(config(FA(4), num_blocks=10), CacheOptions(spec_decode=SpecDecode("eagle", 1)))
    serve(kv, "a", tokens + [4, 5])
    assert kv.lookup(Request("b", tokens + [4, 5])).num_tokens == 8
