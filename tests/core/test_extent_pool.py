"""``ExtentBlockPool`` (``hybridkv.core.extent_pool``): state groups' extents (a head block id
plus the tail ids a recurrent state needs) in the same pool as the attention blocks.

* A stateful Hypothesis machine drives the pool against a brute-force byte model (which ids
  are free, which extents exist with which tails, which are cached).
* Sibling state groups (one model's recurrent layers) evict a checkpoint together: evicting
  one group's copy evicts the free copies in the others, tails included, and keeps referenced
  ones.
* ``allocate`` stops on a count that disagrees with the queue; ``check()`` (white box) names
  each corrupted extent.
"""

from __future__ import annotations

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hybridkv.core.extent_pool import ExtentBlockPool
from tests.support.helpers import content_key


def test_sibling_eviction_releases_the_evicted_extents_tails() -> None:
    """ExtentBlockPool._evict_free: evicting group 0's last copy of a checkpoint also evicts
    the free copy of the same hash in its sibling group 1 — the *whole* extent (docstring: a
    checkpoint is never partially evicted), its tail included.

    6 ids (usable 1..5). Extent (1, 2) in group 0 and (3, 4) in group 1, both hashed ``content_key``
    and freed: cached, tails held, num_free 5 (fresh 5, heads 1 and 3, tails 2 and 4).
    ``allocate(2)`` pops 5 and head 1 (LRU first): group 0's last copy goes, so 3 and its
    tail 4 are evicted too; 1's tail 2 and the extent (3, 4) are free scratch afterwards.
    So 3 blocks stay free, no tail is held, and allocating all 3 hands out exactly 2, 3, 4."""
    pool = ExtentBlockPool(6, 2)
    pool.siblings = {0: (1,), 1: (0,)}
    a = pool.allocate_extent(2)
    b = pool.allocate_extent(2)
    assert pool.extent(a) == (1, 2) and pool.extent(b) == (3, 4)
    pool.insert(0, content_key(7), a)
    pool.insert(1, content_key(7), b)
    pool.free([a])
    pool.free([b])
    assert pool.num_free == 5 and pool.num_held == 2
    pool.check()
    assert sorted(pool.allocate(2)) == [1, 5]
    assert content_key(7) not in pool.index[0] and content_key(7) not in pool.index[1]
    assert pool.num_held == 0
    assert pool.num_free == 3
    pool.check()
    assert sorted(pool.allocate(3)) == [2, 3, 4]
    assert pool.num_free == 0
    pool.check()


def _extent_pool() -> ExtentBlockPool:
    """Extent (1, 2) referenced; block 3 allocated then freed (scratch, in the queue)."""
    pool = ExtentBlockPool(20, 1)
    assert pool.allocate_extent(2) == 1
    pool.free(pool.allocate(1))
    pool.check()
    return pool


def _head_zero(pool):
    pool.tails[0] = ()
    return r"^extent head 0 has no state$"


def _head_past_fresh(pool):
    n = pool.queue.next_fresh
    pool.tails[n] = ()
    return rf"^extent head {n} has no state$"


def _tail_zero(pool):
    pool.tails[1] = (2, 0)
    return r"^extent of head 1: tail 0 is invalid or shared$"


def _tail_past_fresh(pool):
    n = pool.queue.next_fresh
    pool.tails[1] = (2, n)
    return rf"^extent of head 1: tail {n} is invalid or shared$"


def _tail_shared(pool):
    head = pool.allocate_extent(2)        # (4, 5)
    pool.tails[head] = (2,)               # 2 is already extent 1's tail
    return rf"^extent of head {head}: tail 2 is invalid or shared$"


def _tail_hashed(pool):
    pool.block_hash[2] = content_key(9)
    return r"^tail 2 of extent 1 is hashed$"


def _tail_queued(pool):
    pool.tails[1] = (2, 3)                # 3 is a free scratch block in the queue
    return r"^tail 3 of extent 1 is in the free queue$"


def _referenced_tail_ref(pool):
    pool.ref_cnt[2] = 2
    return r"^tail 2 of referenced extent 1 has ref 2$"


def _free_tail_ref(pool):
    pool.insert(0, content_key(9), 1)
    pool.free([1])                        # cached: the tail is held, ref 0
    pool.check()
    pool.ref_cnt[2] = 1
    return r"^tail 2 of free extent 1 has ref 1$"


def _num_held_off(pool):
    pool.num_held += 1
    return r"^0 tails of free extents are held but num_held is 1$"


@pytest.mark.parametrize("corrupt", [_head_zero, _head_past_fresh, _tail_zero, _tail_past_fresh,
                                     _tail_shared, _tail_hashed, _tail_queued,
                                     _referenced_tail_ref, _free_tail_ref, _num_held_off])
def test_extent_check_rejects_corrupted_extents(corrupt) -> None:
    """ExtentBlockPool check (class docstring's invariants): tails are disjoint, explicit ids,
    never heads, never hashed, never queued; a tail's ref is 1 iff its head is referenced;
    ``num_held`` = the tails of free heads. Each corruption breaks one and must be reported by
    its message, naming the head / tail / counts."""
    pool = _extent_pool()
    expected = corrupt(pool)
    with pytest.raises(AssertionError, match=expected):
        pool.check()


def test_sibling_eviction_evicts_every_free_duplicate_and_keeps_referenced_ones() -> None:
    """ExtentBlockPool._evict_free with a duplicated hash: group 1 holds the same checkpoint
    twice (extents (1, 2) and (3, 4), content computed twice) and group 0 once (5, 6). With
    (1, 2) free, (3, 4) referenced and group 0's copy free and least recently used,
    ``allocate(2)`` pops fresh id 7 and head 5 — group 0's last copy — which evicts group 1's
    *free* copy (1 and its tail) but leaves the referenced copy 3 indexed (the duplicate set
    shrinks to one block). Blocks 1, 2 and 5's tail 6 are free scratch afterwards."""
    pool = ExtentBlockPool(8, 2)
    pool.siblings = {0: (1,), 1: (0,)}
    a, b, c = (pool.allocate_extent(2) for _ in range(3))
    assert (a, b, c) == (1, 3, 5)
    pool.insert(1, content_key(7), a)
    pool.insert(1, content_key(7), b)
    pool.insert(0, content_key(7), c)
    assert pool.index[1][content_key(7)] == {1: None, 3: None}
    pool.free([c])
    pool.free([a])
    assert pool.num_free == 5 and pool.num_held == 2     # fresh 7, heads 5 and 1, tails 6, 2
    pool.check()
    assert sorted(pool.allocate(2)) == [5, 7]
    assert content_key(7) not in pool.index[0]
    assert pool.index[1][content_key(7)] == 3 and pool.block_hash[1] is None
    assert pool.num_held == 0 and pool.num_free == 3
    assert pool.num_evictions == 2
    pool.check()
    assert sorted(pool.allocate(3)) == [1, 2, 6]
    pool.check()


def test_extent_allocate_stops_on_a_count_that_disagrees_with_the_queue() -> None:
    """ExtentBlockPool.allocate trusts ``num_free`` (queue + held tails) only while the queue
    and the held tails can supply it; a corrupted ``num_held`` (one tail counted that no free
    head holds) must end in an AssertionError naming the disagreement, not a silent short
    allocation or an endless loop."""
    pool = ExtentBlockPool(4, 1)
    pool.num_held += 1                     # 3 queued + 1 phantom held tail
    assert pool.num_free == 4
    with pytest.raises(AssertionError, match=r"^free-block count disagrees with the queue and held tails$"):
        pool.allocate(4)


class ExtentPoolMachine(RuleBasedStateMachine):
    """The pool against a brute-force byte model: which ids are free (bytes = count x block
    bytes), which extents exist with which tails, which are cached; check() after every step."""

    BLOCK_BYTES = 4096

    @initialize(n=st.integers(8, 30), siblings=st.booleans())
    def setup(self, n, siblings):
        self.pool = ExtentBlockPool(n, 2)
        if siblings:                                  # groups 0 and 1 serve hits together
            self.pool.siblings = {0: (1,), 1: (0,)}
        self.n = n
        self.ref: dict[int, int] = {}                 # referenced ids -> model ref count
        self.extents: dict[int, tuple[int, ...]] = {}  # head -> tails (model)
        self.cached: set[int] = set()                 # hashed ids (heads or plain blocks)
        self.hash_of: dict[int, tuple[int, bytes]] = {}  # cached id -> (group, hash)

    def free_blocks(self) -> int:
        tails = {x for t in self.extents.values() for x in t}
        held = sum(1 for h in self.ref if h not in tails)
        return self.n - 1 - held - sum(len(self.extents[h]) for h in self.ref if h in self.extents)

    def _took(self, ids):
        """ids were just handed out: every cached extent that lost a block lost all of them;
        with siblings, an evicted hash leaves no free copy in the other group."""
        for b in ids:
            assert b not in self.ref, f"block {b} handed out while referenced"
        gone = set(ids)
        bh = self.pool.block_hash
        evicted = {b for b in self.cached if b >= len(bh) or bh[b] is None}
        for b in evicted:
            assert b not in self.ref, f"referenced block {b} lost its hash"
            assert b in gone or self.pool.siblings, f"block {b} evicted without being handed out"
            g, h = self.hash_of[b]
            last = not any(self.hash_of[x] == (g, h) for x in self.cached - evicted - gone)
            if self.pool.siblings and last:            # the group's last copy went
                for b2, (g2, h2) in self.hash_of.items():
                    if g2 != g and h2 == h and b2 not in self.ref and b2 not in evicted:
                        raise AssertionError(f"free sibling copy {b2} of an evicted checkpoint stays")
        for h in list(self.extents):
            blocks = {h, *self.extents[h]}
            if h not in self.ref and (blocks & gone or h in evicted):
                assert h in gone or h in evicted, f"extent {h} partially evicted"
                del self.extents[h]
        self.cached -= gone | evicted
        for b in gone | evicted:
            self.hash_of.pop(b, None)

    @rule(n=st.integers(1, 6))
    def allocate(self, n):
        if n > self.pool.num_free:
            with pytest.raises(ValueError):
                self.pool.allocate(n)
            return
        ids = self.pool.allocate(n)
        assert len(ids) == len(set(ids)) == n
        self._took(ids)
        for b in ids:
            self.ref[b] = 1

    @rule(k=st.integers(1, 9))
    def allocate_extent(self, k):
        if k > self.pool.num_free:
            return
        head = self.pool.allocate_extent(k)
        ext = self.pool.extent(head)
        assert len(ext) == k == len(set(ext)) and ext[0] == head
        self._took(ext)
        self.ref[head] = 1
        if k > 1:
            self.extents[head] = ext[1:]

    @rule(data=st.data(), g=st.integers(0, 1), h=st.integers(0, 2))
    def hash_one(self, data, g, h):
        held = sorted(b for b in self.ref if b not in self.cached)
        if held:
            b = data.draw(st.sampled_from(held))
            self.pool.insert(g, b"h%d" % h, b)        # few hashes: siblings share them
            self.cached.add(b)
            self.hash_of[b] = (g, b"h%d" % h)

    @rule(data=st.data())
    def free_one(self, data):
        if self.ref:
            b = data.draw(st.sampled_from(sorted(self.ref)))
            self.pool.free([b])
            self.ref[b] -= 1
            if not self.ref[b]:
                del self.ref[b]
                if b not in self.cached:
                    self.extents.pop(b, None)       # an unhashed extent dissolves

    @rule(data=st.data())
    def touch_one(self, data):
        live = sorted(self.ref) + sorted(self.cached - set(self.ref))
        if live:
            b = data.draw(st.sampled_from(live))
            before = self.pool.extent(b)
            self.pool.touch([b])
            assert self.pool.extent(b) == before    # a hit keeps its checkpoint intact
            self.ref[b] = self.ref.get(b, 0) + 1

    @invariant()
    def agrees(self):
        if not hasattr(self, "pool"):
            return
        self.pool.check()
        assert self.pool.num_free == self.free_blocks()
        assert self.pool.num_free * self.BLOCK_BYTES == self.free_blocks() * self.BLOCK_BYTES
        for h, tails in self.extents.items():
            assert self.pool.extent(h) == (h, *tails)
        assert {b for b in self.cached} == {b for b in range(1, self.n)
                                             if b < len(self.pool.block_hash) and self.pool.block_hash[b]}


TestExtentPool = ExtentPoolMachine.TestCase
TestExtentPool.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
