"""Continuous batching over the KV-cache manager, in the manner of vLLM v1.

One step::

    schedule()                       update(output, sampled)
    ──────────                       ───────────────────────
    1. running requests, in order:   per scheduled request that reached the end of its tokens:
       decode (1 + drafts) or the      - rejected drafts: num_computed -= k - accepted
       next prefill chunk; if the      - append accepted drafts + the bonus token
       pool is full, preempt from      - finish at max_tokens / max_model_len / a stop token
       the back (FCFS) or the          (finished: blocks freed, cached ones stay cached)
       lowest priority, by recompute
    2. if nobody was preempted,
       admit waiting requests: prefix
       lookup, then the first chunk

The token budget (``max_num_batched_tokens``) bounds the tokens computed per step; a request
whose prompt does not fit is split into chunks (chunked prefill) unless that is disabled.
``num_computed_tokens`` advances at schedule time (as in vLLM): a scheduled request's KV for
``[start, start + num_new_tokens)`` is written by the step's forward pass. With state groups
(recurrent layers) a chunk also ends at the first checkpoint position inside its known tokens
(:meth:`KVCacheManager.export_positions`), chunked prefill on or off, and each scheduled
request carries its ``state_blocks`` (docs/state-groups.md §3).

Invariants: every scheduled request holds blocks for its tokens plus lookahead slots; a
preempted request holds no blocks and restarts from its (cached) prefix; a request is in
exactly one of ``waiting`` and ``running`` until it finishes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from hybridkv.core.blockref import BlockRef
from hybridkv.core.coordinator import CacheHit, ExternalHit, StateBlocks
from hybridkv.core.manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.core.validation import check_int
from hybridkv.sched.queues import POLICIES, WaitingQueue, make_waiting_queue
from hybridkv.sched.request import EngineRequest, RequestStatus


class ExternalKV(Protocol):
    """What the scheduler needs from a KV connector (scheduler side).

    ``match`` answers how far an external tier extends a local hit (normally through
    :meth:`KVCacheManager.lookup_external`, so the core's hit rules apply). ``take_saves``
    drains the blocks the manager cached since the last call (the connector subscribes with
    :meth:`KVCacheManager.add_cached_listener`).
    """

    def match(self, request: Request, hit: CacheHit) -> ExternalHit | None: ...

    def take_saves(self) -> list[BlockRef]: ...


class KVLoad:
    """One request's external load this step: the pool ``blocks`` to fill from the tier."""

    __slots__ = ("req", "external", "blocks")

    def __init__(self, req: EngineRequest, external: ExternalHit, blocks: list[BlockRef]) -> None:
        self.req = req
        self.external = external
        self.blocks = blocks


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Batching limits.

    Args:
        max_num_batched_tokens: tokens computed per step (prefill chunks + decodes + drafts).
        max_num_seqs: requests running at once.
        max_model_len: tokens per request (prompt + outputs); None: the manager's, or no cap.
        enable_chunked_prefill: split prompts longer than the remaining budget.
        long_prefill_token_threshold: cap on one request's prefill chunk (0: none), so long
            prompts do not starve decodes.
        policy: ``fcfs`` or ``priority`` (lower ``priority`` first; preempts the highest); see
            :mod:`hybridkv.sched.queues`.
        reserve_full_sequence: admit a waiting request only if its whole current sequence
            fits (``KVCacheManager.allocate(..., full_sequence_must_fit=True)``; vLLM's
            ``scheduler_reserve_full_isl``, on by default there too), so admitted requests
            are rarely preempted later. False: admit when the first chunk fits.
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    reserve_full_sequence: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            check_int(name, getattr(self, name), 1)
        check_int("max_model_len", self.max_model_len, 2, optional=True)
        check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if not isinstance(self.reserve_full_sequence, bool):
            raise ValueError(
                f"reserve_full_sequence must be True or False, got {self.reserve_full_sequence!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {self.policy!r}; valid: {', '.join(POLICIES)}")


class ScheduledRequest:
    """One request's share of a step.

    The step computes the KV of ``num_new_tokens`` tokens at positions ``start ..``: the known
    tokens ``token_ids[start : start + num_new_tokens - num_draft_tokens]`` followed by the
    request's ``num_draft_tokens`` drafts. ``samples`` is True when the chunk reaches the end
    of the known tokens, so the step samples (and verifies drafts) for it. ``state_blocks``:
    for a config with state groups, :meth:`KVCacheManager.state_blocks` taken right after the
    allocation (live extent, restore, exports of this step); empty otherwise.
    """

    __slots__ = ("req", "start", "num_new_tokens", "num_draft_tokens", "new_block_ids", "samples",
                 "state_blocks")

    def __init__(self, req: EngineRequest, start: int, num_new_tokens: int, num_draft_tokens: int,
                 new_block_ids: list[list[int]]) -> None:
        self.req = req
        self.start = start
        self.num_new_tokens = num_new_tokens
        self.num_draft_tokens = num_draft_tokens
        self.new_block_ids = new_block_ids
        self.samples = start + num_new_tokens - num_draft_tokens >= len(req.request.token_ids)
        self.state_blocks: list[StateBlocks] = []

    def token_ids(self) -> list[int]:
        """The tokens to compute: known tokens, then drafts."""
        end = self.start + self.num_new_tokens - self.num_draft_tokens
        known = list(self.req.request.token_ids[self.start:end])
        return known + self.req.spec_token_ids[:self.num_draft_tokens]

    def __repr__(self) -> str:
        return (f"ScheduledRequest({self.req.request_id!r}, start={self.start}, "
                f"new={self.num_new_tokens}, drafts={self.num_draft_tokens})")


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes.

    Attributes:
        step: the step index (0-based).
        scheduled: requests computed this step, in batch order.
        num_scheduled_tokens: the sum of their ``num_new_tokens`` (<= the token budget).
        preempted: requests preempted this step (their blocks are freed).
        admitted: requests moved from waiting to running this step (new or resumed); their
            ``num_cached_tokens`` is set at their first admission.
        loads: external KV to load this step (with a connector); those requests compute
            nothing this step and join the running set at :meth:`Scheduler.update`.
        saves_before: blocks cached since the last step whose KV is already computed; save
            them before this step's forward pass (their blocks may be reused by it).
        saves_after: blocks cached this step; save them after the forward pass.

    A worker runs a step as: saves_before, loads, forward over ``scheduled``, saves_after.
    """

    step: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    preempted: list[EngineRequest] = field(default_factory=list)
    admitted: list[EngineRequest] = field(default_factory=list)
    loads: list[KVLoad] = field(default_factory=list)
    saves_before: list[BlockRef] = field(default_factory=list)
    saves_after: list[BlockRef] = field(default_factory=list)


class Scheduler:
    """Continuous-batching scheduler driving a :class:`KVCacheManager`.

    Engine-agnostic: a caller loops ``out = schedule()``, runs (or models) the forward pass,
    then ``update(out, sampled)``, and, with speculative decoding, sets each running request's
    ``spec_token_ids`` (at most k) before the next ``schedule()``.

    Args:
        kv: the manager (its ``spec_decode`` gives k and the lookahead slots).
        config: batching limits.
        connector: an external KV tier (see :class:`ExternalKV`), or None.
    """

    def __init__(self, kv: KVCacheManager, config: SchedulerConfig | None = None,
                 connector: ExternalKV | None = None) -> None:
        if not isinstance(kv, KVCacheManager):
            raise ValueError(f"Scheduler needs a KVCacheManager, got {type(kv).__name__}")
        config = config or SchedulerConfig()
        if not isinstance(config, SchedulerConfig):
            raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        self.kv = kv
        self.config = config
        max_len = config.max_model_len
        if kv.max_model_len is not None:
            max_len = kv.max_model_len if max_len is None else min(max_len, kv.max_model_len)
        self.max_model_len = max_len
        spec = kv.spec_decode
        self.max_drafts = spec.num_speculative_tokens if spec else 0
        self.drafter_window = spec.drafter_window if spec and spec.method == "dflash" else None
        self.waiting: WaitingQueue = make_waiting_queue(config.policy)
        self.running: list[EngineRequest] = []
        self.loading: list[EngineRequest] = []   # admitted, waiting for their external KV
        self.requests: dict[object, EngineRequest] = {}
        self.connector = connector
        self._seq = itertools.count()
        self.step_index = 0
        self.num_preemptions = 0
        self._awaiting_update: int | None = None

    # ---- queue --------------------------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> None:
        """Queue a new request. Raises ValueError for a duplicate id or a prompt too long."""
        if not isinstance(req, EngineRequest):
            raise ValueError(f"add_request needs an EngineRequest, got {type(req).__name__}")
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in the scheduler")
        if self.max_model_len is not None and req.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"request {req.request_id!r} has {req.num_prompt_tokens} prompt tokens; "
                f"max_model_len={self.max_model_len} leaves no room for an output token")
        req._seq = next(self._seq)
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.push(req)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def abort_request(self, request_id: object) -> None:
        """Finish a request now (status ABORTED); its blocks are freed. Unknown ids: no-op."""
        req = self.requests.get(request_id)
        if req is None:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.loading:
            self.loading.remove(req)
        else:
            self.waiting.remove(req)
        self._finish(req, RequestStatus.FINISHED_ABORTED)

    # ---- scheduling ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Choose this step's work and allocate its blocks (see the module docstring)."""
        if self._awaiting_update is not None:
            raise RuntimeError(
                f"schedule() called again before update() for step {self._awaiting_update}; "
                "apply each step's sampled tokens first")
        cfg = self.config
        kv = self.kv
        out = SchedulerOutput(self.step_index)
        self._awaiting_update = self.step_index
        if self.connector is not None:
            out.saves_before = self.connector.take_saves()
        self.step_index += 1
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        max_len = self.max_model_len
        scheduled = out.scheduled
        running = self.running
        has_state = kv.config.has_state
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            req = r.request
            computed = req.num_computed_tokens
            num_tokens = len(req.token_ids)
            drafts = len(r.spec_token_ids)
            if drafts:
                self._check_drafts(r, drafts)
            num_new = num_tokens + drafts - computed
            if threshold and num_new > threshold and computed + 1 < num_tokens:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if max_len is not None and computed + num_new > max_len:
                num_new = max_len - computed
            if num_new <= 0:
                i += 1
                continue
            if has_state:
                num_new = self._end_at_export(req, computed, num_new, min(num_tokens, computed + num_new))
            while True:
                new_blocks = kv.allocate(req, num_new)
                if new_blocks is not None:
                    break
                victim = self._choose_victim(i)
                if victim is r and len(running) == 1 and not scheduled and not self.loading:
                    raise RuntimeError(self._too_small(r))
                self._preempt(victim, out)
                if victim is r:
                    break
            if r.status is not RequestStatus.RUNNING:
                break  # r preempted itself: nothing after it fits either
            num_drafts = computed + num_new - num_tokens
            s = ScheduledRequest(r, computed, num_new, num_drafts if num_drafts > 0 else 0, new_blocks)
            if has_state:
                s.state_blocks = kv.state_blocks(req)
            scheduled.append(s)
            req.num_computed_tokens = computed + num_new
            budget -= num_new
            i += 1
        if not out.preempted:
            budget = self._admit(out, budget)
        out.num_scheduled_tokens = cfg.max_num_batched_tokens - budget
        if self.connector is not None:
            out.saves_after = self.connector.take_saves()
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting requests while budget, seats and blocks last; returns the budget left."""
        cfg = self.config
        kv = self.kv
        threshold = cfg.long_prefill_token_threshold
        while budget > 0 and len(self.running) + len(self.loading) < cfg.max_num_seqs:
            r = self.waiting.peek()
            if r is None:
                return budget
            req = r.request
            hit = kv.lookup(req)
            ext = self.connector.match(req, hit) if self.connector is not None else None
            if ext is not None and kv.allocate(
                    req, 0, hit, external=ext, full_sequence_must_fit=cfg.reserve_full_sequence) is not None:
                self.waiting.pop()
                if r.num_cached_tokens < 0:
                    r.num_cached_tokens = hit.num_tokens
                req.num_computed_tokens = hit.num_tokens
                r.status = RequestStatus.WAITING_FOR_KV
                r.pending_external = ext
                self.loading.append(r)
                tables = kv.block_ids(req)
                out.loads.append(KVLoad(r, ext, [ref.resolve(tables) for ref in ext.loads]))
                continue
            if ext is not None and (self.running or out.scheduled or self.loading):
                return budget        # the load does not fit yet: wait for blocks to be freed
            # no load; or alone in the pool and the load cannot fit: compute past the local hit
            # (chunked), or be refused below as too large for the pool
            num_new = req.num_tokens - hit.num_tokens
            if not cfg.enable_chunked_prefill and num_new > budget:
                return budget
            if threshold and num_new > threshold:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if kv.config.has_state:
                num_new = self._end_at_export(req, hit.num_tokens, num_new, hit.num_tokens + num_new, hit)
            new_blocks = kv.allocate(req, num_new, hit,
                                     full_sequence_must_fit=cfg.reserve_full_sequence)
            if new_blocks is None:
                if not self.running and not out.scheduled and not self.loading:
                    raise RuntimeError(self._too_small(r))
                return budget
            self.waiting.pop()
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = hit.num_tokens
            r.status = RequestStatus.RUNNING
            self.running.append(r)
            out.admitted.append(r)
            s = ScheduledRequest(r, hit.num_tokens, num_new, 0, new_blocks)
            req.num_computed_tokens = hit.num_tokens
            if kv.config.has_state:
                s.state_blocks = kv.state_blocks(req)
            out.scheduled.append(s)
            req.num_computed_tokens = hit.num_tokens + num_new
            budget -= num_new
        return budget

    def _end_at_export(self, req: Request, computed: int, num_new: int, known_end: int,
                       hit: CacheHit | None = None) -> int:
        """State groups: end the chunk at the first checkpoint position strictly inside its
        known tokens ``(computed, known_end)`` (:meth:`KVCacheManager.export_positions`), so
        the live state sits on it when the step ends; otherwise ``num_new`` unchanged. An
        export at ``known_end`` needs no cut (a verify step keeps the state there too)."""
        for p in self.kv.export_positions(req, num_new, hit):
            if computed < p < known_end:
                return p - computed
        return num_new

    def _check_drafts(self, r: EngineRequest, drafts: int) -> None:
        if drafts > self.max_drafts:
            raise ValueError(
                f"request {r.request_id!r} carries {drafts} draft tokens; the speculative "
                f"config allows at most k={self.max_drafts}")
        if self.drafter_window is not None and drafts + 1 > self.drafter_window:
            raise ValueError(
                f"request {r.request_id!r}: {drafts} drafts + the bonus query exceed the "
                f"DFlash drafter window of {self.drafter_window} tokens")

    def _too_small(self, r: EngineRequest) -> str:
        return (f"the KV cache cannot hold request {r.request_id!r} ({r.num_tokens} tokens) even "
                f"alone: the pool has {self.kv.config.num_blocks - 1} blocks; give a larger cache "
                f"(num_blocks), "
                f"a smaller max_num_batched_tokens (sliding-window groups hold a whole prefill "
                f"chunk) or a smaller max_model_len")

    def _choose_victim(self, i: int) -> EngineRequest:
        """The request to preempt among running[i:] (not yet scheduled this step)."""
        return self.waiting.victim(self.running[i:])

    def _preempt(self, r: EngineRequest, out: SchedulerOutput) -> None:
        self.running.remove(r)
        self.kv.free(r.request)
        r.request.num_computed_tokens = 0
        r.request.num_preemptions += 1
        r.spec_token_ids = []
        r.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        out.preempted.append(r)
        self.waiting.push_preempted(r)

    # ---- results ------------------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: Mapping[object, Sequence[int]],
               loaded: Mapping[object, bool] | None = None) -> list[EngineRequest]:
        """Apply a step's sampled tokens; returns the requests that finished.

        Args:
            out: the step's :class:`SchedulerOutput`.
            sampled: request id -> tokens sampled for it: the accepted drafts followed by one
                bonus token (``accepted + 1`` tokens) for each request whose chunk ``samples``;
                absent or empty for partial prefill chunks.
            loaded: request id -> whether its external load (``out.loads``) succeeded; a
                missing or False entry means the tokens are recomputed from the local hit.
        """
        if out.step != self._awaiting_update:
            raise RuntimeError(f"update() got step {out.step}'s output; the pending step is "
                               f"{self._awaiting_update}")
        self._awaiting_update = None
        for load in out.loads:
            r = load.req
            if r.status is not RequestStatus.WAITING_FOR_KV:
                continue  # aborted during the step
            ok = bool(loaded and loaded.get(r.request_id))
            before = r.request.num_computed_tokens
            self.kv.commit_external(r.request, load.external, ok)
            r.num_external_tokens += r.request.num_computed_tokens - before
            r.pending_external = None
            self.loading.remove(r)
            r.status = RequestStatus.RUNNING
            self.running.append(r)
        finished: list[EngineRequest] = []
        max_len = self.max_model_len
        for s in out.scheduled:
            r = s.req
            if r.status is not RequestStatus.RUNNING:
                continue  # aborted during the step
            req = r.request
            toks = sampled.get(r.request_id)
            if s.num_draft_tokens:
                accepted = len(toks) - 1 if toks else 0
                if not 0 <= accepted <= s.num_draft_tokens:
                    raise ValueError(
                        f"request {r.request_id!r}: {len(toks or ())} sampled tokens for a step "
                        f"with {s.num_draft_tokens} drafts; expected 1 to {s.num_draft_tokens + 1}")
                req.num_computed_tokens -= s.num_draft_tokens - accepted
            if r.spec_token_ids:
                r.spec_token_ids = []
            if not s.samples or not toks:
                continue
            num_tokens = len(req.token_ids)
            room = r.max_tokens - (num_tokens - req.num_prompt_tokens)
            if max_len is not None and max_len - num_tokens < room:
                room = max_len - num_tokens
            status = None
            toks = list(toks[:room]) if len(toks) > room else list(toks)
            if r.stop_token_ids:
                for j, t in enumerate(toks):
                    if t in r.stop_token_ids:
                        toks = toks[:j + 1]
                        status = RequestStatus.FINISHED_STOPPED
                        break
            req.append_tokens(toks)
            if r.first_token_step < 0:
                r.first_token_step = out.step
            if status is None:
                num_tokens += len(toks)
                if num_tokens - req.num_prompt_tokens >= r.max_tokens:
                    status = RequestStatus.FINISHED_LENGTH
                elif max_len is not None and num_tokens >= max_len:
                    status = RequestStatus.FINISHED_MAX_MODEL_LEN
            if status is not None:
                self.running.remove(r)
                self._finish(r, status)
                finished.append(r)
        return finished

    def _finish(self, r: EngineRequest, status: RequestStatus) -> None:
        r.status = status
        self.kv.free(r.request)
        r.spec_token_ids = []
        del self.requests[r.request_id]
