"""``KVCacheManager.stats()``: queries and hits add up over requests, each admitted request is
counted once, and preempted requests are counted apart.
"""

from __future__ import annotations

from hybridkv import (MLA, KVCacheConfig, KVCacheGroup, KVCacheManager, Request, SlidingWindow,
                      SpecDecode)
from tests.support.helpers import FA, config, manager, prompt, run_prompt, serve
from hybridkv.core.cache_options import CacheOptions


def test_stats_count_every_admitted_request_once() -> None:
    """_record; allocate — hits and queries add up over requests (the last one does not
    overwrite them), a request allocated without a hit adds no hit, a request that skips the
    cache or a manager without caching counts nothing, a failed allocation counts nothing, and
    preempted requests add up apart.

    "a" (12 tokens) caches 3 blocks; "b" (13 tokens, hit 12); "c" (5 other tokens, allocated
    without a lookup: hit None); "d" skips the cache; "e" (40 tokens) does not fit; "p1", "p2"
    are preempted requests with hits 12 and 8."""
    kv = KVCacheManager(config(FA(4), num_blocks=12), CacheOptions(vllm_compat=True))
    serve(kv, "a", prompt(0, 12))
    serve(kv, "b", prompt(0, 13))
    c = Request("c", prompt(300, 5))
    assert kv.allocate(c, 5) is not None
    kv.free(c)
    serve(kv, "d", prompt(0, 13), skip_prefix_cache=True)
    e = Request("e", prompt(600, 48))
    assert kv.allocate(e, 48, kv.lookup(e)) is None
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (3, 12 + 13 + 5, 12)
    for rid, n in (("p1", 13), ("p2", 9)):
        p = Request(rid, prompt(0, n))
        p.num_preemptions = 1
        hit = kv.lookup(p)
        assert kv.allocate(p, n - hit.num_tokens, hit) is not None
        kv.free(p)
    s = kv.stats()
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (2, 22, 20)
    assert (s.requests, s.queries, s.hits) == (3, 30, 12)
    off = KVCacheManager(config(FA(4), num_blocks=12), CacheOptions(enable_caching=False))
    serve(off, "a", prompt(0, 12))
    assert (off.stats().requests, off.stats().queries) == (0, 0)


def test_stats_count_preempted_requests_apart() -> None:
    """stats — the three preempted counters replaced by None.

    "a" caches 8 tokens (2 blocks of 4). A preempted 9-token request with the same prefix
    hits 8: preempted_requests 1, preempted_queries 9, preempted_hits 8; the normal counters
    hold only "a" (1 request, 9 queries, 0 hits)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    serve(kv, "a", prompt(0, 9))
    p = Request("p", prompt(0, 9))
    p.num_preemptions = 1
    hit = kv.lookup(p)
    assert hit.num_tokens == 8
    assert kv.allocate(p, 1, hit) is not None
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (1, 9, 0)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 9, 8)


def test_stats_count_queries_and_hits():
    kv = manager(FA(4), num_blocks=30, compat=False)
    run_prompt(kv, "a", list(range(20)))
    run_prompt(kv, "b", list(range(20)))
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (2, 40, 16)


def _v4_flash_groups(num_blocks: int) -> KVCacheConfig:
    """DeepSeek-V4-Flash's five groups at its block sizes {256, 64, 64, 4, 8} (vLLM #42948;
    the deepseek-v4-flash preset) plus its MTP layer in a draft group."""
    def swa(bs: int, w: int) -> SlidingWindow:
        return SlidingWindow(bs, num_kv_heads=1, head_dim=8, window=w)
    return KVCacheConfig((
        KVCacheGroup("mla", MLA(256), ("l0",)), KVCacheGroup("swa_a", swa(64, 128), ("l1",)),
        KVCacheGroup("swa_b", swa(64, 128), ("l2",)), KVCacheGroup("c4", swa(4, 8), ("l3",)),
        KVCacheGroup("c128", swa(8, 128), ("l4",)),
        KVCacheGroup("mtp", MLA(256), ("mtp.0",), is_draft=True)), num_blocks=num_blocks)


def _resend_rates(kv: KVCacheManager, n: int) -> tuple[int, tuple[float, ...]]:
    """Serve an ``n``-token prompt, then resend it: the resend's hit and its per-group block
    hit rate (the counters' difference over the resend alone)."""
    serve(kv, "a", prompt(1000, n))
    before = kv.stats()
    b, hit = run_prompt(kv, "b", prompt(1000, n))
    kv.free(b)
    after = kv.stats()
    return hit.num_tokens, tuple(
        (h1 - h0) / (q1 - q0) for h0, h1, q0, q1 in zip(before.group_hit_blocks, after.group_hit_blocks,
                                                      before.group_query_blocks, after.group_query_blocks))


def test_block_hit_rate_by_group_counts_each_groups_own_hit() -> None:
    """_record; lookup — per group, the blocks a hit could cover ((num_tokens - 1) // bs) and
    the blocks of the group's own hit, on DeepSeek-V4-Flash's groups.

    A resend of an 8,193-token prompt (32 blocks of 256 a hit could cover): without
    speculative decoding every group hits all of them (8,192 tokens: 1.0); MTP in drop mode
    needs the block after the hit, which the resend does not have past 8,192, so the hit is
    31 x 256 = 7,936 tokens and every group's rate is 31/32 = 0.96875 (vLLM #51771's "one
    block, 96.9 %"). The first request of each run counts its blocks with no hit: 8,192 /
    bs queried per group (32, 128, 128, 2,048, 1,024)."""
    kv = KVCacheManager(_v4_flash_groups(30_000))
    assert _resend_rates(kv, 8193) == (8192, (1.0,) * 6)
    s = kv.stats()
    assert s.group_query_blocks == (64, 256, 256, 4096, 2048, 64)
    assert s.block_hit_rate_by_group == (0.5,) * 6
    drop = KVCacheManager(_v4_flash_groups(30_000), CacheOptions(
        spec_decode=SpecDecode("mtp", 1, hash_lookahead=False)))
    assert _resend_rates(drop, 8193) == (7936, (0.96875,) * 6)


def test_block_hit_rate_by_group_names_the_group_a_broken_mask_empties() -> None:
    """_record; lookup — a write mask that never caches one window group (the c4 group's
    runs are skipped, like vLLM #51771's disjoint read gate and write mask) takes the common
    hit to 0: the aggregate rate is 0 as if nothing were ever cached, while the per-group
    rates show c4 at 0 and every other group at its correct-drop 31/32."""
    kv = KVCacheManager(_v4_flash_groups(30_000), CacheOptions(
        spec_decode=SpecDecode("mtp", 1, hash_lookahead=False)))
    real = kv.coordinator._cache_ends
    broken = kv.config.group_index("c4")

    def cache_ends(g, *args):
        if g != broken:
            real(g, *args)
    kv.coordinator._cache_ends = cache_ends
    assert _resend_rates(kv, 8193) == (0, (0.96875, 0.96875, 0.96875, 0.0, 0.96875, 0.96875))
    assert kv.stats().hits == 0
