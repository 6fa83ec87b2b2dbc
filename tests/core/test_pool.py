"""The block pool (``hybridkv.core.pool``): ``BlockPool`` and its ``FreeBlockQueue``.

* The lazy pool against the eager one (:mod:`tests.support.eager_pool`, the pool as it was):
  random operation sequences (allocate, free, touch, insert and insert_run by any id, fresh
  ones included, drop_hash, reset) on both pools; after every step the returned ids, the whole
  free-queue order, every block's ref count / hash / group, the index, the index version, the
  eviction callbacks (with the version each sees) and counters agree, and ``check()`` passes
  on both. The same random request traffic on a manager
  built with either pool gives the same block ids, tables, hits and queue order.
* Scale: a pool for 10^12 tokens costs a few list slots and grows with the blocks used.
* The free queue: explicit and fresh ids, prepend/append order, popping past the free count.
* The index: duplicated hashes (a copy dropped, the others stay), ``insert_run`` against one
  ``insert`` per pair (fresh ids, a longer hash list, a subclass's ``insert``), the change
  record ``index_changes_since`` (the lookup memo's source) and its bound; ``free_version``.
* Bad calls (ids past the pool, double frees) are refused naming the block and lose nothing.
* ``check()`` (white box): each corruption of one invariant is caught and named.
"""

from __future__ import annotations

import random
import sys
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv import KVCacheManager, Request
from hybridkv.core import FreeBlockQueue, free_queue, pool as lazy
from hybridkv.core.eviction import make_policy
from hybridkv.core.extent_pool import ExtentBlockPool
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.free_queue import GAP as _GAP, HEAD as _HEAD, TAIL as _TAIL
from hybridkv.core.pool import _MAX_CHANGES, BlockPool
from tests.support import eager_pool as eager
from tests.support.helpers import FA, SWA, config, content_key
from tests.support.random_ops import Model, configs
from hybridkv.core.cache_options import CacheOptions


def _state(p, n: int) -> tuple:
    """Everything observable about a pool of ``n`` blocks (implicit ids read as fresh)."""
    def at(lst, b, default):
        return lst[b] if b < len(lst) else default
    return (list(p.queue), p.num_free, p.num_evictions,
            [at(p.ref_cnt, b, 0) for b in range(n)],
            [at(p.block_hash, b, None) for b in range(n)],
            [at(p.block_group, b, 0) if at(p.block_hash, b, None) is not None else None
             for b in range(n)],
            [dict(idx) for idx in p.index])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 24), st.integers(1, 3), st.data())
def test_lazy_pool_matches_eager_pool(n, groups, data):
    ev_lazy: list = []
    ev_eager: list = []
    # each callback also records the index version it sees: its own drop counted, no later one
    a = lazy.BlockPool(n, groups, on_evict=lambda g, h: ev_lazy.append((g, h, a.index_version)))
    b = eager.BlockPool(n, groups, on_evict=lambda g, h: ev_eager.append((g, h, b.index_version)))
    held: list[int] = []                       # one entry per reference taken
    ids = st.integers(1, n - 1)
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        op = data.draw(st.sampled_from(["alloc", "alloc", "free", "touch", "insert", "insert_run",
                                        "drop", "reset"]))
        if op == "alloc":
            k = data.draw(st.integers(0, min(b.num_free, 6)))
            got = a.allocate(k)
            assert got == b.allocate(k)
            held += got
        elif op == "free" and held:
            picks = data.draw(st.lists(st.integers(0, len(held) - 1), unique=True, max_size=len(held)))
            blocks = [held[i] for i in picks]
            for i in sorted(picks, reverse=True):
                del held[i]
            a.free(blocks)
            b.free(blocks)
        elif op == "touch":
            blocks = data.draw(st.lists(ids, max_size=4))
            a.touch(blocks)
            b.touch(blocks)
            held += blocks
        elif op == "insert":
            blk = data.draw(ids)
            if b.block_hash[blk] is None:
                g = data.draw(st.integers(0, groups - 1))
                h = bytes([data.draw(st.integers(0, 3))])     # few hashes: duplicates happen
                a.insert(g, h, blk)
                b.insert(g, h, blk)
        elif op == "insert_run":                   # any unhashed ids, fresh ones included;
            blks = data.draw(st.lists(ids, unique=True, max_size=4))    # hashes may run longer
            blks = [x for x in blks if b.block_hash[x] is None]
            g = data.draw(st.integers(0, groups - 1))
            hs = [bytes([k]) for k in data.draw(st.lists(st.integers(0, 3), min_size=len(blks),
                                                         max_size=len(blks) + 1))]
            a.insert_run(g, hs, blks)
            b.insert_run(g, hs, blks)
        elif op == "drop":
            blk = data.draw(ids)
            a.drop_hash(blk)
            b.drop_hash(blk)
        elif op == "reset":
            a.reset_hashes()
            b.reset_hashes()
        a.check()
        b.check()
        assert _state(a, n) == _state(b, n)
        assert ev_lazy == ev_eager
        assert a.index_version == b.index_version
        assert a.next_fresh <= len(a.ref_cnt) == a.queue.capacity <= max(2 * a.next_fresh, 64)


def test_free_of_a_fresh_id_is_the_same_error():
    p = lazy.BlockPool(10**12, 1)
    with pytest.raises(AssertionError, match="block 7 freed more often"):
        p.free([7])
    p.check()


@pytest.fixture
def eager_manager(monkeypatch):
    """Build managers with the eager pool (the manager looks BlockPool up at construction)."""
    import hybridkv.core.manager as manager_mod

    def make(cfg, **kw):
        monkeypatch.setattr(manager_mod, "BlockPool", eager.BlockPool)
        try:
            return KVCacheManager(cfg, CacheOptions(**kw))
        finally:
            monkeypatch.setattr(manager_mod, "BlockPool", lazy.BlockPool)
    return make


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(configs(states=False), st.lists(st.tuples(st.integers(0, 4), st.integers(0, 10**6)), min_size=1, max_size=40))  # the eager pool has no extents
def test_manager_with_lazy_pool_matches_eager_pool(eager_manager, cfg_args, ops):
    cfg, retention, spec, compat = cfg_args
    kw = dict(retention_interval=retention, spec_decode=spec, vllm_compat=compat, enable_events=True,
              hash_seed="same")
    models = [Model(KVCacheManager(cfg, CacheOptions(**kw)), spec, compat), Model(eager_manager(cfg, **kw), spec, compat)]
    assert isinstance(models[0].kv.pool, lazy.BlockPool)
    assert isinstance(models[1].kv.pool, eager.BlockPool)
    for op, x in ops:
        for m in models:                      # the same step on both (the model is deterministic)
            if op <= 1 or not m.running:
                base = m.prompts[x % len(m.prompts)] if m.prompts and x % 3 else []
                tokens = base[: (x // 7) % (len(base) + 1)] + [(x >> k) % 5 for k in range(1 + x % 13)]
                m.admit(tokens, None, chunk=1 + x % 40)
            elif op <= 3:
                m.step(sorted(m.running)[x % len(m.running)], x % 5)
            else:
                m.finish(sorted(m.running)[x % len(m.running)])
            m.kv.check_integrity()
        lz, eg = (m.kv for m in models)
        assert models[0].mirror.cached() == models[1].mirror.cached()   # the same KV events
        assert list(lz.pool.queue) == list(eg.pool.queue)
        assert sorted(models[0].running) == sorted(models[1].running)
        for rid in models[0].running:
            assert lz.block_ids(rid) == eg.block_ids(rid)
        assert lz.stats() == eg.stats()


def _list_bytes(*lists) -> int:
    return sum(sys.getsizeof(x) for x in lists)


def test_pool_for_a_trillion_tokens_is_small():
    # 10^12 tokens of a 16-token-block model: 62.5 G blocks; the eager pool needed ~2 TB.
    num_blocks = 10**12 // 16 + 1
    tracemalloc.start()
    try:
        kv = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=num_blocks), CacheOptions(
            retention_interval=0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"building the manager allocated {peak} bytes"
    pool = kv.pool
    assert pool.num_free == num_blocks - 1 and pool.next_fresh == 1
    assert len(pool.ref_cnt) == len(pool.block_hash) == len(pool.block_group) == 1
    assert len(pool.queue._next) == len(pool.queue._prev) == 4
    assert _list_bytes(pool.ref_cnt, pool.block_hash, pool.block_group,
                       pool.queue._next, pool.queue._prev) < 1024
    rng = random.Random(0)
    for i in range(20):                       # traffic: state grows with the blocks used only
        req = Request(f"r{i}", [rng.randrange(3) for _ in range(rng.randrange(2, 200))])
        hit = kv.lookup(req)
        assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        kv.free(req)
    used = pool.next_fresh
    assert 2 < used < 2 * 20 * 200 // 16 + 2
    cap = pool.queue.capacity
    assert used <= cap <= max(2 * used, 64)
    assert len(pool.ref_cnt) == cap and len(pool.queue._next) == cap + 3
    assert pool.num_free == num_blocks - 1
    kv.check_integrity()


CORRUPTIONS = [  # (what the error names, how to break a pool)
    ("counts", lambda p: setattr(p.queue, "next_fresh", p.queue.next_fresh + 1)),
    ("capacity 1000 outside", lambda p: setattr(p.queue, "capacity", 1000)),
    ("ref_cnt holds", lambda p: p.ref_cnt.append(0)),
    ("fresh block 30 .* has state", lambda p: p.ref_cnt.__setitem__(30, 1)),
    ("gap node", lambda p: (p.queue._next.__setitem__(free_queue.HEAD, free_queue.TAIL),
                            p.queue._prev.__setitem__(free_queue.TAIL, free_queue.HEAD))),
    ("counts", lambda p: setattr(p.queue, "num_free", p.queue.num_free + 1)),
    ("back-link", lambda p: p.queue._prev.__setitem__(p.queue._next[free_queue.HEAD], 5)),
    ("in free queue", lambda p: p.ref_cnt.__setitem__(6, 0)),
    ("no state", lambda p: p.index[0].__setitem__(b"y", 40)),
    ("have a hash", lambda p: p.block_hash.__setitem__(2, b"z")),
    ("twice|back-link", lambda p: p.queue.append_n([2])),
]


@pytest.mark.parametrize("what,corrupt", CORRUPTIONS)
def test_check_catches_corruption(what, corrupt):
    p = lazy.BlockPool(50, 1)
    got = p.allocate(6)
    p.insert(0, b"x", got[0])
    p.free(got[:4])
    p.check()
    corrupt(p)
    with pytest.raises(AssertionError, match=what):
        p.check()


def test_touch_and_insert_by_fresh_id_keep_the_queue_order():
    p = lazy.BlockPool(12, 1)
    q = eager.BlockPool(12, 1)
    for pool in (p, q):
        pool.free(pool.allocate(2)[::-1])       # 2, 1 at the head
        pool.insert(0, b"h", 7)                 # a free, never-used block gets a hash
        pool.touch([5])                          # and one is taken by id
    assert list(p.queue) == list(q.queue) == [2, 1, 3, 4, 6, 7, 8, 9, 10, 11]
    assert p.next_fresh == 8
    p.check()


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


# The integrity checker's corruptions (white box: each case breaks exactly one invariant of
# BlockPool.check after a few legal operations, and pins the message's named values)
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


def _pool_state(p: BlockPool) -> tuple:
    return (p.index, p.block_hash, p.block_group, p.ref_cnt, list(p.queue), p.index_version,
            p.index_changes_since(0))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.lists(st.integers(0, 40), min_size=0, max_size=30),
       st.lists(st.integers(0, 40), max_size=6), st.data())
def test_insert_run_equals_inserts(groups, keys, present, data) -> None:
    a, b = BlockPool(200, groups), BlockPool(200, groups)
    g = data.draw(st.integers(0, groups - 1))
    for p in (a, b):                                   # some hashes already cached
        for k in present:
            p.insert(g, bytes([k]), p.allocate(1)[0])
    blocks_a, blocks_b = a.allocate(len(keys)), b.allocate(len(keys))
    assert blocks_a == blocks_b
    hashes = [bytes([k]) for k in keys]                 # duplicates happen
    a.insert_run(g, hashes, blocks_a)
    for h, blk in zip(hashes, blocks_b):
        b.insert(g, h, blk)
    assert _pool_state(a) == _pool_state(b)
    a.check()


@pytest.mark.parametrize("fresh, extra", [
    (2, 0),          # both ids fresh, the first one at the fresh mark
    (1, 0),          # an allocated id, then the id at the fresh mark
    (0, 2),          # allocated ids, two hashes more than blocks: pairs as zip makes them
])
def test_insert_run_by_fresh_ids_or_with_spare_hashes_equals_inserts(fresh, extra) -> None:
    """``insert_run`` is ``insert`` per pair for any unhashed ids (a fresh id becomes explicit
    first) and pairs hashes with blocks as ``zip`` does (spare hashes are not inserted)."""
    a, b = BlockPool(100, 2), BlockPool(100, 2)
    for p in (a, b):
        p.allocate(3)
    blocks = [1, 2, 3][fresh:] + list(range(a.next_fresh, a.next_fresh + fresh))
    hashes = [content_key(k) for k in range(len(blocks) + extra)]
    a.insert_run(1, hashes, blocks)
    for h, blk in zip(hashes, blocks):
        b.insert(1, h, blk)
    assert _pool_state(a) == _pool_state(b)
    assert a.next_fresh == b.next_fresh
    a.check()


def test_insert_run_calls_a_subclass_insert_once_per_pair_in_order() -> None:
    """A subclass that overrides ``insert`` sees every pair of an ``insert_run`` (the bulk
    path is the base class's own)."""
    calls = []

    class Recording(BlockPool):
        def insert(self, group, h, b):
            calls.append((group, h, b))
            super().insert(group, h, b)

    p = Recording(20, 1)
    blocks = p.allocate(3)
    p.insert_run(0, [b"x", b"y", b"z"], blocks)
    assert calls == [(0, b"x", blocks[0]), (0, b"y", blocks[1]), (0, b"z", blocks[2])]
    p.check()


def test_dropping_one_of_three_copies_keeps_the_other_two_cached() -> None:
    """A hash held by three blocks: each drop removes exactly its block from the index."""
    p = BlockPool(10, 1)
    x, y, z = p.allocate(3)
    p.insert_run(0, [b"h"] * 3, [x, y, z])
    p.drop_hash(y)
    assert p.index[0][b"h"] == {x: None, z: None}
    p.check()
    p.drop_hash(x)
    assert p.index[0][b"h"] == z
    p.check()


def test_eviction_callbacks_see_the_index_version_count_their_own_drop() -> None:
    """With an ``on_evict`` callback, the index version advances by one per evicted hash,
    before its callback runs; the change record then holds exactly the drops since."""
    seen = []
    p = BlockPool(6, 2, on_evict=lambda g, h: seen.append((g, h, p.index_version,
                                                             p.index_changes_since(v))))
    blocks = p.allocate(5)
    p.insert_run(0, [b"a", b"b"], blocks[:2])
    p.insert_run(1, [b"c", b"d", b"e"], blocks[2:])
    p.free(blocks)
    v = p.index_version
    p.allocate(4)                                    # evicts a, b, c, d (LRU order)
    assert seen == [(0, b"a", v + 1, [b"a"]), (0, b"b", v + 2, [b"a", b"b"]),
                    (1, b"c", v + 3, [b"a", b"b", b"c"]),
                    (1, b"d", v + 4, [b"a", b"b", b"c", b"d"])]
    assert p.index_version == v + 4 and p.index_changes_since(p.index_version) == []
    p.check()


def test_index_changes_since_names_every_change_and_forgets_on_reset() -> None:
    p = BlockPool(50, 1)
    v0 = p.index_version
    x, y = p.allocate(2)
    p.insert(0, b"x", x)
    v1 = p.index_version
    p.insert_run(0, [b"y"], [y])
    p.free([x, y])
    p.allocate(49)                        # every block: evicts x, then y (LRU order)
    assert p.index_changes_since(v0) == [b"x", b"y", b"x", b"y"]
    assert p.index_changes_since(v1) == [b"y", b"x", b"y"]
    assert p.index_changes_since(p.index_version) == []
    p.reset_hashes()
    assert p.index_changes_since(v1) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(9, 40), st.lists(st.integers(0, 60), max_size=12), st.integers(9, 30))
def test_large_allocations_match_the_eager_pool(first, cached, again) -> None:
    """Allocations of more than 8 blocks (a slice assignment when the ids are one fresh or
    uncached run) leave the pool as the eager reference pool does, evictions included."""
    from tests.support import eager_pool as eager
    a, b = BlockPool(120, 1), eager.BlockPool(120, 1)
    for p in (a, b):
        got = p.allocate(first)
        for k in sorted(set(cached)):
            if k < len(got):
                p.insert(0, bytes([k]), got[k])
        p.free(list(reversed(got)))
    assert a.allocate(again) == b.allocate(again)
    assert a.allocate(min(a.num_free, 50)) == b.allocate(min(b.num_free, 50))
    assert (a.num_evictions, list(a.queue), a.index) == (b.num_evictions, list(b.queue), b.index)
    assert a.ref_cnt == b.ref_cnt[:len(a.ref_cnt)] and a.block_hash == b.block_hash[:len(a.block_hash)]
    a.check()


def test_prepend_n_order():  # vLLM: test_free_kv_cache_block_queue_prepend_n
    q = FreeBlockQueue(8, [])
    q.append_n([7])
    q.prepend_n([4, 5])
    q.prepend_n([1, 2])
    q.prepend_n([])
    assert list(q) == [1, 2, 4, 5, 7]
    assert q.popleft_n(5) == [1, 2, 4, 5, 7] and len(q) == 0


def test_hash_index_duplicates():  # vLLM: test_maybe_evict_cached_block
    from hybridkv.core import BlockPool
    p = BlockPool(5, 1)
    p.insert(0, b"h0", 1)
    p.insert(0, b"h1", 2)
    p.insert(0, b"h0", 4)
    assert p.index[0][b"h0"] == {1: None, 4: None}
    p.drop_hash(2)
    assert b"h1" not in p.index[0]
    p.drop_hash(1)
    assert p.index[0][b"h0"] == 4 and p.cached_block(0, b"h0") == 4
    p.drop_hash(4)
    assert p.index[0] == {}
