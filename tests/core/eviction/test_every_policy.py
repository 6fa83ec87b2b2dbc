"""What every eviction policy promises, driven through the manager.

* every policy keeps ``check_integrity`` green after every step of random operation sequences,
  and every hit reads blocks that hold the request's tokens (shadow record) and equals the
  oracle over the KV-event mirror (so a hit never reads a block the policy evicted: its
  ``BlockRemoved`` took the key out of the mirror);
* a prefix hit twice survives a scan; one request's tail goes before its prefix; the sweep's
  seeded operation mix stays consistent at every step.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv import KVCacheManager
from hybridkv.core.eviction import POLICIES, make_policy
from hybridkv.core.policy_pool import PolicyBlockPool
from tests.hypothesis_budget import budgeted, examples, note
from tests.support.policies import NON_LRU, policy_config, serve_prompt
from tests.support.random_ops import MAX_OPS, MIN_OPS, Model, configs, decode_ops
from hybridkv.core.cache_options import CacheOptions


def _run(cfg_args, ops, policy: str) -> None:
    cfg, retention, spec, _ = cfg_args
    kv = KVCacheManager(cfg, CacheOptions(
        retention_interval=retention, spec_decode=spec, enable_events=True, eviction_policy=policy))
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


@pytest.mark.parametrize("policy", ["s3fifo", "lfu", "cost"])
def test_hot_prefix_survives_a_scan(policy):
    """A prefix hit twice survives a stream of one-off prompts larger than the cache, which
    flushes it under LRU (the scan-resistance every non-LRU policy here promises)."""
    def run(p: str) -> int:
        kv = KVCacheManager(policy_config(24), CacheOptions(eviction_policy=p))
        hot = list(range(100, 117))                         # 4 full blocks + 1 token
        serve_prompt(kv, "h0", hot)
        assert serve_prompt(kv, "h1", hot) == 16
        assert serve_prompt(kv, "h2", hot) == 16
        for i in range(12):                                  # 12 x 3 blocks > 23 blocks
            serve_prompt(kv, f"s{i}", [1000 + 20 * i + k for k in range(13)])
        return serve_prompt(kv, "h3", hot)
    assert run("lru") == 0
    assert run(policy) == 16


def test_tail_goes_before_prefix():
    """One request's chain, freed tail first: every policy evicts its tail before its prefix,
    so a shorter cache still serves the longest prefix it can."""
    for p in POLICIES:
        kv = KVCacheManager(policy_config(10), CacheOptions(eviction_policy=p))
        serve_prompt(kv, "a", list(range(33)))        # 9 blocks: 8 cached + 1 partial scratch
        serve_prompt(kv, "b", [500 + k for k in range(9)])        # 3 blocks: scratch + 2 evicted
        assert serve_prompt(kv, "c", list(range(33))) == 24, p    # blocks 0..5 left: 24 tokens


@pytest.mark.parametrize("policy", NON_LRU)
def test_seeded_operation_mix(policy):
    """The sweep's cost benchmark mix (allocate, free tail first, hits), checked every step: a
    queue emptied by hits and refilled later must stay reachable (an eva regression)."""
    from hybridkv.sim.policy_cost import pool_op_mix
    pool = PolicyBlockPool(300, 1, make_policy(policy))
    held = pool_op_mix(pool, 3000, seed=1, after_step=lambda p: p.check())
    for run in held:
        pool.free(run)
    pool.check()
    assert pool.num_free == 299
