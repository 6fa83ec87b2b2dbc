"""The hit-point layer: on a hybrid config, windows go with the chain they end.

* at the pool, block by block: the inner policy ranks key-group blocks only; the companions an
  evicted anchor held are evicted before the policy's next victim; a companion freed without a
  cached anchor goes first; live companions go last, oldest first; a reallocated anchor orphans
  its companions; a hit takes a companion back;
* through the manager: which configs get the layer (hybrid, a policy object; never LRU
  without hints or compat mode), and where the coordinator anchors each companion (the key
  block ending its hit point);
* the case that shows why: a request's hit point survives eviction pressure that, block by
  block, would evict its window first.

The random-operation property tests (``test_every_policy.py``, ``test_hint_layer.py``) run
every policy, hybrid configs included, through this layer with the integrity check after every
step.
"""

from __future__ import annotations

import pytest

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request, SlidingWindow,
                      SpecDecode)
from hybridkv.core.eviction import HitPointLayer, LRUPolicy, key_group, make_policy
from hybridkv.core.eviction.hint_layer import HintLayer
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.rules import make_rule
from hybridkv.core.cache_options import CacheOptions


def _pool(num_blocks: int = 16) -> PolicyBlockPool:
    return PolicyBlockPool(num_blocks, 2, HitPointLayer(LRUPolicy(), key_group=0))


def _cache(pool: PolicyBlockPool, group: int, blocks: list[int], tag: str) -> None:
    for i, b in enumerate(blocks):
        pool.insert(group, f"{tag}{i}".encode().ljust(16, b"."), b)


def test_an_evicted_anchor_takes_its_companions_before_the_next_victim():
    pool = _pool()
    blocks = pool.allocate(8)
    assert blocks == [1, 2, 3, 4, 5, 6, 7, 8]
    _cache(pool, 0, [1, 2], "a")          # request a: key chain 1, 2; windows 3, 4 end at block 2
    _cache(pool, 1, [3, 4], "aw")
    _cache(pool, 0, [5, 6], "b")          # request b: key chain 5, 6; windows 7, 8 end at block 6
    _cache(pool, 1, [7, 8], "bw")
    pool.anchor([3, 4], [2, 2])
    pool.anchor([7, 8], [6, 6])
    pool.free([2, 1])                     # a, key group tail first, then its windows
    pool.free([4, 3])
    pool.free([6, 5])
    pool.free([8, 7])
    pool.check()
    pool.allocate(7)                      # the 7 never-used ids go first
    # LRU over the key group: 2 first (a's tail), which kills a's windows 4, 3: they go next,
    # before the policy's next victim 1; then b's tail 6 and its windows
    assert pool.allocate(6) == [2, 4, 3, 1, 6, 8]
    layer = pool.policy
    assert layer.counts == (4, 3, 0)      # 4 killed with an anchor, 3 dead evicted, 0 live
    assert list(layer) == [7, 5] and pool.block_hash[7] is not None
    pool.check()


def test_block_by_block_lru_would_break_the_hit_point_first():
    """The same frees under the pool's plain LRU queue evict a's first window block after a's
    whole key chain only because the key group was freed first; freed windows first (as a
    window release during the prefill does), LRU takes a window before any key block."""
    plain = PolicyBlockPool(16, 2, LRUPolicy())
    layered = _pool()
    for pool in (plain, layered):
        pool.allocate(4)
        _cache(pool, 0, [1, 2], "a")
        _cache(pool, 1, [3, 4], "aw")
        pool.anchor([3, 4], [2, 2]) if pool is layered else None
        pool.free([4, 3])                 # the windows leave first (window release)
        pool.free([2, 1])
        pool.allocate(11)
    assert plain.allocate(1) == [4]       # LRU: a window, so the hit point at block 2 is gone
    assert layered.allocate(1) == [2]     # the layer: the chain's tail, its windows right after
    assert layered.allocate(2) == [4, 3]


def test_a_companion_without_a_cached_anchor_goes_first():
    pool = _pool()
    pool.allocate(4)
    _cache(pool, 0, [1], "k")
    _cache(pool, 1, [2, 3, 4], "w")
    pool.anchor([2, 3, 4], [1, 0, 1])     # 3's hit point has no key block cached
    pool.free([1])
    pool.free([2, 3, 4])
    pool.allocate(11)
    assert pool.allocate(4) == [3, 1, 4, 2]     # killed companions: latest anchored first
    assert pool.policy.counts == (2, 3, 0)


def test_live_companions_go_last_oldest_first_when_nothing_else_is_free():
    pool = _pool(8)
    pool.allocate(3)
    _cache(pool, 0, [1], "k")
    _cache(pool, 1, [2, 3], "w")
    pool.anchor([3, 2], [1, 1])
    pool.free([3, 2])                     # the key block stays in use
    pool.allocate(4)                      # the never-used ids
    assert pool.allocate(1) == [3]        # only live companions are free
    assert pool.policy.counts == (0, 0, 1)
    assert pool.policy.anchor_of == {2: 1} and pool.policy.comps_of == {1: {2: None}}
    pool.check()


def test_a_reallocated_anchor_orphans_its_companions_and_a_hit_takes_one_back():
    pool = _pool(8)
    pool.allocate(3)
    _cache(pool, 0, [1], "k")
    _cache(pool, 1, [2, 3], "w")
    pool.anchor([2, 3], [1, 1])
    pool.free([2, 3])
    pool.touch([3])                       # a hit on companion 3 takes it back
    assert list(pool.policy) == [2]
    pool.free([3])
    pool.free([1])
    pool.allocate(4)
    assert pool.allocate(1) == [1]        # the anchor is the policy's victim ...
    assert pool.policy.dead == {2: None, 3: None} and not pool.policy.held
    pool.check()


def test_the_layer_refuses_a_bad_key_group():
    with pytest.raises(ValueError, match="key_group must be a group index >= 0, got -1"):
        HitPointLayer(LRUPolicy(), -1)
    with pytest.raises(ValueError, match=r"key_group 2 is not a group of a pool of 2 groups \(valid: 0..1\)"):
        PolicyBlockPool(8, 2, HitPointLayer(LRUPolicy(), 2))
    with pytest.raises(ValueError, match="inner must be an EvictionPolicy"):
        HitPointLayer(object(), 0)


# ---- which configs get it, and what the coordinator anchors ------------------------------------

FA = FullAttention(block_size=4, num_kv_heads=1, head_dim=8)
SW = SlidingWindow(block_size=2, window=4, num_kv_heads=1, head_dim=8)


def _hybrid(num_blocks: int = 64) -> KVCacheConfig:
    return KVCacheConfig((KVCacheGroup("fa", FA, ("l0",)), KVCacheGroup("sw", SW, ("l1",))), num_blocks=num_blocks)


def test_key_group_is_the_first_downward_closed_group_of_a_hybrid_config():
    assert key_group([make_rule(FA), make_rule(SW)]) == 0
    assert key_group([make_rule(SW), make_rule(FA), make_rule(FA)]) == 1
    assert key_group([make_rule(FA), make_rule(FA)]) is None     # dense: nothing to anchor
    assert key_group([make_rule(SW)]) is None
    rules = [make_rule(FA), make_rule(SW)]
    assert make_policy("lru", rules) is None                     # vLLM's order, untouched
    layered = make_policy("lru", rules, hints=True)
    assert isinstance(layered, HitPointLayer) and isinstance(layered.inner, HintLayer)
    assert isinstance(make_policy("s3fifo", rules), HitPointLayer)
    assert not isinstance(make_policy("s3fifo", [make_rule(FA)]), HitPointLayer)


def test_the_manager_anchors_each_window_block_at_the_key_block_ending_its_hit_point():
    kv = KVCacheManager(_hybrid(), CacheOptions(eviction_policy="s3fifo", retention_interval=4))
    assert kv.coordinator.anchor_key == 0
    req = Request("a", list(range(13)))          # alignment 4: hit points at 4, 8, 12
    assert kv.allocate(req, 13) is not None
    req.num_computed_tokens = 13
    fa, sw = (list(t) for t in kv.coordinator.reqs["a"].tables)
    kv.free(req)
    layer = kv.pool.policy
    # window block j (tokens [2j, 2j + 2)) ends hit point e = ceil((2j + 2) / 4) * 4, whose
    # key block is fa[e / 4 - 1]; only the cached windows (each hit point's last 4 tokens) count
    want = {sw[j]: fa[-(-(2 * j + 2) // 4) - 1] for j in range(6)
            if sw[j] and kv.pool.block_hash[sw[j]] is not None}
    assert want and layer.anchor_of == want
    kv.check_integrity()


def test_compat_mode_and_plain_lru_have_no_layer():
    assert KVCacheManager(_hybrid()).coordinator.anchor_key is None
    assert KVCacheManager(_hybrid(), CacheOptions(vllm_compat=True)).coordinator.anchor_key is None
    assert KVCacheManager(_hybrid(), CacheOptions(eviction_policy="lfu")).coordinator.anchor_key == 0


def test_a_drop_mode_proof_block_anchors_at_the_hit_point_it_proves():
    """EAGLE drop mode (no lookahead hashing): a hit at e also needs the draft group's block
    starting at e (its proof block). A draft block starting at a multiple of the alignment is
    anchored to the key block ending there, not to the next hit point's."""
    draft = KVCacheConfig((KVCacheGroup("fa", FA, ("l0",)), KVCacheGroup("sw", SW, ("l1",)),
                           KVCacheGroup("d", FA, ("l2",), is_draft=True)), num_blocks=64)
    kv = KVCacheManager(draft, CacheOptions(
        eviction_policy="s3fifo", retention_interval=4, spec_decode=SpecDecode("eagle", 1,
        hash_lookahead=False)))
    assert kv.coordinator.proof == [True, False, True]       # fa and d: one lookup unit
    req = Request("a", list(range(13)))
    assert kv.allocate(req, 13) is not None
    req.num_computed_tokens = 13
    fa, sw, d = (list(t) for t in kv.coordinator.reqs["a"].tables)
    kv.free(req)
    anchor_of, bh = kv.pool.policy.anchor_of, kv.pool.block_hash
    # draft block j covers [4j, 4j + 4): it starts at 4j, the proof of the hit point at 4j,
    # whose last key block is the key group's own proof block, fa[j]; a window block j' of
    # 2 tokens ends hit point e = ceil((2j' + 2) / 4) * 4, last key block fa[e / 4]
    cached_d = [j for j in range(1, 3) if bh[d[j]] is not None]
    assert cached_d and all(anchor_of[d[j]] == fa[j] for j in cached_d)
    for j in range(6):
        if sw[j] and bh[sw[j]] is not None:
            e = -(-(2 * j + 2) // 4) * 4
            assert anchor_of.get(sw[j]) == (fa[e // 4] if e // 4 < len(fa) else None), j
    kv.check_integrity()
