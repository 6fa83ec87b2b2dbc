"""What ``Scheduler.update`` applies from a step's sampled tokens, on hand-built steps: accepted
drafts cut at ``max_tokens`` and ``max_model_len``, a stop token among accepted drafts, tokens
given for a partial prefill chunk ignored, any sequence type accepted, a request aborted during
the step skipped without stopping the others, ``first_token_step`` set once, and the checks on
a drafted step's token count. Each step runs on both scheduling paths."""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request, SpecDecode
from hybridkv.core.cache_options import CacheOptions
from hybridkv.sched import EngineRequest, RequestStatus, Scheduler, SchedulerConfig
from tests.support.helpers import FA, config

PATHS = pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-request"])


def kv(num_blocks: int = 64, bs: int = 32, **kw) -> KVCacheManager:
    return KVCacheManager(config(FA(bs), num_blocks=num_blocks), CacheOptions(**kw))


def req(rid: str, n: int, max_tokens: int, base: int = 0, **kw) -> EngineRequest:
    return EngineRequest(Request(rid, list(range(base, base + n))), max_tokens, **kw)


def drafted(batched: bool, max_tokens: int, drafts: list[int], max_model_len: int | None = None,
            **kw) -> tuple[Scheduler, EngineRequest, object]:
    """An 8-token prompt prefilled (one output token, 1), then a step verifying ``drafts``."""
    sched = Scheduler(kv(spec_decode=SpecDecode("eagle", 3)),
                      SchedulerConfig(batched=batched, max_model_len=max_model_len))
    a = req("a", 8, max_tokens, **kw)
    sched.add_request(a)
    sched.update(sched.schedule(), {"a": [1]})
    a.spec_token_ids = drafts
    out = sched.schedule()
    assert [(s.start, s.num_new_tokens, s.num_draft_tokens) for s in out.scheduled] == \
        [(8, 1 + len(drafts), len(drafts))]
    return sched, a, out


@PATHS
def test_accepted_drafts_past_max_tokens_are_cut_and_the_request_finishes(batched) -> None:
    """max_tokens 3, one output so far, 3 drafts all accepted (4 sampled tokens): only 2 fit,
    the request finishes with exactly 3 outputs."""
    sched, a, out = drafted(batched, 3, [5, 6, 7])
    assert sched.update(out, {"a": [5, 6, 7, 8]}) == [a]
    assert a.output_token_ids == [1, 5, 6] and a.status is RequestStatus.FINISHED_LENGTH


@PATHS
def test_accepted_drafts_past_max_model_len_are_cut(batched) -> None:
    """max_model_len 12 (the scheduler's), 9 tokens, 3 drafts (8 + 4 = 12 computed): all
    accepted would make 13 tokens; the bonus token is dropped and the request finishes at 12."""
    sched, a, out = drafted(batched, 10, [5, 6, 7], max_model_len=12)
    assert sched.update(out, {"a": [5, 6, 7, 8]}) == [a]
    assert a.output_token_ids == [1, 5, 6, 7] and a.num_tokens == 12
    assert a.status is RequestStatus.FINISHED_MAX_MODEL_LEN


@PATHS
def test_a_stop_token_among_accepted_drafts_ends_the_output_there(batched) -> None:
    sched, a, out = drafted(batched, 10, [5, 42, 7], stop_token_ids=[42])
    assert sched.update(out, {"a": [5, 42, 7, 8]}) == [a]
    assert a.output_token_ids == [1, 5, 42] and a.status is RequestStatus.FINISHED_STOPPED


@PATHS
def test_a_sampling_step_needs_one_to_drafts_plus_one_tokens(batched) -> None:
    """A drafted step takes 1 to drafts + 1 sampled tokens, a plain decode step at least 1:
    fewer or more is refused by name (a sampling step reported without tokens would leave the
    request with every known token computed and nothing left to schedule)."""
    sched, a, out = drafted(batched, 10, [5])
    with pytest.raises(ValueError, match=r"^request 'a': 3 sampled tokens for a step with 1 "
                                         r"drafts; expected 1 to 2$"):
        sched.update(out, {"a": [5, 6, 7]})
    for missing in ({}, {"a": None}, {"a": []}):
        sched, a, out = drafted(batched, 10, [5, 6])
        with pytest.raises(ValueError, match=r"^request 'a': 0 sampled tokens for a step with 2 "
                                             r"drafts; expected 1 to 3$"):
            sched.update(out, missing)
        sched, a, out = drafted(batched, 10, [])
        with pytest.raises(ValueError, match=r"^request 'a': 0 sampled tokens for a step with 0 "
                                             r"drafts; expected 1 to 1$"):
            sched.update(out, missing)
    sched, a, out = drafted(batched, 10, [5, 6])
    sched.update(out, {"a": [9]})                              # both drafts rejected
    assert a.output_token_ids == [1, 9] and a.num_computed_tokens == 9
    out = sched.schedule()
    assert [(s.start, s.num_new_tokens) for s in out.scheduled] == [(9, 1)]


@PATHS
def test_tokens_given_for_a_partial_prefill_chunk_are_ignored(batched) -> None:
    """A 12-token prompt in chunks of 8 and 4: the first chunk does not sample, so a token an
    engine reports for it anyway is dropped; the second chunk's token is the first output."""
    sched = Scheduler(kv(bs=4), SchedulerConfig(max_num_batched_tokens=8, batched=batched))
    a = req("a", 12, 5)
    sched.add_request(a)
    out = sched.schedule()
    assert out.samples == [False]
    assert sched.update(out, [[99]]) == [] and a.output_token_ids == []
    out = sched.schedule()
    assert out.samples == [True]
    sched.update(out, [[3]])
    assert a.output_token_ids == [3] and a.num_computed_tokens == 12


@PATHS
def test_sampled_tokens_may_be_any_sequence(batched) -> None:
    """Tuples and ranges (by id or by slot) append the same tokens as lists."""
    sched = Scheduler(kv(spec_decode=SpecDecode("eagle", 3)), SchedulerConfig(batched=batched))
    a, b = req("a", 8, 10), req("b", 8, 10, base=100)
    for r in (a, b):
        sched.add_request(r)
    sched.update(sched.schedule(), {"a": (1,), "b": range(4, 5)})
    a.spec_token_ids = [5, 6]
    out = sched.schedule()
    sched.update(out, [(5, 9), range(7, 8)])
    assert a.output_token_ids == [1, 5, 9] and b.output_token_ids == [4, 7]
    assert a.num_computed_tokens == 10 and b.num_computed_tokens == 9
    assert all(type(t) is int for t in a.output_token_ids + b.output_token_ids)


@PATHS
def test_a_request_aborted_during_the_step_does_not_stop_the_others(batched) -> None:
    sched = Scheduler(kv(), SchedulerConfig(batched=batched))
    a, b, c = req("a", 8, 10), req("b", 8, 10, base=100), req("c", 8, 10, base=200)
    for r in (a, b, c):
        sched.add_request(r)
    out = sched.schedule()
    sched.abort_request("a")
    assert sched.update(out, {"a": [1], "b": [2], "c": [3]}) == []
    assert a.status is RequestStatus.FINISHED_ABORTED and a.output_token_ids == []
    assert b.output_token_ids == [2] and c.output_token_ids == [3]


@PATHS
def test_first_token_step_is_the_step_of_the_first_output(batched) -> None:
    sched = Scheduler(kv(bs=4), SchedulerConfig(max_num_batched_tokens=4, batched=batched))
    a, b = req("a", 3, 5), req("b", 6, 5, base=100)
    for r in (a, b):
        sched.add_request(r)
    for _ in range(3):
        out = sched.schedule()
        sched.update(out, [[1] if s else None for s in out.samples])
    # step 0: a's 3 tokens and b's first; a decodes on steps 1 and 2 beside b's chunks of 3
    # and 2 tokens, the second of which samples b's first output
    assert (a.first_token_step, b.first_token_step) == (0, 2)
    assert len(a.output_token_ids) == 3 and len(b.output_token_ids) == 1
