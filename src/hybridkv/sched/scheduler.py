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

A step's batch is :class:`~hybridkv.sched.output.SchedulerOutput`'s parallel lists, one slot per
scheduled request. With ``SchedulerConfig.batched`` (the default) the quiet decode steps of
running requests (no block to allocate, cache or release: one manager call answers for all of
them) take a slot without a per-request manager call; everything else takes the per-request
path, which ``batched=False`` runs for every request (the reference; same results, tested).

Invariants: every scheduled request holds blocks for its tokens plus lookahead slots; a
preempted request holds no blocks and restarts from its (cached) prefix; a request is in
exactly one of ``waiting`` and ``running`` until it finishes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

from hybridkv.core.blockref import BlockRef
from hybridkv.core.coordinator import CacheHit, ExternalHit
from hybridkv.core.manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.core.validation import check_int
from hybridkv.sched.output import KVLoad, ScheduledRequest, SchedulerOutput  # noqa: F401 (re-exported)
from hybridkv.sched.queues import POLICIES, WaitingQueue, make_waiting_queue
from hybridkv.sched.request import EngineRequest, RequestStatus

# The statuses as module constants: reading a member through its enum class costs ~75 ns (the
# enum type's __getattr__ hook runs on every class attribute read), a module global far less.
_WAITING, _WAITING_FOR_KV, _RUNNING, _PREEMPTED = (
    RequestStatus.WAITING, RequestStatus.WAITING_FOR_KV, RequestStatus.RUNNING,
    RequestStatus.PREEMPTED)
_FINISHED_LENGTH, _FINISHED_MAX_MODEL_LEN, _FINISHED_STOPPED, _FINISHED_ABORTED = (
    RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_MAX_MODEL_LEN,
    RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ABORTED)


class ExternalKV(Protocol):
    """What the scheduler needs from a KV connector (scheduler side).

    ``match`` answers how far an external tier extends a local hit (normally through
    :meth:`KVCacheManager.lookup_external`, so the core's hit rules apply). ``take_saves``
    drains the blocks the manager cached since the last call (the connector subscribes with
    :meth:`KVCacheManager.add_cached_listener`).
    """

    def match(self, request: Request, hit: CacheHit) -> ExternalHit | None: ...

    def take_saves(self) -> list[BlockRef]: ...


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
        batched: schedule the quiet decode steps of running requests (one known token plus
            drafts, no block to allocate, cache or release) as one batch: one manager call
            (:meth:`KVCacheManager.quiet_steps`) for all of them and a slot each in the
            output's lists; the other requests (prefill chunks, steps that need a block, a
            cut budget, preemption, state groups) take the per-request path. The two paths
            schedule exactly the same steps (tested); False runs the per-request path for
            every request (the reference).
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    reserve_full_sequence: bool = True
    batched: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            check_int(name, getattr(self, name), 1)
        check_int("max_model_len", self.max_model_len, 2, optional=True)
        check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        for name in ("reserve_full_sequence", "batched"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {self.policy!r}; valid: {', '.join(POLICIES)}")


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
        config = SchedulerConfig() if config is None else config
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
        self._num_groups = len(kv.config.groups)
        # the batched step needs no state group (their chunks end at checkpoints, and every
        # slot carries state_blocks): with one, every request takes the per-request path
        self._has_state = kv.config.has_state          # (a config never changes)
        self._batched = config.batched and not self._has_state

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
        req.status = _WAITING
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
        holds = True
        if req in self.running:
            self.running.remove(req)
        elif req in self.loading:
            self.loading.remove(req)
        else:                    # waiting: never allocated, or preempted (its blocks freed then)
            self.waiting.remove(req)
            holds = False
        self._finish(req, _FINISHED_ABORTED, holds)

    # ---- scheduling ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Choose this step's work and allocate its blocks (see the module docstring)."""
        if self._awaiting_update is not None:
            raise RuntimeError(
                f"schedule() called again before update() for step {self._awaiting_update}; "
                "apply each step's sampled tokens first")
        cfg = self.config
        out = SchedulerOutput(self.step_index, self._num_groups)
        self._awaiting_update = self.step_index
        if self.connector is not None:
            out.saves_before = self.connector.take_saves()
        self.step_index += 1
        budget = cfg.max_num_batched_tokens
        if self.running:
            if self._batched:
                budget = self._schedule_batched(out, budget)
            else:
                budget = self._schedule_running(out, budget, 0)
        if not out.preempted:
            budget = self._admit(out, budget)
        out.num_scheduled_tokens = cfg.max_num_batched_tokens - budget
        if self.connector is not None:
            out.saves_after = self.connector.take_saves()
        return out

    @cython.locals(running=list, reqs=list, nums=list, quiet=list, slots=list, starts=list,
                   news=list, drafts=list, blocks=list, samples=list, n=cython.Py_ssize_t,
                   i=cython.Py_ssize_t, computed=cython.Py_ssize_t, need=cython.Py_ssize_t,
                   req=Request, r=EngineRequest)
    def _schedule_batched(self, out: SchedulerOutput, budget: int) -> int:
        """The running requests, in order: quiet decode steps as a batch, the rest one by one.

        One :meth:`KVCacheManager.quiet_steps` call answers, for every running request, whether
        a step of its known token plus its drafts would allocate, cache and release nothing
        (a pure question about each request alone: another request's allocation cannot change
        the answer). Walking the requests in order, a request that is decoding, answered quiet,
        and fits the budget and ``max_model_len`` uncut gets its slot without a manager call:
        exactly what the per-request path's :meth:`KVCacheManager.allocate` fast path gives.
        Any other request takes :meth:`_schedule_one`; after a preemption (the running list
        changed under the answers) the rest of the step is the per-request path.
        """
        running = self.running
        reqs = [r.request for r in running]
        if self.max_drafts:
            nums = [1 + len(r.spec_token_ids) for r in running]
        else:
            nums = [1] * len(running)
        quiet = self.kv.quiet_steps(reqs, nums)
        max_len = self.max_model_len
        slots, starts, news = out.requests, out.starts, out.num_new_tokens
        drafts, blocks, samples = out.num_draft_tokens, out.new_block_ids, out.samples
        preempted = out.preempted
        n = len(running)
        i = 0
        while i < n and budget > 0:
            if quiet[i]:
                req = reqs[i]
                computed = req.num_computed_tokens
                need = nums[i]
                if computed + 1 == len(req.token_ids) and need <= budget \
                        and (max_len is None or computed + need <= max_len):
                    r = running[i]
                    if need > 1:
                        self._check_drafts(r, need - 1)
                    slots.append(r)
                    starts.append(computed)
                    news.append(need)
                    drafts.append(need - 1)
                    blocks.append(None)
                    samples.append(True)
                    req.num_computed_tokens = computed + need
                    budget -= need
                    i += 1
                    continue
            left = self._schedule_one(out, i, budget)
            if left is None:
                return budget
            budget = left
            i += 1
            if preempted:
                return self._schedule_running(out, budget, i)
        return budget

    def _schedule_running(self, out: SchedulerOutput, budget: int, i: int) -> int:
        """The per-request path over ``running[i:]``; returns the budget left."""
        running = self.running
        while i < len(running) and budget > 0:
            left = self._schedule_one(out, i, budget)
            if left is None:
                break
            budget = left
            i += 1
        return budget

    def _schedule_one(self, out: SchedulerOutput, i: int, budget: int) -> int | None:
        """Schedule ``running[i]``'s next chunk (decode, drafts or prefill), preempting from
        the back while the pool is full; returns the budget left, or None when the request
        preempted itself (nothing after it fits either)."""
        cfg = self.config
        kv = self.kv
        running = self.running
        max_len = self.max_model_len
        r = running[i]
        req = r.request
        computed = req.num_computed_tokens
        num_tokens = len(req.token_ids)
        drafts = len(r.spec_token_ids)
        if drafts:
            self._check_drafts(r, drafts)
        num_new = num_tokens + drafts - computed
        threshold = cfg.long_prefill_token_threshold
        if threshold and num_new > threshold and computed + 1 < num_tokens:
            num_new = threshold
        if num_new > budget:
            num_new = budget
        if max_len is not None and computed + num_new > max_len:
            num_new = max_len - computed
        if num_new <= 0:
            return budget
        has_state = self._has_state
        if has_state:
            num_new = self._end_at_export(req, computed, num_new, min(num_tokens, computed + num_new))
        while True:
            new_blocks = kv.allocate(req, num_new)
            if new_blocks is not None:
                break
            victim = self._choose_victim(i)
            if victim is r and len(running) == 1 and not out.requests and not self.loading:
                raise RuntimeError(self._too_small(r))
            self._preempt(victim, out)
            if victim is r:
                break
        if r.status is not _RUNNING:
            return None
        num_drafts = computed + num_new - num_tokens
        out.add(r, computed, num_new, num_drafts if num_drafts > 0 else 0, new_blocks,
                computed + num_new - (num_drafts if num_drafts > 0 else 0) >= num_tokens)
        if has_state:
            out.state_blocks.append(kv.state_blocks(req))
        req.num_computed_tokens = computed + num_new
        return budget - num_new

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
                r.status = _WAITING_FOR_KV
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
            if self._has_state:
                num_new = self._end_at_export(req, hit.num_tokens, num_new, hit.num_tokens + num_new, hit)
            new_blocks = kv.allocate(req, num_new, hit,
                                     full_sequence_must_fit=cfg.reserve_full_sequence)
            if new_blocks is None:
                if not self.running and not out.requests and not self.loading:
                    raise RuntimeError(self._too_small(r))
                return budget
            self.waiting.pop()
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = hit.num_tokens
            r.status = _RUNNING
            self.running.append(r)
            out.admitted.append(r)
            out.add(r, hit.num_tokens, num_new, 0, new_blocks,
                    hit.num_tokens + num_new >= len(req.token_ids))
            req.num_computed_tokens = hit.num_tokens
            if self._has_state:
                out.state_blocks.append(kv.state_blocks(req))
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
        r.status = _PREEMPTED
        self.num_preemptions += 1
        out.preempted.append(r)
        self.waiting.push_preempted(r)

    # ---- results ------------------------------------------------------------------------------
    @cython.locals(reqs=list, num_drafts=list, samples=list, j=cython.Py_ssize_t,
                   nd=cython.Py_ssize_t, accepted=cython.Py_ssize_t,
                   num_tokens=cython.Py_ssize_t, r=EngineRequest, req=Request)
    def update(self, out: SchedulerOutput,
               sampled: Mapping[object, Sequence[int]] | list[Sequence[int] | None],
               loaded: Mapping[object, bool] | None = None) -> list[EngineRequest]:
        """Apply a step's sampled tokens; returns the requests that finished.

        Args:
            out: the step's :class:`SchedulerOutput`.
            sampled: the tokens sampled for each request whose chunk ``samples``: the accepted
                drafts followed by one bonus token (``accepted + 1`` tokens, at least one);
                absent, None or empty for partial prefill chunks (tokens given for those are
                ignored). Either a mapping request id -> tokens, or a
                list with one entry per slot of ``out``, in batch order (no id lookups).
            loaded: request id -> whether its external load (``out.loads``) succeeded; a
                missing or False entry means the tokens are recomputed from the local hit.
        """
        if out.step != self._awaiting_update:
            raise RuntimeError(f"update() got step {out.step}'s output; the pending step is "
                               f"{self._awaiting_update}")
        reqs = out.requests
        by_slot = sampled.__class__ is list
        if by_slot and len(sampled) != len(reqs):
            raise ValueError(f"sampled has {len(sampled)} entries for a step of {len(reqs)} "
                             "scheduled requests; give one per slot, in batch order")
        self._awaiting_update = None
        for load in out.loads:
            r = load.req
            if r.status is not _WAITING_FOR_KV:
                continue  # aborted during the step
            ok = bool(loaded and loaded.get(r.request_id))
            before = r.request.num_computed_tokens
            self.kv.commit_external(r.request, load.external, ok)
            r.num_external_tokens += r.request.num_computed_tokens - before
            r.pending_external = None
            self.loading.remove(r)
            r.status = _RUNNING
            self.running.append(r)
        finished: list[EngineRequest] = []
        max_len = self.max_model_len
        running_status = _RUNNING
        num_drafts, samples = out.num_draft_tokens, out.samples
        for j in range(len(reqs)):
            r = reqs[j]
            if r.status is not running_status:
                continue  # aborted during the step
            req = r.request
            # (not by_slot: sampled is the mapping)
            toks = sampled[j] if by_slot else sampled.get(r.request_id)  # type: ignore[union-attr]
            nd = num_drafts[j]
            if nd:
                accepted = len(toks) - 1 if toks else -1
                if not 0 <= accepted <= nd:
                    raise ValueError(
                        f"request {r.request_id!r}: {len(toks or ())} sampled tokens for a step "
                        f"with {nd} drafts; expected 1 to {nd + 1}")
                req.num_computed_tokens -= nd - accepted
            if r.spec_token_ids:
                r.spec_token_ids = []
            if not samples[j]:
                continue
            if not toks:            # every known token is computed: without one, no next step
                raise ValueError(f"request {r.request_id!r}: 0 sampled tokens for a step with 0 "
                                 "drafts; expected 1 to 1")
            num_tokens = len(req.token_ids)
            room = r.max_tokens - (num_tokens - req.num_prompt_tokens)
            if max_len is not None and max_len - num_tokens < room:
                room = max_len - num_tokens
            status = None
            if len(toks) > room:
                toks = list(toks[:room])
            elif toks.__class__ is not list:
                toks = list(toks)
            if r.stop_token_ids:
                for k, t in enumerate(toks):
                    if t in r.stop_token_ids:
                        toks = toks[:k + 1]
                        status = _FINISHED_STOPPED
                        break
            req.append_tokens(toks)
            if r.first_token_step < 0:
                r.first_token_step = out.step
            if status is None:
                num_tokens += len(toks)
                if num_tokens - req.num_prompt_tokens >= r.max_tokens:
                    status = _FINISHED_LENGTH
                elif max_len is not None and num_tokens >= max_len:
                    status = _FINISHED_MAX_MODEL_LEN
            if status is not None:
                self.running.remove(r)
                self._finish(r, status)
                finished.append(r)
        return finished

    def _finish(self, r: EngineRequest, status: RequestStatus, holds_blocks: bool = True) -> None:
        r.status = status
        if holds_blocks:
            self.kv.free(r.request)
        r.spec_token_ids = []
        del self.requests[r.request_id]
