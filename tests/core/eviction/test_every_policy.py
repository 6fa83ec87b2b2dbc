"""Eviction policies (hybridkv.core.eviction) driven through the manager.

* every policy keeps ``check_integrity`` green after every step of random operation sequences,
  and every hit reads blocks that hold the request's tokens (shadow record) and equals the
  oracle over the KV-event mirror (so a hit never reads a block the policy evicted: its
  ``BlockRemoved`` took the key out of the mirror);
* LRU builds the untouched :class:`BlockPool` (the seam costs it nothing);
* each policy's own promise on small hand-made sequences; bad names get a clear error.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request, SlidingWindow
from hybridkv.core.eviction import (EVICTION_POLICIES, POLICIES, RECOMMENDED, EvictionPolicy, make_policy,
                                    policy_names, resolve_policy)
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import BlockPool
from tests.support.random_ops import MAX_OPS, MIN_OPS, Model, configs, decode_ops
from tests.support.helpers import serve_chain
from tests.hypothesis_budget import budgeted, examples, note
from tests.support.policies import NON_LRU, eviction_order, policy_config, serve_contents, serve_prompt
from tests.support.helpers import content_key


def _run(cfg_args, ops, policy: str) -> None:
    cfg, retention, spec, _ = cfg_args
    kv = KVCacheManager(cfg, retention_interval=retention, spec_decode=spec, enable_events=True,
                        eviction_policy=policy)
    m = Model(kv, spec, False)
    for op, x in ops:
        if op == 7:
            assert kv.reset_prefix_cache() == (not m.running)
        elif op <= 1 or not m.running:
            base = m.prompts[x % len(m.prompts)] if m.prompts and x % 3 else []
            keep = base[: (x // 7) % (len(base) + 1)]
            tokens = keep + [(x >> k) % 5 for k in range(1 + x % 13)]
            m.admit(tokens, "s" if x % 11 == 0 else None, chunk=1 + x % 40)
        elif op <= 4:
            m.step(sorted(m.running)[x % len(m.running)], x % 5)
        else:
            m.finish(sorted(m.running)[x % len(m.running)])
        kv.check_integrity()
    note("evictions", kv.stats().evictions)
    for rid in list(m.running):
        m.finish(rid)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1


@pytest.mark.parametrize("policy", NON_LRU)
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg_args=configs(states=False), ops=st.binary(min_size=4 * MIN_OPS, max_size=4 * MAX_OPS).map(decode_ops))
@budgeted(0.15)
def test_random_operations_keep_invariants(policy, cfg_args, ops):
    _run(cfg_args, ops, policy)


def test_lru_keeps_the_plain_pool():
    assert type(KVCacheManager(policy_config(8)).pool) is BlockPool
    assert type(KVCacheManager(policy_config(8), eviction_policy="lru").pool) is BlockPool
    for p in NON_LRU:
        assert type(KVCacheManager(policy_config(8), eviction_policy=p).pool) is PolicyBlockPool


def test_bad_policy_names():
    for bad in ("LRU", "", "fifo", None, 3):
        with pytest.raises(ValueError, match="unknown eviction policy.*valid: lru, s3fifo"):
            KVCacheManager(policy_config(8), eviction_policy=bad)
    with pytest.raises(ValueError, match="vllm_compat.*must be 'lru'"):
        KVCacheManager(policy_config(8), eviction_policy="s3fifo", vllm_compat=True)
    assert resolve_policy("recommended") == RECOMMENDED
    assert make_policy("lru") is None


class _ToyMRU(EvictionPolicy):
    """A toy policy for the registry test: evict the block freed last first (MRU)."""

    name = "toy-mru"
    __slots__ = ("held", "made_with")

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[int, None] = {}           # in free order
        self.made_with: tuple = ()

    @classmethod
    def create(cls, rules, clock):
        pol = cls()
        pol.made_with = (rules, clock)
        return pol

    def __len__(self) -> int:
        return len(self.held)

    def __contains__(self, b: int) -> bool:
        return b in self.held

    def __iter__(self):
        return iter(self.held)

    def on_free(self, blocks) -> None:
        self.held.update(dict.fromkeys(blocks))

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            del self.held[b]

    def pop(self, n: int) -> list[int]:
        return [self.held.popitem()[0] for _ in range(n)]

    def forget(self, blocks) -> None:
        pass


def test_a_new_policy_is_one_class_and_one_registration_line(monkeypatch):
    """Registering a toy policy makes its name valid everywhere a name is checked (the error
    lists it, compat mode refuses it) and the manager runs it through the one factory
    signature, ``create(rules, clock)``: victims in the toy's order (MRU keeps the request
    served first, LRU the one served last), integrity green. Guards against a name list or an
    if-chain beside the registry that a new policy would also have to be added to."""
    monkeypatch.setattr(EVICTION_POLICIES, "_table", dict(EVICTION_POLICIES._table))
    EVICTION_POLICIES.register("toy-mru")(_ToyMRU)
    assert resolve_policy("toy-mru") == "toy-mru" and "toy-mru" in policy_names()
    with pytest.raises(ValueError, match=r"^unknown eviction policy 'toy'; valid: lru, .*, toy-mru, recommended$"):
        resolve_policy("toy")
    with pytest.raises(ValueError, match="vllm_compat pins vLLM's LRU order; eviction_policy must be 'lru', "
                                         "got 'toy-mru'"):
        KVCacheManager(policy_config(9), eviction_policy="toy-mru", vllm_compat=True)

    def run(policy: str) -> tuple[int, int]:
        clock = lambda: 0.0                                   # noqa: E731
        kv = KVCacheManager(policy_config(9), eviction_policy=policy, clock=clock)
        if policy == "toy-mru":
            assert type(kv.pool) is PolicyBlockPool and type(kv.pool.policy) is _ToyMRU
            rules, got_clock = kv.pool.policy.made_with
            assert len(rules) == 1 and rules[0].block_size == 4 and got_clock is clock
        a, b = list(range(9)), list(range(100, 109))          # 2 cached blocks each
        serve_prompt(kv, "a", a)
        serve_prompt(kv, "b", b)
        serve_prompt(kv, "c", list(range(200, 221)))               # 6 blocks: evicts 2 cached ones
        kv.check_integrity()
        return kv.lookup(Request("a2", a)).num_tokens, kv.lookup(Request("b2", b)).num_tokens

    assert run("lru") == (0, 8)
    assert run("toy-mru") == (8, 0)


def test_every_registered_policy_carries_its_registered_name():
    """A policy's ``name`` (in its messages) is the key it is registered under."""
    assert len(EVICTION_POLICIES) == len(POLICIES) - 2
    for key, cls in EVICTION_POLICIES.items():
        assert cls.name == key and type(make_policy(key)) is cls


@pytest.mark.parametrize("policy", ["s3fifo", "lfu", "cost"])
def test_hot_prefix_survives_a_scan(policy):
    """A prefix hit twice survives a stream of one-off prompts larger than the cache, which
    flushes it under LRU (the scan-resistance every non-LRU policy here promises)."""
    def run(p: str) -> int:
        kv = KVCacheManager(policy_config(24), eviction_policy=p)
        hot = list(range(100, 117))                         # 4 full blocks + 1 token
        serve_prompt(kv, "h0", hot)
        assert serve_prompt(kv, "h1", hot) == 16
        assert serve_prompt(kv, "h2", hot) == 16
        for i in range(12):                                  # 12 x 3 blocks > 23 blocks
            serve_prompt(kv, f"s{i}", [1000 + 20 * i + k for k in range(13)])
        return serve_prompt(kv, "h3", hot)
    assert run("lru") == 0
    assert run(policy) == 16


def test_tail_goes_before_prefix():
    """One request's chain, freed tail first: every policy evicts its tail before its prefix,
    so a shorter cache still serves the longest prefix it can."""
    for p in POLICIES:
        kv = KVCacheManager(policy_config(10), eviction_policy=p)
        serve_prompt(kv, "a", list(range(33)))        # 9 blocks: 8 cached + 1 partial scratch
        serve_prompt(kv, "b", [500 + k for k in range(9)])        # 3 blocks: scratch + 2 evicted
        assert serve_prompt(kv, "c", list(range(33))) == 24, p    # blocks 0..5 left: 24 tokens


def test_cost_policy_keeps_full_attention_over_sliding_window():
    full = FullAttention(block_size=512, num_kv_heads=1, head_dim=4)
    swa = SlidingWindow(block_size=512, num_kv_heads=1, head_dim=4, window=512)
    kv = KVCacheManager(policy_config(8, full, swa), eviction_policy="cost")
    w = kv.pool.policy.weights
    assert w[0] == 1.0 and 0 < w[1] < w[0]


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


# ---- eva: learned hit density by age ----------------------------------------------------------


def test_eva_without_statistics_is_lru_by_batch():
    """Before it has learned anything every value is 0, and ties go oldest bucket first: with
    one bucket per freed block that is exactly LRU, each batch tail first."""
    from hybridkv.core.eviction.eva import EVAPolicy
    evicted: list[bytes] = []
    pool = PolicyBlockPool(16, 1, EVAPolicy(ages=64, width=1, min_events=10**9),
                           on_evict=lambda g, h: evicted.append(h))
    chains = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    for chain in chains:
        blocks = pool.allocate(len(chain))
        for b, t in zip(blocks, chain):
            pool.insert(0, content_key(t), b)
        pool.free(blocks[::-1])                      # tail first, as the coordinator frees
    hit = pool.cached_block(0, content_key(3))              # a hit makes block 3 the newest
    pool.touch([hit])
    pool.free([hit])
    assert eviction_order(pool, evicted) == [2, 1, 0, 4, 8, 7, 6, 5, 3]


def test_eva_learns_a_dead_time():
    """Every block is read again about 7 buckets after it was first freed, never earlier and
    never a second time. The policy learns both: blocks already reused once (class 1, never
    reused again) go first, oldest first; the blocks still waiting for their reuse go last,
    youngest first (the furthest from their reuse) — the opposite of LRU."""
    from hybridkv.core.eviction.eva import EVAPolicy
    evicted: list[bytes] = []
    pol = EVAPolicy(ages=16, width=1, min_events=4)
    pool = PolicyBlockPool(200, 1, pol, on_evict=lambda g, h: evicted.append(h))
    for t in range(60):
        b, = pool.allocate(1)
        pool.insert(0, content_key(t), b)
        pool.free([b])
        if t >= 3:                                   # content t-3 comes back now
            c = pool.cached_block(0, content_key(t - 3))
            pool.touch([c])
            pool.free([c])
        pool.check()
    state = {int.from_bytes(pool.block_hash[b], "little"): (k[0], pol._age(k[1]))
             for b, k in pol.where.items()}
    waiting = sorted((t for t, (c, _) in state.items() if c == 0), key=lambda t: state[t][1])
    assert waiting == [59, 58, 57] and [state[t][1] for t in waiting] == [2, 4, 6]
    order = eviction_order(pool, evicted)
    assert order[-3:] == waiting                     # youngest first, the one due next last
    done = order[:-3]
    assert all(state[t][0] == 1 for t in done)
    assert [state[t][1] for t in done] == sorted((state[t][1] for t in done), reverse=True)


def test_eva_turns_classes_count_turns():
    """A conversation that comes back k times is freed in class k (capped at 4); a block reused
    SHARED_REUSES times or more (a system prompt) does not count. ``eva`` classes a first turn
    by the system prompt (8+ reuses: its last class) and every returning conversation as 1 (its
    deepest reused block was read once)."""
    from hybridkv.core.eviction.eva import EVAPolicy
    from hybridkv.core.eviction.turns import SHARED_REUSES, TurnEVAPolicy
    classes: dict[str, list[int]] = {}
    for policy in (TurnEVAPolicy(ages=64, width=1000), EVAPolicy(ages=64, width=1000)):
        pool = PolicyBlockPool(64, 1, policy)
        system = pool.allocate(1)
        pool.insert(0, content_key(0), system[0])
        pool.free(system)
        for _ in range(SHARED_REUSES):               # the system prompt: shared content
            pool.touch(system)
            pool.free(system)
        chain, seen = list(system), []
        for turn in range(6):                        # each turn re-reads the whole chain
            pool.touch(chain)
            new = pool.allocate(2)
            for b in new:
                pool.insert(0, content_key(100 * turn + b + 1), b)
            chain = chain + new
            pool.free(chain[::-1])
            seen.append(policy.where[chain[-1]][0])
            pool.check()
        classes[policy.name] = seen
    assert classes == {"eva-turns": [0, 1, 2, 3, 4, 4], "eva": [4, 1, 1, 1, 1, 1]}


def test_eva_bad_arguments():
    from hybridkv.core.eviction.eva import EVAPolicy
    for kw in ({"ages": 1}, {"ages": 2.5}, {"width": 0}, {"min_events": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            EVAPolicy(**kw)


@pytest.mark.parametrize("policy", NON_LRU)
def test_seeded_operation_mix(policy):
    """The sweep's cost benchmark mix (allocate, free tail first, hits), checked every step: a
    queue emptied by hits and refilled later must stay reachable (an eva regression)."""
    from hybridkv.sim.policy_cost import pool_op_mix
    pool = PolicyBlockPool(300, 1, make_policy(policy))
    held = pool_op_mix(pool, 3000, seed=1, after_step=lambda p: p.check())
    for run in held:
        pool.free(run)
    pool.check()
    assert pool.num_free == 299


# ---- arc and adaptive: chains that come back ------------------------------------------------


def _conversation_vs_flood(pool: BlockPool) -> int:
    """A shared root hit by 8 first turns, a conversation that comes back once, then a flood of
    first turns larger than the cache; returns the conversation's hits on its third turn."""
    for i in range(8):
        serve_contents(pool, [0, 1000 + i])
    serve_contents(pool, [0, 1, 2])
    assert serve_contents(pool, [0, 1, 2, 3]) == 3
    for i in range(40):
        serve_contents(pool, [0, 2000 + 2 * i, 2001 + 2 * i])
    return serve_contents(pool, [0, 1, 2, 3, 4])


def test_arc_keeps_a_returning_conversation_through_a_flood():
    """LRU loses the conversation to 40 one-off first turns (80 blocks > 30); chain ARC files
    the returning chain in t2 and the one-off tails in t1, which alone are evicted."""
    from hybridkv.core.eviction.arc import ChainARCPolicy
    assert _conversation_vs_flood(BlockPool(31, 1)) == 1          # only the shared root survives
    pol = ChainARCPolicy()
    pool = PolicyBlockPool(31, 1, pol)
    assert _conversation_vs_flood(pool) == 4
    t2 = {int.from_bytes(pool.block_hash[b], "little") for b in pol.t2}
    assert {0, 1, 2, 3, 4} <= t2 and all(t >= 2000 for t in
                                         (int.from_bytes(pool.block_hash[b], "little") for b in pol.t1))


def test_arc_order_tail_first_within_a_list():
    from hybridkv.core.eviction.arc import ChainARCPolicy
    evicted: list[bytes] = []
    pool = PolicyBlockPool(12, 1, ChainARCPolicy(), on_evict=lambda g, h: evicted.append(h))
    serve_contents(pool, [10, 11, 12])
    serve_contents(pool, [20, 21])
    assert eviction_order(pool, evicted) == [12, 11, 10, 21, 20]


def _rounds(pool: BlockPool, n: int = 8) -> list[int]:
    """Two conversations come back once per round, each after a flood of 12 one-off first
    turns (24 blocks, most of the 30-block cache); per round, the conversations' hits."""
    for i in range(8):
        serve_contents(pool, [0, 1000 + i])                         # the root becomes shared
    convs = {1: [0, 10, 11], 2: [0, 20, 21]}
    for c in convs.values():
        serve_contents(pool, c)
    out, f = [], 0
    for r in range(n):
        for _ in range(12):
            serve_contents(pool, [0, 5000 + f, 5001 + f])
            f += 2
        hits = 0
        for k, c in convs.items():
            c.append(100 * k + r)
            hits += serve_contents(pool, c)
        out.append(hits)
    return out


def test_adaptive_switches_to_arc_when_its_shadow_is_ahead():
    """Exactly LRU while the shadows are level or LRU leads; once ARC's shadow is ahead, the
    real cache evicts like chain ARC and hits what ARC hits."""
    from hybridkv.core.eviction.adaptive import AdaptivePolicy
    from hybridkv.core.eviction.arc import ChainARCPolicy
    lru = _rounds(BlockPool(31, 1))
    arc = _rounds(PolicyBlockPool(31, 1, ChainARCPolicy()))
    pol = AdaptivePolicy()
    adaptive = _rounds(PolicyBlockPool(31, 1, pol))
    assert lru == [6, 5, 3, 2, 2, 2, 2, 2] and arc == [2, 8, 10, 9, 14, 16, 18, 20]
    assert adaptive[:4] == lru[:4] and adaptive[4:] == arc[4:]
    assert pol.use_arc and pol.scores[0] > pol.score_lru


def test_bad_policy_arguments():
    from hybridkv.core.eviction.adaptive import AdaptivePolicy
    from hybridkv.core.eviction.arc import ChainARCPolicy
    for bad in (0, -1.0, "2"):
        with pytest.raises(ValueError, match="ghost_ratio"):
            ChainARCPolicy(ghost_ratio=bad)
    for bad in (-0.1, 1.0, None):
        with pytest.raises(ValueError, match="margin"):
            AdaptivePolicy(margin=bad)
    with pytest.raises(ValueError, match="challengers"):
        AdaptivePolicy(challengers=())


@pytest.mark.parametrize("name", ["adaptive", "adaptive-turns"])
@settings(max_examples=examples(60), deadline=None)
@given(num_blocks=st.integers(2, 40),
       ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)), min_size=1, max_size=120))
def test_adaptive_is_exactly_lru_while_lru_leads(name, num_blocks, ops):
    """The same operations on plain LRU and on ``adaptive`` / ``adaptive-turns``: while no
    challenger's shadow has been ahead, every allocation returns the same blocks (victims
    included) and every lookup hits the same block."""
    pol = make_policy(name)
    pools = (BlockPool(num_blocks, 1), PolicyBlockPool(num_blocks, 1, pol))
    held: list[list[int]] = []
    h = 0
    for op, x in ops:
        if pol.use_arc:
            break
        if op <= 1 and pools[0].num_free:
            k = 1 + x % pools[0].num_free
            got = [p.allocate(k) for p in pools]
            assert got[0] == got[1]
            for b in got[0][: 1 + x % 3]:
                h += 1
                for p in pools:
                    p.insert(0, h.to_bytes(8, "little"), b)
            held.append(got[0])
        elif op == 2 and held:
            run = held.pop(x % len(held))
            for p in pools:
                p.free(run[::-1])
        elif op == 3 and h:
            key = (1 + x % h).to_bytes(8, "little")
            b = pools[0].cached_block(0, key)
            assert b == pools[1].cached_block(0, key)
            if b is not None:
                for p in pools:
                    p.touch([b])
                held.append([b])
        for p in pools:
            p.check()
        assert pools[0].num_free == pools[1].num_free
