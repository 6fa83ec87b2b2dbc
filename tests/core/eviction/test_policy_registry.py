"""Tests that kill the mutants mutmut found surviving in ``src/hybridkv/core/eviction/*``
(TESTING.md, "Mutation testing"; the survivors left: docs/mutation-survivors.md).

An eviction policy decides *which* cached free block is reused next, so the observable is the
eviction order: each test drives a :class:`PolicyBlockPool` (the pool every non-LRU policy is
attached to) through the documented seam — compute a chain, hit its cached prefix, free it
tail first, allocate until victims are taken — and asserts the contents evicted, first victim
first, with the order derived by hand from the policy's documented algorithm (the comments
walk through each derivation). Content ``t`` is stored under the key ``t.to_bytes(8)``.
"""

from __future__ import annotations

import math

import pytest

from hybridkv import FullAttention, SlidingWindow
from hybridkv.core.eviction import (POLICIES, AdaptivePolicy, ChainARCPolicy, CostAwarePolicy, EVAPolicy,
                                    LFUPolicy, PriorityPolicy, S3FIFOPolicy, TurnAdaptivePolicy, TurnEVAPolicy,
                                    make_policy, resolve_policy)
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.rules import make_rule
from tests.support.helpers import serve_chain
from tests.support.policies import Cache, check_fails, model_workload
from tests.support.helpers import content_key


# ---- the registry (eviction/__init__.py) and the base class --------------------------------

@pytest.mark.parametrize("bad", ["LRU", "", "fifo", None, 3, "adaptive "])
def test_unknown_policy_name_is_refused_naming_it_and_the_valid_names(bad):
    """resolve_policy / make_policy: the message names the bad value (repr) and every valid name."""
    msg = (f"unknown eviction policy {bad!r}; valid: lru, s3fifo, lfu, cost, eva, eva-turns, arc, "
           "adaptive, adaptive-turns, priority, recommended")
    for call in (resolve_policy, make_policy):
        with pytest.raises(ValueError) as exc:
            call(bad)
        assert str(exc.value) == msg


def test_each_policy_name_builds_its_policy():
    """make_policy maps every valid name to its class (``lru``: None, the pool's own list;
    ``recommended``: ``adaptive``); ``adaptive-turns`` challenges LRU with chain ARC and
    eva-turns, ``adaptive`` with chain ARC alone."""
    want = {"lru": type(None), "s3fifo": S3FIFOPolicy, "lfu": LFUPolicy, "cost": CostAwarePolicy,
            "eva": EVAPolicy, "eva-turns": TurnEVAPolicy, "arc": ChainARCPolicy,
            "adaptive": AdaptivePolicy, "adaptive-turns": TurnAdaptivePolicy, "priority": PriorityPolicy,
            "recommended": AdaptivePolicy}
    assert set(want) == set(POLICIES)
    for name, cls in want.items():
        assert type(make_policy(name)) is cls, name
        assert resolve_policy(name) == ("adaptive" if name == "recommended" else name)
    assert [type(a) for a in make_policy("adaptive").alts] == [ChainARCPolicy]
    assert [type(a) for a in make_policy("adaptive-turns").alts] == [ChainARCPolicy, TurnEVAPolicy]
    assert [type(a) for a in make_policy("recommended").alts] == [ChainARCPolicy]
    # eva-turns keeps its own horizon (64 buckets), eva its (32)
    assert make_policy("eva-turns").ages == 64 and make_policy("eva").ages == 32


def test_priority_policy_from_the_registry_reads_its_clock():
    """make_policy("priority", clock=...) uses the given clock for TTLs; the default clock is
    a working callable (time.monotonic)."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = make_policy("priority", clock=lambda: t[0])
    c = Cache(pol, 4)
    a, b, d = c.pool.allocate(3)
    for blk, k in ((a, 1), (b, 2), (d, 3)):
        c.pool.insert(0, content_key(k), blk)
    c.pool.retain([a, b, d], [0], [RetentionMark(1, 90, 5.0)])       # block a: priority 90 for 5 s
    c.pool.free([a, b, d])
    t[0] = 1.0
    assert c.drain() == [2, 3, 1]                 # 1 still pinned at t = 1
    default = make_policy("priority")
    Cache(default, 4).serve([1, 2])
    assert callable(default.clock) and isinstance(default.clock(), float)


class _Rule:
    """A hit rule as make_policy reads it: a block size and a recompute cost per block index."""

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
    pol = make_policy("cost", [full, swa])
    w_full, w_swa = full.recompute_cost(1024), swa.recompute_cost(1024)
    assert w_full > w_swa > 1
    assert pol.weights == [1.0, w_swa / w_full]


def test_a_policy_attaches_to_one_pool_only():
    """attach: a policy already owned by a pool refuses a second pool, naming itself;
    attaching again to its own pool is harmless (the base rule; ``adaptive`` attaches its
    shadows once, so it is called once, as the contract says)."""
    for name in ("s3fifo", "lfu", "arc", "eva", "adaptive", "priority"):
        pol = make_policy(name)
        first = PolicyBlockPool(4, 1, pol)
        assert pol.pool is first
        if name != "adaptive":
            pol.attach(first)
            assert pol.pool is first
        with pytest.raises(ValueError) as exc:
            PolicyBlockPool(4, 1, pol)
        assert str(exc.value) == f"eviction policy {pol.name!r} is already attached to another pool"
        assert pol.pool is first


# ---- s3fifo ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", [0, 0.0, 1, 1.0, -0.5, 1.5])
def test_s3fifo_small_ratio_must_be_a_fraction(ratio):
    with pytest.raises(ValueError) as exc:
        S3FIFOPolicy(small_ratio=ratio)
    assert str(exc.value) == f"small_ratio must be in (0, 1), got {ratio!r}"


def test_s3fifo_small_queue_goes_first_only_while_over_its_share():
    """Victims come from ``small`` while it holds more than 10 % of the held blocks (or ``main``
    is empty), else from ``main``, where a hit block gets a second chance (count - 1, back to
    the end). 11 blocks: contents 1..10 hit once (main, tail first: 10, 9, .., 1), 100 never
    hit (small). Draining: small 1 of 11 (not > 1.1) -> main: every block spends its hit going
    round once, then 10 leaves; small 1 of 10 (not > 1.0) -> 9 leaves; small 1 of 9 (> 0.9)
    -> 100 leaves; then main in order."""
    c = Cache(S3FIFOPolicy(), 12)
    chain = list(range(1, 11))
    c.serve(chain)
    assert c.serve(chain) == 10
    c.serve([100])
    assert c.drain() == [10, 9, 100, 8, 7, 6, 5, 4, 3, 2, 1]


def test_s3fifo_small_exactly_at_its_share_is_not_over_it():
    """small_ratio 0.5, 2 blocks in small and 2 in main: 2 is not more than half of 4, so the
    victim comes from main (its hit spent first: both main blocks go round, then 2 leaves);
    then small 2 of 3 is over half: 11 leaves; small 1 of 2 is not: 1 (main); then 12."""
    c = Cache(S3FIFOPolicy(small_ratio=0.5), 5)
    c.serve([1, 2])
    c.serve([1, 2])                                 # main: 2, 1 (freed tail first), one hit each
    c.serve([11])
    c.serve([12])                                   # small: 11, 12
    assert c.drain() == [2, 11, 1, 12]


def test_s3fifo_hit_counts_cap_at_three():
    """A block's hit count is capped at 3 and starts at 0: content 1 hit 5 times and content 2
    hit 3 times have the same count, so in main (1 ahead of 2) they spend their three chances
    in turn and 1 leaves first (uncapped, 2 would run out first). Hit 3 times against twice,
    the block behind leaves first."""
    c = Cache(S3FIFOPolicy(), 3)
    for _ in range(6):
        c.serve([1])
    for _ in range(4):
        c.serve([2])
    assert c.drain() == [1, 2]
    # content 1 hit 3 times, content 2 twice: 2 runs out first although it is behind 1
    c = Cache(S3FIFOPolicy(), 3)
    for _ in range(4):
        c.serve([1])
    for _ in range(3):
        c.serve([2])
    assert c.drain() == [2, 1]


def test_s3fifo_counts_a_hit_on_a_block_in_use():
    """A hit on a block another request holds counts too (on_hit with held False): content 1,
    read twice by two overlapping requests, has 2 hits; content 2 has 1 (3 > 2 would not
    pass with a lost hit). main: 2 then 1 (1 freed last). Drain: 2 (1 -> 0, round), 1 (2 ->
    1, round), 2 leaves, 1 (1 -> 0, round), 1 leaves."""
    c = Cache(S3FIFOPolicy(), 4)
    c.serve([1])
    c.serve([2])
    c.serve([2])                                    # 2: one hit, main
    b = c.block(1)
    c.pool.touch([b])                               # request x hits 1 (leaves small)
    c.pool.touch([b])                               # request y hits 1 while x holds it
    c.pool.free([b])
    c.pool.free([b])                                # now free: 2 hits -> main
    c.pool.check()
    assert c.drain() == [2, 1]
    # the same with a single reader: 1 hit each, 2 ahead of 1, so the order is the same; but
    # a third content hit once and freed between shows the count: 1 (count 2) outlives it
    c = Cache(S3FIFOPolicy(), 5)
    for t in (1, 2, 3):
        c.serve([t])
    c.serve([2])
    b = c.block(1)
    c.pool.touch([b])
    c.pool.touch([b])
    c.pool.free([b, b])
    c.serve([3])                                    # main: 2, 1, 3 (one, two, one hits)
    assert c.drain() == [2, 3, 1]


def test_s3fifo_ghost_readmits_recomputed_content_to_main():
    """Content evicted from ``small`` is remembered (ghost, up to num_blocks - 1 = 3 hashes);
    computed again while remembered it enters ``main``, so the one-off blocks after it leave
    first. 4 blocks (3 usable):

    serve 1, 2, 3 (small 1 2 3); 4 evicts 1 (ghost 1); 5 evicts 2 (ghost 1 2); computing 1
    again evicts 3 (ghost 1 2 3, at capacity) and 1 is readmitted to main. small 4 5, main 1:
    6 evicts 4, 7 evicts 5, 8 evicts 6 (small 6 7 is over 10 %); the drain: 7, 8, then 1."""
    c = Cache(S3FIFOPolicy(), 4)
    for t in (1, 2, 3, 4, 5, 1, 6, 7, 8):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2, 3, 4, 5, 6]
    assert c.drain() == [7, 8, 1]


def test_s3fifo_ghost_forgets_beyond_num_blocks_minus_one():
    """The ghost keeps num_blocks - 1 = 3 hashes: after 1, 2, 3, 4 were evicted from small,
    1 is forgotten (computing it again files it in small), 2 is remembered (main).

    serve 1, 2, 3; 4, 5, 6 evict 1, 2, 3 (ghost 1 2 3); computing 1 evicts 4 (ghost 2 3 4):
    1 goes to small (5 6 1). 7 evicts 5, 8 evicts 6, 9 evicts 1 (small FIFO)."""
    c = Cache(S3FIFOPolicy(), 4)
    for t in (1, 2, 3, 4, 5, 6, 1, 7, 8, 9):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2, 3, 4, 5, 6, 1]


def test_s3fifo_forgets_a_reallocated_blocks_hits():
    """A block's hit count lasts until its id is reallocated (forget): block b holds content 1,
    is hit (count 1), loses its hash while held (drop_hash) and returns as scratch; reused for
    content 2, it is a block never hit, so it is filed in small (not main): the drain takes
    small in FIFO order 2, 3, 4 (with the stale count, 2 would sit in main and leave last)."""
    c = Cache(S3FIFOPolicy(), 4)
    pool = c.pool
    b, = pool.allocate(1)
    pool.insert(0, content_key(1), b)
    pool.free([b])
    pool.touch([b])
    pool.drop_hash(b)
    pool.free([b])
    assert pool.allocate(1) == [b]                   # scratch is reused first
    pool.insert(0, content_key(2), b)
    pool.free([b])
    c.serve([3])
    c.serve([4])
    assert c.drain() == [2, 3, 4]


def test_s3fifo_second_chances_carry_over_between_evictions():
    """The hit count a main block keeps after one eviction is what it spends at the next, and
    a ghost-readmitted block (no hits) leaves main at its turn without a chance. 3 usable
    blocks: 1, 2, 3 (small); 4 evicts 1 (ghost); 1 again evicts 2 and is readmitted (main);
    4 and 3 are hit (main: 1, 4, 3, one hit each for 4 and 3); 5 evicts 1 (main's head, no
    hit); 2 again evicts 5 (small) and is readmitted to main behind 4 and 3, which still hold
    their hit: the drain spends 4's and 3's chances, so 2 leaves first, then 4, then 3."""
    c = Cache(S3FIFOPolicy(), 4)
    for t in (1, 2, 3, 4, 1):
        assert c.serve([t]) == 0
    assert c.serve([4]) == 1
    assert c.serve([3]) == 1
    for t in (5, 2):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2, 1, 5]
    assert c.drain() == [2, 4, 3]


def test_s3fifo_check_rejects_a_corrupted_state():
    """check(): a block in both queues (the first five ids named) and a ghost over
    num_blocks - 1 hashes are reported."""
    c = Cache(S3FIFOPolicy(), 8)
    c.serve([1, 2, 3, 4, 5, 6, 7])
    pol = c.policy
    for b in list(pol.small):
        pol.main[b] = None
    with pytest.raises(AssertionError) as exc:
        pol.check()
    assert str(exc.value) == "s3fifo: blocks [1, 2, 3, 4, 5] are in both queues"
    for n in (2, 8):
        c = Cache(S3FIFOPolicy(), n)
        c.serve([1])
        for k in range(n - 1):
            c.policy.ghost[content_key(100 + k)] = None
        c.policy.check()                                 # n - 1: at capacity
        c.policy.ghost[content_key(99)] = None
        with pytest.raises(AssertionError) as exc:
            c.policy.check()
        assert str(exc.value) == "s3fifo: ghost queue over its capacity"


# ---- lfu and cost (frequency.py) ----------------------------------------------------------

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


# ---- chain ARC ------------------------------------------------------------------------------

def _returning_then_one_offs(num_blocks: int, one_offs: list[int]) -> Cache:
    """Chain [1, 2] computed, then come back as [1, 2, 3] (its deepest reused block, 2, was
    reused once: the whole batch, new tail 3 included, goes to t2 as 3, 2, 1); then one-off
    first turns (t1, in free order)."""
    c = Cache(ChainARCPolicy(), num_blocks)
    c.serve([1, 2])
    assert c.serve([1, 2, 3]) == 2
    for t in one_offs:
        c.serve([t])
    return c


def test_arc_takes_t1_only_while_it_is_over_its_target():
    """Victims come from t1 while it holds more than p blocks (p starts at half the capacity),
    else from t2. Capacity 6, p = 3: t1 holds 3 (not over): t2 first (3, 2, 1: tail first),
    then t1. Capacity 7, p = 3.5: t1 holds 4 (over): 10 leaves, then t1 holds 3: t2, then t1."""
    assert _returning_then_one_offs(7, [10, 11, 12]).drain() == [3, 2, 1, 10, 11, 12]
    assert _returning_then_one_offs(8, [10, 11, 12, 13]).drain() == [10, 3, 2, 1, 11, 12, 13]


def test_arc_content_shared_by_eight_requests_marks_a_first_turn():
    """A chain whose deepest reused block has been reused 1..7 times is a returning
    conversation (all of it to t2); reused SHARED_REUSES = 8 times or more it is shared content
    (a system prompt), so the chain is a first turn: its new blocks go to t1, the reused root
    to t2. Root 0, then [0, 100 + i] for i = 0..7: tails 100..106 land in t2, 107 in t1.
    Capacity 9, p = 4.5: t1 (1 block) is not over: t2 in order (100..106, then 0, re-freed
    last), then 107."""
    c = Cache(ChainARCPolicy(), 10)
    c.serve([0])
    for i in range(8):
        assert c.serve([0, 100 + i]) == 1
    assert c.drain() == [100, 101, 102, 103, 104, 105, 106, 0, 107]


def test_arc_recomputed_t1_ghost_grows_t1s_target():
    """Content remembered in b1 (evicted from t1) and computed again: t1 was too small, p grows
    by max(1, |b2| / |b1|) = 1 (2 -> 3), and the content (reused once now) goes to t2.
    Capacity 4, p = 2: 1, 2, 3, 4 in t1; 5 evicts 1; recomputing 1 evicts 2 (t1 3 > 2) and
    finds 1 in b1: p = 3. Drain: t1 holds 3, not over 3: t2's 1 first, then 3, 4, 5. (With p
    still 2, 3 would leave first.)"""
    c = Cache(ChainARCPolicy(), 5)
    for t in (1, 2, 3, 4, 5, 1):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2]
    assert c.policy.p == 3
    assert c.drain() == [1, 3, 4, 5]


def test_arc_recomputed_t2_ghost_shrinks_t1s_target():
    """Content remembered in b2 (evicted from t2) and computed again: p shrinks by max(1,
    |b1| / |b2|). Capacity 4, p = 2: [1, 2] twice (t2: 2, 1); 3, 4 in t1; 5 evicts 2 (t1 2 is
    not over 2: from t2; b2 = {2}); recomputing 2 evicts 3 (t1 3 > 2; b1 = {3}) and finds 2 in
    b2: p = 2 - max(1, 1 / 1) = 1; 2 (reused twice) goes to t2. Drain: t1 (4, 5) is over 1:
    4; then t1 1 is not over 1: t2 (1, 2); then 5."""
    c = Cache(ChainARCPolicy(), 5)
    c.serve([1, 2])
    c.serve([1, 2])
    for t in (3, 4, 5, 2):
        assert c.serve([t]) == 0
    assert c.evicted == [2, 3]
    assert c.policy.p == 1
    assert c.drain() == [4, 1, 2, 5]


# ---- priority ---------------------------------------------------------------------------------

def test_priority_rebuild_keeps_levels_moved_entries_and_expiries():
    """Dead entries (one per hit) are dropped once they outnumber the live ones by 64; the
    rebuild must keep every live entry of every level (0..100), the entries an expiry moved,
    the expiries still pending, and the mask bit of every level that still holds entries.
    5 blocks, freed 5 first (so no entry's seq equals its block id), t = 0: 1 priority 90
    until t = 10, 2 priority 60 until t = 1 then 50, 3 default (35), 4 priority 100, 5
    priority 61. At t = 2 one victim is taken: 2's mark lapses first (moved to level 50,
    leaving a dead entry at 60), the victim is 3 (lowest level). Then 4 is hit and freed 70
    times (a rebuild on the way), each step checked. At t = 11 1's mark has lapsed too (to
    the default level): the drain goes level by level, 1 (35), 2 (50), 5 (61), 4 (100)."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 6)
    pool = c.pool
    blocks = pool.allocate(5)
    for k, b in enumerate(blocks, 1):
        pool.insert(0, content_key(k), b)
    for b, marks in zip(blocks, ([RetentionMark(1, 90, 10.0)],
                                 [RetentionMark(1, 60, 1.0), RetentionMark(1, 50, None)], [],
                                 [RetentionMark(1, 100, None)], [RetentionMark(1, 61, None)])):
        if marks:
            pool.retain([b], [0], marks)
    pool.free(blocks[::-1])
    t[0] = 2.0
    victim = pool.allocate(1)
    assert c.evicted == [3]
    pool.free(victim)                                # back hash-less (scratch)
    d = c.block(4)
    entries = []
    for _ in range(70):
        pool.touch([d])
        pool.free([d])
        pool.check()
        entries.append(pol._entries)
    assert min(entries) < 10                         # rebuilt
    t[0] = 11.0
    assert c.drain() == [1, 2, 5, 4]


def test_eva_accepts_the_smallest_valid_arguments():
    """ages >= 2 (an integer), width >= 1 or None, min_events > 0: the boundaries are valid."""
    for kw in ({"ages": 2}, {"width": 1}, {"min_events": 1}, {"min_events": 0.5}):
        pol = EVAPolicy(**kw)
        Cache(pol, 6).serve([1, 2, 3])
        assert getattr(pol, next(iter(kw))) == next(iter(kw.values()))


# ---- eva-turns ------------------------------------------------------------------------------

def test_eva_turns_passes_its_arguments_on():
    """TurnEVAPolicy(ages, width, min_events) overrides eva's bucket count, bucket width and
    events per curve (the width otherwise comes from the pool at attach)."""
    pol = TurnEVAPolicy(ages=8, width=3, min_events=5)
    PolicyBlockPool(40, 1, pol)
    assert (pol.ages, pol.width, pol.min_events) == (8, 3, 5)
    pol = TurnEVAPolicy()
    PolicyBlockPool(41, 1, pol)
    assert (pol.ages, pol.width, pol.min_events) == (64, 10, 128)


@pytest.mark.parametrize("reuses, cls", [(1, 1), (3, 3), (4, 4), (7, 4), (8, 0), (9, 0)])
def test_eva_turns_ignores_blocks_reused_eight_times_or_more(reuses, cls):
    """Class of a batch: min(4, r), r the largest reuse count below SHARED_REUSES = 8 among its
    blocks. A new block freed with a root reused ``reuses`` times: 7 counts (class 4), 8 is
    shared content and ignored (class 0)."""
    pol = TurnEVAPolicy(width=1000)
    c = Cache(pol, 16)
    c.serve([0])
    for _ in range(reuses - 1):
        c.serve([0])
    assert c.serve([0, 1]) == 1                       # the root's reuses-th hit
    assert pol.where[c.block(1)][0] == cls


# ---- integrity checks: a deliberately corrupted policy must be rejected -------------------


@pytest.mark.parametrize("cls", [LFUPolicy, CostAwarePolicy])
def test_lfu_check_rejects_lost_heap_entries(cls):
    c = Cache(cls(), 4)
    c.serve([1, 2])
    c.policy.check()
    c.policy.heap.clear()
    check_fails(c.policy.check, f"{c.policy.name}: 2 held blocks but 0 live heap entries")


def test_arc_check_rejects_a_corrupted_state():
    """Both lists holding a block; a ghost list over int(ghost_ratio x capacity); the target
    p outside [0, capacity] (both ends allowed)."""
    c = Cache(ChainARCPolicy(), 9)
    c.serve(list(range(1, 8)))                       # 7 blocks in t1
    pol = c.policy
    for b in pol.t1:
        pol.t2[b] = None
    check_fails(pol.check, "arc: blocks [1, 2, 3, 4, 5] are in both lists")
    for ratio, cap in ((2.0, 16), (0.1, 1), (0.5, 4)):
        for lst in ("b1", "b2"):
            c = Cache(ChainARCPolicy(ghost_ratio=ratio), 9)
            ghosts = getattr(c.policy, lst)
            for k in range(cap):
                ghosts[k] = 0
            c.policy.check()
            ghosts[cap] = 0
            n1, n2 = len(c.policy.b1), len(c.policy.b2)
            check_fails(c.policy.check, f"arc: ghost lists {n1}, {n2} over {cap}")
    c = Cache(ChainARCPolicy(), 9)
    for p in (0.0, 8.0):
        c.policy.p = p
        c.policy.check()
    for p in (-0.5, 8.5):
        c.policy.p = p
        check_fails(c.policy.check, f"arc: target {p} outside [0, 8]")


def test_eva_check_rejects_a_corrupted_state():
    """A block queued under one key but recorded under another; a held block in no queue; a
    ghost table over max(64, ages x width) entries."""
    pol = EVAPolicy(ages=4, width=2)
    c = Cache(pol, 9)
    c.serve([1, 2])
    b = c.block(1)
    key = pol.where[b]
    pol.where[b] = (3, 7)
    check_fails(pol.check, f"eva: block {b} in queue {key} but recorded in (3, 7)")
    pol.where[b] = key
    pol.where[99] = key
    check_fails(pol.check, "eva: 3 held blocks but 2 queued")
    for ages, width, cap in ((4, 2, 64), (8, 10, 80)):
        pol = EVAPolicy(ages=ages, width=width)
        c = Cache(pol, 9)
        for k in range(cap):
            pol.ghost[k] = (0, 0, 0)
        pol.check()
        pol.ghost[cap] = (0, 0, 0)
        check_fails(pol.check, "eva: ghost table over its capacity")


def _hold(alt, b: int, key=None) -> None:
    """Make challenger ``alt`` hold block ``b`` too (consistently with its own check)."""
    if isinstance(alt, ChainARCPolicy):
        alt.t1[b] = None
    else:
        alt.where[b] = key
        alt.queues[key][b] = None


def _drop(alt, b: int):
    if isinstance(alt, ChainARCPolicy):
        alt.t1.pop(b, None) or alt.t2.pop(b, None)
        return None
    key = alt.where.pop(b)
    del alt.queues[key][b]
    return key


@pytest.mark.parametrize("name", ["adaptive", "adaptive-turns"])
def test_adaptive_check_rejects_a_corrupted_state(name):
    """Every challenger's own check runs; each must hold the same blocks as the LRU list (the
    same count and each block); the shadows must fit the pool's capacity."""
    def fresh():
        pol = make_policy(name)
        Cache(pol, 6).serve([1, 2, 3])
        pol.check()
        return pol

    for i in range(len(fresh().alts)):
        pol = fresh()
        alt = pol.alts[i]
        _hold(alt, 99, _drop(alt, next(iter(pol.fifo))))          # same count, another block
        check_fails(pol.check, f"adaptive: LRU list (3) and {alt.name} (3) hold different blocks")
        pol = fresh()
        alt = pol.alts[i]
        _hold(alt, 77, None if isinstance(alt, ChainARCPolicy) else alt.where[next(iter(pol.fifo))])
        check_fails(pol.check, f"adaptive: LRU list (3) and {alt.name} (4) hold different blocks")
    pol = fresh()
    arc = pol.alts[0]
    for b in list(arc.t1):
        arc.t2[b] = None
    with pytest.raises(AssertionError, match="arc: blocks"):
        pol.check()
    for over in ("lru", "shadow"):                       # capacity 5, 3 keys in each shadow
        pol = fresh()
        if over == "lru":
            def add(k):
                pol.shadow_lru[k] = None
        else:
            def add(k):
                pol.shadows[-1].on_free([k])
        add(("x", 0))
        add(("x", 1))
        pol.check()                                      # 5: at the capacity
        add(("x", 2))
        check_fails(pol.check, "adaptive: a shadow is over the pool's capacity")


def test_priority_check_rejects_a_corrupted_state():
    """A level holding entries with its mask bit clear; a level's FIFO out of free order;
    more held blocks than live entries; an entry count that disagrees; seq and level tables
    with different blocks; a block's marks that are not a Pareto list (priority descending,
    expiry ascending). Levels 35 (the default) and 100 (the top) are both checked."""
    from hybridkv.core.retention_config import RetentionMark

    def fresh():
        pol = PriorityPolicy(lambda: 0.0)
        c = Cache(pol, 8)
        blocks = c.pool.allocate(5)
        for k, b in enumerate(blocks, 1):
            c.pool.insert(0, content_key(k), b)
        c.pool.retain(blocks[:2], [0, 1], [RetentionMark(2, 100, None)])
        c.pool.free(blocks)                          # 1, 2 at level 100; 3, 4, 5 at 35
        pol.check()
        return pol

    for lv in (35, 100):
        pol = fresh()
        pol.mask &= ~(1 << lv)
        check_fails(pol.check, f"priority: level {lv} holds entries but its mask bit is clear")
        pol = fresh()
        pol.fifo[lv].reverse()
        check_fails(pol.check, f"priority: level {lv}'s FIFO is not in free order")
    pol = fresh()
    pol.seq_of[99] = 1000
    pol.level_of[99] = 35
    check_fails(pol.check, "priority: 6 held blocks but 5 live entries")
    pol = fresh()
    pol._entries += 1
    check_fails(pol.check, "priority: counts 6 entries, holds 5")
    pol = fresh()
    pol.level_of[99] = 35
    check_fails(pol.check, "priority: seq and level tables disagree")
    for marks in ([(50, 10.0), (60, 5.0)], [(60, 10.0), (50, 5.0)], [(60, 5.0), (60, 10.0)],
                  [(60, 5.0), (50, 5.0)], [(90, 1.0), (60, 5.0), (50, 5.0)]):
        pol = fresh()
        pol.marks[5] = marks
        check_fails(pol.check, f"priority: block 5's marks are not a Pareto list: {marks}")
    pol = fresh()
    pol.marks[5] = [(90, 1.0), (60, 5.0), (50, math.inf)]
    pol.check()


# ---- eva and eva-turns against a brute-force model of the module docstring -----------------

class EvaModel:
    """eva / eva-turns as the module docstring states it, block by block (no queues, no
    ranking cache, no cursor): the clock counts freed blocks, a block's age is the number of
    buckets (``width`` clock units) since it was freed, capped at ``ages - 1``; per class and
    age, E counts the blocks (held, or evicted and remembered as a ghost within the horizon)
    that entered that age and H the reuses there (a hit on a free cached block, or a ghost's
    content freed again); counts halve once per horizon; the value of an age is the expected
    reuses until the next one over the buckets held until then, from the H / E hazards
    (pooled over the classes where a class has fewer than ``min_events`` entries); the victim
    is the held block of lowest (value, -age, class), oldest first."""

    def __init__(self, ages: int, width: int, min_events: float, turns: bool) -> None:
        self.A, self.W, self.m, self.turns = ages, width, min_events, turns
        self.clock = self.epoch = self.seq = 0
        self.held: dict[int, tuple[int, int, int]] = {}     # block -> (class, free epoch, seq)
        self.content: dict[int, int] = {}
        self.hits: dict[int, int] = {}
        self.ghost: dict[int, tuple[int, int, int]] = {}    # content -> (class, epoch, reuses)
        self.H = [[0.0] * ages for _ in range(5)]
        self.E = [[0.0] * ages for _ in range(5)]
        self.value = [[0.0] * ages for _ in range(5)]
        self.next_decay = width * ages
        self.ghost_cap = max(64, ages * width)

    def age(self, e: int) -> int:
        return min(self.A - 1, self.epoch - e)

    def batch_class(self, blocks) -> int:
        if self.turns:
            r = max([0] + [self.hits.get(b, 0) for b in blocks if self.hits.get(b, 0) < 8])
            return min(4, r)
        for b in blocks:                                   # tail first: the deepest reused
            if self.hits.get(b, 0):
                return min(4, (0, 1, 2, 3, 3, 3, 3, 3)[self.hits[b]] if self.hits[b] < 8 else 4)
        return 0

    def hit(self, b: int, free: bool) -> None:
        if free:
            c, e, _ = self.held.pop(b)
            self.H[c][self.age(e)] += 1
        self.hits[b] = self.hits.get(b, 0) + 1

    def forget(self, blocks) -> None:
        for b in blocks:
            self.hits.pop(b, None)

    def free(self, blocks, contents) -> None:
        for b, t in zip(blocks, contents):
            self.content[b] = t
            g = self.ghost.pop(t, None)
            if g is not None:
                self.hits[b] = g[2] + 1
                if self.epoch - g[1] < self.A:             # still within the horizon
                    self.H[g[0]][self.epoch - g[1]] += 1
        c = self.batch_class(blocks)
        for b in blocks:
            self.seq += 1
            self.held[b] = (c, self.epoch, self.seq)
        self.E[c][0] += len(blocks)
        self.clock += len(blocks)
        new = self.clock // self.W
        if new == self.epoch:
            return
        A = self.A
        for step in range(max(self.epoch + 1, new - A), new + 1):
            for c, e, _ in self.held.values():
                self.E[c][min(A - 1, step - e)] += 1
            for c, e, _ in self.ghost.values():
                if step - e < A:
                    self.E[c][step - e] += 1
        self.epoch = new
        if self.clock >= self.next_decay:
            self.next_decay = self.clock + self.W * A
            for rows in (self.H, self.E):
                for row in rows:
                    row[:] = [x / 2 for x in row]
        for c in range(5):
            hazard = []
            for a in range(A):
                h, e = self.H[c][a], self.E[c][a]
                if e < self.m:
                    h, e = sum(r[a] for r in self.H), sum(r[a] for r in self.E)
                hazard.append(min(1.0, h / e) if e >= self.m else None)
            self.value[c] = self.density(hazard)

    def density(self, hazard) -> list[float]:
        A = self.A
        if all(h is None for h in hazard):
            return [0.0] * A
        h = hazard[-1] or 0.0
        reuse, space = (1.0, 1 / h) if h else (0.0, float(A))   # the last bucket, for ever
        out = [reuse / space]
        for a in range(A - 2, -1, -1):
            h = hazard[a] or 0.0
            reuse, space = h + (1 - h) * reuse, 1 + (1 - h) * space
            out.append(reuse / space)
        return out[::-1]

    def compare(self, pol) -> None:
        for mine, theirs in ((self.E, pol.exp_n), (self.H, pol.hit_n), (self.value, pol.value)):
            assert [x for row in mine for x in row] == pytest.approx(
                [x for row in theirs for x in row], rel=1e-9, abs=1e-12)

    def pop(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b = min(self.held, key=lambda x: (self.value[self.held[x][0]][self.age(self.held[x][1])],
                                              -self.age(self.held[x][1]), self.held[x][0],
                                              self.held[x][2]))
            c, e, _ = self.held.pop(b)
            self.ghost[self.content[b]] = (c, max(e, self.epoch - self.A + 1), self.hits.get(b, 0))
            out.append(b)
        while len(self.ghost) > self.ghost_cap:
            del self.ghost[next(iter(self.ghost))]
        return out


@pytest.mark.parametrize("cls, ages, width, min_events, num_blocks, seed", [
    (EVAPolicy, 6, 2, 3, 13, 1),
    (EVAPolicy, 4, 1, 2, 9, 2),
    (EVAPolicy, 5, None, 4.5, 17, 3),
    (EVAPolicy, 4, None, 2, 8, 6),
    (EVAPolicy, 3, None, 3, 12, 7),
    (TurnEVAPolicy, 6, 2, 3, 13, 4),
    (TurnEVAPolicy, 4, 1, 2, 9, 5),
])
def test_eva_matches_a_brute_force_model(cls, ages, width, min_events, num_blocks, seed):
    """Every victim, and after every request the learned counts (E, H) and value curves,
    equal the model's. Without ``width`` the bucket is max(1, capacity // 4) blocks."""
    pol = cls(ages=ages, width=width, min_events=min_events)
    model = EvaModel(ages, width or max(1, (num_blocks - 1) // 4), min_events, cls is TurnEVAPolicy)
    assert model_workload(pol, model, num_blocks, 400, seed) > 250
    assert any(v > 0 for row in model.value for v in row)


# ---- adaptive -----------------------------------------------------------------------------------

def _requests(seed: int, n: int, keys: int):
    """One-block requests: a few popular contents, a stream of one-offs, and contents that
    come back after a while (a skewed, drifting mix)."""
    import random
    rng = random.Random(seed)
    for k in range(n):
        r = rng.random()
        if r < 0.3:
            yield [rng.randint(1, 3)]
        elif r < 0.6:
            yield [10 + rng.randint(0, keys)]
        elif r < 0.8:
            yield [100 + (k // 7) % (2 * keys)]
        else:
            yield [1000 + k]


@pytest.mark.parametrize("name, num_blocks, seed, switches", [
    ("adaptive", 2, 1, False), ("adaptive", 7, 2, True), ("adaptive", 31, 3, False),
    ("adaptive-turns", 9, 4, True), ("adaptive-turns", 31, 5, False), ("margin 0", 7, 7, True),
    ("margin 0", 5, 6, True)])
def test_adaptive_shadows_score_what_lru_and_each_challenger_would_hit(name, num_blocks, seed, switches):
    """The shadows are caches of the pool's capacity on content keys: after every request
    each shadow's count equals the leading hits a real pool of that capacity (plain LRU, and
    one per challenger policy) has had; the counts halve once DECAY_CAPACITIES = 8
    capacities of blocks have been freed since the last halving; the policy evicts like the
    first challenger with the top count once that count exceeds (1 + margin) x LRU's + 1
    (margin 0.1 by default), else LRU
    (from the start: nothing is ahead). One-block requests, so "leading hits" and "a hit"
    are the same thing for the shadows and the pools."""
    from hybridkv.core.pool import BlockPool
    pol = AdaptivePolicy(margin=0) if name == "margin 0" else make_policy(name)
    assert pol.use_arc is False and pol.mode == -1
    real = Cache(pol, num_blocks)
    pools = [BlockPool(num_blocks, 1)] + [
        PolicyBlockPool(num_blocks, 1, type(a)()) for a in pol.alts]
    cap = num_blocks - 1
    scores = [0.0] * len(pools)
    freed = 0
    switched = ties = 0
    for chain in _requests(seed, 400, cap + 2):
        real.serve(chain)
        for i, p in enumerate(pools):
            scores[i] += serve_chain(p, [content_key(t) for t in chain])
        freed += len(chain)
        if freed >= 8 * cap:
            freed = 0
            scores = [x * 0.5 for x in scores]
        assert [pol.score_lru] + pol.scores == scores
        top = max(range(1, len(scores)), key=scores.__getitem__)
        ahead = scores[top] > scores[0] * (1.0 + pol.margin) + 1.0
        ties += scores[top] == scores[0] * (1.0 + pol.margin) + 1.0
        assert pol.mode == (top - 1 if ahead else -1) and pol.use_arc == ahead
        switched += ahead
    assert 0 < scores[0] and (0 < switched < 400) == switches
    assert ties or name != "margin 0"                # exactly at the threshold is not ahead


def test_adaptive_margin_bounds():
    """margin must be a number in [0, 1): 0 is valid (switch as soon as a challenger leads by
    more than one hit); the message names the bad value; challengers cannot be empty."""
    assert AdaptivePolicy(margin=0).margin == 0.0
    assert AdaptivePolicy(margin=0.99).margin == 0.99
    for bad in (-0.01, 1, 1.0, "0.1", None):
        with pytest.raises(ValueError) as exc:
            AdaptivePolicy(margin=bad)
        assert str(exc.value) == f"margin must be a number in [0, 1), got {bad!r}"
    with pytest.raises(ValueError) as exc:
        AdaptivePolicy(challengers=())
    assert str(exc.value) == "challengers must name at least one policy factory"


def test_adaptive_shadows_key_content_by_group():
    """The shadows key a block by its group and hash: the same hash in two groups (the same
    tokens in two KV-cache groups) is two contents, not a hit."""
    pol = AdaptivePolicy()
    c = Cache(pol, 9, num_groups=3)
    for g in (0, 1, 2):
        assert c.serve([1], group=g) == 0
    assert pol.score_lru == 0 and pol.scores == [0]
    for g in (2, 1, 0):
        assert c.serve([1], group=g) == 1
    assert pol.score_lru == 3 and pol.scores == [3]


def test_arc_discard_remembers_the_ghost_like_an_eviction():
    """discard(b): block b leaves its list (another policy chose it) and its content is
    remembered in that list's ghost with its reuse count, at most int(ghost_ratio x capacity)
    ghosts, the oldest forgotten first. Capacity 4, ghost_ratio 0.5: 2 ghosts per list."""
    pol = ChainARCPolicy(ghost_ratio=0.5)
    c = Cache(pol, 5)
    c.serve([1])
    c.serve([1])                                     # reused once: t2
    for t in (2, 3, 4):
        c.serve([t])                                 # t1
    pol.discard(c.block(1))
    assert dict(pol.b2) == {content_key(1): 1} and c.block(1) not in pol
    for t in (2, 3, 4):
        pol.discard(c.block(t))
    assert list(pol.b1.items()) == [(content_key(3), 0), (content_key(4), 0)]
    assert len(pol) == 0


class ArcModel:
    """Chain ARC as the module docstring states it, on plain lists: t1 / t2 in free order,
    ghosts b1 / b2 (content, reuses) of at most int(ghost_ratio x capacity) entries, target p
    from half the capacity, moved by recomputed ghosts; victims from t1 while it holds more
    than p blocks (or t2 is empty)."""

    def __init__(self, capacity: int, ghost_ratio: float) -> None:
        self.cap = capacity
        self.gcap = max(1, int(ghost_ratio * capacity))
        self.p = capacity / 2
        self.t1: list[int] = []
        self.t2: list[int] = []
        self.b1: list[list] = []                          # [content, reuses], oldest first
        self.b2: list[list] = []
        self.reuses: dict[int, int] = {}
        self.content: dict[int, int] = {}

    def hit(self, b: int, free: bool) -> None:
        if free:
            (self.t1 if b in self.t1 else self.t2).remove(b)
        self.reuses[b] = self.reuses.get(b, 0) + 1

    def forget(self, blocks) -> None:
        for b in blocks:
            self.reuses.pop(b, None)

    @staticmethod
    def _take(ghosts: list, t: int):
        for i, (u, r) in enumerate(ghosts):
            if u == t:
                del ghosts[i]
                return r
        return None

    def free(self, blocks, contents) -> None:
        for b, t in zip(blocks, contents):
            self.content[b] = t
            r = self._take(self.b1, t)
            if r is not None:
                self.reuses[b] = r + 1
                self.p = min(self.cap, self.p + max(1.0, len(self.b2) / max(1, len(self.b1))))
                continue
            r = self._take(self.b2, t)
            if r is not None:
                self.reuses[b] = r + 1
                self.p = max(0.0, self.p - max(1.0, len(self.b1) / max(1, len(self.b2))))
        deepest = next((self.reuses[b] for b in blocks if self.reuses.get(b)), 0)
        for b in blocks:
            returning = 0 < deepest < 8 or self.reuses.get(b, 0) > 0
            (self.t2 if returning else self.t1).append(b)

    def pop(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            if self.t1 and (not self.t2 or len(self.t1) > self.p):
                b, ghosts = self.t1.pop(0), self.b1
            else:
                b, ghosts = self.t2.pop(0), self.b2
            ghosts.append([self.content[b], self.reuses.get(b, 0)])
            if len(ghosts) > self.gcap:
                del ghosts[0]
            out.append(b)
        return out

    def compare(self, pol) -> None:
        assert pol.p == pytest.approx(self.p)


@pytest.mark.parametrize("num_blocks, ghost_ratio, seed", [(13, 2.0, 1), (9, 0.5, 2), (17, 1.0, 3),
                                                           (8, 0.3, 4), (21, 2.0, 5)])
def test_arc_matches_a_model_of_the_docstring(num_blocks, ghost_ratio, seed):
    """Every victim, and the target p after every request, equal the model's."""
    model = ArcModel(num_blocks - 1, ghost_ratio)
    assert model_workload(ChainARCPolicy(ghost_ratio), model, num_blocks, 400, seed) > 250


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, "2", None])
def test_arc_ghost_ratio_must_be_a_positive_number(bad):
    with pytest.raises(ValueError) as exc:
        ChainARCPolicy(ghost_ratio=bad)
    assert str(exc.value) == f"ghost_ratio must be a number > 0, got {bad!r}"


def test_arc_a_recomputed_ghost_keeps_its_reuse_count_plus_one():
    """A recomputed ghost's block gets the ghost's reuse count + 1, so a conversation that
    comes back is recognized as returning until its deepest reuse count reaches
    SHARED_REUSES = 8 (then it is shared content: the new blocks go to t1).

    From b1 (capacity 4, p = 2): 1..4 in t1; 5 evicts 1 (b1: 1 with 0 reuses); recomputing 1
    evicts 2 and readmits 1 (reuses 1, p = 3, t2); five hits make 6; [1, 6] hits it (7:
    returning) and evicts 3 from t1 (t2 is empty while 1 is held): t2 = 6, 1. Drain: t1 (4, 5)
    is not over 3: 6, 1, then 4, 5.

    From b2 (capacity 3, p = 1.5): 1 hit 5 times, 2 and 3 once (all t2); 5 evicts 1 (t1 is
    empty; b2: 1 with 5); recomputing 1 evicts 2 (t1 holds 1, not over 1.5) and readmits 1
    (reuses 6, p = 1.5 - 1 = 0.5); [1, 6] hits it (7: returning) and evicts 5 (t1 over 0.5):
    t2 = 3, 6, 1. With one more hit before the eviction the count reaches 8 at [1, 6]: 6 goes
    to t1 and leaves first."""
    c = Cache(ChainARCPolicy(), 5)
    for t in (1, 2, 3, 4, 5, 1):
        assert c.serve([t]) == 0
    for _ in range(5):
        assert c.serve([1]) == 1
    assert c.serve([1, 6]) == 1
    assert c.evicted == [1, 2, 3]
    assert c.drain() == [6, 1, 4, 5]
    for hits, drain in ((5, [3, 6, 1]), (6, [6, 3, 1])):
        c = Cache(ChainARCPolicy(), 4)
        for t, n in ((1, hits), (2, 1), (3, 1)):
            for _ in range(n + 1):
                c.serve([t])
        for t in (5, 1):
            assert c.serve([t]) == 0
        assert c.policy.p == 0.5
        assert c.serve([1, 6]) == 1
        assert c.evicted == [1, 2, 5]
        assert c.drain() == drain


def test_priority_marks_reach_the_positions_below_their_block_count():
    """retain(blocks, positions, marks): the block at table position j gets the marks with
    j < num_blocks, whatever order the marks and the positions come in (a sliding window
    releases its blocks back to front). Marks reaching 1, 3 and 2 blocks (priorities 90, 60,
    75, no TTL): position 0 -> 90, 1 -> 75, 2 -> 60, 3 -> none (the default, 35). Freed in
    position order, they leave lowest level first: 3, 2, 1, 0."""
    from hybridkv.core.retention_config import RetentionMark
    pol = PriorityPolicy(lambda: 0.0)
    c = Cache(pol, 6)
    table = c.pool.allocate(4)
    for j, b in enumerate(table):
        c.pool.insert(0, content_key(10 + j), b)
    c.pool.retain(table, [3, 2, 1, 0], [RetentionMark(1, 90, None), RetentionMark(3, 60, None),
                                        RetentionMark(2, 75, None)])
    assert [pol.level(b, 0.0)[0] for b in table] == [90, 75, 60, 35]
    c.pool.free(table)
    assert c.drain() == [13, 12, 11, 10]


def test_priority_a_dominated_mark_is_not_kept():
    """A block's marks form a Pareto list: a new mark with the same priority and an earlier
    expiry than one it holds adds nothing (the list stays valid for check())."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 4)
    b, = c.pool.allocate(1)
    c.pool.insert(0, content_key(1), b)
    c.pool.retain([b], [0], [RetentionMark(1, 60, 10.0)])
    c.pool.retain([b], [0], [RetentionMark(1, 60, 5.0)])
    c.pool.retain([b], [0], [RetentionMark(1, 50, 8.0)])
    assert pol.marks[b] == [(60, 10.0)]
    c.pool.free([b])
    c.pool.check()


def test_priority_a_block_steps_down_through_each_timed_mark():
    """A block with several timed marks drops to the next live one when the first lapses, and
    from it to the default when that one lapses too. 1: 90 until t = 5, then 60 until t = 10;
    2: default (35); 3: 70; 4: 50 (no TTL). At t = 6 one victim: 1 is at 60 now, 2 (35)
    leaves. At t = 11 1 is at the default: 1 (35), 4 (50), 3 (70)."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 5)
    blocks = c.pool.allocate(4)
    for k, b in enumerate(blocks, 1):
        c.pool.insert(0, content_key(k), b)
    c.pool.retain(blocks[:1], [0], [RetentionMark(1, 90, 5.0), RetentionMark(1, 60, 10.0)])
    c.pool.retain(blocks[2:3], [0], [RetentionMark(1, 70, None)])
    c.pool.retain(blocks[3:], [0], [RetentionMark(1, 50, None)])
    c.pool.free(blocks)
    t[0] = 6.0
    c.pool.free(c.pool.allocate(1))
    assert c.evicted == [2]
    t[0] = 11.0
    assert c.drain() == [1, 4, 3]


def test_priority_an_expired_block_merges_into_its_new_level_by_free_time():
    """A block moved to a lower level by an expiry keeps its free time: within the level it
    goes between the blocks freed before and after it. Freed in the order 1 (default), 3
    (priority 90 until t = 5), 2 (default); the block holding 3 has the highest id. At t = 6
    the drain is 1, 3, 2."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 4)
    b1, b2, b3 = c.pool.allocate(3)
    for k, b in ((1, b1), (2, b2), (3, b3)):
        c.pool.insert(0, content_key(k), b)
    c.pool.retain([b3], [0], [RetentionMark(1, 90, 5.0)])
    c.pool.free([b1, b3, b2])
    t[0] = 6.0
    assert c.drain() == [1, 3, 2]


@pytest.mark.parametrize("first, second, want", [
    ((90, 10.0), (60, 10.0), [(90, 10.0)]),                  # dominated: same expiry, lower
    ((90, 5.0), (60, 10.0), [(90, 5.0), (60, 10.0)]),        # neither dominates: both kept
    ((60, 5.0), (60, 10.0), [(60, 10.0)]),                   # same priority, later expiry wins
    ((60, 10.0), (90, 10.0), [(90, 10.0)]),                  # same expiry, higher priority wins
    ((60, 10.0), (60, 10.0), [(60, 10.0)]),
])
def test_priority_marks_stay_a_pareto_list(first, second, want):
    """A block's marks (priority, expiry) keep only the ones no other mark beats on both
    (priority descending, expiry ascending): what the block's level follows over time."""
    from hybridkv.core.retention_config import RetentionMark
    pol = PriorityPolicy(lambda: 0.0)
    c = Cache(pol, 4)
    b, = c.pool.allocate(1)
    c.pool.insert(0, content_key(1), b)
    for p, e in (first, second):
        c.pool.retain([b], [0], [RetentionMark(1, p, e)])
    assert pol.marks[b] == want
    assert pol.level(b, 0.0) == want[0]
    c.pool.free([b])
    c.pool.check()


def test_priority_clock_must_be_callable():
    with pytest.raises(ValueError) as exc:
        PriorityPolicy(3)
    assert str(exc.value) == "clock must be a callable returning seconds, got 3"
