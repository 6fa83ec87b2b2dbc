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
from hybridkv.core.eviction.hit_points import MIN_SAMPLES
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.retention import HIT_POINT_CLASSES, hit_point_class
from hybridkv.core.rules import make_rule
from hybridkv.core.cache_options import CacheOptions


def _pool(num_blocks: int = 32, groups: int = 2, followers: tuple[int, ...] = ()) -> PolicyBlockPool:
    return PolicyBlockPool(num_blocks, groups, HitPointLayer(LRUPolicy(), key_group=0, followers=followers))


def _cache(pool: PolicyBlockPool, group: int, blocks: list[int], tag: str, last: int = 1) -> None:
    """Cache ``blocks`` in ``group`` under hashes ending in byte ``last`` (0 mod 8: sampled)."""
    for i, b in enumerate(blocks):
        pool.insert(group, f"{tag}{i}".encode().ljust(15, b".") + bytes([last]), b)


def _two_chains(pool: PolicyBlockPool) -> None:
    """Requests a (key chain 1, 2, 3; windows 5, 6 end at 3) and b (1, 2, 4; windows 7, 8 end
    at 4) share blocks 1 and 2; each hit point is anchored with its chain, then everything is
    freed, key tails first."""
    assert pool.allocate(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    _cache(pool, 0, [1, 2, 3], "a")
    _cache(pool, 0, [4], "b")
    _cache(pool, 1, [5, 6], "aw")
    _cache(pool, 1, [7, 8], "bw")
    pool.anchor([5, 6], [2, 2], [1, 2, 3])
    pool.anchor([7, 8], [2, 2], [1, 2, 4])
    pool.free([4])
    pool.free([3, 2, 1])
    pool.free([6, 5, 8, 7])


def test_a_hit_point_is_the_unit_and_its_death_frees_what_only_it_needed():
    pool = _pool()
    _two_chains(pool)
    layer = pool.policy
    assert list(layer.inner) == [4, 3]                  # the policy ranks hit points only
    assert list(layer.covered) == [2, 1] and list(layer.held) == [6, 5, 8, 7]
    assert layer.need == {4: 1, 3: 1, 2: 2, 1: 1}       # 2 is needed by both hit points
    pool.check()
    pool.allocate(23)                                   # the never-used ids go first
    # LRU over hit points: b's (anchor 4) first; its windows die, and 4 with them; 2 stays
    # (a still needs it)
    assert pool.allocate(1) == [4]
    assert list(layer.dead) == [8, 7] and layer.need == {3: 1, 2: 1, 1: 1}
    # the dead windows go before a's hit point; a's death frees its windows and its whole chain
    assert pool.allocate(3) == [8, 7, 3]
    assert list(layer.dead) == [6, 5, 2, 1] and not layer.need and not layer.covered
    assert pool.allocate(4) == [6, 5, 2, 1]
    assert layer.counts == (4, 6, 0)        # 4 companions killed, 6 dead blocks, 0 needed ones
    pool.check()


class _Scaling(LRUPolicy):
    """LRU that records the capacity shares it is told (as the hint layer's shadows are)."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[float] = []

    def scale_capacity(self, share: float) -> None:
        self.told.append(share)


def test_an_inner_policy_that_scales_hears_the_hit_points_share_of_what_they_need():
    # 33 blocks: told every 32 // 16 = 2 blocks freed; two live hit points need key blocks
    # 1-4 and windows 5-8: 2 / 8
    pool = PolicyBlockPool(33, 2, HitPointLayer(_Scaling(), 0))
    _two_chains(pool)
    assert pool.policy.inner.told == [0.25, 0.25]


class _Returns(LRUPolicy):
    """LRU that records the blocks it is told came back (as the hint layer's shadows are)."""

    def __init__(self) -> None:
        super().__init__()
        self.back: list[list[int]] = []

    def returned(self, blocks) -> None:
        self.back.append(list(blocks))


def test_a_dead_hit_point_released_again_is_told_as_returned():
    """b's hit point (anchor 4) is evicted; a request recomputes its key block (the same hash,
    into block 8) and releases it without anchoring a window there: the inner policy hears it
    came back (once), and not of a key block that never ended a hit point."""
    pool = PolicyBlockPool(32, 2, HitPointLayer(_Returns(), 0))
    _two_chains(pool)
    inner = pool.policy.inner
    pool.allocate(23)
    assert pool.allocate(1) == [4]
    assert pool.allocate(2) == [8, 7]
    _cache(pool, 0, [8], "b")                         # b0...: block 4's hash again
    _cache(pool, 0, [7], "c")
    pool.free([8, 7])
    assert inner.back == [[8]]
    assert pool.allocate(2) == [8, 7]
    _cache(pool, 0, [8], "b")
    pool.free([8])
    assert inner.back == [[8]]                         # told once per death
    pool.check()


def test_a_window_a_later_hit_point_reads_outlives_the_hit_point_it_was_anchored_at():
    """A window longer than the alignment serves several hit points; its block is anchored at
    the first. Evicting that hit point keeps the block while a later hit point on the chain
    (which needs the same key block) lives; it dies with the key block."""
    pool = _pool(16)
    pool.allocate(6)
    _cache(pool, 0, [1, 2, 5], "k")
    _cache(pool, 1, [3, 4, 6], "w")
    pool.anchor([3], [0], [1, 2])          # hit point at 1 (3 reaches 2's too)
    pool.anchor([4], [1], [1, 2])          # hit point at 2
    pool.anchor([6], [1], [1, 5])          # hit point at 5, another branch after 1
    layer = pool.policy
    assert layer.need == {1: 3, 2: 1, 5: 1}
    pool.free([1])
    pool.free([5])
    pool.free([2])
    pool.free([3, 4, 6])
    assert list(layer.inner) == [1, 5, 2]
    pool.allocate(9)
    # hit point 1 goes first, but block 1 is still needed (by 2): 3 stays; then hit point 5
    assert pool.allocate(1) == [5]
    assert list(layer.held) == [3, 4] and list(layer.dead) == [6] and list(layer.covered) == [1]
    assert layer.live == {2} and list(layer.inner) == [2]
    pool.check()
    assert pool.allocate(2) == [6, 2]
    assert list(layer.dead) == [4, 3, 1]
    pool.check()


def test_block_by_block_lru_would_break_the_hit_point_first():
    """Windows freed before the chain (a window release during the prefill): plain LRU over
    blocks takes a window first, so the hit point is gone while its whole chain stays; the
    layer takes the hit point (the chain's tail and its windows) whole."""
    plain = PolicyBlockPool(16, 2, LRUPolicy())
    layered = _pool(16)
    for pool in (plain, layered):
        pool.allocate(4)
        _cache(pool, 0, [1, 2], "a")
        _cache(pool, 1, [3, 4], "aw")
        pool.anchor([3, 4], [1, 1], [1, 2]) if pool is layered else None
        pool.free([4, 3])                 # the windows leave first (window release)
        pool.free([2, 1])
        pool.allocate(11)
    assert plain.allocate(1) == [4]       # LRU: a window, so the hit point at block 2 is gone
    assert layered.allocate(1) == [2]     # the layer: the hit point at 2 ...
    assert layered.allocate(3) == [4, 3, 1]     # ... its windows, then the chain it needed


def test_blocks_no_hit_point_needs_go_first():
    pool = _pool(16)
    pool.allocate(4)
    _cache(pool, 0, [1, 2, 3], "k")
    _cache(pool, 1, [4], "w")
    pool.anchor([4], [0], [1, 2, 3])      # the only hit point ends at block 1
    pool.free([3, 2, 1])                  # 3 and 2 (past every hit point) are dead at once
    pool.free([4])
    assert list(pool.policy.dead) == [3, 2] and list(pool.policy.inner) == [1]
    pool.allocate(11)
    assert pool.allocate(4) == [3, 2, 1, 4]
    assert pool.policy.counts == (1, 3, 0)


def test_a_companion_without_a_cached_anchor_is_dead():
    pool = _pool(16)
    pool.allocate(4)
    _cache(pool, 0, [1], "k")
    _cache(pool, 1, [2, 3, 4], "w")
    pool.anchor([2, 3, 4], [0, -1, 0], [1])     # 3's hit point has no key block cached
    pool.free([1])
    pool.free([2, 3, 4])
    pool.allocate(11)
    assert pool.allocate(4) == [3, 1, 4, 2]     # 3 dead; then the hit point's death: 4, 2
    assert pool.policy.counts == (2, 3, 0)


def test_followers_live_and_die_with_the_key_block_at_their_place():
    pool = _pool(16, groups=3, followers=(2,))
    pool.allocate(6)
    _cache(pool, 0, [1, 2], "k")
    _cache(pool, 1, [3], "w")
    _cache(pool, 2, [4, 5, 6], "f")             # a drafter's blocks: at key places 0, 1, and none
    pool.anchor([3], [1], [1, 2])
    pool.anchor([4, 5, 6], [0, 1, -1], [1, 2], follow=True)
    assert pool.policy.node_of == {4: 1, 5: 2} and 6 not in pool.policy.anchor_of
    pool.free([2, 1])
    pool.free([3])
    pool.free([6, 5, 4])
    layer = pool.policy
    assert list(layer.dead) == [6] and list(layer.held) == [3, 5, 4]
    pool.check()
    pool.allocate(9)
    assert pool.allocate(1) == [6]
    assert pool.allocate(1) == [2]              # the hit point: its window, then the chain
    assert list(layer.dead) == [5, 3, 4, 1]     # followers and windows die with their key block
    assert pool.allocate(4) == [5, 3, 4, 1]
    pool.check()


def test_needed_blocks_go_last_when_nothing_else_is_free():
    pool = _pool(8)
    pool.allocate(3)
    _cache(pool, 0, [1], "k")
    _cache(pool, 1, [2, 3], "w")
    pool.anchor([3, 2], [0, 0], [1])
    pool.free([3, 2])                     # the key block stays in use
    pool.allocate(4)                      # the never-used ids
    assert pool.allocate(1) == [3]        # only live companions are free: oldest first
    assert pool.policy.counts == (0, 0, 1)
    assert pool.policy.anchor_of == {2: 1} and pool.policy.comps_of == {1: {2: None}}
    pool.check()
    assert pool.allocate(1) == [2]        # the hit point's last companion: it dies
    assert not pool.policy.comps_of and not pool.policy.need
    pool.check()


def test_a_hit_takes_a_companion_back_and_marks_its_hit_point_served():
    pool = _pool(8)
    pool.allocate(3)
    _cache(pool, 0, [1], "k")
    _cache(pool, 1, [2, 3], "w")
    pool.anchor([2, 3], [0, 0], [1])
    pool.free([2, 3])
    pool.touch([3])                       # a hit on companion 3 takes it back: it served
    assert list(pool.policy) == [2] and pool.policy.served == {1}
    pool.free([3])
    pool.free([1])
    pool.allocate(4)
    assert pool.allocate(1) == [1]        # the hit point is the policy's victim ...
    assert list(pool.policy.dead) == [3, 2] and not pool.policy.held and not pool.policy.served
    pool.check()


def test_a_reanchored_companion_moves_and_its_old_hit_point_dies_without_it():
    pool = _pool(16)
    pool.allocate(4)
    _cache(pool, 0, [1, 2], "k")
    _cache(pool, 1, [3], "w")
    pool.anchor([3], [0], [1, 2])
    assert pool.policy.need == {1: 1}
    pool.anchor([3], [1], [1, 2])         # anchored again (a later release): the latest wins
    assert pool.policy.anchor_of == {3: 2} and pool.policy.need == {2: 1, 1: 1}
    assert pool.policy.counts[0] == 0     # the old hit point died without a companion to kill
    pool.check()


# ---- classes: where a hit point ends, and which classes serve ----------------------------------

def test_hit_point_class_is_where_it_ends_against_the_prompt():
    # prompt of 1000 tokens, alignment 256: its last aligned end r = floor(999 / 256) * 256 = 768
    assert [hit_point_class(e, 1000, 256) for e in (256, 512, 768, 1024, 1280)] == [0, 1, 2, 3, 3]
    assert hit_point_class(1024, 1025, 256) == 2 and hit_point_class(768, 1025, 256) == 1
    assert HIT_POINT_CLASSES == 4


def _hit_point(pool: PolicyBlockPool, tag: str, cls: int, served: bool) -> None:
    """One sampled hit point of class ``cls`` (a key block and a window block), freed; a hit
    on its window first if ``served``."""
    k, w = pool.allocate(2)
    _cache(pool, 0, [k], tag, last=0)
    _cache(pool, 1, [w], tag + "w", last=0)
    pool.anchor([w], [0], [k], classes=[cls])
    pool.free([w, k])
    if served:
        pool.touch([k, w])
        pool.free([w, k])


def test_a_class_whose_sampled_hit_points_serve_little_is_cold_and_its_hit_points_go_first():
    pool = PolicyBlockPool(4096, 2, HitPointLayer(LRUPolicy(), 0))
    layer = pool.policy
    for i in range(MIN_SAMPLES):          # class 1: every third served; class 3: none
        _hit_point(pool, f"one{i}", 1, i % 3 == 0)
        _hit_point(pool, f"three{i}", 3, False)
        assert layer.cold == [False] * 4 or i == MIN_SAMPLES - 1
    assert layer.born_n == [0, MIN_SAMPLES, 0, MIN_SAMPLES] and layer.served_n == [0, 11, 0, 0]
    assert layer.cold == [False, False, False, True]
    # a new class-3 hit point outside the sample (hash byte 1) is idle, a sampled one is not
    k, w, k2, w2 = pool.allocate(4)
    _cache(pool, 0, [k], "late", last=1)
    _cache(pool, 1, [w], "latew", last=1)
    _cache(pool, 0, [k2], "samp", last=8)
    _cache(pool, 1, [w2], "sampw", last=8)
    pool.anchor([w], [0], [k], classes=[3])
    pool.anchor([w2], [0], [k2], classes=[3])
    pool.free([w, k, w2, k2])
    assert list(layer.idle) == [k] and k2 in layer.inner
    pool.allocate(pool.queue.num_free)
    assert pool.allocate(2) == [k, w]     # the idle hit point before every ranked one
    pool.check()


def test_a_bad_class_is_refused():
    pool = _pool()
    pool.allocate(2)
    _cache(pool, 0, [1], "k")
    _cache(pool, 1, [2], "w")
    with pytest.raises(ValueError, match="hit-point class must be in 0..3, got 4"):
        pool.anchor([2], [0], [1], classes=[4])


def test_the_layer_refuses_a_bad_key_group_or_follower():
    with pytest.raises(ValueError, match="key_group must be a group index >= 0, got -1"):
        HitPointLayer(LRUPolicy(), -1)
    with pytest.raises(ValueError, match=r"group 2 of the hit-point layer is not a group of a pool of 2 "
                                         r"groups \(valid: 0..1\)"):
        PolicyBlockPool(8, 2, HitPointLayer(LRUPolicy(), 2))
    with pytest.raises(ValueError, match="inner must be an EvictionPolicy"):
        HitPointLayer(object(), 0)
    with pytest.raises(ValueError, match=r"followers must be group indices >= 0 other than the key "
                                         r"group 0, got \['0'\]"):
        HitPointLayer(LRUPolicy(), 0, followers=[0])


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
    # classes against the prompt's last aligned end, floor(12 / 4) * 4 = 12: the hit points
    # at 4, 8 and 12 are 0 (below), 1 (one unit below) and 2 (the resend end)
    assert {a: c & 7 for a, c in layer.cls_of.items()} == {fa[0]: 0, fa[1]: 1, fa[2]: 2}
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
    anchor_of, node_of, bh = kv.pool.policy.anchor_of, kv.pool.policy.node_of, kv.pool.block_hash
    # draft block j covers [4j, 4j + 4): a follower (full attention) at the place of the key
    # block it goes with: it starts at 4j, the proof of the hit point at 4j, whose last key
    # block is the key group's own proof block, fa[j]; a window block j' of 2 tokens ends hit
    # point e = ceil((2j' + 2) / 4) * 4, last key block fa[e / 4]
    cached_d = [j for j in range(1, 3) if bh[d[j]] is not None]
    assert cached_d and all(node_of[d[j]] == fa[j] for j in cached_d)
    for j in range(6):
        if sw[j] and bh[sw[j]] is not None:
            e = -(-(2 * j + 2) // 4) * 4
            assert anchor_of.get(sw[j]) == (fa[e // 4] if e // 4 < len(fa) else None), j
    kv.check_integrity()
