"""Eviction policies (hybridkv.core.eviction) driven through the manager.

* every policy keeps ``check_integrity`` green after every step of random operation sequences,
  and every hit reads blocks that hold the request's tokens (shadow record) and equals the
  oracle over the KV-event mirror (so a hit never reads a block the policy evicted: its
  ``BlockRemoved`` took the key out of the mirror);
* LRU builds the untouched :class:`BlockPool` (the seam costs it nothing);
* each policy's own promise on small hand-made sequences; bad names get a clear error.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request, SlidingWindow
from hybridkv.core.eviction import POLICIES, RECOMMENDED, make_policy, resolve_policy
from hybridkv.core.pool import BlockPool, PolicyBlockPool
from tests.core.test_properties import MAX_OPS, MIN_OPS, Model, configs, decode_ops
from tests.hypothesis_budget import budgeted, examples, note

NON_LRU = [p for p in POLICIES if p not in ("lru", "recommended")]


def _run(cfg_args, ops, policy: str) -> None:
    cfg, retention, spec, _ = cfg_args
    kv = KVCacheManager(cfg, retention_interval=retention, spec_decode=spec, enable_events=True,
                        eviction_policy=policy)
    m = Model(kv, spec, False)
    for op, x in ops:
        if op == 7:
            assert kv.reset_prefix_cache() == (not m.running)
        elif op <= 1 or not m.running:
            base = m.prompts[x % len(m.prompts)] if m.prompts and x % 3 else []
            keep = base[: (x // 7) % (len(base) + 1)]
            tokens = keep + [(x >> k) % 5 for k in range(1 + x % 13)]
            m.admit(tokens, "s" if x % 11 == 0 else None, chunk=1 + x % 40)
        elif op <= 4:
            m.step(sorted(m.running)[x % len(m.running)], x % 5)
        else:
            m.finish(sorted(m.running)[x % len(m.running)])
        kv.check_integrity()
    note("evictions", kv.stats().evictions)
    for rid in list(m.running):
        m.finish(rid)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1


@pytest.mark.parametrize("policy", NON_LRU)
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg_args=configs(states=False), ops=st.binary(min_size=4 * MIN_OPS, max_size=4 * MAX_OPS).map(decode_ops))
@budgeted(0.15)
def test_random_operations_keep_invariants(policy, cfg_args, ops):
    _run(cfg_args, ops, policy)


def _cfg(num_blocks: int, *specs) -> KVCacheConfig:
    specs = specs or (FullAttention(block_size=4, num_kv_heads=1, head_dim=4),)
    return KVCacheConfig(tuple(KVCacheGroup(f"g{i}", s, (f"l{i}",)) for i, s in enumerate(specs)),
                         num_blocks=num_blocks)


def _serve(kv: KVCacheManager, rid: str, tokens: list[int]) -> int:
    """Run one request to completion (prefill only) and free it; the hit length in tokens."""
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
    req.num_computed_tokens = req.num_tokens
    kv.free(req)
    kv.check_integrity()
    return hit.num_tokens


def test_lru_keeps_the_plain_pool():
    assert type(KVCacheManager(_cfg(8)).pool) is BlockPool
    assert type(KVCacheManager(_cfg(8), eviction_policy="lru").pool) is BlockPool
    for p in NON_LRU:
        assert type(KVCacheManager(_cfg(8), eviction_policy=p).pool) is PolicyBlockPool


def test_bad_policy_names():
    for bad in ("LRU", "", "fifo", None, 3):
        with pytest.raises(ValueError, match="unknown eviction policy.*valid: lru, s3fifo"):
            KVCacheManager(_cfg(8), eviction_policy=bad)
    with pytest.raises(ValueError, match="vllm_compat.*must be 'lru'"):
        KVCacheManager(_cfg(8), eviction_policy="s3fifo", vllm_compat=True)
    assert resolve_policy("recommended") == RECOMMENDED
    assert make_policy("lru") is None


@pytest.mark.parametrize("policy", ["s3fifo", "lfu", "cost"])
def test_hot_prefix_survives_a_scan(policy):
    """A prefix hit twice survives a stream of one-off prompts larger than the cache, which
    flushes it under LRU (the scan-resistance every non-LRU policy here promises)."""
    def run(p: str) -> int:
        kv = KVCacheManager(_cfg(24), eviction_policy=p)
        hot = list(range(100, 117))                         # 4 full blocks + 1 token
        _serve(kv, "h0", hot)
        assert _serve(kv, "h1", hot) == 16
        assert _serve(kv, "h2", hot) == 16
        for i in range(12):                                  # 12 x 3 blocks > 23 blocks
            _serve(kv, f"s{i}", [1000 + 20 * i + k for k in range(13)])
        return _serve(kv, "h3", hot)
    assert run("lru") == 0
    assert run(policy) == 16


def test_tail_goes_before_prefix():
    """One request's chain, freed tail first: every policy evicts its tail before its prefix,
    so a shorter cache still serves the longest prefix it can."""
    for p in POLICIES:
        kv = KVCacheManager(_cfg(10), eviction_policy=p)
        _serve(kv, "a", list(range(33)))        # 9 blocks: 8 cached + 1 partial scratch
        _serve(kv, "b", [500 + k for k in range(9)])        # 3 blocks: scratch + 2 evicted
        assert _serve(kv, "c", list(range(33))) == 24, p    # blocks 0..5 left: 24 tokens


def test_cost_policy_keeps_full_attention_over_sliding_window():
    full = FullAttention(block_size=512, num_kv_heads=1, head_dim=4)
    swa = SlidingWindow(block_size=512, num_kv_heads=1, head_dim=4, window=512)
    kv = KVCacheManager(_cfg(8, full, swa), eviction_policy="cost")
    w = kv.pool.policy.weights
    assert w[0] == 1.0 and 0 < w[1] < w[0]


@pytest.mark.parametrize("policy", NON_LRU)
@settings(max_examples=examples(80), deadline=None)
@given(num_blocks=st.integers(2, 40),
       ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), max_size=80))
def test_policy_pool_keeps_the_region_order(policy, num_blocks, ops):
    """Pool level, every step checked: scratch and never-used blocks are always reused before
    any cached block is evicted, a hit takes exactly its block back, and ``check()`` holds."""
    pool = PolicyBlockPool(num_blocks, 1, make_policy(policy))
    held: list[int] = []
    h = 0
    for op, x in ops:
        if op <= 1 and pool.num_free:
            k = 1 + x % pool.num_free
            uncached = pool.num_free - len(pool.policy)
            before = pool.num_evictions
            got = pool.allocate(k)
            assert len(set(got)) == k and all(pool.ref_cnt[b] == 1 for b in got)
            assert pool.num_evictions - before <= max(0, k - uncached)
            for b in got[: x % 3]:
                h += 1
                pool.insert(0, h.to_bytes(8, "little"), b)
            held.extend(got)
        elif op == 2 and held:
            i = x % len(held)
            run = held[i:i + 1 + x % 4]
            del held[i:i + len(run)]
            pool.free(run[::-1])
        elif op == 3 and h:
            b = pool.cached_block(0, (1 + x % h).to_bytes(8, "little"))
            if b is not None:
                free = pool.ref_cnt[b] == 0
                n = pool.num_free
                pool.touch([b])
                assert pool.num_free == n - free and b not in pool.policy
                held.append(b)
        elif op == 4 and held:
            pool.drop_hash(held[x % len(held)])
        elif op == 5 and not held:
            pool.reset_hashes()
        pool.check()
    pool.free(held)
    pool.check()
    assert pool.num_free == num_blocks - 1
