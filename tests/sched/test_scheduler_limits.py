"""The scheduler's limits at their edges, on hand-built steps: the last token of the budget,
``max_model_len`` cutting drafts, the long-prefill threshold on later chunks, the drafter
window at its size, exact preemption counts and the too-small message. Each step is checked on
both scheduling paths (``batched`` and the per-request reference)."""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request, SpecDecode
from hybridkv.core.cache_options import CacheOptions
from hybridkv.sched import EngineRequest, RequestStatus, Scheduler, SchedulerConfig
from tests.support.helpers import FA, config

PATHS = pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-request"])


def kv(num_blocks: int = 64, bs: int = 4, **kw) -> KVCacheManager:
    return KVCacheManager(config(FA(bs), num_blocks=num_blocks), CacheOptions(**kw))


def req(rid: str, n: int, max_tokens: int, base: int = 0, **kw) -> EngineRequest:
    return EngineRequest(Request(rid, list(range(base, base + n))), max_tokens, **kw)


def steps(out) -> list[tuple[str, int, int, int]]:
    return [(s.req.request_id, s.start, s.num_new_tokens, s.num_draft_tokens) for s in out.scheduled]


def prefilled(sched: Scheduler, *rs: EngineRequest) -> None:
    """Admit and prefill every request in one step, one sampled token each."""
    for r in rs:
        sched.add_request(r)
    out = sched.schedule()
    assert {s.req.request_id for s in out.scheduled} == {r.request_id for r in rs}
    sched.update(out, {r.request_id: [1] for r in rs})


@PATHS
def test_the_last_token_of_the_budget_is_used(batched) -> None:
    """Three one-token prompts and a budget of 3: the three prefills fill the first step and
    the three decodes the second; the third decode gets the budget's last token."""
    sched = Scheduler(kv(), SchedulerConfig(max_num_batched_tokens=3, batched=batched))
    rs = [req(f"r{i}", 1, 5, base=10 * i) for i in range(3)]
    prefilled(sched, *rs)
    out = sched.schedule()
    assert steps(out) == [("r0", 1, 1, 0), ("r1", 1, 1, 0), ("r2", 1, 1, 0)]
    assert out.num_scheduled_tokens == 3


@PATHS
@pytest.mark.parametrize("cap", ["manager", "scheduler"])
def test_max_model_len_cuts_drafts_and_the_drafts_check_applies_to_quiet_steps(batched, cap) -> None:
    """max_model_len 12 (the manager's, or only the scheduler's, which the manager's quiet-step
    answer does not know), a 9-token request (8 prompt + 1 output) with 3 drafts: 9 + 3 > 12,
    so the step computes its known token and 2 drafts (12 tokens). With room for all drafts
    they are all scheduled; more than k drafts are refused even where the step needs no block."""
    k = kv(bs=32, spec_decode=SpecDecode("eagle", 3),
           max_model_len=12 if cap == "manager" else None)               # quiet steps
    sched = Scheduler(k, SchedulerConfig(batched=batched,
                                         max_model_len=12 if cap == "scheduler" else None))
    a = req("a", 7, 4)
    prefilled(sched, a)
    a.spec_token_ids = [5, 6, 7]
    out = sched.schedule()
    assert steps(out) == [("a", 7, 4, 3)]                      # 7 + 4 = 11 <= 12
    sched.update(out, {"a": [5, 9]})                           # one draft accepted: 10 tokens
    a.spec_token_ids = [1, 2, 3]
    out = sched.schedule()
    assert steps(out) == [("a", 9, 3, 2)]                      # cut to max_model_len
    assert out.scheduled[0].token_ids() == [9, 1, 2]
    k2 = kv(bs=32, spec_decode=SpecDecode("eagle", 3))
    sched = Scheduler(k2, SchedulerConfig(batched=batched))
    b = req("b", 7, 10)
    prefilled(sched, b)
    out = sched.schedule()                                     # a decode: the next step is quiet
    sched.update(out, {"b": [1]})
    assert k2.quiet_steps([b.request], [5]) == [True]
    b.spec_token_ids = [0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"^request 'b' carries 4 draft tokens; the speculative "
                                         r"config allows at most k=3$"):
        sched.schedule()


@PATHS
def test_the_long_prefill_threshold_caps_every_chunk_but_not_decode_steps(batched) -> None:
    """Threshold 4 on a 10-token prompt: chunks 4, 4, 2; threshold 1: one token per chunk up
    to the last prompt token; a decode step with drafts is not capped."""
    def three_chunks(threshold: int, prompt_len: int) -> list[tuple]:
        sched = Scheduler(kv(), SchedulerConfig(long_prefill_token_threshold=threshold,
                                                batched=batched))
        sched.add_request(req("a", prompt_len, 2))
        chunks = []
        for _ in range(3):
            out = sched.schedule()
            chunks += steps(out)
            sched.update(out, {"a": [1]} if out.scheduled[0].samples else {})
        return chunks

    assert three_chunks(4, 10) == [("a", 0, 4, 0), ("a", 4, 4, 0), ("a", 8, 2, 0)]
    assert three_chunks(1, 3) == [("a", 0, 1, 0), ("a", 1, 1, 0), ("a", 2, 1, 0)]
    k = kv(bs=16, spec_decode=SpecDecode("eagle", 3))
    sched = Scheduler(k, SchedulerConfig(long_prefill_token_threshold=2, batched=batched))
    c = req("c", 5, 8)
    sched.add_request(c)
    while c.num_output_tokens == 0:
        out = sched.schedule()
        sched.update(out, {"c": [1]} if out.scheduled[0].samples else {})
    c.spec_token_ids = [4, 4, 4]
    assert steps(sched.schedule()) == [("c", 5, 4, 3)]


@PATHS
def test_drafts_that_fill_the_drafter_window_are_allowed(batched) -> None:
    """DFlash with k = 3 and a 4-token window: 3 drafts + the bonus query fill it exactly."""
    k = kv(bs=16, spec_decode=SpecDecode("dflash", 3, drafter_window=4))
    sched = Scheduler(k, SchedulerConfig(batched=batched))
    a = req("a", 7, 10)
    prefilled(sched, a)
    a.spec_token_ids = [1, 2, 3]
    assert steps(sched.schedule()) == [("a", 7, 4, 3)]


@PATHS
def test_a_preemption_is_counted_once_and_leaves_the_request_preempted(batched) -> None:
    """5 usable blocks of 4 tokens, two 8-token prompts (2 blocks each) decoding: when both
    need a third block only one fits, and the later arrival is preempted: counted once on the
    request and once on the scheduler, status PREEMPTED, drafts dropped."""
    sched = Scheduler(kv(num_blocks=6), SchedulerConfig(batched=batched))
    a, b = req("a", 8, 6), req("b", 8, 6, base=100)
    prefilled(sched, a, b)                                     # 8 computed each: 2 full blocks
    out = sched.schedule()                                     # each needs its 3rd block
    assert [r.request_id for r in out.preempted] == ["b"]
    assert steps(out) == [("a", 8, 1, 0)]
    assert (b.request.num_preemptions, sched.num_preemptions) == (1, 1)
    assert b.status is RequestStatus.PREEMPTED and b.spec_token_ids == []
    assert b.request.num_computed_tokens == 0 and a.request.num_preemptions == 0


@PATHS
def test_preemptions_are_counted_per_request_and_per_scheduler(batched) -> None:
    """Three 8-token prompts with 12 outputs in 7 usable blocks, run to the end: each
    request's count is the number of steps that preempted it (one is preempted twice), and
    the scheduler's the total."""
    from collections import Counter
    sched = Scheduler(kv(num_blocks=8), SchedulerConfig(batched=batched))
    rs = [req(f"r{i}", 8, 12, base=100 * i) for i in range(3)]
    for r in rs:
        sched.add_request(r)
    seen: Counter = Counter()
    for _ in range(500):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        seen.update(r.request_id for r in out.preempted)
        sched.update(out, {s.req.request_id: [1] for s in out.scheduled if s.samples})
    assert not sched.has_unfinished()
    assert [r.request.num_preemptions for r in rs] == [seen[r.request_id] for r in rs] == [0, 1, 2]
    assert sched.num_preemptions == 3


def test_finished_requests_hold_no_drafts_and_the_too_small_message_counts_usable_blocks() -> None:
    sched = Scheduler(kv(bs=16, spec_decode=SpecDecode("eagle", 2)))
    a = req("a", 7, 2)
    prefilled(sched, a)
    a.spec_token_ids = [3, 3]
    out = sched.schedule()
    sched.update(out, {"a": [3]})
    assert a.status is RequestStatus.FINISHED_LENGTH and a.spec_token_ids == []
    sched = Scheduler(kv(num_blocks=4))
    sched.add_request(req("big", 40, 1))
    with pytest.raises(RuntimeError, match=r"^the KV cache cannot hold request 'big' \(40 tokens\) "
                                           r"even alone: the pool has 3 blocks; give a larger"):
        sched.schedule()


@PATHS
def test_the_priority_victim_is_chosen_among_requests_not_yet_scheduled(batched) -> None:
    """Priority policy, running ``[A (priority 9), B (priority 1)]`` in a full pool: A's step
    needs no block and is scheduled; B's needs one, and the victim is chosen among the
    requests not yet scheduled this step (B itself), never A, whose step is already taken,
    even though A has the worse priority."""
    sched = Scheduler(kv(num_blocks=6), SchedulerConfig(policy="priority", batched=batched))
    a = req("A", 8, 10, priority=9)
    prefilled(sched, a)                                        # A: 8 computed, 2 blocks
    sched.add_request(req("B", 8, 10, base=100, priority=1))
    out = sched.schedule()                                     # A takes its 3rd block, B 2
    assert steps(out) == [("A", 8, 1, 0), ("B", 0, 8, 0)]
    sched.update(out, {"A": [1], "B": [1]})
    out = sched.schedule()
    assert steps(out) == [("A", 9, 1, 0)]
    assert [r.request_id for r in out.preempted] == ["B"]


class EverythingTier:
    """A connector whose tier holds every block of every request (and saves nothing)."""

    def __init__(self, kv) -> None:
        self.kv = kv

    def match(self, request, hit):
        return self.kv.lookup_external(request, hit, lambda g, h: True)

    def take_saves(self):
        return []


def test_aborting_a_request_that_waits_for_its_external_load_frees_it() -> None:
    """A tier that holds every block: the request is admitted to load (WAITING_FOR_KV, blocks
    allocated); aborting it then finishes it, takes it out of the loading list and frees its
    blocks (the step's update then has nothing of it to apply)."""
    k = kv()

    sched = Scheduler(k, connector=EverythingTier(k))
    a = req("a", 16, 2)
    sched.add_request(a)
    out = sched.schedule()
    assert [ld.req for ld in out.loads] == [a] and a.status is RequestStatus.WAITING_FOR_KV
    assert sched.loading == [a] and k.pool.num_free < k.pool.num_blocks - 1
    sched.abort_request("a")                           # before its load reported
    assert a.status is RequestStatus.FINISHED_ABORTED and sched.loading == []
    assert not sched.has_unfinished() and k.pool.num_free == k.pool.num_blocks - 1
    assert sched.update(out, {}) == [] and a.status is RequestStatus.FINISHED_ABORTED


@PATHS
def test_a_request_that_outgrows_the_pool_alone_fails_at_that_step(batched) -> None:
    """3 usable blocks of 4 tokens, one request decoding past 12 tokens: the step that needs a
    4th block raises at once (it cannot be preempted in favour of anyone)."""
    sched = Scheduler(kv(num_blocks=4), SchedulerConfig(batched=batched))
    a = req("a", 8, 10)
    prefilled(sched, a)
    for _ in range(3):                                         # positions 8, 9, 10, 11
        out = sched.schedule()
        assert steps(out) == [("a", a.request.num_computed_tokens - 1, 1, 0)]
        sched.update(out, {"a": [1]})
    out = sched.schedule()
    sched.update(out, {"a": [1]})
    with pytest.raises(RuntimeError, match=r"^the KV cache cannot hold request 'a' \(13 tokens\)"):
        sched.schedule()


@PATHS
def test_the_worst_priority_request_preempts_itself_when_it_needs_a_block_first(batched) -> None:
    """Priority policy, running ``[A (priority 9), B (priority 1)]`` in a full pool and A's step
    needs a block: A is the victim and preempts itself, which ends the step's pass over the
    running requests (``_schedule_one``: nothing after a self-preemption fits either)."""
    sched = Scheduler(kv(num_blocks=5), SchedulerConfig(policy="priority", batched=batched))
    a = req("A", 7, 10, priority=9)
    prefilled(sched, a)                                        # A: 7 computed, 8 tokens
    sched.add_request(req("B", 8, 10, base=100, priority=1))
    out = sched.schedule()                                     # A decodes pos 7, B admitted
    assert steps(out) == [("A", 7, 1, 0), ("B", 0, 8, 0)]
    sched.update(out, {"A": [1], "B": [1]})
    out = sched.schedule()                                     # A needs a 3rd block: none free
    assert [r.request_id for r in out.preempted] == ["A"]
    assert steps(out) == [] and a.status is RequestStatus.PREEMPTED


def test_loads_commit_per_request_and_an_aborted_one_is_skipped() -> None:
    """Two requests loading from a tier that holds every block; the first is aborted during
    the step. ``update`` skips it and commits the second's successful load: it runs from the
    loaded tokens, which count as external; a load reported failed recomputes from the local
    hit. A sampled list of the wrong length is refused by name."""
    k = kv()

    sched = Scheduler(k, connector=EverythingTier(k))
    a, b, c = req("a", 16, 2), req("b", 16, 2, base=100), req("c", 16, 2, base=200)
    for r in (a, b, c):
        sched.add_request(r)
    out = sched.schedule()
    assert [ld.req for ld in out.loads] == [a, b, c]
    with pytest.raises(ValueError, match=r"^sampled has 1 entries for a step of 0 scheduled "
                                         r"requests; give one per slot, in batch order$"):
        sched.update(out, [None])
    sched.abort_request("a")
    sched.update(out, {}, loaded={"a": True, "b": True})
    assert b.status is RequestStatus.RUNNING and c.status is RequestStatus.RUNNING
    assert b.num_external_tokens == b.request.num_computed_tokens == 12      # 3 of 4 blocks
    assert c.num_external_tokens == 0 and c.request.num_computed_tokens == 0
