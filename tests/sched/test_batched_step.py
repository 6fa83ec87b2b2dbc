"""The batched step against the per-request step of the same scheduler (the reference).

Two managers and two schedulers, identical but for ``SchedulerConfig.batched``, run the same
random workload in lockstep (same arrivals, same sampled tokens, same drafts, same aborts);
every step must schedule the same slots (request, start, tokens, drafts, samples, new blocks,
state blocks) in the same order, preempt and admit the same requests, finish the same ones,
and leave the same block tables and pool. Workloads cover speculative decoding with budget
and max_model_len cuts, preemption under a small pool, chunked prefill and prefill caps,
both policies, sliding-window hybrids and state groups. The simulator's results are
compared the same way on bundled workloads.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, Request, SpecDecode
from hybridkv.core.specs import KVCacheConfig, KVCacheGroup, StateSpec
from hybridkv.sched import EngineRequest, RequestStatus, Scheduler, SchedulerConfig
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.simulator import TIMING_KEYS
from hybridkv.sim.tiers.config import TierConfig
from hybridkv.sim.traffic.workloads import get_workload
from tests.support.helpers import FA, SWA, config
from hybridkv.core.cache_options import CacheOptions


def _slots(out) -> list[tuple]:
    return [(s.req.request_id, s.start, s.num_new_tokens, s.num_draft_tokens, s.samples,
             s.new_block_ids, s.state_blocks) for s in out.scheduled]


def _kv_state(kv: KVCacheManager, sched: Scheduler) -> tuple:
    tables = {r.request_id: kv.block_ids(r.request) for r in sched.running}
    return tables, kv.num_free_blocks, kv.stats(), kv.pool.num_evictions


@st.composite
def workloads(draw):
    kind = draw(st.sampled_from(["full", "hybrid", "state"]))
    bs = draw(st.sampled_from([2, 4]))
    if kind == "state":
        a = draw(st.sampled_from([bs, 2 * bs]))
        groups = (KVCacheGroup("full", FA(bs), ("f",)),
                  KVCacheGroup("state", StateSpec(a, conv_shape=(1, 4), state_shape=(2, 4)), ("s",)))
        make_config = lambda n: KVCacheConfig(groups, num_blocks=n)   # noqa: E731
        specs_blocks = 2 * -(-60 // bs) + 8
        retention = draw(st.sampled_from([None, 0, 2 * a]))
    else:
        specs = [FA(bs)] + ([SWA(bs, draw(st.sampled_from([3, 8])))] if kind == "hybrid" else [])
        make_config = lambda n: config(*specs, num_blocks=n)           # noqa: E731
        specs_blocks = sum(-(-60 // bs) for _ in specs) + 1
        retention = draw(st.sampled_from([None, 0])) if kind == "hybrid" else 0
    method = draw(st.sampled_from([None, None, "eagle", "mtp", "ngram", "dflash"]))
    spec = SpecDecode(method, draw(st.integers(1, 3))) if method else None
    shared = [draw(st.integers(0, 5)) for _ in range(draw(st.integers(0, 16)))]
    reqs = []
    for i in range(draw(st.integers(1, 12))):
        tail = [100 + i * 50 + j for j in range(draw(st.integers(1, 20)))]
        prefix = shared[:draw(st.integers(0, len(shared)))]
        reqs.append((prefix + tail, draw(st.integers(1, 14)), draw(st.integers(0, 8)),
                     draw(st.integers(0, 3))))
    chunked = draw(st.booleans())
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(4, 40)) if chunked else 60,
        max_num_seqs=draw(st.integers(1, 8)), enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        reserve_full_sequence=draw(st.booleans()))
    num_blocks = specs_blocks + draw(st.integers(0, 40))     # small pools preempt
    return (make_config, num_blocks, retention, spec, reqs, sched_cfg, draw(st.integers(0, 2**16)),
            draw(st.sampled_from([0.0, 0.0, 0.05])))


def _pair(w, batched: bool):
    make_config, num_blocks, retention, spec, reqs, sched_cfg, _, _ = w
    kv = KVCacheManager(make_config(num_blocks), CacheOptions(
        spec_decode=spec, retention_interval=retention, max_model_len=60))
    sched = Scheduler(kv, dataclasses.replace(sched_cfg, batched=batched))
    arrivals: dict[int, list[EngineRequest]] = {}
    for i, (tokens, max_tokens, at, prio) in enumerate(reqs):
        arrivals.setdefault(at, []).append(
            EngineRequest(Request(f"r{i}", tokens), max_tokens, priority=prio, arrival_time=float(at),
                          stop_token_ids=(7 * 61,)))
    return kv, sched, arrivals


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_batched_step_schedules_what_the_per_request_step_does(w) -> None:
    seed, abort_rate = w[6], w[7]
    runs = [_pair(w, batched) for batched in (True, False)]
    rngs = [random.Random(seed), random.Random(seed)]
    k = runs[0][1].max_drafts
    outputs: list[dict] = [{}, {}]
    for step in range(3000):
        seen = []
        for (kv, sched, arrivals), rng, done in zip(runs, rngs, outputs):
            for r in arrivals.pop(step, []):
                sched.add_request(r)
            if not sched.has_unfinished() and not arrivals:
                seen.append(None)
                continue
            if abort_rate and sched.running and rng.random() < abort_rate:
                sched.abort_request(sched.running[rng.randrange(len(sched.running))].request_id)
            out = sched.schedule()
            record = [_slots(out), [r.request_id for r in out.preempted],
                      [r.request_id for r in out.admitted], out.num_scheduled_tokens,
                      len(out.requests), _kv_state(kv, sched)]
            # sampled tokens: one list per slot; the accepted drafts are drawn per slot
            sampled = []
            for s in out.scheduled:
                if not s.samples:
                    sampled.append(None)
                    continue
                a = rng.randint(0, s.num_draft_tokens) if s.num_draft_tokens else 0
                n = len(s.req.request.token_ids)
                sampled.append([7 * (n + j) for j in range(a + 1)])
            finished = sched.update(out, sampled)
            for r in finished:
                done[r.request_id] = (r.status, list(r.request.token_ids))
            record += [[r.request_id for r in finished], _kv_state(kv, sched)]
            if k:  # drafts for every decoding request, sometimes more than are useful
                for r in sched.running:
                    req = r.request
                    if req.num_computed_tokens + 1 == req.num_tokens:
                        r.spec_token_ids = [0] * rng.randint(0, k)
            kv.check_integrity()
            seen.append(record)
        assert seen[0] == seen[1], f"step {step}"
        if seen[0] is None:
            break
    else:
        pytest.fail("no progress in 3000 steps")
    assert outputs[0] == outputs[1]
    assert all(st_.finished for st_, _ in outputs[0].values())


def test_the_batched_step_calls_the_manager_only_off_the_fast_path() -> None:
    """The batch path is not dead code: with batching, allocate() is called for exactly the
    (step, request) pairs where the per-request step's allocate() left the fast path (its
    coordinator allocated: planned and committed, or applied a running request's step
    directly), and for no decode step in between."""
    calls: list[list[tuple]] = []
    for batched in (True, False):
        kv = KVCacheManager(config(FA(16), num_blocks=200))
        sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=256, batched=batched))
        seen: list[tuple] = []
        spied = [(kv, "allocate")] if batched else \
            [(kv.coordinator, "allocate"), (kv.coordinator, "_step")]
        depth = [0]                 # a call inside a spied call is the same allocation

        for inner, name in spied:
            def spy(req, *a, _original=getattr(inner, name), _seen=seen, _sched=sched, **kw):
                if not depth[0]:
                    _seen.append((_sched.step_index, req.request_id, req.num_computed_tokens))
                depth[0] += 1
                try:
                    return _original(req, *a, **kw)
                finally:
                    depth[0] -= 1
            setattr(inner, name, spy)
        for i in range(4):
            sched.add_request(EngineRequest(Request(f"r{i}", list(range(i * 100, i * 100 + 20))), 40))
        steps = 0
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update(out, [[9] if s else None for s in out.samples])
            steps += 1
        assert steps == 40          # the prompts, then 39 decode steps
        calls.append(seen)
    assert calls[0] == calls[1]
    assert 4 < len(calls[0]) < 40   # 4 prompts + 156 decode steps, a few off the fast path


@pytest.mark.parametrize("edge", ["budget", "max_model_len"])
def test_a_quiet_step_that_just_fits_takes_the_fast_path(edge) -> None:
    """A quiet decode step that takes the budget's last token, or whose drafts end exactly at
    the scheduler's max_model_len, is a slot of the batch: no allocate() call for it, and the
    step is the per-request path's."""
    spec = SpecDecode("eagle", 3) if edge == "max_model_len" else None
    n = 1 if edge == "budget" else 8
    runs = []
    for batched in (True, False):
        kv = KVCacheManager(config(FA(32), num_blocks=20), CacheOptions(spec_decode=spec))
        sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=3 if edge == "budget" else 64,
                                              max_model_len=12, batched=batched))
        for i in range(3):
            sched.add_request(EngineRequest(Request(f"r{i}", list(range(10 * i, 10 * i + n))), 4))
        for _ in range(2):                                     # the prompts, a first decode
            sched.update(sched.schedule(), [[1]] * 3)
        if spec:
            sched.running[0].spec_token_ids = [5, 6]           # 9 + 1 + 2 = 12 = max_model_len
        calls = []
        original = kv.allocate
        kv.allocate = lambda req, *a, _o=original, _c=calls, **kw: _c.append(req.request_id) or _o(req, *a, **kw)
        out = sched.schedule()
        runs.append((_slots(out), calls))
    (slots, calls), (reference, _) = runs
    assert slots == reference
    assert [s[:4] for s in slots] == ([("r0", 2, 1, 0), ("r1", 2, 1, 0), ("r2", 2, 1, 0)]
                                      if edge == "budget" else
                                      [("r0", 9, 3, 2), ("r1", 9, 1, 0), ("r2", 9, 1, 0)])
    assert calls == []


def test_sampled_by_slot_must_match_the_batch() -> None:
    kv = KVCacheManager(config(FA(4), num_blocks=40))
    sched = Scheduler(kv)
    sched.add_request(EngineRequest(Request("a", [1, 2, 3]), 2))
    out = sched.schedule()
    with pytest.raises(ValueError, match="sampled has 2 entries for a step of 1"):
        sched.update(out, [[5], [6]])
    assert sched.update(out, [[5]]) == []
    assert sched.requests["a"].status is RequestStatus.RUNNING


def test_batched_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="batched must be True or False, got 1"):
        SchedulerConfig(batched=1)   # type: ignore[arg-type]


@pytest.mark.parametrize("preset, blocks, spec, tiers", [
    ("llama-3.1-8b", 300, SpecDecode("eagle", 3), None),       # drafts, preemption
    ("llama-3.1-8b", 300, None, TierConfig(cpu_cache_tokens=20_000)),  # a CPU tier: loads, saves
    ("gemma-3-27b", 400, None, None),                           # sliding-window hybrid, preemption
    ("qwen3-next-80b-a3b", 2000, None, None),                  # state groups
])
def test_simulator_results_equal_with_and_without_batching(preset, blocks, spec, tiers) -> None:
    items = items_from_trace(get_workload("chat", num_conversations=12, turns=3, seed=3))
    res = []
    for batched in (True, False):
        cfg = SimConfig(get_preset(preset), get_gpu("h100"), num_blocks=blocks, spec=spec,
                        sched=SchedulerConfig(max_num_batched_tokens=512, batched=batched),
                        optimum=False, seed=2, tiers=tiers)
        d = Simulator(cfg).run(items).to_json()
        for key in TIMING_KEYS:
            d.pop(key)
        res.append(d)
    assert res[0] == res[1]
    assert res[0]["steps"] > 40 and res[0]["output_tokens"] > 0
    if tiers is not None:
        assert res[0]["load_s_total"] > 0           # the tier served loads


def test_quiet_steps_answers_what_allocate_does() -> None:
    """KVCacheManager.quiet_steps: True exactly when allocate() would hand out no block and
    change nothing (its fast path); False for a request the manager does not hold."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=60), CacheOptions(max_model_len=40))
    reqs = [Request(f"q{i}", list(range(10 * i, 10 * i + 6))) for i in range(3)]
    assert kv.quiet_steps(reqs, [1, 1, 1]) == [False, False, False]      # not held yet
    for r in reqs:
        assert kv.allocate(r, 6) is not None
        r.num_computed_tokens = 6
        r.append_tokens([1000])
    seen = set()
    for _ in range(14):                          # q1 ends at 34 tokens (max_model_len 40)
        answers = kv.quiet_steps(reqs, [1, 2, 1])
        seen.update(answers)
        for r, n, quiet in zip(reqs, [1, 2, 1], answers):
            free, stats = kv.num_free_blocks, kv.stats()
            new = kv.allocate(r, n)
            assert new is not None
            changed = any(new) or kv.num_free_blocks != free or kv.stats() != stats
            if quiet:
                assert not changed, (r, n)
            r.num_computed_tokens += n
            r.append_tokens([1000 + j for j in range(n)])
    assert seen == {True, False}                 # both answers met (block boundaries, windows)
    kv.check_integrity()
    assert kv.quiet_steps([reqs[0]], [40]) == [False]                    # past max_model_len


def test_the_batched_quiet_test_is_the_per_request_one() -> None:
    """quiet_steps (one coordinator call for the batch, ``steps_quiet``) answers, request by
    request, what the coordinator's ``step_is_quiet`` answers: the same list at every step of
    a run through block boundaries and window slides, False for a request not held and for
    another Request object with a held id, and pairs the two lists as ``zip`` does."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=60), CacheOptions(max_model_len=40))
    coord = kv.coordinator
    reqs = [Request(f"b{i}", list(range(10 * i, 10 * i + 5 + i))) for i in range(3)]
    for r in reqs:
        assert kv.allocate(r, r.num_tokens) is not None
        r.num_computed_tokens = r.num_tokens
        r.append_tokens([1000])
    twin = Request("b0", list(range(5)))
    twin.num_computed_tokens = reqs[0].num_computed_tokens
    stranger = Request("nobody", [1, 2, 3])
    batch = [*reqs, twin, stranger]
    nums = [1, 2, 1, 1, 1]
    answers = []
    for _ in range(12):
        got = kv.quiet_steps(batch, nums)
        assert got == [coord.step_is_quiet(r, n, kv.lookahead_slots) for r, n in zip(batch, nums)]
        assert got[3:] == [False, False]
        answers.append(got[:3])
        for r, n in zip(reqs, nums):
            assert kv.allocate(r, n) is not None
            r.num_computed_tokens += n
            r.append_tokens([2000 + j for j in range(n)])
    assert {a for step in answers for a in step} == {True, False}
    assert kv.quiet_steps(batch, nums[:2]) == kv.quiet_steps(batch[:2], nums)[:2]
    assert len(kv.quiet_steps(batch, nums[:2])) == 2
    kv.check_integrity()
