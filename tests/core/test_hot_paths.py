"""The hot paths' shortcuts against the plain code they replace (issue 10's speed work).

* a hit rule scans a list-backed probe in C (slices, ``all``, ``index``) with the same answer
  as probing block by block;
* ``BlockPool.insert_run`` leaves the pool exactly as one ``insert`` per block would;
* the pool's record of index changes names every hash inserted or dropped since a version;
* a memoized lookup that outlived index changes (none touching the request's hashes) equals
  a fresh lookup, and its hit is adopted without re-verification;
* vLLM's write mask walked run by run (``next_masked_run``) covers exactly the blocks the
  block-by-block walk (``next_masked_block``) visits;
* ``Request.append_tokens`` leaves the tokens unchanged when a list holds a bad item.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import Request
from hybridkv.core.pool import BlockPool
from hybridkv.core.retention import Retention
from hybridkv.core.rules import make_rule

from tests.support.helpers import FA, SWA, manager
from tests.support.random_ops import ATTENTION_SPECS


@settings(max_examples=400, deadline=None)
@given(ATTENTION_SPECS, st.booleans(), st.lists(st.booleans(), min_size=0, max_size=60),
       st.integers(1, 4), st.data())
def test_list_probe_scan_matches_block_by_block(spec, proof, flags, step, data) -> None:
    rule = make_rule(spec, proof)
    e_max = data.draw(st.integers(0, max(len(flags) - rule.proof, 0)))
    calls = []

    def probe(j: int) -> bool:
        calls.append(j)
        return flags[j]

    assert rule.longest_hit(flags.__getitem__, e_max, step) == rule.longest_hit(probe, e_max, step)


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


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([(FA(4),), (FA(4), SWA(4, 8)), (FA(4), SWA(8, 12))]),
       st.sampled_from([(True, "lru"), (False, "lru"), (False, "lfu")]),
       st.integers(12, 60), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)),
                                     min_size=1, max_size=40))
def test_memoized_lookup_equals_a_fresh_one(specs, mode, num_blocks, ops) -> None:
    """Waiting requests are looked up (and their admission planned) again and again while
    others run, cache and evict: every answer equals one made from scratch (the hit, and the
    count of its blocks in the free queue), and adopting it keeps the pool sound."""
    compat, policy = mode
    kv = manager(*specs, num_blocks=num_blocks, compat=compat, eviction_policy=policy,
                 retention=0 if len(specs) > 1 else None)
    coord = kv.coordinator
    base = [7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 7, 8, 7, 9]
    waiting = [Request(f"w{i}", base[: 8 + 4 * i] + [i] * (3 + i)) for i in range(3)]
    running: list[Request] = []
    n = 0
    for op, x in ops:
        if op == 0:                                     # a new request runs its prompt
            req = Request(f"r{n}", base[: x % 17] + [x % 3] * (1 + x % 9))
            n += 1
            hit = kv.lookup(req)
            if kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None:
                req.num_computed_tokens = req.num_tokens
                running.append(req)
        elif op == 1 and running:                       # a decode step
            req = running[x % len(running)]
            req.append_tokens([x % 4])
            if kv.allocate(req, 1) is None:
                kv.free(running.pop(running.index(req)))
            else:
                req.num_computed_tokens += 1
        elif op == 2 and running:
            kv.free(running.pop(x % len(running)))
        for w in waiting:
            hit = kv.lookup(w)
            fresh = coord._find_longest_hit(w, w.num_tokens - 1)
            assert (hit.num_tokens, hit.block_ids, hit.shared_prefix_boundary) == \
                (fresh.num_tokens, fresh.block_ids, fresh.shared_prefix_boundary)
            assert hit.epoch == coord.epoch
            plan = coord.plan(w, w.num_tokens - hit.num_tokens, hit, 0, reserve_tokens=w.num_tokens)
            assert [gp.touched for gp in plan.groups] == \
                [coord._num_evictable(ids) for ids in hit.block_ids]
        if op == 3:                                      # admit one waiting request now
            w = waiting[x % len(waiting)]
            hit = kv.lookup(w)
            if kv.allocate(w, w.num_tokens - hit.num_tokens, hit) is not None:
                kv.free(w)
        kv.check_integrity()


@settings(max_examples=400, deadline=None)
@given(ATTENTION_SPECS, st.booleans(), st.sampled_from([0, 32, 64, 256]),
       st.lists(st.integers(0, 40), max_size=4), st.integers(0, 30), st.integers(0, 60))
def test_masked_runs_cover_the_masked_blocks(spec, proof, interval, ends, j, hi) -> None:
    rule = make_rule(spec, proof)
    interval = interval // rule.block_size * rule.block_size if interval else 0
    ret = Retention(interval, rule.block_size)
    ends = tuple(sorted(set(ends)))
    walked = []
    i = ret.next_masked_block(rule, j, ends)
    while i < hi:
        walked.append(i)
        i = ret.next_masked_block(rule, i + 1, ends)
    runs = []
    k = j
    while True:
        i, stop = ret.next_masked_run(rule, k, ends)
        if i >= hi:
            break
        assert stop > i
        runs.extend(range(i, min(stop, hi)))
        k = stop
    assert runs == walked


def test_append_tokens_with_a_bad_item_changes_nothing() -> None:
    r = Request("r", [1, 2, 3])
    for bad in ([4, "x"], [5, 2**70], [6, 1.5]):
        with pytest.raises(ValueError, match="request 'r'"):
            r.append_tokens(bad)
        assert list(r.token_ids) == [1, 2, 3]
    r.append_tokens([4, 5])
    assert list(r.token_ids) == [1, 2, 3, 4, 5]


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
