"""The optimum is computed on exactly the served workload: online <= optimum <= unlimited <= 1,
whatever max_model_len rejects or cuts, on hybrid presets with speculative decoding; and the gap
report's causes add up to what the online run missed."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv.core.spec_decode import SpecDecode
from hybridkv.sched import SchedulerConfig
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.bounds.hybrid_bound import is_hybrid
from hybridkv.sim.traffic.workitems import served_workload
from hybridkv.sim.traffic.traces import TraceRequest
from hybridkv.sim.traffic.workloads import get_workload

H100 = get_gpu("h100")


@st.composite
def chat_like(draw):
    """Requests that extend earlier ones (prompt + answer), with known answers, some long."""
    reqs, pool = [], [[]]
    for i in range(draw(st.integers(2, 12))):
        base = pool[draw(st.integers(0, len(pool) - 1))]
        prompt = base + [1000 + i] * draw(st.integers(1, 40))
        out = [5000 + 100 * i + j for j in range(draw(st.integers(1, 12)))]
        reqs.append(TraceRequest(f"r{i}", draw(st.integers(0, 4)) * 0.01, np.array(prompt), len(out),
                                 output_ids=np.array(out)))
        pool.append(prompt + out)
    return reqs


def _check(res) -> None:
    g = res.gap
    assert res.optimal_hit_blocks is not None and g is not None
    assert res.hit_blocks <= res.optimal_hit_blocks <= g.ceiling_blocks <= res.prompt_blocks
    assert 0 <= res.block_hit_rate <= res.optimal_block_hit_rate <= 1
    assert g.online_blocks == res.hit_blocks
    assert (g.in_flight_blocks + g.evicted_blocks + g.retained_blocks + g.routed_blocks
            == g.ceiling_blocks - g.online_blocks)
    assert g.routed_blocks == 0                     # one instance
    hb = res.hybrid_bound_hit_blocks
    assert (hb is not None) == is_hybrid(res_config(res))
    if hb is not None:
        assert res.hit_blocks <= hb <= res.optimal_hit_blocks


def res_config(res):
    return get_preset(res.config["preset"]).kv_config(num_blocks=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_like(), st.integers(40, 160), st.booleans(),
       st.sampled_from(["llama-3.1-8b", "gemma-3-27b", "deepseek-v4-style"]),
       st.one_of(st.none(), st.integers(8, 120)), st.sampled_from([None, ("eagle", 2), ("mtp", 1)]))
def test_bound_on_the_served_workload(reqs, num_blocks, sequential, preset, max_model_len, spec) -> None:
    p = get_preset(preset)
    p = p.with_block_size(4 if p.block_size == 16 else 64)   # deepseek-v4-style: 64/16/2 blocks
    sched = SchedulerConfig(max_num_batched_tokens=256, max_model_len=max_model_len)
    cfg = SimConfig(p, H100, num_blocks=num_blocks, sequential=sequential, sched=sched,
                    max_model_len=max_model_len, spec=SpecDecode(*spec) if spec else None)
    items = items_from_trace(reqs)
    try:
        res = Simulator(cfg).run(items)
    except (RuntimeError, ValueError) as exc:  # a pool too small for one request: a clear refusal
        assert "cannot hold request" in str(exc) or "needs" in str(exc)
        return
    _check(res)
    served, rejected = served_workload(items, max_model_len)
    assert res.rejected == rejected and len(served) + rejected == len(items)
    if sequential:
        assert res.gap.in_flight_blocks == 0


def test_the_issue_16_run_stays_at_most_1() -> None:
    """`simulate --max-model-len 4096` used to report an optimum of 1.098."""
    items = items_from_trace(get_workload("chat"))
    res = Simulator(SimConfig(get_preset("llama-3.1-8b"), H100, num_blocks=187_501,
                              sched=SchedulerConfig(max_model_len=4096), max_model_len=4096)).run(items)
    assert res.rejected > 0
    _check(res)
