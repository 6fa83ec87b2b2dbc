"""Block-level LRU / Belady simulations: the published table, optimality, edge cases."""

from __future__ import annotations

import bisect
import itertools
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv.sim.bounds.optimal import (
    BlockCacheResult,
    belady_block_hit_rate,
    capacity_blocks_for_tokens,
    infinite_block_hit_rate,
    lru_block_hit_rate,
)
from hybridkv.sim.traffic.traces import iter_mooncake_records
from tests.hypothesis_budget import budgeted, examples, is_deep

# src/hybridkv/sim/traffic/data/README.md (the traces README of the Mooncake copies): hit rate at capacity (tokens, M = 10**6) with 512-token blocks.
CAPACITIES = [500_000, 1_000_000, 3_000_000, 10_000_000, 50_000_000]
TABLE = {
    ("conversation", "lru"): [0.044, 0.053, 0.136, 0.285, 0.364],
    ("conversation", "belady"): [0.189, 0.253, 0.353, 0.366, 0.366],
    ("synthetic", "lru"): [0.083, 0.142, 0.309, 0.567, 0.640],
    ("synthetic", "belady"): [0.274, 0.376, 0.550, 0.640, 0.640],
}
INFINITE = {"conversation": 0.366, "synthetic": 0.640}


@lru_cache(maxsize=None)
def _hash_ids(trace_dir: Path, name: str) -> tuple[tuple[int, ...], ...]:
    path = trace_dir / f"mooncake_{name}.jsonl.xz"
    return tuple(rec.hash_ids for rec in iter_mooncake_records(path))


# --------------------------------------------------------------------------------------------
# The published table (all 20 numbers; about 5 s in total)
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name,policy", list(TABLE))
def test_reproduces_readme_table(trace_dir: Path, name: str, policy: str) -> None:
    requests = _hash_ids(trace_dir, name)
    simulate = lru_block_hit_rate if policy == "lru" else belady_block_hit_rate
    got = [simulate(requests, capacity_blocks_for_tokens(c, 512)).hit_rate for c in CAPACITIES]
    for cap, want, have in zip(CAPACITIES, TABLE[(name, policy)], got):
        assert abs(have - want) <= 0.01, f"{name} {policy} @ {cap} tokens: {have:.4f} vs {want}"


@pytest.mark.parametrize("name", list(INFINITE))
def test_infinite_cache_ceiling(trace_dir: Path, name: str) -> None:
    result = infinite_block_hit_rate(_hash_ids(trace_dir, name))
    assert abs(result.hit_rate - INFINITE[name]) <= 0.005
    assert result.block_refs == {"conversation": 288_500, "synthetic": 121_877}[name]


# --------------------------------------------------------------------------------------------
# Hand-checked cases
# --------------------------------------------------------------------------------------------


def test_belady_bypasses_and_lru_evicts_tail_first() -> None:
    reqs = [["a", "b"], ["c"], ["a", "b"]]
    # Belady keeps {a, b} and lets c bypass: the third request hits both blocks.
    bel = belady_block_hit_rate(reqs, 2)
    assert (bel.block_hits, bel.block_refs, bel.request_hits) == (2, 5, (0, 0, 2))
    # LRU frees the first request tail first, so c evicts b and only a hits.
    assert lru_block_hit_rate(reqs, 2).request_hits == (0, 0, 1)
    # Touching head first makes a the older block: a is evicted and nothing leads.
    assert lru_block_hit_rate(reqs, 2, evict_tail_first=False).request_hits == (0, 0, 0)


def test_leading_hits_only() -> None:
    # Capacity 1: tail-first LRU touches "a" last, so it keeps the head block and hits once.
    reqs = [["a", "b"], ["a", "b"]]
    assert lru_block_hit_rate(reqs, 1).request_hits == (0, 1)
    assert belady_block_hit_rate(reqs, 1).request_hits == (0, 1)  # keeps the shallower block
    assert belady_block_hit_rate(reqs, 0).block_hits == 0
    assert lru_block_hit_rate([], 4).hit_rate == 0.0


def test_rejects_bad_capacity() -> None:
    with pytest.raises(ValueError, match="capacity_blocks"):
        belady_block_hit_rate([[1]], -1)
    with pytest.raises(ValueError, match="capacity_blocks"):
        lru_block_hit_rate([[1]], 1.5)  # type: ignore[arg-type]
    assert capacity_blocks_for_tokens(1_000_000, 512) == 1953


# --------------------------------------------------------------------------------------------
# Properties on random chained traces
# --------------------------------------------------------------------------------------------


def _chained(paths: list[list[int]]) -> list[list[tuple[int, ...]]]:
    """Turn token paths into chained block keys: block p's key is the path prefix [0, p]."""
    return [[tuple(path[: p + 1]) for p in range(len(path))] for path in paths]


def traces(max_requests: int, max_len: int, alphabet: int):
    path = st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=max_len)
    return st.lists(path, min_size=1, max_size=max_requests).map(_chained)


def _used_later(requests, i: int) -> set:
    """Keys some request after ``i`` references: only they can ever hit again."""
    return {k for keys in requests[i + 1:] for k in keys}


def brute_force_optimum(requests: list[list[tuple[int, ...]]], capacity: int) -> int:
    """Maximum total leading hits over every sequence of cache contents (bypass allowed).

    Two dominance facts, independent of Belady, keep the search small: a key no later request
    references can never hit, so keeping it helps nothing; and a larger cache never hits less
    (whatever a subset would do later, the superset can do too). So after each request only
    the largest subsets of the still-useful keys are tried."""

    @lru_cache(maxsize=None)
    def best(i: int, cache: frozenset) -> int:
        if i == len(requests):
            return 0
        keys = requests[i]
        hits = 0
        for k in keys:
            if k not in cache:
                break
            hits += 1
        universe = sorted((cache | set(keys)) & _used_later(requests, i))
        size = min(capacity, len(universe))
        return hits + max(best(i + 1, frozenset(kept)) for kept in itertools.combinations(universe, size))

    return best(0, frozenset())


#: The brute-force search's reach: small by default, deeper (longer chains, more requests,
#: a third token value, larger caches) under ``--hypothesis-profile=deep``.
BRUTE = (dict(max_requests=7, max_len=4, alphabet=3, capacity=5) if is_deep()
         else dict(max_requests=5, max_len=3, alphabet=2, capacity=3))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(BRUTE["max_requests"], BRUTE["max_len"], BRUTE["alphabet"]),
       st.integers(0, BRUTE["capacity"]))
@budgeted(0.05)
def test_belady_equals_brute_force_optimum(requests, capacity) -> None:
    """Belady (with bypass, deeper blocks evicted first on a tie) hits exactly the optimum
    found by exhaustive search; a bound one block off on any searched case fails here."""
    got = belady_block_hit_rate(requests, capacity)
    assert got.block_hits == brute_force_optimum(requests, capacity)
    assert got == naive_belady(requests, capacity)


@settings(max_examples=150, deadline=None)
@given(traces(max_requests=30, max_len=8, alphabet=3), st.integers(0, 12))
def test_belady_dominates_lru_and_is_bounded(requests, capacity) -> None:
    bel = belady_block_hit_rate(requests, capacity)
    inf = infinite_block_hit_rate(requests)
    for tail_first in (True, False):
        assert lru_block_hit_rate(requests, capacity, evict_tail_first=tail_first).block_hits <= bel.block_hits
    assert bel.block_hits <= inf.block_hits
    assert belady_block_hit_rate(requests, capacity + 1).block_hits >= bel.block_hits
    assert bel.block_refs == sum(map(len, requests)) == inf.block_refs
    assert sum(bel.request_hits) == bel.block_hits


@settings(max_examples=50, deadline=None)
@given(traces(max_requests=20, max_len=6, alphabet=3))
def test_large_capacity_equals_infinite(requests) -> None:
    big = sum(map(len, requests))
    inf = infinite_block_hit_rate(requests)
    assert belady_block_hit_rate(requests, big).request_hits == inf.request_hits
    assert lru_block_hit_rate(requests, big).request_hits == inf.request_hits


def brute_force_pool_optimum(requests: list[list[tuple[int, ...]]], capacity: int,
                             footprints: list[int]) -> int:
    """As :func:`brute_force_optimum`, but while request ``i`` runs its misses hold
    ``footprints[i] - hits`` blocks of their own: the cache first shrinks to any subset that
    keeps the hit blocks and has at most ``max(hits, capacity - (footprint - hits))`` blocks.
    The same dominance holds (more hits leave as much more room, so a larger cache is never
    worse): only the largest still-useful subsets are tried, during and after the request."""

    @lru_cache(maxsize=None)
    def best(i: int, cache: frozenset) -> int:
        if i == len(requests):
            return 0
        keys = requests[i]
        hits = 0
        for k in keys:
            if k not in cache:
                break
            hits += 1
        later = _used_later(requests, i)
        pinned = frozenset(keys[:hits])
        room = max(hits, capacity - (footprints[i] - hits))
        rest = sorted((cache - pinned) & later)
        score = 0
        for kept_rest in itertools.combinations(rest, min(room - hits, len(rest))):
            universe = sorted((pinned | frozenset(kept_rest) | set(keys)) & later)
            for kept in itertools.combinations(universe, min(capacity, len(universe))):
                score = max(score, best(i + 1, frozenset(kept)))
        return hits + score

    return best(0, frozenset())


POOL = (dict(max_requests=6, max_len=4, alphabet=3, capacity=4) if is_deep()
        else dict(max_requests=4, max_len=3, alphabet=2, capacity=3))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(POOL["max_requests"], POOL["max_len"], POOL["alphabet"]),
       st.integers(0, POOL["capacity"]), st.data())
@budgeted(0.05)
def test_pool_constrained_belady_equals_brute_force(requests, capacity, data) -> None:
    """Belady with a running request's footprint is the optimum under that constraint (the
    tighter bound BENCHMARKS.md reports beside plain Belady), and never above plain Belady."""
    fps = [len(k) + data.draw(st.integers(0, 2)) for k in requests]
    got = belady_block_hit_rate(requests, capacity, footprints=fps)
    assert got.block_hits == brute_force_pool_optimum(requests, capacity, fps)
    assert got.block_hits <= belady_block_hit_rate(requests, capacity).block_hits
    assert got == naive_belady(requests, capacity, footprints=fps)


def naive_belady(requests, capacity: int, hit_limits=None, footprints=None) -> BlockCacheResult:
    """The rule of ``belady_block_hit_rate``'s docstring, one request at a time and without a
    heap (for chained keys, where a key's depth is its position in every request): count the
    leading cached blocks (at most the hit limit); cut the cache to ``max(hits, capacity -
    (footprint - hits))`` keeping the blocks used soonest from this request on; add the
    request's blocks; keep the ``capacity`` blocks used soonest after it (a tie: the
    shallower one), never one no later request uses."""
    inf = float("inf")
    uses: dict = {}
    for j, keys in enumerate(requests):
        for k in keys:
            uses.setdefault(k, []).append(j)

    def next_use(key, start: int) -> float:
        at = bisect.bisect_left(uses[key], start)
        return uses[key][at] if at < len(uses[key]) else inf

    cache: set = set()
    per: list[int] = []
    refs = 0
    for i, keys in enumerate(requests):
        limit = len(keys) if hit_limits is None else min(hit_limits[i], len(keys))
        h = 0
        while h < limit and keys[h] in cache:
            h += 1
        per.append(h)
        refs += limit
        if footprints is not None:
            target = max(h, capacity - (footprints[i] - h))
            cache = set(sorted(cache, key=lambda k: (next_use(k, i), len(k)))[:target])
        pool = [k for k in cache | set(keys) if next_use(k, i + 1) < inf]
        cache = set(sorted(pool, key=lambda k: (next_use(k, i + 1), len(k)))[:capacity])
    return BlockCacheResult("belady", capacity, sum(per), refs, tuple(per))


@st.composite
def hot_traces(draw):
    """60 to 120 requests, each a prefix of one of a few 12-block paths plus a short tail:
    hot blocks are referenced again and again (the heap's stale entries pile up)."""
    bases = draw(st.lists(st.lists(st.integers(0, 2), min_size=12, max_size=12), min_size=1, max_size=4))
    reqs = draw(st.lists(st.tuples(st.integers(0, len(bases) - 1), st.integers(1, 12),
                                   st.lists(st.integers(0, 2), max_size=3)), min_size=60, max_size=120))
    return _chained([bases[b][:n] + tail for b, n, tail in reqs])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hot_traces(), st.integers(0, 20), st.data())
def test_belady_follows_its_rule_on_long_traces(requests, capacity, data) -> None:
    """On traces too long for the exhaustive search (hundreds of references to hot blocks, so
    the heap collects stale entries and is compacted in most examples), the simulation equals :func:`naive_belady`, with
    hit limits and footprints too: the heap's bookkeeping (lazy invalidation, compaction,
    integer priorities) changes nothing."""
    assert belady_block_hit_rate(requests, capacity) == naive_belady(requests, capacity)
    limits = [data.draw(st.integers(0, len(k) + 1)) for k in requests]
    fps = [len(k) + data.draw(st.integers(0, 3)) for k in requests]
    assert belady_block_hit_rate(requests, capacity, limits, footprints=fps) == \
        naive_belady(requests, capacity, limits, fps)


def test_the_bound_counts_a_prompt_that_ends_on_a_block_boundary() -> None:
    """A prompt of exactly 16 blocks with pseudo outputs leaves all 16 blocks computed; a later
    request extending it hits all 16 online, so the bound must allow 16 (below the online hits,
    the simulator would refuse its own result)."""
    import numpy as np

    from hybridkv.sim import SimConfig, Simulator, items_from_trace
    from hybridkv.cost.presets import get_gpu, get_preset
    from hybridkv.sim.traffic.traces import TraceRequest
    rng = np.random.default_rng(0)
    a = rng.integers(0, 50_000, 16 * 512)
    items = items_from_trace([TraceRequest("a", 0.0, a, 1),
                              TraceRequest("c", 1.0, np.concatenate([a, [7, 8, 9]]), 1)])
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    for sequential in (True, False):
        res = Simulator(SimConfig(preset, get_gpu("h100"), 1000, sequential=sequential)).run(items)
        assert res.hit_blocks == res.optimal_hit_blocks == 16


# --------------------------------------------------------------------------------------------
# The bound of a simulated workload: its keys, capacity and gap report
# --------------------------------------------------------------------------------------------


def test_gap_report_charges_each_cause_by_hand() -> None:
    """Keys are letters; R0 computes k1 k2 k3 (finished at t=5).

    * R1 (admitted t=3, limit 3) could hit k1 k2 k3, hit 1: k2 was still being computed
      (R0 finished after t=3): 2 blocks in flight.
    * R2 (t=10, limit 2) could hit k1 k2, hit 0: R0 had finished: 2 blocks evicted.
    * R3 (t=20, limit 4) could hit k1..k4 (k4 from R1, finished t=8), hit 1, while the
      full-attention groups alone held 3: [1, 3) is retained (another group could not serve
      it), [3, 4) evicted (charged by k4's producer R1).
    * R4 (t=4, limit 3) hit 0 with the attention groups holding 2, but R0 was in flight: all 3
      blocks in flight.
    * R0 could hit nothing: no loss.

    With instances [0, 0, 1, 1, 0], R2's and R3's evicted blocks were computed on instance 0:
    routed instead; in-flight and retained blocks stay what they are."""
    from hybridkv.sim.bounds.optimal import OnlineHits, gap_report
    keys = [["k1", "k2", "k3"], ["k1", "k2", "k3", "k4"], ["k1", "k2", "x"],
            ["k1", "k2", "k3", "k4", "k5"], ["k1", "k2", "k3"]]
    limits = [3, 3, 2, 4, 3]
    online = OnlineHits(hit_blocks=[0, 1, 0, 1, 0], admitted_t=[0, 3, 10, 20, 4],
                        finished_t=[5, 8, 12, 25, 9], attention_blocks=[0, 1, 0, 3, 2])
    g = gap_report(keys, limits, 9, online)
    assert (g.ceiling_blocks, g.optimum_blocks, g.online_blocks) == (0 + 3 + 2 + 4 + 3, 9, 2)
    assert (g.in_flight_blocks, g.in_flight_requests) == (2 + 3, 2)
    assert (g.evicted_blocks, g.evicted_requests) == (2 + 1, 2)
    assert (g.retained_blocks, g.retained_requests) == (2, 1)
    assert (g.routed_blocks, g.routed_requests) == (0, 0)
    routed = OnlineHits(online.hit_blocks, online.admitted_t, online.finished_t,
                        online.attention_blocks, instance=[0, 0, 1, 1, 0])
    g = gap_report(keys, limits, 9, routed)
    assert (g.in_flight_blocks, g.retained_blocks, g.evicted_blocks) == (5, 2, 0)
    assert (g.routed_blocks, g.routed_requests, g.evicted_requests) == (3, 2, 0)
    # without attention probes the whole loss is charged by the first missed block
    plain = OnlineHits(online.hit_blocks, online.admitted_t, online.finished_t)
    g = gap_report(keys, limits, 9, plain)
    assert (g.retained_blocks, g.in_flight_blocks, g.evicted_blocks) == (0, 5, 2 + 3)


def _served(prompt, out=None, max_tokens=None):
    import numpy as np

    from hybridkv.sim.traffic.traces import TraceRequest
    from hybridkv.sim.traffic.workitems import ServedItem, WorkItem
    out_ids = None if out is None else np.asarray(out)
    tr = TraceRequest(f"r{len(prompt)}-{0 if out is None else len(out)}", 0.0, np.asarray(prompt),
                      0 if out is None else len(out), output_ids=out_ids)
    item = WorkItem(tr.request_id, 0.0, tr.prompt_len, tr.output_len, tr)
    return item if max_tokens is None else ServedItem(item, max_tokens)


def test_the_bound_keys_cover_known_outputs_cut_at_max_tokens() -> None:
    """Blocks of 4 tokens. X: prompt 1..8 with a known answer 9..13; Y: 1..12 then 77.
    X leaves its tokens but the last sampled one computed: 12 tokens, 3 blocks, so Y (limit
    12 // 4 = 3) hits 3. Cut to 2 output tokens X leaves 9 tokens (2 blocks): Y hits 2; an
    X without known output leaves its 8 prompt tokens (2 blocks). Y's own last token is
    never a hit: Y' = 1..12 (limit 11 // 4 = 2) hits 2 though X holds 3 blocks of it.
    The keys of one list are kept per block size, never mixed between sizes."""
    from hybridkv.sim.bounds.bound_inputs import optimal_hit_blocks
    x = list(range(1, 9))
    y = list(range(1, 13)) + [77]
    assert optimal_hit_blocks([_served(x, [9, 10, 11, 12, 13], 5), _served(y, None, 1)], 4, 100) == 3
    assert optimal_hit_blocks([_served(x, [9, 10, 11, 12, 13], 2), _served(y, None, 1)], 4, 100) == 2
    assert optimal_hit_blocks([_served(x, [9, 10, 11, 12, 13]), _served(y)], 4, 100) == 3
    assert optimal_hit_blocks([_served(x, None, 1), _served(y, None, 1)], 4, 100) == 2
    assert optimal_hit_blocks([_served(x, [9, 10, 11, 12, 13], 5), _served(y[:12], None, 1)], 4, 100) == 2
    same = [_served(x, [9, 10, 11, 12, 13], 5), _served(y, None, 1)]
    assert [optimal_hit_blocks(same, bs, 100) for bs in (4, 2, 4)] == [3, 6, 3]
    assert optimal_hit_blocks(same, 4, 1) == 1          # one block of cache: X's first


def test_optimum_capacity_counts_every_full_attention_group() -> None:
    """A key block costs key_block / block_size blocks in every full-attention-type group (at
    least one), none in window groups: (num_blocks - 1) // units."""
    from hybridkv.sim.bounds.optimal import optimum_capacity_blocks
    from hybridkv.cost.presets import get_preset
    llama = get_preset("llama-3.1-8b").kv_config(num_blocks=101)
    assert optimum_capacity_blocks(llama, 101, 16) == 100
    assert optimum_capacity_blocks(llama, 101, 64) == 25            # 4 blocks per key block
    assert type(optimum_capacity_blocks(llama, 101, 64)) is int     # a block count, not 25.0
    assert optimum_capacity_blocks(llama, 101, 8) == 100            # never below one block
    gemma = get_preset("gemma-3-27b").kv_config(num_blocks=101)
    assert optimum_capacity_blocks(gemma, 101, 16) == 100           # the window group is free
    ds = get_preset("deepseek-v4-style").kv_config(num_blocks=1001)
    assert optimum_capacity_blocks(ds, 1001, 256) == 500            # MLA and its MTP draft group


def test_capacity_in_tokens_and_hit_limits() -> None:
    """Whole blocks of a token capacity; a negative capacity or a block of no tokens is
    refused. A hit limit caps what counts (and is referenced) for both simulations."""
    assert [capacity_blocks_for_tokens(t, 512) for t in (0, 511, 512, 1535)] == [0, 0, 1, 2]
    for bad in ((-1, 512), (10, 0)):
        with pytest.raises(ValueError, match=f"need capacity_tokens >= 0 and block_tokens > 0, got {bad[0]}, {bad[1]}"):
            capacity_blocks_for_tokens(*bad)
    reqs = [["a", "b", "c"], ["a", "b", "c"], ["a", "b", "c"]]
    for sim in (lru_block_hit_rate, belady_block_hit_rate):
        r = sim(reqs, 10, hit_limits=[3, 2, 5])
        assert (r.request_hits, r.block_refs, r.block_hits) == ((0, 2, 3), 3 + 2 + 3, 5)
    assert belady_block_hit_rate([], 3) == BlockCacheResult("belady", 3, 0, 0, ())
    assert infinite_block_hit_rate([["a"], ["a", "b"]]).capacity_blocks is None


def test_the_bound_in_a_forked_child_equals_the_inline_one(monkeypatch) -> None:
    """Above PARALLEL_OPTIMUM_TOKENS the bound, the gap report, ``extra``'s answer and the hazard
    reference are computed in a forked child; its answer is the inline one, an error in the
    child is raised here, and cancel stops it."""
    import multiprocessing as mp

    import hybridkv.sim.bounds.optimum_job as job_module
    from hybridkv.sim.bounds.optimal import OnlineHits
    from hybridkv.sim.bounds.optimum_job import Extra, OptimumJob
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    monkeypatch.setattr(job_module, "_PARTS", None)
    served = [_served(list(range(1, 9)), [9, 10, 11, 12, 13], 5), _served(list(range(1, 13)) + [77], None, 1)]
    online = OnlineHits([0, 1], [0.0, 1.0], [0.5, 2.0])
    inline = OptimumJob(list(served), 4, 100, parallel=True).result(online)
    monkeypatch.setattr(job_module, "PARALLEL_OPTIMUM_TOKENS", 0)
    extra = Extra(lambda inputs, capacity, seconds: capacity, lambda before, got: ("extra", before))
    job = OptimumJob(served, 4, 100, parallel=True, extra=extra)
    assert job._child is not None
    first = job.result(online)
    assert first == (inline[0], inline[1], ("extra", 100), inline[3]) and inline[0] == 3
    assert not job.reused and {"keys", "optimum", "hazard", "unlimited", "gap"} <= set(job.seconds)
    again = OptimumJob(served, 4, 100, parallel=True, extra=extra)      # the same size: reused
    assert again._child is None and again.result(online) == first and again.reused
    assert set(again.seconds) == {"gap"}
    assert OptimumJob(served, 4, 100, parallel=False)._child is None

    def boom(*a):
        raise ArithmeticError("from the child")
    with pytest.raises(ArithmeticError, match="from the child"):
        OptimumJob(served, 4, 100, extra=Extra(boom, boom)).result(online)
    job = OptimumJob(served, 4, 99)
    job.cancel()
    assert not job._child.is_alive()


def test_capacity_defaults_to_512_token_blocks_and_accepts_one_token_blocks() -> None:
    """The default block size was not the documented 512 tokens, or one-token blocks (the
    smallest valid size) were refused."""
    assert capacity_blocks_for_tokens(1024) == 2 and capacity_blocks_for_tokens(1023) == 1
    assert capacity_blocks_for_tokens(5, 1) == 5


def test_belady_keeps_the_sooner_used_block_of_one_block_requests() -> None:
    """With one-block requests the eviction key lost its next-use order (a zero depth span left
    only the insertion order), so the block used next was evicted: 1 hit instead of 2."""
    got = belady_block_hit_rate([["A"], ["B"], ["A"], ["A"], ["B"]], 1)
    assert (got.block_hits, got.request_hits) == (2, (0, 0, 1, 1, 0))


def test_the_unlimited_cache_names_itself() -> None:
    """The unlimited cache's result was not labelled ``"infinite"``."""
    got = infinite_block_hit_rate([["A"], ["A"]])
    assert (got.policy, got.capacity_blocks, got.block_hits) == ("infinite", None, 1)


def test_lru_names_itself_and_its_capacity_and_a_bad_capacity_is_named() -> None:
    """The LRU result was not labelled ``"lru"`` with its capacity, or a negative capacity's
    error did not name ``capacity_blocks``."""
    got = lru_block_hit_rate([["A"], ["A"]], 3)
    assert (got.policy, got.capacity_blocks, got.block_hits) == ("lru", 3, 1)
    with pytest.raises(ValueError, match="^capacity_blocks must be an integer >= 0, got -1$"):
        lru_block_hit_rate([["A"]], -1)


def test_the_inline_job_returns_the_hazard_reference_and_extras_answer(monkeypatch) -> None:
    """Computed in-process, the job dropped ``extra`` (its answer came back None), handed it
    other inputs or capacity, or lost the hazard reference; the forked path's equality test
    cannot see a loss both paths share."""
    import hybridkv.sim.bounds.optimum_job as job_module
    from hybridkv.sim.bounds.bound_inputs import _compute_bound_keys, bound_inputs
    from hybridkv.sim.bounds.hazard import hazard_bound
    from hybridkv.sim.bounds.optimal import OnlineHits
    from hybridkv.sim.bounds.optimum_job import Extra, OptimumJob
    monkeypatch.setattr(job_module, "_PARTS", None)
    served = [_served(list(range(1, 9)), [9, 10, 11, 12, 13], 5), _served(list(range(1, 13)) + [77], None, 1)]
    online = OnlineHits([0, 1], [0.0, 1.0], [0.5, 2.0])
    seen = []

    def before(inputs, capacity, seconds):
        seen.append((inputs, capacity))
        return "before"

    def after(got, got_online):
        seen.append((got, got_online))
        return "extra"
    opt, _, more, hazard = OptimumJob(served, 4, 100, parallel=False,
                                      extra=Extra(before, after)).result(online)
    keys, limits = _compute_bound_keys(served, 4)
    assert opt == 3 and more == "extra"
    assert seen == [(bound_inputs(served, 4), 100), ("before", online)]
    assert hazard == hazard_bound(keys, limits, 100)


def test_bound_keys_stop_before_the_last_sampled_token() -> None:
    """The bound's keys kept the block that ends on the last sampled token (whose KV is never
    written), or dropped a prompt's last full block when the request has no outputs."""
    from hybridkv.sim.bounds.bound_inputs import _compute_bound_keys
    keys, limits = _compute_bound_keys([_served([1, 2, 3, 4], [5, 6, 7, 8])], 4)
    assert [len(k) for k in keys] == [1] and limits == [0]    # tokens 1-8, the 8th never written
    keys, _ = _compute_bound_keys([_served(list(range(1, 9)), [])], 4)
    assert [len(k) for k in keys] == [2]                       # no outputs: both prompt blocks


def test_a_producer_that_finished_as_the_follow_up_was_admitted_is_not_in_flight() -> None:
    """A block whose producer finished at the very time the follow-up was admitted was charged
    to in-flight (the producer had finished: the block was evicted)."""
    from hybridkv.sim.bounds.optimal import OnlineHits, gap_report
    online = OnlineHits(hit_blocks=[0, 0], admitted_t=[0.0, 1.0], finished_t=[1.0, 2.0])
    g = gap_report([["k1", "k2"], ["k1", "k2"]], [2, 2], 2, online)
    assert (g.evicted_blocks, g.evicted_requests, g.in_flight_blocks) == (2, 1, 0)


def test_a_workload_s_keys_and_hazard_table_are_computed_once_for_all_capacities(monkeypatch) -> None:
    """The per-workload keys, next uses and hazard table (independent of the capacity) were
    recomputed for every capacity of a sweep, or the next uses were not returned."""
    import hybridkv.sim.bounds.bound_inputs as bound_module
    import hybridkv.sim.bounds.optimum_job as job_module
    from hybridkv.sim.bounds.optimal import OnlineHits, next_use_indices
    from hybridkv.sim.bounds.optimum_job import OptimumJob
    monkeypatch.setattr(job_module, "_PARTS", None)
    served = [_served(list(range(1, 9)), [9, 10, 11, 12, 13], 5), _served(list(range(1, 13)) + [77], None, 1)]
    online = OnlineHits([0, 1], [0.0, 1.0], [0.5, 2.0])
    keys, limits, uses = bound_module._bound_keys(served, 4)
    assert uses == next_use_indices(keys)
    again = bound_module._bound_keys(served, 4)
    assert again[0] is keys and again[1] is limits and again[2] is uses
    assert bound_module._bound_keys(served, 8)[0] is not keys          # another block size: recomputed
    for capacity in (100, 3):
        OptimumJob(served, 4, capacity, parallel=False).result(online)
        inputs = bound_module.bound_inputs(served, 4)
        if capacity == 100:
            parts = inputs._hazard
            assert parts is not None and inputs.keys is bound_module._bound_keys(served, 4)[0]
    assert inputs._hazard is parts


def test_the_bound_accepts_any_iterable_of_items_twice() -> None:
    """A workload given as a tuple (not memoized) left a broken memo that failed the next call."""
    from hybridkv.sim.bounds.bound_inputs import optimal_hit_blocks
    served = (_served(list(range(1, 9)), [9, 10, 11, 12, 13], 5), _served(list(range(1, 13)) + [77], None, 1))
    assert optimal_hit_blocks(served, 4, 100) == 3
    assert optimal_hit_blocks(served, 4, 100) == 3
