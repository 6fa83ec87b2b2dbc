"""Retention configs (``hybridkv.core.retention_config``: priority + TTL per token range) through
the manager and the ``priority`` eviction policy.

* random operation sequences with random retention configs and clock advances keep
  ``check_integrity`` green after every step, and every hit reads blocks holding the request's
  tokens and equals the oracle over the KV-event mirror (a hit never reads an evicted block);
* without retention configs the policy orders exactly like the LRU pool, block for block;
* a pinned system prompt survives a flood of one-off prompts until its TTL runs out, then goes
  in LRU order; a shared block keeps the highest live priority; tail before prefix;
* ``RetentionConfig`` / ``TokenRange`` refuse bad values naming the field and accept the edges;
  ``block_marks`` by hand; bad input gets a clear error naming the valid values and changes
  nothing.
The policy's own structure (levels, marks, rebuilds): ``eviction/test_priority.py``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      RetentionConfig, TokenRange)
from hybridkv.core.eviction import PriorityPolicy, key_group
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.retention_config import DEFAULT_PRIORITY, RetentionMark, block_marks
from hybridkv.core.rules import make_rule
from tests.hypothesis_budget import budgeted, examples, note
from tests.support.helpers import FA, config, prompt, raises
from tests.support.policies import Clock
from tests.support.random_ops import MAX_OPS, MIN_OPS, Model, configs, decode_ops
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def _random_retention(x: int, n_tokens: int) -> RetentionConfig | None:
    """A retention config drawn from the bits of ``x`` (None for about a third)."""
    if x % 3 == 0:
        return None
    ranges = []
    start = (x >> 2) % n_tokens
    while start < n_tokens and len(ranges) < 3:
        end = min(n_tokens, start + 1 + (x >> (3 + len(ranges))) % 9)
        ttl = None if (x >> (5 + len(ranges))) % 3 == 0 else float(1 + (x >> 7) % 5)
        ranges.append(TokenRange(start, end, (x >> (9 + 3 * len(ranges))) % 101, ttl))
        start = end + (x >> 11) % 4
    return RetentionConfig(tuple(ranges), decode_priority=(x >> 13) % 101,
                           decode_ttl_s=None if x % 2 else 2.5)


class RetentionModel(Model):
    """The property-test model whose requests carry random retention configs."""

    def make_request(self, rid, tokens, salt):
        seed = (hash(tuple(tokens)) ^ self.counter * 2654435761) & 0xFFFFFF
        return Request(rid, tokens, RequestCacheParams(
            cache_salt=salt, retention=_random_retention(seed, len(tokens))))


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg_args=configs(states=False), ops=st.binary(min_size=4 * MIN_OPS, max_size=4 * MAX_OPS).map(decode_ops))
@budgeted(0.05)
def test_random_operations_with_retention_keep_invariants(cfg_args, ops):
    cfg, retention, spec, _ = cfg_args
    clock = Clock()
    kv = KVCacheManager(cfg, CacheOptions(
        retention_interval=retention, spec_decode=spec, enable_events=True, eviction_policy="priority"),
        clock=clock)
    m = RetentionModel(kv, spec, False)
    for op, x in ops:
        clock.t += (x >> 20) % 4 * 0.75                    # 0..2.25 s: TTLs of 1..5 s lapse
        if op == 7:
            assert kv.reset_prefix_cache() == (not m.running)
        elif op <= 1 or not m.running:
            base = m.prompts[x % len(m.prompts)] if m.prompts and x % 3 else []
            keep = base[: (x // 7) % (len(base) + 1)]
            tokens = keep + [(x >> k) % 23 for k in range(1 + x % 13)]   # many distinct blocks
            m.admit(tokens, "s" if x % 11 == 0 else None, chunk=1 + x % 40)
        elif op <= 4:
            m.step(sorted(m.running)[x % len(m.running)], x % 5)
        else:
            m.finish(sorted(m.running)[x % len(m.running)])
        kv.check_integrity()
    note("priority evictions", kv.stats().evictions)
    pol = kv.pool.policy
    note("blocks with retention marks", len(getattr(pol, "inner", pol).marks))
    for rid in list(m.running):
        m.finish(rid)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg_args=configs(states=False), ops=st.binary(min_size=4 * MIN_OPS, max_size=4 * MAX_OPS).map(decode_ops))
@budgeted(0.05)
def test_without_retention_configs_the_order_is_lru(cfg_args, ops):
    """The same operations (prefix-cache resets included) on an LRU manager and a priority
    manager give the same block ids, hits and events at every step. On a hybrid config both
    run behind the hit-point layer: the LRU side is exact LRU behind it (a hinted manager
    whose requests carry no hints)."""
    cfg, retention, spec, _ = cfg_args
    hybrid = key_group([make_rule(g.spec) for g in cfg.groups]) is not None
    pair = [KVCacheManager(cfg, CacheOptions(
        retention_interval=retention, spec_decode=spec, enable_events=True, hash_seed="s",
        eviction_policy=p, hints=h), clock=Clock())
            for p, h in (("lru", hybrid), ("priority", False))]
    models = [Model(kv, spec, False) for kv in pair]
    for op, x in ops:
        for m in models:
            if op == 7:
                assert m.kv.reset_prefix_cache() == (not m.running)
            elif op <= 1 or not m.running:
                base = m.prompts[x % len(m.prompts)] if m.prompts and x % 3 else []
                tokens = base[: (x // 7) % (len(base) + 1)] + [(x >> k) % 5 for k in range(1 + x % 13)]
                m.admit(tokens, None, chunk=1 + x % 40)
            elif op <= 4:
                m.step(sorted(m.running)[x % len(m.running)], x % 5)
            else:
                m.finish(sorted(m.running)[x % len(m.running)])
        a, b = pair
        assert sorted(models[0].running) == sorted(models[1].running)
        for rid, req in models[0].running.items():
            assert a.block_ids(req) == b.block_ids(models[1].running[rid])
        events = [m.events for m in models]     # the models feed their mirrors as they go
        assert events[0] == events[1]
        for m in models:
            m.events = []
        assert a.pool.ref_cnt == b.pool.ref_cnt and a.pool.block_hash == b.pool.block_hash
        assert a.stats() == b.stats()
    note("evictions compared with LRU", pair[0].stats().evictions)


def _cfg(num_blocks: int, block_size: int = 4) -> KVCacheConfig:
    spec = FullAttention(block_size=block_size, num_kv_heads=1, head_dim=4)
    return KVCacheConfig((KVCacheGroup("g", spec, ("l",)),), num_blocks=num_blocks)


def _serve(kv: KVCacheManager, rid: str, tokens: list[int], retention=None, decode: int = 0) -> int:
    """Prefill one request (then ``decode`` tokens), free it; the hit length in tokens."""
    req = Request(rid, tokens, RequestCacheParams(retention=retention))
    hit = kv.lookup(req)
    assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
    req.num_computed_tokens = req.num_tokens
    for k in range(decode):
        req.append_tokens([7000 + k])
        assert kv.allocate(req, 1) is not None
        req.num_computed_tokens += 1
    kv.free(req)
    kv.check_integrity()
    return hit.num_tokens


SYSTEM = list(range(100, 116))                           # 4 full blocks of 4 tokens


def _flood(kv: KVCacheManager, tag: str, n: int = 12) -> None:
    for i in range(n):                                   # 12 x 3 blocks > the 23-block pool
        _serve(kv, f"{tag}{i}", [10_000 * (1 + len(tag)) + 20 * i + k for k in range(13)])


def test_pinned_system_prompt_survives_a_flood_until_its_ttl():
    clock = Clock()
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy="priority"), clock=clock)
    pin = RetentionConfig((TokenRange(0, 16, 100, ttl_s=600.0),))
    _serve(kv, "a", SYSTEM + [1], pin)
    for minute in range(1, 10):                          # used without a config: marks stay
        clock.t = 60.0 * minute
        _flood(kv, f"f{minute}-")
        assert _serve(kv, f"u{minute}", SYSTEM + [2]) == 16
    lru = KVCacheManager(_cfg(24))                       # the same traffic under LRU loses it
    _serve(lru, "a", SYSTEM + [1])
    _flood(lru, "f")
    assert _serve(lru, "u", SYSTEM + [2]) == 0
    clock.t = 600.0 + 1e-9                               # the last pinning release was at t=0
    _flood(kv, "late")
    assert _serve(kv, "gone", SYSTEM + [3]) == 0


def test_the_ttl_restarts_at_each_release_by_a_pinning_request():
    clock = Clock()
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy="priority"), clock=clock)
    pin = RetentionConfig((TokenRange(0, 16, 100, ttl_s=10.0),))
    _serve(kv, "a", SYSTEM + [1], pin)
    clock.t = 8.0
    assert _serve(kv, "b", SYSTEM + [2], pin) == 16       # pinned again until t = 18
    clock.t = 15.0
    _flood(kv, "f")
    assert _serve(kv, "c", SYSTEM + [3]) == 16
    clock.t = 18.5
    _flood(kv, "g")
    assert _serve(kv, "d", SYSTEM + [4]) == 0


def test_after_expiry_blocks_go_in_lru_order_by_their_free_time():
    """An expired block keeps its place in LRU order (its free time), not its expiry time:
    with default blocks freed before and after it, it goes between them."""
    clock = Clock()
    pool = PolicyBlockPool(8, 1, PriorityPolicy(clock))
    got = pool.allocate(7)
    for i, b in enumerate(got):
        pool.insert(0, bytes([i]), b)
    mark = (RetentionMark(3, 90, 5.0),)
    pool.free([got[0], got[1]])                          # default, freed first
    pool.retain(got, [2], mark)
    pool.free([got[2]])                                  # pinned 5 s
    pool.free(got[3:])                                   # default, freed later
    pool.check()
    assert pool.allocate(1) == [got[0]]
    assert pool.allocate(1) == [got[1]]
    assert pool.allocate(1) == [got[3]]                # got[2] still pinned
    clock.t = 5.0
    assert pool.allocate(4) == [got[2], got[4], got[5], got[6]]
    pool.check()


def test_lower_priority_goes_first_and_equal_priorities_in_lru_order():
    clock = Clock()
    pool = PolicyBlockPool(10, 1, PriorityPolicy(clock))
    got = pool.allocate(9)
    for i, b in enumerate(got):
        pool.insert(0, bytes([i]), b)
    prios = [50, 10, 90, 10, 35, 50, 0, 90, 35]
    for j, (b, p) in enumerate(zip(got, prios)):
        if p != DEFAULT_PRIORITY:
            pool.retain(got, [j], (RetentionMark(len(got), p, None),))
    pool.free(got)
    want = sorted(range(9), key=lambda j: (prios[j], j))
    assert pool.allocate(9) == [got[j] for j in want]
    pool.check()


def test_a_shared_block_keeps_the_highest_live_priority():
    clock = Clock()
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy="priority"), clock=clock)
    high = RetentionConfig((TokenRange(0, 16, 90, ttl_s=30.0),))
    low = RetentionConfig((TokenRange(0, 16, 60, ttl_s=300.0),))
    a = Request("a", SYSTEM + [1], RequestCacheParams(retention=high))
    b = Request("b", SYSTEM + [2], RequestCacheParams(retention=low))
    for req in (a, b):
        hit = kv.lookup(req)
        assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
    kv.free(a)
    kv.free(b)
    policy = kv.pool.policy
    block = kv.lookup(Request("q", SYSTEM + [3])).block_ids[0][0]
    assert policy.level(block, 0.0) == (90, 30.0)
    assert policy.level(block, 31.0) == (60, 300.0)       # the 90 lapsed: the next live mark
    assert policy.level(block, 301.0) == (DEFAULT_PRIORITY, math.inf)


def test_a_later_range_keeps_its_whole_prefix():
    """Tail before prefix: a high priority on tokens 8..16 also holds blocks 0..1 (the later
    blocks are useless without them), and a low priority before a default tail is lifted."""
    marks = block_marks(RetentionConfig((TokenRange(0, 8, 0), TokenRange(8, 16, 90))), 4, 20, 20)
    assert sorted(marks) == [RetentionMark(2, 0, None), RetentionMark(4, 90, None),
                             RetentionMark(5, DEFAULT_PRIORITY, None)]
    def run(policy: str, retention) -> int:
        kv = KVCacheManager(_cfg(14), CacheOptions(eviction_policy=policy), clock=Clock())
        _serve(kv, "a", list(range(33)), retention)       # 8 cached blocks + 1 scratch
        _serve(kv, "x", [900 + k for k in range(5)])       # 1 cached default block, newer
        _serve(kv, "b", [500 + k for k in range(21)])      # 6 blocks: 4 uncached + 2 evictions
        return _serve(kv, "c", list(range(33)))
    assert run("lru", None) == 24                          # a's tail (blocks 7, 6) went
    # priority: x's block, then a's tail block 7; blocks 0..4 (before the range) are lifted to
    # 90 with it (at the default they would have gone first and c would hit 16)
    assert run("priority", RetentionConfig((TokenRange(20, 32, 90),))) == 28
    clock = Clock()
    kv2 = KVCacheManager(_cfg(10), CacheOptions(eviction_policy="priority"), clock=clock)
    _serve(kv2, "a", list(range(33)), RetentionConfig((TokenRange(0, 12, 5),), decode_priority=5))
    _serve(kv2, "b", [500 + k for k in range(9)])
    assert _serve(kv2, "c", list(range(33))) == 24        # tail first, as LRU


def test_decode_priority_marks_generated_blocks():
    marks = block_marks(RetentionConfig((TokenRange(0, None, 80),), decode_priority=3,
                                        decode_ttl_s=2.0), 4, 10, 17)
    assert sorted(marks) == [RetentionMark(3, 80, None), RetentionMark(5, 3, 2.0)]
    clock = Clock()
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy="priority"), clock=clock)
    _serve(kv, "a", SYSTEM, RetentionConfig(decode_priority=100), decode=9)
    assert all(p == 100 for b, lst in kv.pool.policy.marks.items() for p, _ in lst[:1])


@pytest.mark.parametrize("make, match", [
    (lambda: TokenRange(0, 4, 101), r"priority must be an integer in \[0, 100\].*got 101"),
    (lambda: TokenRange(0, 4, -1), r"priority must be an integer in \[0, 100\]"),
    (lambda: TokenRange(0, 4, 50.5), r"priority must be an integer"),
    (lambda: TokenRange(0, 4, 50, 0), r"ttl_s must be None .* > 0, got 0"),
    (lambda: TokenRange(0, 4, 50, -3.0), r"ttl_s must be None .* > 0"),
    (lambda: TokenRange(0, 4, 50, math.inf), r"ttl_s must be None .*finite"),
    (lambda: TokenRange(4, 4, 50), r"end must be None .* > start \(4\), got 4"),
    (lambda: TokenRange(5, 2, 50), r"end must be None .* > start \(5\), got 2"),
    (lambda: TokenRange(-1, 2, 50), r"start must be a non-negative integer, got -1"),
    (lambda: RetentionConfig((TokenRange(0, 8, 50), TokenRange(4, 12, 60))), r"must not overlap"),
    (lambda: RetentionConfig(((0, 4, 50),)), r"must hold TokenRange"),
    (lambda: RetentionConfig(decode_priority=200), r"decode_priority must be an integer in \[0, 100\]"),
    (lambda: RetentionConfig(decode_ttl_s=0.0), r"decode_ttl_s must be None"),
    (lambda: Request("r", [1, 2, 3], RequestCacheParams(retention=RetentionConfig((TokenRange(0, 4, 50),)))),
     r"retention range \[0, 4\) lies outside the prompt \[0, 3\); valid ranges: 0 <= start < end <= 3"),
    (lambda: Request("r", [1, 2, 3], RequestCacheParams(
        retention=RetentionConfig((TokenRange(3, None, 50),)))),
     r"retention range \[3, None\) lies outside the prompt"),
    (lambda: Request("r", [1, 2, 3], RequestCacheParams(retention="pin")), r"retention must be a RetentionConfig or None"),
    (lambda: KVCacheManager(_cfg(8), CacheOptions(eviction_policy="priority"), clock=5), r"clock must be None or a callable"),
    (lambda: KVCacheManager(_cfg(8), CacheOptions(eviction_policy="pin")), r"unknown eviction policy 'pin'; valid: .*priority"),
])
def test_bad_retention_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _state(kv: KVCacheManager):
    pool = kv.pool
    return (kv.stats(), kv.num_free_blocks, list(pool.ref_cnt), list(pool.block_hash),
            list(pool.queue), sorted(getattr(pool, "policy", ())))


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "lfu", "cost"])
def test_a_policy_that_ignores_retention_refuses_it_and_changes_nothing(policy):
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy=policy, enable_events=True))
    _serve(kv, "a", SYSTEM + [1])
    running = Request("run", SYSTEM + [9, 9, 9])
    hit = kv.lookup(running)
    kv.allocate(running, running.num_tokens - hit.num_tokens, hit)
    kv.take_events()
    before = _state(kv)
    req = Request("b", SYSTEM + [2], RequestCacheParams(
        retention=RetentionConfig((TokenRange(0, 16, 90, 60.0),))))
    hit = kv.lookup(req)
    with pytest.raises(ValueError, match=rf"eviction_policy='{policy}' ignores.*eviction_policy='priority'"):
        kv.allocate(req, req.num_tokens - hit.num_tokens, hit)
    assert _state(kv) == before and kv.take_events() == []
    kv.check_integrity()


def test_a_range_made_invalid_after_construction_is_refused_at_allocate():
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy="priority", enable_events=True), clock=Clock())
    _serve(kv, "a", SYSTEM + [1])
    kv.take_events()
    before = _state(kv)
    req = Request("b", [1, 2, 3])
    req.retention = RetentionConfig((TokenRange(0, 9, 50),))
    with pytest.raises(ValueError, match=r"lies outside the prompt \[0, 3\)"):
        kv.allocate(req, 3)
    assert _state(kv) == before and kv.take_events() == []


@pytest.mark.parametrize("policy, t, want", [("priority", 599.0, 16), ("priority", 600.0, 8),
                                             ("lru", 0.0, 8)])
def test_after_its_ttl_the_system_prompt_goes_first_tail_first(policy, t, want):
    """Pinned at t=0 for 600 s, then a flood of newer one-off prompts: a request that needs two
    evictions takes two flood blocks while the pin holds (t=599), and the prompt's two tail
    blocks once it lapsed (t=600): they are the least recently used, and tail before prefix."""
    clock = Clock()
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy=policy), clock=clock)
    pin = RetentionConfig((TokenRange(0, 16, 100, ttl_s=600.0),)) if policy == "priority" else None
    _serve(kv, "a", SYSTEM + [1], pin)
    _flood(kv, "f", 5)                                   # 15 cached blocks, newer than the prompt
    clock.t = t
    pool = kv.pool
    uncached = pool.num_blocks - pool.next_fresh + sum(
        1 for b in range(1, pool.next_fresh) if pool.ref_cnt[b] == 0 and pool.block_hash[b] is None)
    k = uncached + 2                                     # every scratch/fresh block, then 2 evictions
    _serve(kv, "big", [90_000 + i for i in range(4 * k - 2)])
    assert _serve(kv, "probe", SYSTEM + [3]) == want


@pytest.mark.parametrize("policy", ["priority", "s3fifo", "lfu", "cost"])
def test_a_prefix_cache_reset_empties_the_policy(policy):
    """After a reset no block has a hash, so the policy holds none (pinned junk would otherwise
    outrank every block cached later); the blocks sit where LRU keeps them, and serving goes on."""
    kv = KVCacheManager(_cfg(24), CacheOptions(eviction_policy=policy), clock=Clock())
    pin = RetentionConfig((TokenRange(0, 16, 100),)) if policy == "priority" else None
    _serve(kv, "a", SYSTEM + [1], pin)
    assert len(kv.pool.policy) == 4
    assert kv.reset_prefix_cache()
    kv.check_integrity()
    assert len(kv.pool.policy) == 0 and not getattr(kv.pool.policy, "marks", None)
    assert kv.num_free_blocks == 23
    _flood(kv, "f")
    assert _serve(kv, "b", SYSTEM + [2]) == 0


BAD_RETENTION = [
    (lambda: TokenRange(-1, 4, 50), r"\bTokenRange start\b must be a non-negative integer, got -1$"),
    (lambda: TokenRange(True, 4, 50), r"\bTokenRange start\b.*got True$"),
    (lambda: TokenRange(5, 5, 50),
     r"\bTokenRange end\b must be None \(end of the prompt\) or an integer > start \(5\), got 5$"),
    (lambda: TokenRange(0, True, 50), r"\bTokenRange end\b.*> start \(0\), got True$"),
    (lambda: TokenRange(0, 4, 101),
     r"\bTokenRange priority\b must be an integer in \[0, 100\] \(default 35\), got 101$"),
    (lambda: TokenRange(0, 4, -1), r"\bTokenRange priority\b.*\[0, 100\].*got -1$"),
    (lambda: TokenRange(0, 4, True), r"\bTokenRange priority\b.*got True$"),
    (lambda: TokenRange(0, 4, 50.0), r"\bTokenRange priority\b.*got 50\.0$"),
    (lambda: TokenRange(0, 4, 50, 0),
     r"\bTokenRange ttl_s\b must be None \(no expiry\) or a finite number of seconds > 0, got 0$"),
    (lambda: TokenRange(0, 4, 50, math.inf), r"\bTokenRange ttl_s\b.*> 0, got inf$"),
    (lambda: TokenRange(0, 4, 50, True), r"\bTokenRange ttl_s\b.*got True$"),
    (lambda: TokenRange(0, 4, 50, "5"), r"\bTokenRange ttl_s\b.*got '5'$"),
    (lambda: RetentionConfig(TokenRange(0, 4, 50)),
     r"\bRetentionConfig ranges\b must be a sequence of \bTokenRange\b, got TokenRange\("),
    (lambda: RetentionConfig([TokenRange(0, 4, 50), "x"]),
     r"\bRetentionConfig ranges\b must hold \bTokenRange\b, got 'x'$"),
    (lambda: RetentionConfig((TokenRange(0, 10, 50), TokenRange(5, 15, 60))),
     r"\bRetentionConfig ranges\b must not overlap: TokenRange\(start=0, end=10.* and "
     r"TokenRange\(start=5, end=15"),
    (lambda: RetentionConfig((TokenRange(20, 30, 60), TokenRange(0, None, 50))),
     r"must not overlap: TokenRange\(start=0, end=None.* and TokenRange\(start=20"),
    (lambda: RetentionConfig(decode_priority=101),
     r"\bRetentionConfig decode_priority\b must be an integer in \[0, 100\].*got 101$"),
    (lambda: RetentionConfig(decode_ttl_s=-2.5),
     r"\bRetentionConfig decode_ttl_s\b must be None \(no expiry\).*> 0, got -2\.5$"),
]


@pytest.mark.parametrize("build,match", BAD_RETENTION)
def test_bad_retention_config_is_refused_naming_the_field(build, match) -> None:
    """_check_priority, _check_ttl, TokenRange.__post_init__ and RetentionConfig.__post_init__:
    each bound and type check, the owner and field in the message, and the overlap check's
    pairs."""
    with raises(match):
        build()


def test_retention_config_edges_are_accepted() -> None:
    """_check_priority (priorities 0 and 100); _check_ttl (a TTL below 1 s); TokenRange (start
    0, end None); RetentionConfig: a tuple or a list of ranges (stored as a tuple), ranges given
    out of order and ranges that touch (end = next start) are not overlapping."""
    r = TokenRange(0, None, 0, 0.5)
    assert (r.start, r.end, r.priority, r.ttl_s) == (0, None, 0, 0.5)
    assert TokenRange(3, 4, 100, 7).priority == 100
    a, b, c = TokenRange(10, 20, 100), TokenRange(0, 5, 60), TokenRange(5, 10, 70)
    cfg = RetentionConfig([a, b, c], decode_priority=0, decode_ttl_s=1)
    assert cfg.ranges == (a, b, c) and type(cfg.ranges) is tuple
    assert RetentionConfig((a,)).ranges == (a,)
    assert RetentionConfig().ranges == () and RetentionConfig().decode_priority == DEFAULT_PRIORITY


def test_retention_ranges_must_lie_inside_the_prompt() -> None:
    """RetentionConfig.check_prompt: a range must satisfy 0 <= start < end <= prompt length (end
    None: the prompt's end, so only start < length); the message names the range, the prompt and
    the valid ranges."""
    RetentionConfig((TokenRange(0, 10, 50),)).check_prompt(10, "r")
    RetentionConfig((TokenRange(9, None, 50),)).check_prompt(10, "r")
    for rng, shown in ((TokenRange(5, 11, 50), r"\[5, 11\)"), (TokenRange(10, None, 50), r"\[10, None\)"),
                       (TokenRange(12, 14, 50), r"\[12, 14\)")):
        with raises(rf"^request 'q': retention range {shown} lies outside the prompt \[0, 10\); "
                    rf"valid ranges: 0 <= start < end <= 10$"):
            RetentionConfig((rng,)).check_prompt(10, "request 'q'")


def test_block_marks_by_hand() -> None:
    """block_marks: one mark per range (blocks up to the range's end, rounded up), one for the
    uncovered prompt (default priority, up to the last uncovered token), one for the generated
    tokens; equal (priority, TTL) marks merged, the longest winning (block_marks: the last
    added, shorter one won).

    Block size 4, prompt 20, 30 tokens. Ranges [2, 6) p 80 ttl 5 and [12, None) p 60:
    [2, 6) → ceil(6/4) = 2 blocks; [12, 20) → 5 blocks; uncovered [0, 2) and [6, 12): the last
    gap ends at 12 → 3 blocks at 35; decode (60, None) → ceil(30/4) = 8 blocks, merged with the
    range's (60, None) mark of 5 → 8."""
    cfg = RetentionConfig((TokenRange(12, None, 60), TokenRange(2, 6, 80, 5)), decode_priority=60)
    got = set(block_marks(cfg, 4, 20, 30))
    assert got == {RetentionMark(2, 80, 5), RetentionMark(8, 60, None),
                   RetentionMark(3, DEFAULT_PRIORITY, None)}
    # a fully covered prompt has no default mark; no decode mark without generated tokens
    full = RetentionConfig((TokenRange(0, None, 90, 2),), decode_priority=10, decode_ttl_s=3)
    assert set(block_marks(full, 4, 10, 10)) == {RetentionMark(3, 90, 2)}
    assert set(block_marks(full, 4, 10, 11)) == {RetentionMark(3, 90, 2), RetentionMark(3, 10, 3)}
    # a range starting at the prompt's end gives no mark; the uncovered prompt reaches its end
    late = RetentionConfig((TokenRange(6, 12, 90),))
    assert set(block_marks(late, 4, 6, 6)) == {RetentionMark(2, DEFAULT_PRIORITY, None)}
    # a mark of one block; a gap of one token before the first range
    short = RetentionConfig((TokenRange(0, 2, 70),))
    assert set(block_marks(short, 4, 8, 8)) == {RetentionMark(1, 70, None),
                                                 RetentionMark(2, DEFAULT_PRIORITY, None)}
    gap1 = RetentionConfig((TokenRange(1, None, 70),))
    assert set(block_marks(gap1, 4, 8, 8)) == {RetentionMark(2, 70, None),
                                                RetentionMark(1, DEFAULT_PRIORITY, None)}
    # a range at the default priority merges with the default mark; the longer one wins
    same = RetentionConfig((TokenRange(4, 12, DEFAULT_PRIORITY),))
    assert block_marks(same, 4, 12, 12) == (RetentionMark(3, DEFAULT_PRIORITY, None),)
    # touching ranges cover the prompt: no default mark
    touch = RetentionConfig((TokenRange(0, 4, 70), TokenRange(4, None, 80)))
    assert set(block_marks(touch, 4, 8, 8)) == {RetentionMark(1, 70, None), RetentionMark(2, 80, None)}


def test_retention_errors_name_the_request_and_the_fix() -> None:
    """_check_retention — the messages (the policy advice, the type error, the request label of
    a range outside the prompt) changed or dropped."""
    pin = RetentionConfig((TokenRange(0, 8, 100, ttl_s=60.0),))
    lru = KVCacheManager(config(FA(4), num_blocks=16))
    with pytest.raises(ValueError, match=r"use eviction_policy='priority' \(the only policy that "
                       r"reads retention configs\) or drop the config$"):
        lru.allocate(Request("a", prompt(0, 9), RequestCacheParams(retention=pin)), 9)
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(eviction_policy="priority"))
    bad = Request("b", prompt(0, 9))
    bad.retention = "pin"
    with pytest.raises(ValueError, match=r"request 'b': retention must be a RetentionConfig or "
                       r"None, got 'pin'"):
        kv.allocate(bad, 9)
    late = Request("c", prompt(0, 9))    # the constructor checks too: attach it afterwards
    late.retention = RetentionConfig((TokenRange(0, 20, 100, ttl_s=60.0),))
    with pytest.raises(ValueError, match=r"^request 'c': retention range \[0, 20\) lies outside"):
        kv.allocate(late, 9)
