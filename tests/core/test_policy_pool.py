"""``PolicyBlockPool`` (``hybridkv.core.policy_pool``): the pool every non-LRU eviction policy is
attached to.

* Region order: scratch and never-used blocks are reused before any cached block is evicted,
  and a hit takes exactly its block back, whatever the policy (checked at every step).
* Evictions are counted and reported (stats, ``BlockRemoved``) with every policy; a hit on a
  block another request holds reaches the policy.
* ``check()`` (white box): a policy holding a wrong block, or a count that disagrees with its
  blocks, is caught and named.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hybridkv import BlockRemoved, BlockStored, KVCacheManager, Request
from hybridkv.core.eviction import make_policy
from hybridkv.core.policy_pool import PolicyBlockPool
from tests.hypothesis_budget import examples
from tests.support.helpers import FA, config, prompt, serve
from tests.support.policies import NON_LRU
from hybridkv.core.cache_options import CacheOptions


@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo", "cost"])
def test_evictions_are_counted_and_reported_with_every_policy(policy) -> None:
    """pool: PolicyBlockPool.__init__ — on_evict not passed to BlockPool (no BlockRemoved
    events); PolicyBlockPool.allocate — ``evicted``/``num_evictions`` miscounted.

    6 usable blocks, bs 4. Two 9-token prompts cache 2 blocks each (4 cached, all free). A
    unique 24-token request needs all 6 blocks: the 2 uncached ones go first, then the 4 cached
    ones are evicted, whatever the order: 1 eviction after its first 12 tokens, 4 in all, 4 BlockRemoved events naming exactly the 4 cached hashes."""
    kv = KVCacheManager(config(FA(4), num_blocks=7), CacheOptions(enable_events=True, eviction_policy=policy))
    a = serve(kv, "a", prompt(100, 9))
    b = serve(kv, "b", prompt(200, 9))
    stored = {h for ev in kv.take_events() if isinstance(ev, BlockStored) for h in ev.block_hashes}
    assert stored == set(a.block_hashes[:2]) | set(b.block_hashes[:2])
    assert kv.stats().evictions == 0
    z = Request("z", prompt(500, 24))                 # in two chunks: 2 scratch + 1, then 3
    assert kv.allocate(z, 12, kv.lookup(z)) is not None
    assert kv.stats().evictions == 1
    z.num_computed_tokens = 12
    assert kv.allocate(z, 12) is not None
    kv.check_integrity()
    assert kv.stats().evictions == 4
    removed = [h for ev in kv.take_events() if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    assert sorted(removed) == sorted(stored)


def test_lfu_counts_a_hit_on_a_block_another_request_holds() -> None:
    """pool: PolicyBlockPool.touch — ``elif bh[b] is not None: pol.on_hit(b, False)`` (a hit on
    a cached block that is in use) dropped, inverted or given the wrong block.

    LFU, bs 4. Chain A (2 blocks) gets one hit, chain B gets two hits, the second while the
    first holder still runs (the held-block hit). B's holders free first, then A's, so B's
    blocks are older: with B's held hit counted, priorities are A = 2, B = 3 and A goes first;
    without it both are 2 and the older B goes first. A request that evicts exactly 2 cached
    blocks must leave B cached."""
    kv = KVCacheManager(config(FA(4), num_blocks=12), CacheOptions(eviction_policy="lfu"))
    A, B = prompt(100, 8), prompt(200, 8)
    serve(kv, "a", A + [1])
    serve(kv, "b", B + [1])
    y = serve(kv, "y", A + [2], free=False)
    x1 = serve(kv, "x1", B + [3], free=False)
    x2 = serve(kv, "x2", B + [4], free=False)
    assert [kv.lookup(Request(f"q{i}", p + [9])).num_tokens for i, p in enumerate((A, B))] == [8, 8]
    kv.free(x1)
    kv.free(x2)
    kv.free(y)
    kv.check_integrity()
    cached = 4
    n = kv.num_free_blocks - cached + 2          # every uncached free block, then 2 cached ones
    z = Request("z", prompt(900, 4 * n))
    assert kv.allocate(z, 4 * n, kv.lookup(z)) is not None
    kv.check_integrity()
    assert kv.stats().evictions == 2
    assert kv.lookup(Request("qa", A + [9])).num_tokens == 0
    assert kv.lookup(Request("qb", B + [9])).num_tokens == 8


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


@pytest.mark.parametrize("bad, expected", [
    ("zero", r"^eviction policy holds invalid block id 0 \(explicit ids < 3\)$"),
    ("fresh", r"^eviction policy holds invalid block id 3 \(explicit ids < 3\)$"),
    ("queued", r"^block 1 is held by the eviction policy and the free queue$"),
])
def test_policy_check_rejects_a_policy_holding_a_wrong_block(bad, expected) -> None:
    """PolicyBlockPool check: the policy holds only explicit, non-null ids that are not also in
    the free queue. Blocks 1, 2 used and freed as scratch (fresh mark 3); the LFU policy is
    then handed the null block, the fresh id 3, or the queued block 1."""
    pool = PolicyBlockPool(20, 1, make_policy("lfu"))
    pool.free(pool.allocate(2))
    pool.check()
    pool.policy.on_free([{"zero": 0, "fresh": 3, "queued": 1}[bad]])
    with pytest.raises(AssertionError, match=expected):
        pool.check()


def test_policy_check_rejects_a_policy_whose_count_disagrees_with_its_blocks() -> None:
    """PolicyBlockPool check: the policy's ``len`` (what ``num_free`` adds to the queue's
    count) must equal the number of blocks it iterates. An LFU policy whose ``len`` is one too
    high (holding nothing) is reported with both numbers."""
    pool = PolicyBlockPool(20, 1, make_policy("lfu"))
    pool.free(pool.allocate(2))
    pool.check()
    base = type(pool.policy)

    class Miscounting(base):
        __slots__ = ()

        def __len__(self) -> int:
            return base.__len__(self) + 1

    pool.policy.__class__ = Miscounting
    with pytest.raises(AssertionError, match=r"^eviction policy iterates 0 blocks but counts 1$"):
        pool.check()


def test_policy_pool_hit_on_a_queued_or_never_used_block() -> None:
    """PolicyBlockPool.touch: a free block without a hash sits in the queue, not the policy;
    a hit on it takes it out of the queue. A never-used id (below or at / past the per-block
    lists' end) is first made explicit, as in BlockPool. Each ends with one reference."""
    pool = PolicyBlockPool(200, 1, make_policy("lfu"))
    pool.free(pool.allocate(2))            # 1, 2: scratch, queued; lists cover 64 ids
    assert len(pool.ref_cnt) == 64
    pool.touch([1])
    assert pool.ref_cnt[1] == 1 and pool.num_free == 198
    pool.check()
    pool.touch([5])                        # fresh, below the lists' end
    pool.touch([64, 70])                   # fresh, at and past the lists' end
    assert [pool.ref_cnt[b] for b in (5, 64, 70)] == [1, 1, 1]
    assert pool.num_free == 195
    assert pool.next_fresh == 71
    pool.check()
    assert 5 not in pool.allocate(195)     # every other id is still free
    pool.check()
