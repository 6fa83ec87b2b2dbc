"""``lfu`` and ``cost`` (``eviction/frequency.py``): fewest hits first with dynamic aging (a
freed block's priority is the age + 1 + hits), and the same weighted by each group's
recompute cost at the reference depth.
"""

from __future__ import annotations

import pytest

from hybridkv import FullAttention, KVCacheManager, SlidingWindow
from hybridkv.core.eviction import CostAwarePolicy, HitPointLayer, LFUPolicy, make_policy
from hybridkv.core.rules import make_rule
from tests.support.helpers import content_key
from tests.support.policies import Cache, check_fails, policy_config
from hybridkv.core.cache_options import CacheOptions


class _Rule:
    """A hit rule as make_policy reads it: a block size, a recompute cost per block index, and
    downward closed (a dense config: no hit-point layer)."""

    downward_closed = True

    def __init__(self, block_size: int, cost_per_block: int) -> None:
        self.block_size = block_size
        self.cost = cost_per_block
        self.asked: list = []

    def recompute_cost(self, j):
        self.asked.append(j)
        return self.cost * j


def test_cost_weights_value_each_group_at_the_reference_depth():
    """make_policy("cost", rules): group weight = max(1, recompute_cost(16384 // block_size))
    (the block at the reference depth of 16384 tokens), over the largest; no rules: one
    group of weight 1."""
    r5, r16, zero = _Rule(5, 2), _Rule(16, 1), _Rule(16, 0)
    pol = make_policy("cost", [r5, r16, zero])
    assert r5.asked == [3276] and r16.asked == [1024] and zero.asked == [1024]
    assert pol.weights == [1.0, 1024 / 6552, 1 / 6552]
    assert make_policy("cost").weights == [1.0]
    assert make_policy("cost", []).weights == [1.0]
    full = make_rule(FullAttention(block_size=16, num_kv_heads=1, head_dim=4))
    swa = make_rule(SlidingWindow(block_size=16, num_kv_heads=1, head_dim=4, window=64))
    pol = make_policy("cost", [full, swa])          # hybrid: behind the hit-point layer
    w_full, w_swa = full.recompute_cost(1024), swa.recompute_cost(1024)
    assert w_full > w_swa > 1
    assert isinstance(pol, HitPointLayer) and pol.inner.weights == [1.0, w_swa / w_full]


def test_lfu_evicts_the_fewest_hits_first_ties_in_free_order():
    """priority = age + 1 + hits: contents 1, 4, 3 never hit (priority 1, in free order: the
    chain [3, 4] is freed tail first) leave before 2 (one hit: priority 2)."""
    c = Cache(LFUPolicy(), 6)
    c.serve([1])
    c.serve([2])
    assert c.serve([2]) == 1
    c.serve([3, 4])
    assert c.drain() == [1, 4, 3, 2]


def test_lfu_ages_old_popularity_away():
    """Dynamic aging: the age L becomes each victim's priority and a freed block gets L + 1 +
    hits. 2 usable blocks. 1 is hit twice (priority 3). 2 (priority 1) is evicted by 3 (L = 1,
    so 3 gets 2); 3 is evicted by 4 (L = 2, 4 gets 3); now 1 and 4 tie at 3 and 1 was freed
    first: 1 leaves (L = 3), 5 gets 4. Drain: 4 (3), 5 (4). Without aging 1 would stay."""
    c = Cache(LFUPolicy(), 3)
    for _ in range(3):
        c.serve([1])
    for t in (2, 3, 4, 5):
        assert c.serve([t]) == 0
    assert c.evicted == [2, 3, 1]
    assert c.drain() == [4, 5]
    assert c.policy.age == 4


def test_lfu_rebuilds_its_heap_without_losing_live_blocks():
    """A block hit again and again leaves a dead heap entry per hit; once dead entries
    outnumber live ones (by 64) the heap is rebuilt from the live entries only. After 70
    rounds on content 3, the never-hit chain [1, 2] (freed tail first, so its entries' seqs
    are not its block ids) still leaves first, tail first, then 3."""
    c = Cache(LFUPolicy(), 5)
    c.serve([1, 2])
    for _ in range(70):
        c.serve([3])
    assert len(c.policy.heap) < 70                   # rebuilt at least once
    assert c.drain() == [2, 1, 3]


def test_lfu_hit_counts_reset_when_a_block_gets_new_content():
    """hits count the references since the block got its content: an id reused for new
    content starts at 0 (forget). Block b holds 1, hit twice, loses its hash while held, is
    reused for 2: 2 has priority 1, like the never-hit 3 freed after it, and goes first."""
    c = Cache(LFUPolicy(), 4)
    pool = c.pool
    b, = pool.allocate(1)
    pool.insert(0, content_key(1), b)
    pool.free([b])
    pool.touch([b])
    pool.touch([b])
    pool.drop_hash(b)
    pool.free([b, b])
    assert pool.allocate(1) == [b]
    pool.insert(0, content_key(2), b)
    pool.free([b])
    c.serve([3])
    assert c.drain() == [2, 3]


@pytest.mark.parametrize("weights", [(), (0,), (1.0, -1.0), (2.0, 0.0), (float("nan"),)])
def test_cost_weights_must_be_positive(weights):
    with pytest.raises(ValueError) as exc:
        CostAwarePolicy(weights)
    assert str(exc.value) == f"cost weights must be positive, got {list(weights)!r}"


def test_cost_priority_weighs_hits_by_the_groups_cost():
    """priority = age + (1 + hits) x weight(group), weights over the largest: (1, 4) ->
    (0.25, 1). Group 0: 1 (0 hits: 0.25), 3 (1 hit: 0.5), 4 (4 hits: 1.25); group 1: 2 (0
    hits: 1.0). Computing 5 (group 0) evicts 1 (L = 0.25), so 5 gets 0.25 + 0.25 = 0.5 and
    ties with 3, freed earlier. Drain: 3, 5, 2, 4 (LFU alone would keep 2 below 3)."""
    pol = CostAwarePolicy([1.0, 4.0])
    assert pol.weights == [0.25, 1.0]
    c = Cache(pol, 5, num_groups=2)
    c.serve([1])
    c.serve([2], group=1)
    c.serve([3])
    c.serve([3])
    for _ in range(5):
        c.serve([4])
    c.serve([5])
    assert c.evicted == [1]
    assert c.drain() == [3, 5, 2, 4]


@pytest.mark.parametrize("cls", [LFUPolicy, CostAwarePolicy])
def test_lfu_check_rejects_lost_heap_entries(cls):
    c = Cache(cls(), 4)
    c.serve([1, 2])
    c.policy.check()
    c.policy.heap.clear()
    check_fails(c.policy.check, f"{c.policy.name}: 2 held blocks but 0 live heap entries")


def test_cost_policy_keeps_full_attention_over_sliding_window():
    full = FullAttention(block_size=512, num_kv_heads=1, head_dim=4)
    swa = SlidingWindow(block_size=512, num_kv_heads=1, head_dim=4, window=512)
    kv = KVCacheManager(policy_config(8, full, swa), CacheOptions(eviction_policy="cost"))
    # on a hybrid config the policy ranks the key group behind the hit-point layer
    assert isinstance(kv.pool.policy, HitPointLayer) and kv.pool.policy.key_group == 0
    w = kv.pool.policy.inner.weights
    assert w[0] == 1.0 and 0 < w[1] < w[0]
