"""add_evicted_listener and holds_cached: what an offload-on-evict tier is told, and when."""

from __future__ import annotations

from hybridkv import KVCacheManager, Request
from tests.support.helpers import FA, SWA, config


def _serve(kv: KVCacheManager, rid: str, tokens: list[int]) -> Request:
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    assert kv.allocate(req, len(tokens) - hit.num_tokens, hit) is not None
    req.num_computed_tokens = len(tokens)
    kv.free(req)
    return req


def test_the_listener_hears_each_cached_hash_that_leaves_the_pool_and_nothing_else() -> None:
    kv = KVCacheManager(config(FA(4), num_blocks=9), enable_events=True)
    heard: list[tuple[int, bytes]] = []
    kv.add_evicted_listener(lambda g, h: heard.append((g, h)))
    a = _serve(kv, "a", list(range(17)))             # 4 full blocks cached, 1 partial
    cached = [a.block_hashes[j] for j in range(4)]
    assert heard == [] and all(kv.holds_cached(0, h) for h in cached)
    # b takes 5 blocks: a's partial (unhashed), the 3 never used, then the oldest cached one
    _serve(kv, "b", list(range(100, 117)))
    assert len(heard) == 1 and all(g == 0 for g, _ in heard)
    assert {h for _, h in heard} <= set(cached)
    for _, h in heard:
        assert not kv.holds_cached(0, h)
    assert sum(kv.holds_cached(0, h) for h in cached) == 3
    removed = [e for e in kv.take_events() if type(e).__name__ == "BlockRemoved"]
    assert len(removed) == 1                          # the KV events still flow


def test_a_sliding_group_offers_only_blocks_its_write_path_cached() -> None:
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=40), retention_interval=0)
    cached: set[tuple[int, bytes]] = set()
    kv.add_cached_listener(lambda g, hashes, blocks: cached.update((g, h) for h in hashes))
    heard: list[tuple[int, bytes]] = []
    kv.add_evicted_listener(lambda g, h: heard.append((g, h)))
    for i in range(6):
        _serve(kv, f"r{i}", [1000 * i + t for t in range(60)])
    assert any(g == 1 for g, _ in heard)
    assert set(heard) <= cached
    window_cached = sum(1 for g, _ in cached if g == 1)
    assert window_cached < sum(1 for g, _ in cached if g == 0)   # windows, not whole prompts
