"""The scheduler's request (``hybridkv.sched.request``): its checks, its token ledger and its
status, from the module's docstrings."""

from __future__ import annotations

import pytest

from hybridkv import Request
from hybridkv.sched import EngineRequest, RequestStatus


def test_finished_statuses_are_exactly_the_four_ends() -> None:
    ended = {s for s in RequestStatus if s.finished}
    assert ended == {RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_MAX_MODEL_LEN,
                     RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ABORTED}


def test_a_new_request_starts_waiting_with_nothing_computed() -> None:
    r = EngineRequest(Request("a", [5, 6, 7]), 4, priority=-2, arrival_time=3, stop_token_ids=[9, 9.0, 2])
    assert r.status is RequestStatus.WAITING and r.spec_token_ids == []
    assert (r.num_cached_tokens, r.num_external_tokens, r.first_token_step) == (-1, 0, -1)
    assert r.pending_external is None and r.user_data is None
    assert r.priority == -2 and r.arrival_time == 3.0 and type(r.arrival_time) is float
    assert r.stop_token_ids == frozenset({9, 2})
    assert r.request_id == "a" and r.max_tokens == 4


def test_the_token_ledger() -> None:
    """num_tokens = prompt + outputs; outputs are the tokens after the prompt."""
    req = Request("a", [5, 6, 7])
    r = EngineRequest(req, 4)
    assert (r.num_tokens, r.num_prompt_tokens, r.num_output_tokens, r.output_token_ids) == (3, 3, 0, [])
    req.append_tokens([8, 9])
    req.num_computed_tokens = 4
    assert (r.num_tokens, r.num_prompt_tokens, r.num_output_tokens) == (5, 3, 2)
    assert r.output_token_ids == [8, 9] and r.num_computed_tokens == 4
    assert repr(r) == "EngineRequest('a', waiting, tokens=5, computed=4, outputs=2/4)"


@pytest.mark.parametrize("kwargs, message", [
    (dict(request="not a request", max_tokens=1), "EngineRequest needs a core Request, got str"),
    (dict(max_tokens=0), r"request 'a': max_tokens must be an integer >= 1, got 0"),
    (dict(max_tokens=True), "max_tokens must be an integer"),
    (dict(priority=1.5), r"^request 'a': priority must be an integer, got 1.5$"),
    (dict(priority=True), r"^request 'a': priority must be an integer, got True$"),
])
def test_bad_requests_are_named(kwargs, message) -> None:
    args = dict(request=Request("a", [1]), max_tokens=2) | kwargs
    request, max_tokens = args.pop("request"), args.pop("max_tokens")
    with pytest.raises(ValueError, match=message):
        EngineRequest(request, max_tokens, **args)
    assert EngineRequest(Request("a", [1]), 1, priority=-5).priority == -5


def test_priority_and_arrival_default_to_zero() -> None:
    """A request made without priority or arrival time did not get the documented 0 and 0.0,
    so it sorted after explicit zeros under both policies."""
    r = EngineRequest(Request("a", [1, 2]), 1)
    assert r.priority == 0 and r.arrival_time == 0.0
