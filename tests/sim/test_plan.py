"""The planner's parts, each against values derived by hand or a brute-force oracle: the SLO's
verdict, the $/M tokens arithmetic, the candidate space and its cost order, the choice and
"saved by" logic over fake candidates, the goodput bisection, the TTFT lower bound (against
every window by brute force, and against simulated single-server schedules), the early stop,
and the rate scale of a workload."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hybridkv.sched import SchedulerConfig
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.cost.profile import cost_model
from hybridkv.sim.plan.bound import WINDOW_STARTS, PrefillBound, peak_prefill_rate
from hybridkv.sim.plan.early import SLOMissed, StopAtMiss
from hybridkv.sim.plan.planning import goodput_candidates
from hybridkv.sim.plan.pricing import token_cost, usd_per_mtok
from hybridkv.sim.plan.report import _ranges
from hybridkv.sim.plan.search import Measured, Planner, pareto_front
from hybridkv.sim.plan.slo import SLO, Target, metrics
from hybridkv.sim.plan.space import Candidate, Deployment, Options, Space
from hybridkv.sim.traffic.workitems import first_seconds, scale_rate
from hybridkv.sim.traffic.workloads import get_workload

# ---- the SLO ---------------------------------------------------------------------------------


def test_an_slo_parses_units_and_judges_the_worst_target() -> None:
    slo = SLO.parse("ttft-p99=2s, itl-p90=50ms")
    assert slo.targets == (Target("ttft", 99, 2.0), Target("itl", 90, 0.05))
    assert str(slo) == "ttft-p99=2s,itl-p90=50ms"
    values = {"ttft_p99_s": 1.0, "itl_p90_s": 0.049}
    assert slo.ratio(values) == pytest.approx(0.98)          # 0.049 / 0.05 is the worst
    assert slo.meets(values) and slo.at_edge(values)
    assert not slo.meets({"ttft_p99_s": 2.5, "itl_p90_s": 0.01})
    assert slo.ratio({"ttft_p99_s": 1.0}) == math.inf        # a metric missing never meets
    assert metrics({"ttft_p99_s": 3, "itl_p50_s": None})["ttft_p99_s"] == 3.0


@pytest.mark.parametrize("text, message", [
    ("ttft=2s", "is not METRIC-pNN=TIME"), ("tpot-p99=2s", "unknown SLO metric 'tpot'"),
    ("ttft-p95=2s", "percentile must be one of 50, 90, 99"), ("ttft-p99=0", "finite time > 0"),
    ("ttft-p99=1s,ttft-p99=2s", "ttft-p99 is given twice")])
def test_a_bad_slo_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SLO.parse(text)


# ---- cost ------------------------------------------------------------------------------------


def test_dollars_per_million_tokens_by_hand() -> None:
    """4 GPUs at $3.20 for half an hour = $6.40, over 8M prompt + 0.5M output tokens."""
    cost = token_cost(4, 3.20, 1800.0, 8_000_000, 500_000)
    assert cost.usd == pytest.approx(6.40)
    assert cost.per_mtok == pytest.approx(6.40 / 8.5)
    assert cost.per_m_input == pytest.approx(0.80)
    assert cost.per_m_output == pytest.approx(12.80)
    assert usd_per_mtok(1, 2.0, 3600.0, 2_000_000) == pytest.approx(1.0)
    assert token_cost(1, 2.0, 3600.0, 0, 0).per_mtok is None


# ---- the space -------------------------------------------------------------------------------


def _space(**kw) -> Space:
    base = dict(gpus={"h100": [1, 2]}, max_gpus=4, prices={"h100": 3.0, "h200": 4.0},
                cpu_cache_gb=(0.0, 100.0), hints=(None, "session-end"),
                routers=("kv-aware", "least-loaded"))
    base.update(kw)
    return Space(**base)


def test_candidates_come_cheapest_first_with_tiers_and_hints_on_one_instance() -> None:
    space = _space()
    cands = space.candidates()
    # 1 GPU: one instance x 4 option sets; 2: TP2 x 4 + 2 instances x 2 routers; 3: 3 x 2;
    # 4: TP2 x 2 instances x 2 + 4 instances x 2
    assert [len(level) for level in space.levels(cands)] == [4, 6, 2, 4]
    assert [c.deployment.gpus for c in cands] == [1] * 4 + [2] * 6 + [3] * 2 + [4] * 4
    for c in cands:
        single = c.deployment.instances == 1
        assert (c.options.router is None) == single
        assert single or (c.options.cpu_cache_gb == 0 and c.options.hints is None)
    assert cands[0].flags(2.0) == ["--gpu", "h100", "--tp", "1", "--dp", "1", "--gpu-memory-fraction", "0.9",
                                   "--no-optimum", "--rate-scale", "2"]
    four = Candidate(Deployment("h100", 2, 2), Options(router="kv-aware"))
    assert four.flags()[:6] == ["--gpu", "h100", "--tp", "2", "--dp", "2"]
    assert space.cost(four) == 12.0
    assert all(space.searches(f) for f in ("cpu-tier", "hints", "kv-routing"))
    assert not _space(routers=("kv-aware",)).searches("kv-routing")


def test_a_bad_space_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPU-hour price for 'b200'"):
        _space(gpus={"b200": [1]})
    with pytest.raises(ValueError, match="instances must be an integer >= 1"):
        Deployment("h100", 1, 0)


# ---- the choice over fake candidates ----------------------------------------------------------


class Fake:
    """An evaluator from a table: candidate -> TTFT p99 at scale 1, divided by ``1 / scale``
    squared (more load, slower); counts what it was asked."""

    def __init__(self, ttft: dict[Candidate, float]) -> None:
        self.ttft = ttft
        self.asked: list[tuple[Candidate, float]] = []

    def __call__(self, pairs):
        self.asked += pairs
        return [Measured({"ttft_p99_s": self.ttft[c] * s * s}, None, 0.5) for c, s in pairs]


def test_the_choice_is_the_cheapest_that_meets_and_every_cheaper_one_was_run_and_failed() -> None:
    space = _space()
    cands = space.candidates()
    ttft = {c: 5.0 for c in cands}
    tp2_tier = next(c for c in cands if c.deployment == Deployment("h100", 2, 1)
                    and c.options.cpu_cache_gb > 0 and c.options.hints is None)
    two_kv = next(c for c in cands if c.deployment.instances == 2 and c.options.router == "kv-aware"
                  and c.deployment.gpus == 2)
    ttft[tp2_tier] = 1.5
    ttft[two_kv] = 1.2                        # the same cost, more headroom: the choice
    four_ll = next(c for c in cands if c.deployment == Deployment("h100", 1, 4)
                   and c.options.router == "least-loaded")
    ttft[four_ll] = 1.9
    fake = Fake(ttft)
    planner = Planner(space, SLO.parse("ttft-p99=2s"), fake)
    chosen = planner.cheapest()
    assert chosen.candidate == two_kv and chosen.meets
    assert [r.ratio for r in planner.runs.values()][:4] == [2.5] * 4      # level 1: all failed
    assert len(fake.asked) == 10                                          # levels 1 and 2 only
    saved = {s.feature: s for s in planner.saved(chosen)}
    assert saved["cpu-tier"].without.candidate == two_kv                  # not used: same choice
    assert saved["kv-routing"].without.candidate == tp2_tier              # same cost, 2 GPUs
    assert saved["hints"].without.candidate == two_kv
    ttft[two_kv] = ttft[tp2_tier] = 5.0                                   # now only 4 GPUs meet
    planner = Planner(space, SLO.parse("ttft-p99=2s"), Fake(ttft))
    chosen = planner.cheapest()
    assert chosen.candidate == four_ll
    assert planner.saved(chosen)[2].without.candidate == four_ll          # least-loaded: no KV
    before = planner.stats.simulated
    planner.cheapest()
    assert planner.stats.simulated == before and planner.stats.reused > 0  # runs are kept


def test_the_bound_prunes_without_simulating() -> None:
    space = _space(cpu_cache_gb=(0.0,), hints=(None,))
    fake = Fake({c: 1.0 for c in space.candidates()})
    planner = Planner(space, SLO.parse("ttft-p99=2s"), fake,
                      bound=lambda c, s, p: 3.0 if c.deployment.gpus == 1 else 0.0)
    chosen = planner.cheapest()
    assert chosen.candidate.deployment.gpus == 2
    assert planner.stats.pruned == 1 and all(c.deployment.gpus == 2 for c, _ in fake.asked)
    pruned = planner.runs[(space.candidates()[0], 1.0)]
    assert not pruned.simulated and pruned.bound_s == 3.0 and not pruned.meets


def test_goodput_bisects_to_the_precision_within_the_run_budget() -> None:
    """TTFT = 1 s x scale^2 against 2 s: met up to sqrt(2) = 1.414. Doubling: 1 meets, 2 fails;
    then geometric midpoints 1.41 (meets), 1.68 (fails), 1.54 (fails): bracket 1.41-1.54."""
    space = _space(cpu_cache_gb=(0.0,), hints=(None,))
    c = space.candidates()[0]
    planner = Planner(space, SLO.parse("ttft-p99=2s"), Fake({c: 1.0}))
    (g,) = planner.goodput([c], precision=1.1, max_runs=10)
    assert [r.scale for r in g.runs] == [1.0, 2.0, 1.41, 1.68, 1.54]
    assert (g.scale, g.fails_at) == (1.41, 1.54)
    (g,) = Planner(space, SLO.parse("ttft-p99=2s"), Fake({c: 40.0})).goodput([c], max_runs=3)
    assert [r.scale for r in g.runs] == [1.0, 0.5, 0.25] and g.scale is None and g.fails_at == 0.25


def test_goodput_rows_are_the_choice_and_the_deployments_closest_to_meeting() -> None:
    space = _space(cpu_cache_gb=(0.0,), hints=(None,))
    cands = space.candidates()
    planner = Planner(space, SLO.parse("ttft-p99=2s"), Fake({c: 3.5 - c.deployment.gpus for c in cands}),
                      bound=lambda c, s, p: 9.0 if c.deployment.gpus_per_instance == 2 else 0.0)
    chosen = planner.cheapest()
    listed = sorted((r for (_, s), r in planner.runs.items() if s == 1), key=lambda r: cands.index(r.candidate))
    # the choice (2 instances), then the closest to meeting: 1 GPU (ratio 1.25), then TP2 (pruned)
    assert [c.deployment for c in goodput_candidates(space, listed, chosen, 1)] == [
        Deployment("h100", 1, 2)]
    assert [c.deployment for c in goodput_candidates(space, listed, chosen, 2)] == [
        Deployment("h100", 1, 1), Deployment("h100", 1, 2)]
    assert [c.deployment for c in goodput_candidates(space, listed, chosen, 3)] == [
        Deployment("h100", 1, 1), Deployment("h100", 2, 1), Deployment("h100", 1, 2)]
    assert goodput_candidates(space, listed, chosen, 3)[-1] == chosen.candidate
    assert goodput_candidates(space, listed, chosen, 0) == []


def test_the_front_keeps_the_points_nothing_beats_in_both() -> None:
    assert pareto_front([(1, 5), (2, 4), (2, 1), (0.5, 6), (1, 3)]) == [1, 0, 3]
    assert _ranges([0, 1, 2, 5, 7, 8]) == "#0-2, #5, #7-8"


def test_every_option_becomes_its_simulate_flag() -> None:
    o = Options(0.8, 100.0, "s3fifo", "ttl=60:0.9", "approximate")
    assert o.flags() == ["--gpu-memory-fraction", "0.8", "--cpu-cache-gb", "100", "--eviction-policy",
                         "s3fifo", "--hints", "ttl=60:0.9", "--router", "approximate"]
    assert Deployment("h200", 4, 2).label() == "8 x h200 (2x4)"


# ---- the TTFT lower bound ----------------------------------------------------------------------


def _brute(a, work, m) -> float:
    """max over every window j..k and the m latest of it, by the definition."""
    best = 0.0
    n = len(work)
    for j in range(n):
        for k in range(j + m - 1, n):
            w = sorted(work[j:k + 1])
            best = max(best, a[j] - a[k] + sum(w[:len(w) - (m - 1)]))
    return best


def test_the_queue_bound_is_the_brute_force_over_windows() -> None:
    rng = random.Random(3)
    for _ in range(30):
        n = rng.randint(1, WINDOW_STARTS + 1)       # every window start is tried
        arrivals = np.cumsum([rng.random() for _ in range(n)])
        prompts = [rng.randint(100, 5000) for _ in range(n)]
        b = PrefillBound.of(arrivals, prompts, [0] * n)
        pct = rng.choice([50, 90, 99])
        m = PrefillBound.over(pct, n)
        want = _brute(list(arrivals), [p / 1000.0 for p in prompts], m)
        assert b.ttft_lower_bound(1000.0, pct) == pytest.approx(want)


def test_the_bound_holds_for_simulated_single_server_schedules() -> None:
    """One server at the capacity, FCFS, shortest-first or newest-first: the measured
    percentile is never below the bound (nor, with per-request floors, below those)."""
    rng = random.Random(7)
    for trial in range(40):
        n = rng.randint(5, 80)
        arrivals = np.sort([rng.uniform(0, 20) for _ in range(n)])
        prompts = [rng.randint(100, 20000) for _ in range(n)]
        hits = [rng.choice([0, p // 2]) for p in prompts]
        b = PrefillBound.of(arrivals, prompts, hits)
        cap = rng.choice([2000.0, 5000.0, 20000.0])
        work = [(p - h) / cap for p, h in zip(prompts, hits)]
        for order in ("fcfs", "sjf", "lifo"):
            t, done, ttft = 0.0, set(), [0.0] * n
            while len(done) < n:
                ready = [i for i in range(n) if i not in done and arrivals[i] <= t]
                if not ready:
                    t = min(arrivals[i] for i in range(n) if i not in done)
                    continue
                i = {"fcfs": min(ready), "sjf": min(ready, key=lambda i: work[i]),
                     "lifo": max(ready)}[order]
                t += work[i]
                ttft[i] = t - arrivals[i]
                done.add(i)
            for pct in (50, 90, 99):
                assert np.percentile(ttft, pct) >= b.ttft_lower_bound(cap, pct) - 1e-9, (trial, order)


def test_request_floors_are_the_budget_chunks_of_the_uncached_tokens() -> None:
    cost = cost_model(get_preset("llama-3.1-8b"), get_gpu("h100"), 1)
    b = PrefillBound.of([0.0, 1.0, 2.0], [10000, 3000, 5000], [4000, 3000, 0])
    floors = b.request_floors(cost, 4096)
    step = lambda x, c: cost.step_time_arrays(np.array([float(x)]), np.array([float(c)]))  # noqa: E731
    assert floors[0] == pytest.approx((step(4096, 4000) + step(1904, 8096)) / 1.02)
    assert floors[1] == 0.0                                              # fully hit
    assert floors[2] == pytest.approx((step(4096, 0) + step(904, 4096)) / 1.02)
    # p50 of 3: 2 requests must exceed a value for the percentile to: the 2nd largest floor
    assert b.ttft_lower_bound(1e12, 50, floors=floors) == pytest.approx(min(floors[0], floors[2]))
    rate = peak_prefill_rate(cost, 8192)
    assert rate >= 8192 / step(8192, 0) * 1.02


# ---- the early stop and the workload's rate ------------------------------------------------------


def test_a_run_stops_once_the_ttft_target_is_missed_and_runs_whole_otherwise() -> None:
    items = items_from_trace(get_workload("chat", seed=1, num_conversations=6, turns=3))
    cfg = SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=4000,
                    optimum=False, sched=SchedulerConfig(max_num_seqs=2))
    whole = Simulator(cfg).run(items)
    assert StopAtMiss(cfg, (1e9,), (1,)).run(items).to_json()["ttft_p99_s"] == whole.to_json()["ttft_p99_s"]
    fast = scale_rate(items, 1000.0)                     # everything at once: a queue
    with pytest.raises(SLOMissed, match="no first token 0.001 s after arriving"):
        StopAtMiss(cfg, (1e-3,), (2,)).run(fast)


def test_the_executors_run_a_stopping_job_and_name_the_miss() -> None:
    from hybridkv.sim.executors import execute
    items = scale_rate(items_from_trace(get_workload("chat", seed=1, num_conversations=6, turns=3)), 1000.0)
    cfg = SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=4000,
                    optimum=False, sched=SchedulerConfig(max_num_seqs=2))
    (out,) = list(execute([StopAtMiss(cfg, (1e-3,), (2,))], items))
    assert out.result is None and out.error.startswith("SLOMissed: ")


def test_rate_scale_and_duration_cut_the_workload_by_hand() -> None:
    items = items_from_trace(get_workload("chat", seed=1, num_conversations=4, turns=2))
    t0 = items[0].arrival_s
    fast = scale_rate(items, 4.0)
    assert [it.arrival_s for it in fast] == pytest.approx([t0 + (it.arrival_s - t0) / 4 for it in items])
    assert [it.request_id for it in fast] == [it.request_id for it in items]
    assert scale_rate(items, 1) is items
    span = items[-1].arrival_s - t0
    assert first_seconds(items, span) == items
    assert len(first_seconds(items, span / 2)) == sum(it.arrival_s <= t0 + span / 2 for it in items)
    for bad, fn in ((0.0, scale_rate), (float("inf"), scale_rate), (-1.0, first_seconds)):
        with pytest.raises(ValueError, match="> 0"):
            fn(items, bad)
