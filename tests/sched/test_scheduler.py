"""Scheduler invariants under random workloads, and its rules one at a time."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, Request, SpecDecode
from hybridkv.sched import (POLICIES, AcceptanceModel, EngineRequest, FCFSQueue, PriorityQueue, RequestStatus,
                            Scheduler, SchedulerConfig, useful_drafts)
from tests.support.helpers import FA, SWA, config
from hybridkv.core.cache_options import CacheOptions


def _engine_request(rid, tokens, max_tokens, **kw) -> EngineRequest:
    return EngineRequest(Request(rid, tokens), max_tokens, **kw)


def _drive(sched: Scheduler, acc: AcceptanceModel | None, arrivals: dict[int, list[EngineRequest]],
           max_steps: int = 20_000, check=None) -> list[EngineRequest]:
    """Run to completion; sampled token = 7 * position (deterministic), drafts all zeros."""
    finished: list[EngineRequest] = []
    step = 0
    k = sched.max_drafts
    while arrivals or sched.has_unfinished():
        for r in arrivals.pop(step, []):
            sched.add_request(r)
        out = sched.schedule()
        if check:
            check(sched, out)
        sampled = {}
        for s in out.scheduled:
            if s.samples:
                a = min(acc.draw(), s.num_draft_tokens) if (acc and s.num_draft_tokens) else 0
                n = len(s.req.request.token_ids)
                sampled[s.req.request_id] = [7 * (n + j) for j in range(a + 1)]
        finished += sched.update(out, sampled)
        if k:
            for r in sched.running:
                req = r.request
                if req.num_computed_tokens + 1 == req.num_tokens:
                    r.spec_token_ids = [0] * min(k, r.max_tokens - r.num_output_tokens - 1)
        step += 1
        assert step < max_steps, "the scheduler made no progress"
    return finished


@st.composite
def workloads(draw):
    hybrid = draw(st.booleans())
    bs = draw(st.sampled_from([2, 4]))
    specs = [FA(bs)] + ([SWA(bs, draw(st.sampled_from([3, 8])))] if hybrid else [])
    spec = draw(st.sampled_from([None, "eagle", "dflash", "ngram", "mtp"]))
    k = draw(st.integers(1, 3))
    spec_decode = SpecDecode(spec, k) if spec else None
    retention = draw(st.sampled_from([None, 0])) if hybrid else 0
    n_req = draw(st.integers(1, 10))
    shared = [draw(st.integers(0, 5)) for _ in range(draw(st.integers(0, 12)))]
    reqs = []
    for i in range(n_req):
        tail = [100 + i * 50 + j for j in range(draw(st.integers(1, 20)))]
        prefix = shared[:draw(st.integers(0, len(shared)))]
        reqs.append((prefix + tail, draw(st.integers(1, 12)), draw(st.integers(0, 8)),
                     draw(st.integers(0, 3))))
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(4, 40)), max_num_seqs=draw(st.integers(1, 6)),
        enable_chunked_prefill=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5])),
        policy=draw(st.sampled_from(["fcfs", "priority"])))
    # at least one max_model_len (60) request in every group, plus 0..40 blocks of slack
    need = sum(-(-60 // bs) for _ in specs) + 1
    num_blocks = need + draw(st.integers(0, 40))
    return specs, spec_decode, retention, reqs, sched_cfg, num_blocks, draw(st.integers(0, 9))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_scheduler_invariants_under_random_workloads(w) -> None:
    specs, spec_decode, retention, reqs, sched_cfg, num_blocks, seed = w
    max_len = 60
    kv = KVCacheManager(config(*specs, num_blocks=num_blocks), CacheOptions(
        spec_decode=spec_decode, retention_interval=retention, max_model_len=max_len))
    if not sched_cfg.enable_chunked_prefill and sched_cfg.max_num_batched_tokens < max_len:
        sched_cfg = SchedulerConfig(max_num_batched_tokens=max_len, max_num_seqs=sched_cfg.max_num_seqs,
                                    enable_chunked_prefill=False, policy=sched_cfg.policy)
    sched = Scheduler(kv, sched_cfg)
    acc = AcceptanceModel(spec_decode.num_speculative_tokens, rate=0.6, seed=seed) if spec_decode else None
    arrivals: dict[int, list[EngineRequest]] = {}
    wanted = {}
    for i, (tokens, max_tokens, at, prio) in enumerate(reqs):
        r = _engine_request(f"r{i}", tokens, max_tokens, priority=prio, arrival_time=float(at))
        arrivals.setdefault(at, []).append(r)
        wanted[r.request_id] = min(max_tokens, max_len - len(tokens))

    def check(s: Scheduler, out) -> None:
        assert out.num_scheduled_tokens == sum(x.num_new_tokens for x in out.scheduled)
        assert out.num_scheduled_tokens <= sched_cfg.max_num_batched_tokens
        assert len(s.running) <= sched_cfg.max_num_seqs
        ids = [x.req.request_id for x in out.scheduled]
        assert len(ids) == len(set(ids))
        for x in out.scheduled:
            assert x.req.status is RequestStatus.RUNNING
            assert x.num_draft_tokens <= (spec_decode.num_speculative_tokens if spec_decode else 0)
            tables = kv.block_ids(x.req.request)
            # blocks cover the scheduled tokens plus the lookahead slots (up to max_model_len)
            need = min(x.start + x.num_new_tokens + kv.lookahead_slots, max_len)
            for g, t in zip(kv.config.groups, tables):
                assert len(t) * g.spec.block_size >= need
        for r in out.preempted:
            assert r.request_id not in kv.coordinator.reqs and r.num_computed_tokens == 0
        # every unfinished request is in exactly one of waiting / running / loading, under
        # both policies; the waiting queue lists its requests in the order it admits them
        waiting = list(s.waiting)
        assert len(waiting) == s.num_waiting == len(s.waiting)
        assert sorted(map(id, waiting + s.running + s.loading)) == sorted(map(id, s.requests.values()))
        assert s.waiting.peek() is (waiting[0] if waiting else None)
        if sched_cfg.policy == "priority":
            keys = [(r.priority, r.arrival_time, r._seq) for r in waiting]
            assert keys == sorted(keys)
        kv.check_integrity()

    finished = _drive(sched, acc, arrivals, check=check)
    assert sorted(r.request_id for r in finished) == sorted(wanted)
    for r in finished:
        assert r.num_output_tokens == wanted[r.request_id]
        # the sampled tokens are a function of position: resumed requests continued exactly
        assert r.output_token_ids == [7 * (r.num_prompt_tokens + j) for j in range(r.num_output_tokens)]
        assert r.status in (RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_MAX_MODEL_LEN)
    # nothing is referenced any more, and what was cached stays cached
    pool = kv.pool
    assert all(c == 0 for c in pool.ref_cnt)
    assert pool.num_free == pool.num_blocks - 1
    if finished[-1].num_tokens - 1 >= kv.config.alignment:  # the last one's KV stays cached
        assert any(h is not None for h in pool.block_hash)
    kv.check_integrity()


def _kv(num_blocks=64, bs=4, **kw) -> KVCacheManager:
    return KVCacheManager(config(FA(bs), num_blocks=num_blocks), CacheOptions(**kw))


def test_chunked_prefill_splits_by_budget_and_decodes_share_the_step() -> None:
    sched = Scheduler(_kv(), SchedulerConfig(max_num_batched_tokens=10))
    a = _engine_request("a", list(range(25)), 3)
    sched.add_request(a)
    starts = []
    while a.status is not RequestStatus.FINISHED_LENGTH:
        out = sched.schedule()
        starts.append([(s.start, s.num_new_tokens) for s in out.scheduled])
        sched.update(out, {s.req.request_id: [1] for s in out.scheduled if s.samples})
    assert starts == [[(0, 10)], [(10, 10)], [(20, 5)], [(25, 1)], [(26, 1)]]


def test_without_chunked_prefill_a_long_prompt_waits_for_a_whole_budget() -> None:
    sched = Scheduler(_kv(), SchedulerConfig(max_num_batched_tokens=16, enable_chunked_prefill=False))
    sched.add_request(_engine_request("a", list(range(10)), 5))
    sched.add_request(_engine_request("b", list(range(50, 60)), 5))
    out = sched.schedule()
    assert [s.req.request_id for s in out.scheduled] == ["a"]  # b's 10 tokens exceed the 6 left


def test_prefix_hit_is_counted_and_skipped() -> None:
    kv = _kv()
    sched = Scheduler(kv)
    a = _engine_request("a", list(range(20)), 2)
    _drive(sched, None, {0: [a]})
    b = _engine_request("b", list(range(20)) + [99, 98], 2)
    sched.add_request(b)
    out = sched.schedule()
    assert b.num_cached_tokens == 20 and out.scheduled[0].start == 20
    assert out.admitted == [b]


def test_preemption_by_recompute_keeps_cached_blocks_and_resumes() -> None:
    # 9 usable blocks of 4 tokens: two 16-token prompts fit, their decodes do not
    kv = _kv(num_blocks=10)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64))
    a = _engine_request("a", list(range(16)), 8)
    b = _engine_request("b", list(range(100, 116)), 8)
    preempted = []

    def check(s, out):
        preempted.extend(r.request_id for r in out.preempted)
        kv.check_integrity()
    finished = _drive(sched, None, {0: [a, b]}, check=check)
    assert preempted and preempted[0] == "b"          # FCFS: the latest arrival goes
    assert {r.request_id for r in finished} == {"a", "b"}
    assert b.request.num_preemptions >= 1 and b.num_output_tokens == 8
    assert kv.stats().preempted_hits > 0              # b resumed from its own cached prefix
    assert b.num_cached_tokens == 0                   # its first admission's hit, not the resume's


def test_priority_policy_orders_admission_and_preempts_the_lowest_priority() -> None:
    kv = _kv(num_blocks=10)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, policy="priority"))
    low = _engine_request("low", list(range(16)), 8, priority=5, arrival_time=0.0)
    high = _engine_request("high", list(range(100, 116)), 8, priority=1, arrival_time=1.0)
    mid = _engine_request("mid", list(range(200, 204)), 1, priority=3, arrival_time=2.0)
    for r in (low, mid, high):
        sched.add_request(r)
    out = sched.schedule()
    assert [s.req.request_id for s in out.scheduled] == ["high", "mid"]
    sched.update(out, {"high": [1], "mid": [1]})
    with pytest.raises(RuntimeError, match="got step 0's output"):
        sched.update(out, {})
    preempted = []
    _drive(sched, None, {}, check=lambda s, o: preempted.extend(r.request_id for r in o.preempted))
    assert "high" not in preempted


@pytest.mark.parametrize("policy", POLICIES)
def test_both_policies_expose_their_waiting_requests_in_admission_order(policy: str) -> None:
    # one seat: everything but the running request waits; a preempted one waits again
    kv = _kv(num_blocks=10)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, policy=policy))
    reqs = [_engine_request("a", list(range(16)), 8, priority=2, arrival_time=0.0),
            _engine_request("b", list(range(100, 104)), 2, priority=0, arrival_time=1.0),
            _engine_request("c", list(range(200, 204)), 2, priority=1, arrival_time=2.0),
            _engine_request("d", list(range(300, 304)), 2, priority=1, arrival_time=2.0)]
    for r in reqs:
        sched.add_request(r)
    expect = ["a", "b", "c", "d"] if policy == "fcfs" else ["b", "c", "d", "a"]
    assert [r.request_id for r in sched.waiting] == expect
    assert sched.num_waiting == len(sched.waiting) == 4 and bool(sched.waiting)
    assert sched.waiting.peek().request_id == expect[0] and reqs[2] in sched.waiting
    out = sched.schedule()
    assert [x.req.request_id for x in out.scheduled] == expect[:1]
    assert [r.request_id for r in sched.waiting] == expect[1:]
    sched.abort_request(expect[2])
    assert [r.request_id for r in sched.waiting] == expect[1:2] + expect[3:]
    with pytest.raises(ValueError):
        sched.waiting.remove(sched.running[0])  # running, not waiting
    sched.update(out, {expect[0]: [1]})
    order = []
    for _ in range(100):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        order += [r.request_id for r in out.admitted]
        sched.update(out, {x.req.request_id: [1] for x in out.scheduled if x.samples})
    assert order == expect[1:2] + expect[3:]
    assert not sched.waiting and sched.waiting.peek() is None and list(sched.waiting) == []


def test_preempted_requests_go_back_by_policy() -> None:
    running = [_engine_request(x, [1, 2], 1, priority=p, arrival_time=t)
               for x, p, t in (("x", 0, 0.0), ("y", 3, 1.0), ("z", 1, 2.0))]
    for i, r in enumerate(running):
        r._seq = i
    assert FCFSQueue.victim(running).request_id == "z"
    assert PriorityQueue.victim(running).request_id == "y"
    fcfs, prio = FCFSQueue(), PriorityQueue()
    for q in (fcfs, prio):
        q.push(running[0])
        q.push_preempted(running[1])
    assert [r.request_id for r in fcfs] == ["y", "x"]   # FCFS: a preempted request resumes first
    assert [r.request_id for r in prio] == ["x", "y"]   # priority: by its key as always
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'; valid: fcfs, priority"):
        SchedulerConfig(policy="lifo")


def test_spec_decode_steps_verify_drafts_and_roll_back_rejections() -> None:
    kv = _kv(spec_decode=SpecDecode("eagle", 3))
    sched = Scheduler(kv)
    a = _engine_request("a", list(range(8)), 10)
    sched.add_request(a)
    out = sched.schedule()
    sched.update(out, {"a": [50]})
    a.spec_token_ids = [1, 2, 3]
    out = sched.schedule()
    (s,) = out.scheduled
    assert (s.start, s.num_new_tokens, s.num_draft_tokens) == (8, 4, 3)
    assert s.token_ids() == [50, 1, 2, 3]
    assert len(kv.block_ids(a.request)[0]) * 4 >= 8 + 4 + 3   # + k lookahead slots
    sched.update(out, {"a": [1, 60]})                       # one draft accepted, one bonus
    assert a.output_token_ids == [50, 1, 60] and a.num_computed_tokens == 10
    a.spec_token_ids = [0, 0, 0, 0]
    with pytest.raises(ValueError, match="at most k=3"):
        sched.schedule()


def test_dflash_drafter_window_is_checked() -> None:
    with pytest.raises(ValueError, match="window must be >= 4"):
        SpecDecode("dflash", 3, drafter_window=3)
    kv = _kv(spec_decode=SpecDecode("dflash", 3, drafter_window=4))
    assert kv.lookahead_slots == 4
    sched = Scheduler(kv)
    assert sched.drafter_window == 4


def test_stop_tokens_and_max_model_len_finish_requests() -> None:
    sched = Scheduler(_kv(max_model_len=12))
    a = _engine_request("a", list(range(8)), 10, stop_token_ids=[42])
    b = _engine_request("b", list(range(50, 58)), 10)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    fin = sched.update(out, {"a": [42], "b": [1]})
    assert fin == [a] and a.status is RequestStatus.FINISHED_STOPPED and a.output_token_ids == [42]
    while b.status is RequestStatus.RUNNING:
        out = sched.schedule()
        sched.update(out, {"b": [1]})
    assert b.status is RequestStatus.FINISHED_MAX_MODEL_LEN and b.num_tokens == 12


def test_bad_input_errors_name_the_value() -> None:
    kv = _kv(max_model_len=12)
    sched = Scheduler(kv)
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1, got 0"):
        _engine_request("a", [1, 2], 0)
    with pytest.raises(ValueError, match="leaves no room"):
        sched.add_request(_engine_request("a", list(range(12)), 1))
    sched.add_request(_engine_request("a", [1, 2], 1))
    with pytest.raises(ValueError, match="already in the scheduler"):
        sched.add_request(_engine_request("a", [1, 2], 1))
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'"):
        SchedulerConfig(policy="lifo")
    with pytest.raises(ValueError, match="max_num_batched_tokens must be an integer >= 1, got 0"):
        SchedulerConfig(max_num_batched_tokens=0)


def test_a_request_the_pool_can_never_hold_is_a_clear_error() -> None:
    sched = Scheduler(_kv(num_blocks=4))
    sched.add_request(_engine_request("big", list(range(40)), 1))
    with pytest.raises(RuntimeError, match="cannot hold request 'big'"):
        sched.schedule()


def test_abort_frees_blocks() -> None:
    kv = _kv()
    sched = Scheduler(kv)
    a = _engine_request("a", list(range(9)), 5)
    sched.add_request(a)
    sched.schedule()
    with pytest.raises(RuntimeError, match="before update"):
        sched.schedule()
    sched.abort_request("a")
    assert a.status is RequestStatus.FINISHED_ABORTED and not sched.has_unfinished()
    assert kv.pool.num_free == kv.pool.num_blocks - 1


def test_acceptance_model_is_seeded_and_matches_its_distribution() -> None:
    a = AcceptanceModel(3, rate=0.5, seed=1)
    b = AcceptanceModel(3, rate=0.5, seed=1)
    xs = [a.draw() for _ in range(20000)]
    assert xs == [b.draw() for _ in range(20000)]
    mean = sum(xs) / len(xs)
    assert abs(mean - a.mean_accepted) < 0.03 and abs(a.mean_accepted - (0.5 + 0.25 + 0.125)) < 1e-12
    assert set(xs) == {0, 1, 2, 3}
    c = AcceptanceModel(2, probs=[0.0, 0.0, 1.0])
    assert {c.draw() for _ in range(100)} == {2}
    with pytest.raises(ValueError, match="k \\+ 1 = 3 entries"):
        AcceptanceModel(2, probs=[0.5, 0.5])
    with pytest.raises(ValueError, match="exactly one"):
        AcceptanceModel(2)
    random.seed(0)


def test_useful_drafts_is_the_one_draft_count_rule() -> None:
    # prompt 10, max_tokens 6, max_model_len 20: drafts + the bonus token must fit both limits
    r = _engine_request("r", list(range(10)), 6)
    assert useful_drafts(r, 3, None) == 3                 # 6 outputs left: 3 drafts + bonus fit
    assert useful_drafts(r, 0, None) == 0                 # no speculative method
    assert useful_drafts(r, 3, None, num_tokens=13) == 2  # 3 outputs left: 2 drafts + bonus
    assert useful_drafts(r, 3, None, num_tokens=15) == 0  # 1 output left: the bonus alone
    assert useful_drafts(r, 3, 12) == 1                   # 2 positions left under max_model_len
    assert useful_drafts(r, 3, 11) == 0 and useful_drafts(r, 3, 10) == 0   # never negative


def test_config_bounds_name_the_field_and_accept_the_lowest_valid_value() -> None:
    """A max_model_len of 1 or a negative long-prefill threshold was accepted, or rejected with
    an error that did not name the field; 2 and 0 (their lowest valid values) were refused."""
    with pytest.raises(ValueError, match="^max_model_len must be None or an integer >= 2, got 1$"):
        SchedulerConfig(max_model_len=1)
    assert SchedulerConfig(max_model_len=2).max_model_len == 2
    with pytest.raises(ValueError,
                       match="^long_prefill_token_threshold must be an integer >= 0, got -1$"):
        SchedulerConfig(long_prefill_token_threshold=-1)
    assert SchedulerConfig(long_prefill_token_threshold=0).long_prefill_token_threshold == 0


def test_wrong_argument_types_are_named_in_the_error() -> None:
    """Passing a non-manager, a non-config or a non-request gave an error without the type
    that was passed."""
    with pytest.raises(ValueError, match="^Scheduler needs a KVCacheManager, got str$"):
        Scheduler("kv")
    with pytest.raises(ValueError, match="^config must be a SchedulerConfig, got dict$"):
        Scheduler(_kv(), {"policy": "fcfs"})
    for empty in ({}, [], 0):       # falsy, yet not "no config": never the defaults in silence
        with pytest.raises(ValueError, match=f"^config must be a SchedulerConfig, got {type(empty).__name__}$"):
            Scheduler(_kv(), empty)
    with pytest.raises(ValueError, match="^add_request needs an EngineRequest, got Request$"):
        Scheduler(_kv()).add_request(Request("a", [1, 2]))


def test_step_index_counts_the_steps_and_a_missing_update_is_named() -> None:
    """The step counter did not advance by exactly one per schedule(), and scheduling twice
    without update() raised without saying what to do."""
    sched = Scheduler(_kv())
    sched.add_request(_engine_request("a", [1, 2, 3], 4))
    for step in range(3):
        out = sched.schedule()
        assert out.step == step and sched.step_index == step + 1
        sched.update(out, {"a": [7]})
    sched.schedule()
    with pytest.raises(RuntimeError, match=r"^schedule\(\) called again before update\(\) for step 3; "
                                           "apply each step's sampled tokens first$"):
        sched.schedule()


def test_without_chunked_prefill_a_prompt_of_exactly_the_budget_is_admitted() -> None:
    """A prompt as long as max_num_batched_tokens waited forever without chunked prefill (the
    budget check refused a prompt equal to it)."""
    sched = Scheduler(_kv(), SchedulerConfig(max_num_batched_tokens=10, enable_chunked_prefill=False))
    sched.add_request(_engine_request("a", list(range(10)), 2))
    out = sched.schedule()
    assert [(s.req.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 10)]


@pytest.mark.parametrize("reserve", [True, False])
def test_reserve_full_sequence_holds_back_a_prompt_whose_whole_sequence_does_not_fit(reserve) -> None:
    """With reserve_full_sequence (the default) a waiting request whose first chunk fits but
    whose whole prompt does not was admitted anyway; without it the chunk must be admitted."""
    # 9 usable blocks of 4 tokens: a's 28-token prompt plus its decode take 8, b needs 4
    sched = Scheduler(_kv(num_blocks=10),
                      SchedulerConfig(max_num_batched_tokens=5, reserve_full_sequence=reserve))
    a = _engine_request("a", list(range(28)), 4)
    sched.add_request(a)
    while a.num_output_tokens == 0:
        out = sched.schedule()
        sched.update(out, {"a": [1]} if out.scheduled[0].samples else {})
    sched.add_request(_engine_request("b", list(range(100, 116)), 2))
    out = sched.schedule()
    expected = [("a", 1)] if reserve else [("a", 1), ("b", 4)]
    assert [(s.req.request_id, s.num_new_tokens) for s in out.scheduled] == expected


def test_the_tighter_of_the_two_max_model_lens_caps_requests() -> None:
    """A scheduler's max_model_len below the manager's was ignored (the manager's won)."""
    assert Scheduler(_kv(max_model_len=12), SchedulerConfig(max_model_len=8)).max_model_len == 8
    assert Scheduler(_kv(max_model_len=12), SchedulerConfig(max_model_len=20)).max_model_len == 12
    assert Scheduler(_kv(max_model_len=12)).max_model_len == 12


def test_an_added_request_is_waiting() -> None:
    """add_request left the request without the WAITING status until it was scheduled."""
    sched = Scheduler(_kv())
    r = _engine_request("a", [1, 2, 3], 2)
    sched.add_request(r)
    assert r.status is RequestStatus.WAITING and list(sched.waiting) == [r]
