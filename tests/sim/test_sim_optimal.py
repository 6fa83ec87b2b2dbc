"""Block-level LRU / Belady simulations: the published table, optimality, edge cases."""

from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.sim.optimal import (
    belady_block_hit_rate,
    capacity_blocks_for_tokens,
    infinite_block_hit_rate,
    lru_block_hit_rate,
)
from hybridkv.sim.traces import iter_mooncake_records

# src/hybridkv/sim/data/README.md (the traces README of the Mooncake copies): hit rate at capacity (tokens, M = 10**6) with 512-token blocks.
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


def brute_force_optimum(requests: list[list[tuple[int, ...]]], capacity: int) -> int:
    """Maximum total leading hits over every sequence of cache contents (bypass allowed)."""

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
        universe = sorted(cache | set(keys))
        options = (
            frozenset(kept)
            for size in range(min(capacity, len(universe)) + 1)
            for kept in itertools.combinations(universe, size)
        )
        return hits + max(best(i + 1, kept) for kept in options)

    return best(0, frozenset())


@settings(max_examples=60, deadline=None)
@given(traces(max_requests=5, max_len=3, alphabet=2), st.integers(0, 3))
def test_belady_equals_brute_force_optimum(requests, capacity) -> None:
    assert belady_block_hit_rate(requests, capacity).block_hits == brute_force_optimum(requests, capacity)


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
    keeps the hit blocks and has at most ``max(hits, capacity - (footprint - hits))`` blocks."""

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
        pinned = frozenset(keys[:hits])
        room = max(hits, capacity - (footprints[i] - hits))
        rest = sorted(cache - pinned)
        score = 0
        for size in range(min(room - hits, len(rest)) + 1):
            for kept_rest in itertools.combinations(rest, size):
                during = pinned | frozenset(kept_rest)
                universe = sorted(during | set(keys))
                for n in range(min(capacity, len(universe)) + 1):
                    for kept in itertools.combinations(universe, n):
                        score = max(score, best(i + 1, frozenset(kept)))
        return hits + score

    return best(0, frozenset())


@settings(max_examples=40, deadline=None)
@given(traces(max_requests=4, max_len=3, alphabet=2), st.integers(0, 3), st.data())
def test_pool_constrained_belady_equals_brute_force(requests, capacity, data) -> None:
    """Belady with a running request's footprint is the optimum under that constraint (the
    tighter bound BENCHMARKS.md reports beside plain Belady), and never above plain Belady."""
    fps = [len(k) + data.draw(st.integers(0, 2)) for k in requests]
    got = belady_block_hit_rate(requests, capacity, footprints=fps).block_hits
    assert got == brute_force_pool_optimum(requests, capacity, fps)
    assert got <= belady_block_hit_rate(requests, capacity).block_hits


def test_the_bound_counts_a_prompt_that_ends_on_a_block_boundary() -> None:
    """A prompt of exactly 16 blocks with pseudo outputs leaves all 16 blocks computed; a later
    request extending it hits all 16 online, so the bound must allow 16 (below the online hits,
    the simulator would refuse its own result)."""
    import numpy as np

    from hybridkv.sim import SimConfig, Simulator, items_from_trace
    from hybridkv.sim.presets import get_gpu, get_preset
    from hybridkv.sim.traces import TraceRequest
    rng = np.random.default_rng(0)
    a = rng.integers(0, 50_000, 16 * 512)
    items = items_from_trace([TraceRequest("a", 0.0, a, 1),
                              TraceRequest("c", 1.0, np.concatenate([a, [7, 8, 9]]), 1)])
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    for sequential in (True, False):
        res = Simulator(SimConfig(preset, get_gpu("h100"), 1000, sequential=sequential)).run(items)
        assert res.hit_blocks == res.optimal_hit_blocks == 16
