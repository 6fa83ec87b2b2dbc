"""The simulator: determinism, the optimum as a bound, an independent LRU model, #43447."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv.core.spec_decode import SpecDecode
from hybridkv.sched import SchedulerConfig
from hybridkv.cost.costmodel import CostModel
from hybridkv.sim.bounds.optimal import lru_block_hit_rate
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim import SimConfig, Simulator, items_from_mooncake, items_from_trace
from hybridkv.sim.bounds.bound_inputs import optimal_hit_blocks
from hybridkv.sim.traffic.traces import TraceRequest
from hybridkv.sim.traffic.workloads import get_workload, replay_microbenchmark
from hybridkv.sim.simulator import TIMING_KEYS

H100 = get_gpu("h100")


def _run(preset: str, items, num_blocks: int, **kw):
    return Simulator(SimConfig(get_preset(preset), H100, num_blocks=num_blocks, **kw)).run(items)


def test_same_seed_same_result() -> None:
    items = items_from_trace(get_workload("chat", num_conversations=12, turns=3, seed=3))
    a = _run("gemma-3-27b", items, 400, spec=None, seed=5).to_json()
    b = _run("gemma-3-27b", items, 400, spec=None, seed=5).to_json()
    c = _run("llama-3.1-8b", items, 300, spec=SpecDecode("eagle", 3), seed=5).to_json()
    d = _run("llama-3.1-8b", items, 300, spec=SpecDecode("eagle", 3), seed=5).to_json()
    for x, y in ((a, b), (c, d)):
        for key in TIMING_KEYS:
            x.pop(key), y.pop(key)
        assert x == y
    assert a["requests"] == 36 and a["hit_tokens"] > 0
    # 400 blocks are few enough that the run preempts: determinism covers preemption too
    assert a["preemptions"] > 0
    # chat turns repeat the previous answer: the optimum inserts outputs too and still bounds
    for x in (a, c):
        assert x["block_hit_rate"] <= x["optimal_block_hit_rate"]


@st.composite
def small_traces(draw):
    n = draw(st.integers(2, 14))
    stems = [list(draw(st.lists(st.integers(0, 3), min_size=0, max_size=40))) for _ in range(3)]
    reqs = []
    for i in range(n):
        stem = stems[draw(st.integers(0, 2))]
        prompt = stem[:draw(st.integers(0, len(stem)))] + [10 + i] * draw(st.integers(1, 30))
        reqs.append(TraceRequest(f"r{i}", float(draw(st.integers(0, 5))) * 0.01, np.array(prompt),
                                 draw(st.integers(1, 20))))
    return reqs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_traces(), st.integers(48, 120), st.booleans(), st.sampled_from(["llama-3.1-8b", "gemma-3-27b"]))
def test_the_offline_optimum_bounds_every_online_run(reqs, num_blocks, sequential, preset) -> None:
    p = get_preset(preset).with_block_size(4)
    sched = SchedulerConfig(max_num_batched_tokens=64)
    res = Simulator(SimConfig(p, H100, num_blocks=num_blocks, sequential=sequential, sched=sched)
                    ).run(items_from_trace(reqs))
    assert res.optimal_hit_blocks is not None
    assert res.hit_blocks <= res.optimal_hit_blocks
    assert res.block_hit_rate <= res.optimal_block_hit_rate + 1e-12


@pytest.mark.parametrize("capacity", [500, 2000])
def test_sequential_manager_equals_an_independent_lru_model_on_the_mooncake_trace(capacity, trace_dir) -> None:
    """At 512-token blocks, one request at a time, the real manager's hits equal a block-level
    LRU over the same blocks (the harness of the traces README), request by request."""
    items = [dataclasses.replace(it, output_len=0)
             for it in items_from_mooncake(str(trace_dir / "mooncake_conversation.jsonl.xz"), 1500)]
    p = get_preset("llama-3.1-8b").with_block_size(512)
    res = Simulator(SimConfig(p, H100, num_blocks=capacity + 1, sequential=True)).run(items)
    keys = [it.source.hash_ids[:(it.prompt_len - 1) // 512] for it in items]
    lru = lru_block_hit_rate(keys, capacity)
    assert res.hit_blocks == lru.block_hits
    assert res.hit_tokens == 512 * lru.block_hits


@pytest.mark.parametrize("spec", [None, SpecDecode("mtp", 1)])
def test_replay_microbenchmark_shows_the_43447_effect_on_deepseek_v4_style(spec) -> None:
    """Send A, an unrelated B, replay A. Caching every sliding-window block (vLLM's dense
    behaviour) lets B's window churn evict A; retention 0 with scratch-first reuse keeps it."""
    items = items_from_trace(replay_microbenchmark(a_tokens=8192, b_tokens=8192))
    sched = SchedulerConfig(max_num_batched_tokens=2048)
    dense = _run("deepseek-v4-style", items, 1000, vllm_compat=True, retention_interval=None,
                 sched=sched, spec=spec)
    kept = _run("deepseek-v4-style", items, 1000, retention_interval=0, sched=sched, spec=spec)
    assert dense.hit_tokens == 0 and dense.evictions > 0          # A2 misses after B
    assert kept.hit_tokens == 8192 - 256 and kept.evictions == 0   # A2 hits (256-token alignment)
    assert kept.retained_blocks["swa128"] < dense.retained_blocks["swa128"]


def test_vectorized_step_time_equals_the_reference_formula() -> None:
    rng = np.random.default_rng(0)
    for name in ("llama-3.1-8b", "gemma-3-27b", "llama-4-scout", "deepseek-v4-style", "gpt-oss-120b"):
        cm = CostModel(get_preset(name), H100)
        for _ in range(20):
            n = int(rng.integers(1, 40))
            new = rng.integers(0, 3000, n)
            ctx = rng.integers(0, 200_000, n)
            ref = cm.step_time(list(zip(new.tolist(), ctx.tolist())))
            assert cm.step_time_arrays(new, ctx) == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_optimum_matches_the_simulators_accounting() -> None:
    items = items_from_trace(get_workload("system-prompt", num_requests=60, seed=1))
    res = _run("llama-3.1-8b", items, 200)
    assert res.optimal_hit_blocks == optimal_hit_blocks(items, 16, 199)
    assert res.prompt_blocks == sum(-(-it.prompt_len // 16) for it in items)


def test_prompts_longer_than_max_model_len_are_rejected_and_counted(trace_dir) -> None:
    items = items_from_mooncake(str(trace_dir / "mooncake_conversation.jsonl.xz"), 200)
    too_long = sum(1 for it in items if it.prompt_len >= 16384)
    res = _run("llama-3.1-8b", items, 50_000, max_model_len=16384,
               sched=SchedulerConfig(max_model_len=16384))
    assert too_long > 0 and res.rejected == too_long
    assert res.prompt_tokens == sum(it.prompt_len for it in items if it.prompt_len < 16384)


def test_block_hit_rate_by_group_in_the_json_and_the_report() -> None:
    """SimResult.block_hit_rate_by_group; to_json; summary_table; cluster.combine — the
    #43447 replay (A 8,192 tokens, unrelated B, A again) on deepseek-v4-style with MTP: only
    A2 hits, 7,936 tokens (8,191 rounded down to the 256-token alignment; the token and the
    block after it are in A2's prompt, so lookahead hashing and drop mode agree). Per group the
    three requests query (8,192 - 1) // bs blocks each: 3 x 31, 3 x 127, 3 x 1,023 (mla and
    mtp at 256, swa512 at 64, swa128 at 8), and A2 hits 7,936 / bs of them: 31, 124, 992.
    Two instances' results combine by summing the counts (rates unchanged)."""
    from hybridkv.sim.cluster import combine
    from hybridkv.sim.report import summary_table
    items = items_from_trace(replay_microbenchmark(a_tokens=8192, b_tokens=8192))
    for spec in (SpecDecode("mtp", 1), SpecDecode("mtp", 1, hash_lookahead=False)):
        res = _run("deepseek-v4-style", items, 1000, sched=SchedulerConfig(max_num_batched_tokens=2048),
                   spec=spec, optimum=False)
        assert res.hit_tokens == 7936
        assert res.group_query_blocks == {"mla": 93, "swa512": 381, "swa128": 3069, "mtp": 93}
        assert res.group_hit_blocks == {"mla": 31, "swa512": 124, "swa128": 992, "mtp": 31}
        rates = {"mla": 31 / 93, "swa512": 124 / 381, "swa128": 992 / 3069, "mtp": 31 / 93}
        assert res.to_json()["block_hit_rate_by_group"] == rates
        assert ("block hit rate by group    mla=0.3333, swa512=0.3255, swa128=0.3232, mtp=0.3333  "
                in summary_table(res))
        both = combine([res, res])
        assert both.group_hit_blocks == {g: 2 * n for g, n in res.group_hit_blocks.items()}
        assert both.block_hit_rate_by_group == rates
