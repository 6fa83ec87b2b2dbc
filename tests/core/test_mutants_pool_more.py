"""Tests that kill the mutants of ``core/pool.py`` that survived the stop-21 mutmut run on the
current pool (bulk allocation fast path, ``free_version``, extent pools with siblings).
TESTING.md, "Mutation testing: `core/pool.py`, current code (stop 21)".

They drive the pools directly through their documented methods (``allocate``, ``insert``,
``free``, ``touch``, ``allocate_extent``, ``num_free``, ``check``) and the ``free_version``
attribute the coordinator's evictable-count memo relies on; expectations are derived by hand.
"""

from __future__ import annotations

from hybridkv.core.eviction import make_policy
from hybridkv.core.pool import BlockPool, ExtentBlockPool, PolicyBlockPool


def h(i: int) -> bytes:
    return i.to_bytes(8, "little")


def test_bulk_allocate_of_a_gappy_run_references_exactly_the_popped_blocks() -> None:
    """BlockPool.allocate, n > 8: the one-slice fast path is only for n ids spanning exactly
    n values. Allocate 1..20, free 1..9 and 12 (scratch, prepended in that order: the queue
    head is 1..9, 12). ``allocate(10)`` pops exactly those ten: ids 1..12 minus the held 10,
    11 — span 12 = n + 2, not contiguous. Every popped block must then hold one reference
    (freeing 12 again is fine) and the pool must pass its integrity check."""
    pool = BlockPool(64, 1)
    held = pool.allocate(20)
    assert held == list(range(1, 21))
    gone = list(range(1, 10)) + [12]
    pool.free(gone)
    got = pool.allocate(10)
    assert got == gone
    assert [pool.ref_cnt[b] for b in got] == [1] * 10
    assert pool.ref_cnt[10] == pool.ref_cnt[11] == 1
    pool.check()
    pool.free([12])                       # 12 had one reference: no double-free error
    pool.check()


def _versions_distinct(pool, policy_pool: bool) -> list[int]:
    """Drive ``pool`` (3 usable blocks) through ops that each move a cached block into or out
    of the free queue / policy; return ``free_version`` before and after each."""
    seen = [pool.free_version]
    blocks = pool.allocate(3)             # fresh ids (a policy pool counts every allocate)
    if policy_pool:
        seen.append(pool.free_version)
    for i, b in enumerate(blocks):
        pool.insert(0, h(i + 1), b)
    pool.free(blocks)                     # three cached blocks become free
    seen.append(pool.free_version)
    pool.touch([blocks[0]])               # a hit takes one out again
    seen.append(pool.free_version)
    pool.free([blocks[0]])                # and it comes back
    seen.append(pool.free_version)
    pool.allocate(3)                      # evicts the three cached blocks
    seen.append(pool.free_version)
    pool.check()
    return seen


def test_free_version_never_returns_to_an_earlier_value() -> None:
    """BlockPool / PolicyBlockPool ``free_version``: the coordinator reuses a count of free
    cached blocks while the version *equals* the one it was made at
    (``Coordinator._evictable_counts``), so every free, hit and eviction that moves a cached
    block must give a version never seen before (here: no value repeats)."""
    seen = _versions_distinct(BlockPool(4, 1), policy_pool=False)
    assert len(set(seen)) == len(seen), seen
    for name in ("lfu", "s3fifo", "cost"):
        seen = _versions_distinct(PolicyBlockPool(4, 1, make_policy(name)), policy_pool=True)
        assert len(set(seen)) == len(seen), (name, seen)


def test_sibling_eviction_releases_the_evicted_extents_tails() -> None:
    """ExtentBlockPool._evict_free: evicting group 0's last copy of a checkpoint also evicts
    the free copy of the same hash in its sibling group 1 — the *whole* extent (docstring: a
    checkpoint is never partially evicted), its tail included.

    6 ids (usable 1..5). Extent (1, 2) in group 0 and (3, 4) in group 1, both hashed ``h``
    and freed: cached, tails held, num_free 5 (fresh 5, heads 1 and 3, tails 2 and 4).
    ``allocate(2)`` pops 5 and head 1 (LRU first): group 0's last copy goes, so 3 and its
    tail 4 are evicted too; 1's tail 2 and the extent (3, 4) are free scratch afterwards.
    So 3 blocks stay free, no tail is held, and allocating all 3 hands out exactly 2, 3, 4."""
    pool = ExtentBlockPool(6, 2)
    pool.siblings = {0: (1,), 1: (0,)}
    a = pool.allocate_extent(2)
    b = pool.allocate_extent(2)
    assert pool.extent(a) == (1, 2) and pool.extent(b) == (3, 4)
    pool.insert(0, h(7), a)
    pool.insert(1, h(7), b)
    pool.free([a])
    pool.free([b])
    assert pool.num_free == 5 and pool.num_held == 2
    pool.check()
    assert sorted(pool.allocate(2)) == [1, 5]
    assert h(7) not in pool.index[0] and h(7) not in pool.index[1]
    assert pool.num_held == 0
    assert pool.num_free == 3
    pool.check()
    assert sorted(pool.allocate(3)) == [2, 3, 4]
    assert pool.num_free == 0
    pool.check()
