"""``KVCacheManager.stats()``: queries and hits add up over requests, each admitted request is
counted once, and preempted requests are counted apart.
"""

from __future__ import annotations

from hybridkv import KVCacheManager, Request
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
