"""More of vLLM 0.33's unit tests (non-Mamba, non-DCP) through the public API: each test names
the vLLM test it follows.

vLLM's versions call internal unit functions (``get_num_blocks_to_allocate``, a manager's
``find_longest_cache_hit`` with hand-made inputs); these ports drive the same situations through
the public API only (lookup, allocate, free, block_ids, num_free_blocks, events, external
lookup) and check the numbers vLLM's tests assert. Where hybridkv differs by design, the test
says so and checks the documented hybridkv value.
"""

from __future__ import annotations

import pytest

from hybridkv import (MLA, BlockStored, ChunkedLocal, KVCacheManager, Request, SpecDecode)
from tests.support.helpers import C3, FA, SWA, config, serve



# ---- a sliding group coarser than the hash block is keyed by its last fine hash -------------
def test_sliding_window_with_finer_hash_keys_each_block_by_its_last_fine_hash() -> None:
    """vLLM's test_sliding_window_cache_hit_with_finer_hash_alignment: hash block 2 (a FA(2) group
    sets the GCD), SWA(4, W=8). The SWA group's blocks are keyed by fine hashes h1 and h3, and a hit
    of 8 tokens returns exactly those two SWA blocks."""
    kv = KVCacheManager(config(FA(2), SWA(4, 8), num_blocks=30), vllm_compat=True,
                        retention_interval=None, enable_events=True)
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


# ---- blocks an allocation takes = new blocks + free hit blocks, nulls excluded --------------
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
    kv = KVCacheManager(config(spec, num_blocks=1 + taken + 11), vllm_compat=True,
                        retention_interval=None)
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


# ---- what an allocation predicts is what it pulls ------------------------------------------
def test_blocks_pulled_match_the_hand_prediction_while_the_window_slides() -> None:
    """vLLM's test_predictor_matches_allocator_blocks_calculation_with_admission_cap (SWA(2, W=8),
    chunks of 4 up to 16 tokens, vLLM compat): each allocation pulls cdiv(computed + new, 2) -
    len(table) blocks and releases the blocks that left the window: skipped = computed - 8 + 1
    tokens, whole blocks below it. The free count moves by exactly pulled - released."""
    kv = KVCacheManager(config(SWA(2, 8), num_blocks=40), vllm_compat=True, retention_interval=None)
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


# ---- hybrid combinations all hit the shared 48 tokens --------------------------------------
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
    kv = KVCacheManager(config(*COMBOS[name], num_blocks=60), vllm_compat=compat,
                        retention_interval=None if compat else 0)
    serve(kv, "r0", C3 + [3] * 7, chunk=48, free=False)
    assert kv.lookup(Request("r1", C3 + [4] * 5)).num_tokens == 48


# ---- local hit + external blocks, two-phase ---------------------------------------------------
@pytest.mark.parametrize("groups", [2, 3])
def test_local_and_external_hit_allocate_unique_referenced_blocks(groups: int) -> None:
    """vLLM's test_cache_hit_local_and_external*: a request with 5 local hit blocks per group plus 2
    external blocks. Every block id in its tables is unique, every referenced block's ref count
    matches (check_integrity); the same after commit, free and a second allocation. The pool is
    exactly full, so allocating new blocks before touching the hits would evict them."""
    specs = (FA(4), SWA(4, 32), MLA(block_size=4))[:groups]
    tokens = list(range(1, 30))                         # 29 tokens: hits end at 20 and 28
    producer = KVCacheManager(config(*specs, num_blocks=100), hash_seed="s", vllm_compat=True,
                              retention_interval=None)
    tier: set = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    serve(producer, "p", tokens)
    consumer = KVCacheManager(config(*specs, num_blocks=1 + 8 * groups), hash_seed="s",
                              vllm_compat=True, retention_interval=None)
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


# ---- the window frees on the processed basis ---------------------------------------------------
def test_sliding_window_frees_five_blocks_at_the_first_decode_allocation() -> None:
    """vLLM's test_swa_inflight_window_free.py (synchronous scheduling): prompt 100, block 16, W=16.
    While the prefill is being computed nothing is freed; at the first decode allocation 100 - 16 +
    1 = 85 tokens are skipped: 5 blocks become null and return to the free queue; no double free
    later."""
    kv = KVCacheManager(config(SWA(16, 16), num_blocks=20), vllm_compat=True,
                        retention_interval=None)
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


# ---- a sliding group never holds the whole sequence ----------------------------------------------
@pytest.mark.parametrize("compat, swa_peak", [(True, 12), (False, 13)])
def test_sliding_window_admission_holds_a_window_not_the_sequence(compat: bool, swa_peak: int) -> None:
    """vLLM's test_can_fit_full_sequence_swa_cap_admits_long_prompt: FA(16) + SWA(16, W=64), a
    512-token prompt in chunks of 128 with a pool of 64 + 13 + 1 blocks is admitted and runs. By
    hand, before the chunk at c the window frees floor((c - 63 - hold) / 16) blocks and the table
    grows to cdiv(c + 128, 16): the SWA group peaks at 32 - 20 = 12 blocks (vLLM compat) or 13
    (default mode keeps one alignment unit more for the final-length promise, hold = 16), against
    vLLM's reservation cap of 13. A 256-token prompt does not fit a 5-block pool and changes
    nothing."""
    kv = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=64 + 13 + 1), vllm_compat=compat,
                        retention_interval=None if compat else 0)
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
    small = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=5), vllm_compat=compat)
    big = Request("big", list(range(256)))
    assert small.allocate(big, 256, small.lookup(big)) is None
    assert small.num_free_blocks == 4


# ---- the EAGLE drop is one alignment unit (no sub-block hits in hybridkv) -------------------
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
            kv = KVCacheManager(config(FA(4), num_blocks=10), spec_decode=spec, vllm_compat=compat,
                                retention_interval=None)
            serve(kv, "a", tokens + [4])
            hit = kv.lookup(Request("b", tokens + [4]))
            assert (hit.num_tokens, len(hit.block_ids[0])) == (want, want // 4), (compat, spec)
    # hash unit 2 (a FA(2) group sets the GCD): still a whole alignment unit (4) is dropped
    kv = KVCacheManager(config(FA(4), FA(2), num_blocks=20),
                        spec_decode=SpecDecode("eagle", 1, hash_lookahead=False), retention_interval=None)
    serve(kv, "a", tokens + [4])
    assert kv.lookup(Request("b", tokens + [4])).num_tokens == 4
    kv = KVCacheManager(config(FA(4), num_blocks=10), spec_decode=SpecDecode("eagle", 1))
    serve(kv, "a", tokens + [4, 5])
    assert kv.lookup(Request("b", tokens + [4, 5])).num_tokens == 8
