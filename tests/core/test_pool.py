"""The lazy pool against the eager one (``tests/support/eager_pool.py``, the pool as it was).

* Pool level: random operation sequences (allocate, free, touch and insert by any id, fresh
  ones included, drop_hash, reset) on both pools; after every step the returned ids, the whole
  free-queue order, every block's ref count / hash / group, the index, the eviction callbacks
  and counters agree, and ``check()`` passes on both.
* Manager level: the same random request traffic on a manager built with either pool gives the
  same block ids, tables, hits and queue order (``check_integrity`` after every step).
* Scale: a pool for 10^12 tokens costs a few list slots and grows with the blocks used.
* ``check()`` catches corruptions of the lazy bookkeeping.
"""

from __future__ import annotations

import random
import sys
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, Request
from hybridkv.core import pool as lazy
from tests.support import eager_pool as eager
from tests.support.helpers import FA, SWA, config
from tests.support.random_ops import Model, configs


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
    a = lazy.BlockPool(n, groups, on_evict=lambda g, h: ev_lazy.append((g, h)))
    b = eager.BlockPool(n, groups, on_evict=lambda g, h: ev_eager.append((g, h)))
    held: list[int] = []                       # one entry per reference taken
    ids = st.integers(1, n - 1)
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        op = data.draw(st.sampled_from(["alloc", "alloc", "free", "touch", "insert", "drop", "reset"]))
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
            return KVCacheManager(cfg, **kw)
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
    models = [Model(KVCacheManager(cfg, **kw), spec, compat), Model(eager_manager(cfg, **kw), spec, compat)]
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
        kv = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=num_blocks), retention_interval=0)
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
    ("gap node", lambda p: (p.queue._next.__setitem__(lazy._HEAD, lazy._TAIL),
                            p.queue._prev.__setitem__(lazy._TAIL, lazy._HEAD))),
    ("counts", lambda p: setattr(p.queue, "num_free", p.queue.num_free + 1)),
    ("back-link", lambda p: p.queue._prev.__setitem__(p.queue._next[lazy._HEAD], 5)),
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
