"""A request as the scheduler sees it: the core request plus generation limits and status.

The token ledger of one running request (``P`` prompt tokens, outputs appended)::

    token_ids:   [ prompt ............ | outputs ...... ]            num_tokens
    KV:          [ computed ........................ ]  [ last ]   num_computed_tokens
    next step:                                         [ last | d1 .. dk ]   1 + k queries
                                                         ^ sampled last step, KV not yet written

``spec_token_ids`` are the k draft tokens proposed for the next step; they are verified by the
target model and never enter ``token_ids`` (nor any block hash) unless accepted.
"""

from __future__ import annotations

import enum
from typing import Iterable

from hybridkv.core.request import Request
from hybridkv.core.validation import check_int


class RequestStatus(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"  # admitted; external KV is being loaded this step
    RUNNING = "running"
    PREEMPTED = "preempted"            # back in the waiting queue; recomputes on resume
    FINISHED_LENGTH = "finished_length"          # produced max_tokens outputs
    FINISHED_MAX_MODEL_LEN = "finished_max_model_len"
    FINISHED_STOPPED = "finished_stopped"        # sampled a stop token
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self.value.startswith("finished")


class EngineRequest:
    """One generation request: a core :class:`Request` plus limits, priority and progress.

    Args:
        request: the core request (prompt tokens, salt, LoRA, multimodal items).
        max_tokens: output tokens to generate (>= 1).
        priority: lower runs first under the ``priority`` policy (ties: earlier arrival).
        arrival_time: seconds; orders FCFS and priority ties.
        stop_token_ids: sampling any of them finishes the request (the token is kept).

    Attributes set by the scheduler: ``status``, ``num_cached_tokens`` (prefix-cache hit at the
    first admission), ``num_external_tokens`` (tokens loaded from an external tier),
    ``spec_token_ids``, ``num_preemptions`` (on the core request), ``first_token_step``.
    """

    __slots__ = ("request", "max_tokens", "priority", "arrival_time", "stop_token_ids", "status",
                 "spec_token_ids", "num_cached_tokens", "num_external_tokens", "pending_external",
                 "first_token_step", "user_data", "_seq")

    def __init__(self, request: Request, max_tokens: int, *, priority: int = 0,
                 arrival_time: float = 0.0, stop_token_ids: Iterable[int] = ()) -> None:
        if not isinstance(request, Request):
            raise ValueError(f"EngineRequest needs a core Request, got {type(request).__name__}")
        check_int(f"request {request.request_id!r}: max_tokens", max_tokens, 1)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"request {request.request_id!r}: priority must be an integer, got {priority!r}")
        self.request = request
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival_time = float(arrival_time)
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.status = RequestStatus.WAITING
        self.spec_token_ids: list[int] = []
        self.num_cached_tokens = -1
        self.num_external_tokens = 0
        self.pending_external: object = None  # the ExternalHit being loaded
        self.first_token_step = -1
        self.user_data: object = None
        self._seq = 0

    @property
    def request_id(self) -> object:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return self.request.num_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return self.request.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.request.num_tokens - self.request.num_prompt_tokens

    @property
    def num_computed_tokens(self) -> int:
        return self.request.num_computed_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return list(self.request.token_ids[self.request.num_prompt_tokens:])

    def __repr__(self) -> str:
        return (f"EngineRequest({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, outputs={self.num_output_tokens}/{self.max_tokens})")


def useful_drafts(r: EngineRequest, k: int, max_model_len: int | None,
                  num_tokens: int | None = None) -> int:
    """How many draft tokens to propose for ``r``'s next step: the one rule of the engine and
    the simulator.

    A verify step appends the accepted drafts plus one bonus token, so drafts are worth
    proposing only while drafts + bonus still fit under both limits: at most ``k``, at most the
    request's remaining outputs minus one, and at most ``max_model_len - num_tokens - 1``.
    Never negative.

    Args:
        r: the request.
        k: the speculative method's draft tokens per step (0: no drafting).
        max_model_len: the scheduler's cap on tokens per request, or None.
        num_tokens: the request's token count after the step just sampled (default: its
            current count, i.e. after ``Scheduler.update``).
    """
    n = r.num_tokens if num_tokens is None else num_tokens
    room = r.max_tokens - (n - r.num_prompt_tokens)
    if max_model_len is not None and max_model_len - n < room:
        room = max_model_len - n
    return max(0, min(k, room - 1))
