"""Tests that kill the mutants of ``core/pool.py`` that survived a mutmut run on the pool (bulk
allocation fast path, ``free_version``, extent pools with siblings, the integrity checker).
TESTING.md, "Mutation testing"; the survivors left: docs/mutation-survivors.md.

They drive the pools directly through their documented methods (``allocate``, ``insert``,
``free``, ``touch``, ``allocate_extent``, ``num_free``, ``check``) and the ``free_version``
attribute the coordinator's evictable-count memo relies on; expectations are derived by hand.
"""

from __future__ import annotations

import pytest

from hybridkv.core.eviction import make_policy
from hybridkv.core.extent_pool import ExtentBlockPool
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import _GAP, _HEAD, _MAX_CHANGES, _TAIL, BlockPool, FreeBlockQueue
from tests.support.helpers import content_key


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
        pool.insert(0, content_key(i + 1), b)
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
    """BlockPool / ExtentBlockPool / PolicyBlockPool ``free_version``: the coordinator reuses a count of free
    cached blocks while the version *equals* the one it was made at
    (``Coordinator._evictable_counts``), so every free, hit and eviction that moves a cached
    block must give a version never seen before (here: no value repeats)."""
    seen = _versions_distinct(BlockPool(4, 1), policy_pool=False)
    assert len(set(seen)) == len(seen), seen
    seen = _versions_distinct(ExtentBlockPool(4, 1), policy_pool=False)
    assert len(set(seen)) == len(seen), ("extent", seen)
    for name in ("lfu", "s3fifo", "cost"):
        seen = _versions_distinct(PolicyBlockPool(4, 1, make_policy(name)), policy_pool=True)
        assert len(set(seen)) == len(seen), (name, seen)


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


# ---- integrity checker: deliberately corrupted pools check() must reject, naming the fault ----
# (white box: each case breaks exactly one invariant of BlockPool.check / ExtentBlockPool's
# _check_held after a few legal operations, and pins the message's named values)

def _linked(q, before: int, b: int) -> None:
    """Link id ``b`` into the free queue right after node ``before`` (no count update)."""
    after = q._next[before]
    q._next[before] = b
    q._prev[b] = before
    q._next[b] = after
    q._prev[after] = b


def _base_pool() -> BlockPool:
    pool = BlockPool(100, 1)
    pool.free(pool.allocate(1))           # block 1 explicit and free (queue: 1, gap)
    pool.check()
    return pool


def _bad_fresh_mark(pool):
    pool.queue.num_blocks += 1
    return r"^fresh mark 2 outside \[1, 100\]$"


def _prev_links_only(pool):
    q = pool.queue
    q._prev[_HEAD:_HEAD] = [0]
    return rf"^free queue links hold {q.capacity} ids, capacity is {q.capacity}$"


def _gap_twice(pool):
    q = pool.queue
    q._next[_GAP] = _GAP
    return r"^free queue holds the gap node twice$"


def _block_zero_queued(pool):
    _linked(pool.queue, _HEAD, 0)
    return r"^free queue holds invalid block id 0 \(explicit ids < 2\)$"


def _fresh_id_queued(pool):
    _linked(pool.queue, _HEAD, 2)         # 2 == next_fresh: no explicit state yet
    return r"^free queue holds invalid block id 2 \(explicit ids < 2\)$"


def _queued_twice(pool):
    pool.queue._next[1] = 1
    return r"^block 1 is in the free queue twice$"


def _grow_capacity_to(pool, cap: int) -> None:
    q = pool.queue
    more = cap - q.capacity
    q._next[_HEAD:_HEAD] = [0] * more
    q._prev[_HEAD:_HEAD] = [0] * more
    q.capacity = cap
    pool.ref_cnt.extend([0] * more)
    pool.block_hash.extend([None] * more)
    pool.block_group.extend([0] * more)


def _capacity_65(pool):
    _grow_capacity_to(pool, 65)           # fresh mark 2: the bound is max(2 x 2, 64) = 64
    return r"^capacity 65 outside \[2, max\(2 x fresh mark 2, 64\)\]$"


def _fresh_block_hashed(pool):
    pool.block_hash[5] = content_key(9)             # 5 >= fresh mark 2: must have no state at all
    return r"^fresh block 5 \(fresh mark 2\) has state$"


def _gap_lost(pool):
    q = pool.queue                        # queue: 1, gap
    q._next[1] = _TAIL
    q._prev[_TAIL] = 1
    return r"^free queue lost its gap node with 98 fresh ids$"


def _tail_link(pool):
    pool.queue._prev[_TAIL] = 1           # queue: 1, gap; the tail's back-link must be the gap
    return r"^free queue tail link is broken$"


def _free_count_off(pool):
    pool.queue.num_free += 1              # 1 explicit + 98 fresh blocks are free, not 100
    return r"^free queue holds 1 \+ 98 fresh blocks but counts 100$"


def _null_referenced(pool):
    pool.ref_cnt[0] = 1
    return r"^the null block was referenced or hashed$"


def _null_hashed(pool):
    pool.block_hash[0] = content_key(9)             # (reported before the index / hash-count checks)
    return r"^the null block was referenced or hashed$"


def _queued_block_referenced(pool):
    pool.ref_cnt[1] = 1                   # block 1 (the lowest id) is in the queue
    return r"^block 1: ref_cnt 1 but in free queue = True$"


def _negative_ref(pool):
    assert pool.allocate(1) == [1]        # out of the queue, ref 1
    pool.ref_cnt[1] = -1
    return r"^block 1 has negative ref_cnt -1$"


def _empty_duplicate_set(pool):
    pool.index[0][content_key(7)] = {}
    return r"^group 0: empty duplicate set for a hash$"


def _index_names_null(pool):
    pool.index[0][content_key(7)] = 0
    return r"^group 0: the index names block 0, which has no state$"


def _index_names_fresh_mark(pool):
    pool.index[0][content_key(7)] = 2               # 2 == fresh mark: no state yet
    return r"^group 0: the index names block 2, which has no state$"


def _index_wrong_group(pool):
    pool.insert(0, content_key(7), 1)
    pool.check()
    pool.block_group[1] = 1               # right hash, but the block says another group
    return r"^index entry for block 1 disagrees with the block$"


def _index_wrong_hash(pool):
    pool.insert(0, content_key(7), 1)
    pool.check()
    pool.block_hash[1] = content_key(8)             # right group, but the block holds another hash
    return r"^index entry for block 1 disagrees with the block$"


@pytest.mark.parametrize("corrupt", [_bad_fresh_mark, _prev_links_only, _gap_twice,
                                     _block_zero_queued, _fresh_id_queued, _queued_twice,
                                     _capacity_65, _fresh_block_hashed, _gap_lost,
                                     _tail_link, _free_count_off, _null_referenced, _null_hashed,
                                     _queued_block_referenced, _negative_ref,
                                     _empty_duplicate_set, _index_names_null,
                                     _index_names_fresh_mark, _index_wrong_group,
                                     _index_wrong_hash])
def test_check_rejects_a_corrupted_free_queue(corrupt) -> None:
    """BlockPool.check: each corruption breaks one invariant (a queue for another pool size,
    back-link list of another length, the gap node reached twice, the null block / a fresh id /
    a block twice in the queue, capacity past its growth bound, a broken tail link, a free
    count off by one, a referenced or hashed null block, a queued block with a reference, a
    negative reference, an index entry that is empty, names a block without state, or
    disagrees with the block's own hash or group) and must be reported by that invariant's
    message, naming the offending values."""
    pool = _base_pool()
    expected = corrupt(pool)
    with pytest.raises(AssertionError, match=expected):
        pool.check()


def test_check_bounds_capacity_by_twice_the_fresh_mark() -> None:
    """BlockPool.check: past 64 ids the capacity may be at most twice the fresh mark (the
    queue doubles). 40 ids used (fresh mark 41): capacity 83 > 2 x 41 is rejected."""
    pool = BlockPool(200, 1)
    pool.free(pool.allocate(40))
    pool.check()
    assert pool.queue.next_fresh == 41
    _grow_capacity_to(pool, 83)
    with pytest.raises(AssertionError, match=r"^capacity 83 outside \[41, max\(2 x fresh mark 41, 64\)\]$"):
        pool.check()


def test_check_rejects_a_gap_node_with_no_fresh_id_left() -> None:
    """BlockPool.check: once every id is explicit the gap node leaves the queue; a gap linked
    back in is reported as held with 0 fresh ids."""
    pool = BlockPool(4, 1)
    pool.free(pool.allocate(3))
    pool.check()
    _linked(pool.queue, _HEAD, _GAP)
    with pytest.raises(AssertionError, match=r"^free queue holds its gap node with 0 fresh ids$"):
        pool.check()


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


# ---- FreeBlockQueue built from explicit ids (the ``initial`` argument) ----------------------

def _linked_nodes(q: FreeBlockQueue) -> list[int]:
    """The nodes reached from the head sentinel by next-links, gap node included."""
    out, b = [], q._next[_HEAD]
    while b != _TAIL:
        out.append(b)
        b = q._next[b]
    return out


@pytest.mark.parametrize("num_blocks, initial", [(6, [4, 2, 5]), (6, []), (1, None), (2, [1])])
def test_queue_from_explicit_ids_holds_exactly_them_with_no_gap(num_blocks, initial) -> None:
    """FreeBlockQueue(num_blocks, initial): the queue holds exactly ``initial``, in order, all
    explicit (``next_fresh == num_blocks``); ``initial=None`` holds ``1 .. num_blocks-1``
    (none for a pool of the null block only). The gap node is linked exactly while fresh ids
    remain, so with none left it is not in the list; the queue then pops, prepends and
    appends as a plain linked list."""
    q = FreeBlockQueue(num_blocks, initial)
    want = list(range(1, num_blocks)) if initial is None else list(initial)
    assert list(q) == want and len(q) == len(want)
    if initial is not None or num_blocks == 1:
        assert q.next_fresh == num_blocks
        assert _linked_nodes(q) == want   # no gap node: every id is explicit
    assert q.popleft_n(0) == [] and list(q) == want
    first = q.popleft_n(len(want) // 2)
    assert first == want[:len(want) // 2]
    q.prepend_n(first[:1])
    q.append_n(first[1:])
    assert list(q) == first[:1] + want[len(want) // 2:] + first[1:]
    assert q.popleft_n(len(want)) == first[:1] + want[len(want) // 2:] + first[1:]
    assert list(q) == [] and len(q) == 0


def test_pop_past_the_free_count_names_both_numbers() -> None:
    """FreeBlockQueue.popleft_n / BlockPool.allocate with more blocks than are free: a
    ValueError naming the request and the free count; the pool is unchanged."""
    with pytest.raises(ValueError, match=r"^cannot pop 4 blocks, only 3 are free$"):
        FreeBlockQueue(4).popleft_n(4)
    pool = BlockPool(4, 1)
    pool.allocate(1)
    with pytest.raises(ValueError, match=r"^cannot pop 3 blocks, only 2 are free$"):
        pool.allocate(3)
    assert pool.num_free == 2
    pool.check()


def test_per_block_lists_double_only_when_a_fresh_id_passes_them() -> None:
    """Module docstring: the per-block lists (and the queue's link lists) cover ids
    ``0 .. capacity-1``; the first ids handed out make it ``max(used, 64)``, and later it
    doubles (at most to ``num_blocks``) only when a fresh id at or beyond it is handed out.
    So handing out ids up to exactly 63 keeps 64 slots, id 64 makes 128, and a small pool
    stops at its size."""
    pool = BlockPool(1000, 1)
    pool.allocate(10)                      # ids 1..10: fresh mark 11
    assert pool.queue.capacity == len(pool.ref_cnt) == 64
    pool.allocate(53)                      # ids up to 63: fresh mark 64 == capacity
    assert pool.queue.next_fresh == 64
    assert pool.queue.capacity == len(pool.ref_cnt) == len(pool.block_hash) == 64
    pool.allocate(1)                       # id 64: past the lists, they double
    assert pool.queue.capacity == len(pool.ref_cnt) == len(pool.block_group) == 128
    assert len(pool.queue._next) == len(pool.queue._prev) == 128 + 3
    pool.allocate(64)                      # ids up to 128: fresh mark 129 > 128
    assert pool.queue.capacity == 256
    pool.check()
    small = BlockPool(100, 1)
    small.allocate(10)
    assert small.queue.capacity == 64
    small.allocate(60)                     # fresh mark 71: doubling 64 would pass 100
    assert small.queue.capacity == len(small.ref_cnt) == 100
    small.check()


# ---- the index change record (``index_changes_since``) and its memory bound ----------------

def _alternate(pool: BlockPool, b: int, n: int, start: int) -> list[bytes]:
    """``n`` index changes on block ``b`` (unhashed on entry), insert and drop in turn, with
    hashes ``content_key(start), content_key(start + 1), ...`` for the inserts; returns the recorded hashes."""
    out = []
    for i in range(n):
        if i % 2 == 0:
            pool.insert(0, content_key(start + i), b)
            out.append(content_key(start + i))
        else:
            out.append(pool.block_hash[b])
            pool.drop_hash(b)
    return out


@pytest.mark.parametrize("overflow", ["insert", "drop", "insert_run"])
def test_change_record_holds_at_most_max_changes_then_restarts(overflow) -> None:
    """BlockPool's index change record (the lookup memo's source, ``index_changes_since``)
    keeps every change up to ``_MAX_CHANGES`` of them, oldest first; the change that would
    pass the bound restarts it: afterwards only that change is known and any older version
    answers None ("look up again"). Reached by a single insert, a drop, and a bulk
    ``insert_run`` (which restarts when the whole run would not fit)."""
    pool = BlockPool(16, 1)
    b, c = pool.allocate(1)[0], pool.allocate(1)[0]
    run = pool.allocate(8)
    if overflow == "drop":                 # block c stays hashed so a drop can be the last
        pool.insert(0, content_key(1 << 40), c)
        filled = [content_key(1 << 40)] + _alternate(pool, b, _MAX_CHANGES - 2, 0)
        pool.insert(0, content_key((1 << 40) + 1), b)
        filled.append(content_key((1 << 40) + 1))
    else:
        filled = _alternate(pool, b, _MAX_CHANGES, 0)
    assert pool.index_version == _MAX_CHANGES
    assert pool.index_changes_since(0) == filled            # full, nothing forgotten
    assert pool.index_changes_since(_MAX_CHANGES - 3) == filled[-3:]
    if overflow == "insert":
        pool.insert(0, content_key(1 << 41), c)
        last = [content_key(1 << 41)]
    elif overflow == "drop":
        last = [pool.block_hash[b]]
        pool.drop_hash(b)
    else:
        last = [content_key((1 << 42) + j) for j in range(8)]
        pool.insert_run(0, last, run)
    assert pool.index_version == _MAX_CHANGES + len(last)
    assert pool.index_changes_since(0) is None
    assert pool.index_changes_since(_MAX_CHANGES - 1) is None
    assert pool.index_changes_since(_MAX_CHANGES) == last
    pool.check()


def test_a_bulk_run_that_exactly_fills_the_change_record_keeps_it() -> None:
    """``insert_run`` restarts the record only when the run would *pass* ``_MAX_CHANGES``:
    a run that fills it exactly keeps every older change known."""
    pool = BlockPool(16, 1)
    b = pool.allocate(1)[0]
    run = pool.allocate(8)
    filled = _alternate(pool, b, _MAX_CHANGES - 8, 0)
    hashes = [content_key((1 << 42) + j) for j in range(8)]
    pool.insert_run(0, hashes, run)
    assert pool.index_changes_since(0) == filled + hashes
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


# ---- the pool classes' own contract for ids and bad calls (``hybridkv.core`` exports them) --

def test_ids_past_the_pool_are_refused_with_the_valid_range() -> None:
    """BlockPool.touch / insert and FreeBlockQueue.remove / materialize accept any id in
    ``1 .. num_blocks-1`` (module docstring); an id at or past ``num_blocks`` is a ValueError
    naming it and the range, and changes nothing."""
    pool = BlockPool(10, 1)
    pool.allocate(1)
    for call in (lambda: pool.touch([10]), lambda: pool.insert(0, content_key(1), 10)):
        with pytest.raises(ValueError, match=r"^block id 10 out of range \[1, 10\)$"):
            call()
        assert pool.next_fresh == 2 and pool.num_free == 8
        pool.check()
    q = FreeBlockQueue(10)
    with pytest.raises(ValueError, match=r"^block id 10 out of range \[1, 10\)$"):
        q.remove(10)
    with pytest.raises(ValueError, match=r"^block id 11 out of range \[1, 10\)$"):
        q.materialize(12)
    assert q.next_fresh == 1 and list(q) == list(range(1, 10))


@pytest.mark.parametrize("kind", ["policy", "extent"])
def test_pools_with_held_blocks_refuse_to_pop_more_than_are_free(kind) -> None:
    """PolicyBlockPool / ExtentBlockPool.allocate past ``num_free`` (which counts the blocks
    the policy or the held tails hold too): a ValueError naming both numbers."""
    if kind == "policy":
        pool = PolicyBlockPool(4, 1, make_policy("lfu"))
        blocks = pool.allocate(3)
        pool.insert(0, content_key(1), blocks[0])
        pool.free(blocks)                  # 2 scratch blocks in the queue, 1 in the policy
        assert len(pool.policy) == 1
    else:
        pool = ExtentBlockPool(4, 1)
        head = pool.allocate_extent(2)
        pool.insert(0, content_key(1), head)
        pool.free([head])                  # the head queued, its tail held; 1 fresh id
        assert pool.num_held == 1
    assert pool.num_free == 3
    with pytest.raises(ValueError, match=r"^cannot pop 4 blocks, only 3 are free$"):
        pool.allocate(4)
    assert pool.num_free == 3
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


def test_queue_remove_of_a_fresh_id_makes_only_the_ids_up_to_it_explicit() -> None:
    """FreeBlockQueue.remove(b) for a fresh id: ids ``next_fresh .. b`` become explicit (their
    place in the queue order is unchanged), then b leaves the queue; the fresh mark is b + 1."""
    q = FreeBlockQueue(10)
    assert q.popleft_n(1) == [1]
    q.remove(2)                            # the fresh mark itself
    assert q.next_fresh == 3 and list(q) == list(range(3, 10)) and len(q) == 7
    q.remove(5)
    assert q.next_fresh == 6 and list(q) == [3, 4, 6, 7, 8, 9] and len(q) == 6
    assert q.popleft_n(6) == [3, 4, 6, 7, 8, 9]


def test_cached_block_of_a_duplicated_hash_is_the_first_copy() -> None:
    """BlockPool.cached_block: when the same content was computed twice, the first block
    registered is the one a lookup gets; after it is dropped, the other."""
    pool = BlockPool(8, 1)
    a, b = pool.allocate(2)
    pool.insert(0, content_key(3), a)
    pool.insert(0, content_key(3), b)
    assert pool.cached_block(0, content_key(3)) == a
    pool.drop_hash(a)
    assert pool.cached_block(0, content_key(3)) == b


def test_a_double_free_is_reported_and_leaves_the_pool_consistent() -> None:
    """BlockPool.free of a block with no reference left raises AssertionError naming it; the
    block's count stays 0 (it is still free, once) and the pool checks clean."""
    pool = BlockPool(8, 1)
    a, b = pool.allocate(2)
    pool.free([a])
    with pytest.raises(AssertionError, match=rf"^block {a} freed more often than it was referenced$"):
        pool.free([a])
    assert pool.ref_cnt[a] == 0 and pool.num_free == 6
    pool.check()


@pytest.mark.parametrize("kind", ["lru", "policy", "extent"])
def test_a_double_free_inside_a_batch_loses_no_block(kind) -> None:
    """A batch that frees a valid block and then one with no reference left: the error names
    the bad block, the valid free before it takes effect (its block is free and counted, not
    lost: ref 0 outside every free list), the blocks after it are untouched, and the pool
    checks clean — for every pool class."""
    pool = {"lru": lambda: BlockPool(8, 1),
            "policy": lambda: PolicyBlockPool(8, 1, make_policy("lfu")),
            "extent": lambda: ExtentBlockPool(8, 1)}[kind]()
    a, b, c, d = pool.allocate(4)
    pool.insert(0, content_key(5), d)                # one cached block in the batch too
    pool.free([a])
    with pytest.raises(AssertionError, match=rf"^block {a} freed more often than it was referenced$"):
        pool.free([b, d, a, c])
    assert [pool.ref_cnt[x] for x in (a, b, c, d)] == [0, 0, 1, 0]
    assert pool.num_free == 6              # 3 fresh + a, b, d
    pool.check()
    pool.free([c])
    pool.check()
    assert sorted(pool.allocate(7)) == list(range(1, 8))


def test_freeing_a_never_used_id_past_the_lists_loses_no_block() -> None:
    """BlockPool.free with an id never handed out (past the per-block lists: no reference to
    drop) after valid blocks in the same batch: the error names the id, and the valid scratch
    and cached blocks before it are freed (queued), not lost."""
    pool = BlockPool(200, 1)
    a, d = pool.allocate(2)
    pool.insert(0, content_key(5), d)
    assert len(pool.ref_cnt) == 64
    with pytest.raises(AssertionError, match=r"^block 100 freed more often than it was referenced$"):
        pool.free([a, d, 100])
    assert pool.ref_cnt[a] == pool.ref_cnt[d] == 0
    assert pool.num_free == 199
    pool.check()
    assert pool.cached_block(0, content_key(5)) == d


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
