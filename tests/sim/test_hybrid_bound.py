"""The hybrid bound: the optimum of a cache whose hits must end where every group kept its span.

* its parts by hand: the next *counted* reference (a reference beyond a request's limit does
  not count), and Belady on it keeping the block a later request can count;
* with no eviction pressure, one request at a time, every hybrid preset's online run hits
  exactly the bound (the unlimited replay is the same manager, never evicting), while the
  full-attention optimum counts hits no window allows;
* under pressure, online <= hybrid bound <= optimum for every policy, with and without hints
  (``test_sim_bounds.py`` checks the same on random workloads);
* a dense preset has none.
"""

from __future__ import annotations

import math

import pytest

from hybridkv.core.eviction import POLICIES
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.sim.traffic.hint_synthesis import HintSpec
from hybridkv.sim.bounds.hybrid_bound import is_hybrid, next_read_indices
from hybridkv.sim.bounds.optimal import belady_block_hit_rate
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.report.summary import explain_gap
from hybridkv.sim.traffic.workloads import get_workload

H100 = get_gpu("h100")
INF = math.inf
HYBRID = ["gemma-3-27b", "gpt-oss-120b", "llama-4-scout", "deepseek-v4-style", "qwen3-next-80b-a3b"]


def test_next_read_skips_references_beyond_a_requests_limit():
    reqs = [["a", "b", "c"], ["a", "b"], ["a", "b", "c"]]
    assert next_read_indices(reqs, [3, 1, 3]) == [[1, 2, 2], [2, 2], [INF, INF, INF]]
    assert next_read_indices(reqs, [3, 0, 0]) == [[INF, INF, INF], [INF, INF], [INF, INF, INF]]


def test_belady_on_counted_reads_keeps_the_block_a_later_request_counts():
    """Capacity 1. Request 2 references a without counting it (its hit may not end past 0);
    request 3 counts b. By plain next use a (used at 2) beats b (used at 3) and nothing is
    ever hit; by next counted read b is kept and request 3 hits it."""
    reqs = [["a"], ["b"], ["a"], ["b"]]
    limits = [1, 1, 0, 1]
    plain = belady_block_hit_rate(reqs, 1, limits)
    counted = belady_block_hit_rate(reqs, 1, limits, next_uses=next_read_indices(reqs, limits))
    assert plain.block_hits == 0 and counted.block_hits == 1
    assert counted.request_hits == (0, 0, 0, 1) and counted.block_refs == 3


def _chat(limit: int = 120):
    return items_from_trace(get_workload("chat")[:limit])


def _small(name: str):
    p = get_preset(name)
    return p if p.block_size == 16 else p.with_block_size(64 if name == "deepseek-v4-style" else 16)


@pytest.mark.parametrize("preset", HYBRID)
def test_without_pressure_the_online_run_is_the_hybrid_bound(preset):
    p = _small(preset)
    assert is_hybrid(p.kv_config(num_blocks=2))
    res = Simulator(SimConfig(p, H100, num_blocks=2_000_000, sequential=True)).run(_chat())
    assert res.evictions == 0
    assert res.hybrid_bound_hit_blocks == res.hit_blocks > 0
    assert res.hybrid_bound_hit_blocks <= res.optimal_hit_blocks
    # what the unlimited full-attention cache hits beyond it, no cache of this config serves
    assert res.hybrid_unservable_blocks == res.gap.ceiling_blocks - res.hit_blocks
    d = res.to_json()
    assert d["hybrid_bound_block_hit_rate"] == res.hit_blocks / res.prompt_blocks
    assert d["fraction_of_hybrid_bound"] == 1.0


def test_the_full_attention_optimum_counts_hits_no_window_allows():
    """gpt-oss-120b (128-token windows), every 16-token block a promised end: the windows are
    kept everywhere and the two bounds agree; only at the replay boundaries (retention 0)
    does a hit need a stored window, and the hybrid bound falls below the optimum."""
    p = _small("gpt-oss-120b")
    dense_ends = Simulator(SimConfig(p, H100, num_blocks=2_000_000, sequential=True,
                                     retention_interval=None)).run(_chat())
    assert dense_ends.hybrid_bound_hit_blocks == dense_ends.optimal_hit_blocks == dense_ends.hit_blocks
    sparse = Simulator(SimConfig(p, H100, num_blocks=2_000_000, sequential=True)).run(_chat())
    assert sparse.hybrid_bound_hit_blocks == sparse.hit_blocks < sparse.optimal_hit_blocks
    never = sparse.optimal_hit_blocks - sparse.hit_blocks       # nothing evicted: all unservable
    assert sparse.hybrid_unservable_blocks == never and dense_ends.hybrid_unservable_blocks == 0
    assert (f"never servable: {never:,} of the blocks an unlimited cache hits "
            f"({never / sparse.prompt_blocks:.1%}) no cache of this configuration serves: no window "
            "is ever stored where they end") in explain_gap(sparse)
    assert "never servable" not in explain_gap(dense_ends)


_UNDER_PRESSURE = _chat(90)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p not in ("recommended", "priority")])
@pytest.mark.parametrize("hints", [None, HintSpec("session-end", 1.0)])
def test_under_pressure_every_policy_stays_at_or_below_the_bound(policy, hints):
    p = _small("deepseek-v4-style")
    res = Simulator(SimConfig(p, H100, num_blocks=2500, sequential=True, eviction_policy=policy,
                              hints=hints)).run(_UNDER_PRESSURE)
    assert res.evictions > 0
    assert res.hit_blocks <= res.hybrid_bound_hit_blocks <= res.optimal_hit_blocks


def test_a_dense_preset_has_no_hybrid_bound():
    res = Simulator(SimConfig(get_preset("llama-3.1-8b"), H100, num_blocks=50_000,
                              sequential=True)).run(_chat(40))
    assert res.hybrid_bound_hit_blocks is None and res.to_json()["hybrid_bound_block_hit_rate"] is None
    assert "hybrid bound" not in __import__("hybridkv.sim.report.summary", fromlist=["x"]).summary_table(res)


def test_a_sweep_replays_a_workload_once_for_all_sizes_and_policies(monkeypatch):
    import hybridkv.sim.bounds.hybrid_bound as hb
    made = []
    real = hb.KVCacheManager

    def counting(*a, **kw):
        made.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(hb, "KVCacheManager", counting)
    hb._SERVABLE = None
    p = _small("gpt-oss-120b")
    items = _chat(60)
    runs = [Simulator(SimConfig(p, H100, num_blocks=n, sequential=True, eviction_policy=pol)).run(items)
            for n in (1500, 3000) for pol in ("lru", "s3fifo")]
    assert len(made) == 1
    assert len({r.hybrid_unservable_blocks for r in runs}) == 1
    Simulator(SimConfig(p, H100, num_blocks=3000, sequential=True, retention_interval=None)).run(items)
    assert len(made) == 2                                  # another retention: another replay
