"""The engine loop: the shared scheduler decides, the paged model computes, greedy sampling verifies.

One step::

    out = scheduler.schedule()          blocks allocated (+ lookahead slots), hits adopted
    rows.write(block tables)            persistent per-group block-table rows (block_table.py)
    target forward                      KV for [start, start + n) of every scheduled request
    greedy verify                       accepted drafts + 1 bonus token per sampling request
    drafter.propose(...)                draft KV brought up to date, next drafts chosen
    scheduler.update(out, sampled)      tokens appended, rejected drafts uncounted, finishes
    req.spec_token_ids = drafts         for the next schedule()

Greedy verification of drafts ``d1 .. dj`` for a request whose last known token sits at row
``i`` of its logits: ``g = argmax(logits[i : i + j + 1])``; accept the longest prefix with
``d_m == g_{m-1}``; the bonus is ``g_a``. The output therefore always equals plain greedy
decoding of the target, whatever the drafter proposes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hybridkv.connectors.connector import KVConnector
from hybridkv.core.manager import KVCacheManager
from hybridkv.sched import EngineRequest, RequestStatus, Scheduler, useful_drafts

from .block_table import BlockTableRows
from .drafters import Drafter, StepRequest
from .kv_cache import PagedKVCache
from .llm_options import RuntimeConfig
from .metadata import SequenceInput, build_step_metadata
from .models.base import PagedCausalLM
from .state_pages import PooledStates, StatePages


@dataclass
class EngineStats:
    """Counters of one engine's life."""

    steps: int = 0
    computed_tokens: int = 0     # known tokens computed: prompts, recomputes, decode inputs
    draft_tokens: int = 0        # draft tokens verified by the target
    accepted_tokens: int = 0     # of those, accepted
    preemptions: int = 0
    finished: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class LogitsRecord:
    """Per request: every computed real position and its logits (fp32, CPU), in step order.

    Positions recomputed after a preemption appear again; a test compares every entry.
    """

    positions: list[int] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)

    def add(self, start: int, logits: torch.Tensor) -> None:
        self.positions.extend(range(start, start + logits.shape[0]))
        self.rows.append(logits.detach().to("cpu"))

    def stacked(self) -> tuple[list[int], torch.Tensor]:
        return self.positions, torch.cat(self.rows) if self.rows else torch.empty(0)


class EngineCore:
    """Runs a :class:`Scheduler` over a paged model, with an optional drafter.

    Args:
        model: the target model.
        kv: the KV-cache manager (the scheduler's).
        scheduler: the continuous-batching scheduler.
        cache: the paged KV tensors for ``kv.config`` (target and drafter groups).
        drafter: proposes drafts (its method must match ``kv.spec_decode``), or None.
        runtime: its ``record_logits`` (keep every computed position's logits per request)
            and ``check_draft_slots`` (make draft writes past a request's blocks raise instead
            of landing in whatever block the persistent row still names, the GPU-like default)
            are read; device and dtype are the model's.

    The scheduler's KV connector (``Scheduler(..., connector=...)``), if any, runs its worker
    side around each forward pass: saves of earlier-cached blocks, loads, forward, saves of
    this step.
    """

    def __init__(self, model: PagedCausalLM, kv: KVCacheManager, scheduler: Scheduler,
                 cache: PagedKVCache, drafter: Drafter | None = None,
                 runtime: RuntimeConfig | None = None) -> None:
        runtime = runtime if runtime is not None else RuntimeConfig()
        spec = kv.spec_decode
        if (drafter is None) != (spec is None):
            raise ValueError("give a drafter exactly when the manager has a SpecDecode config")
        if drafter is not None and spec is not None and drafter.method != spec.method:
            raise ValueError(f"drafter method {drafter.method!r} does not match the manager's "
                             f"speculative method {spec.method!r}")
        if cache.config is not kv.config:
            raise ValueError("the paged cache must be built from the manager's KVCacheConfig")
        model.check_kv_cache(cache)
        if model.has_state and drafter is not None and drafter.capture_layers:
            raise ValueError(f"{drafter.method} reads target layer features, which "
                             f"{model.config.model_type} (recurrent layers) does not expose")
        self.states: PooledStates | None = None
        if model.has_state:
            if not kv.config.has_state:
                raise ValueError(f"{model.config.model_type} has recurrent layers: the KV-cache config needs "
                                 "their state group (kv_cache_groups builds it)")
            index = {name: i for i, name in enumerate(model.layer_names)}
            self.states = PooledStates(StatePages(cache, index), model.states)  # type: ignore[attr-defined]
        self.model = model
        self.kv = kv
        self.scheduler = scheduler
        self.cache = cache
        self.drafter = drafter
        self.device = model.device
        self.record_logits = runtime.record_logits
        self.check_draft_slots = runtime.check_draft_slots
        connector = scheduler.connector
        if connector is not None and not isinstance(connector, KVConnector):
            raise ValueError(f"the scheduler's connector must be a KVConnector (the engine runs its worker "
                             f"side), got {type(connector).__name__}")
        self.connector: KVConnector | None = connector
        self.k = spec.num_speculative_tokens if spec is not None else 0
        self.target_groups = model.group_indices(cache)
        self.rows = BlockTableRows(len(kv.config.groups), scheduler.config.max_num_seqs)
        self.records: dict[object, LogitsRecord] = {}
        self.stats = EngineStats()
        self.step_hooks: list[Callable[[], None]] = []
        if drafter is not None:
            limit = drafter.max_draft_tokens()
            if limit is not None and self.k > limit:
                raise ValueError(f"{drafter.method} drafts at most {limit} tokens per step; "
                                 f"num_speculative_tokens={self.k} is too many")
            drafter.bind(self)

    # ---- requests ---------------------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> None:
        self.scheduler.add_request(req)
        if self.record_logits:
            self.records.setdefault(req.request_id, LogitsRecord())

    def abort_request(self, request_id: object) -> None:
        """Abort a request: the scheduler frees its blocks; its block-table row and any
        recurrent state (state models) are released too. Unknown ids: no-op."""
        self.scheduler.abort_request(request_id)
        self.rows.release(request_id)
        self.model.release_state(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[EngineRequest]:
        """Schedule, compute, verify, draft, update. Returns the requests that finished.
        Then calls every ``step_hooks`` entry (the KV events publisher, for one)."""
        finished = self._step()
        for hook in self.step_hooks:
            hook()
        return finished

    @torch.no_grad()
    def _step(self) -> list[EngineRequest]:
        sched = self.scheduler
        out = sched.schedule()
        for r in out.preempted:
            self.rows.release(r.request_id)
            self.model.release_state(r.request_id)  # a preempted request recomputes from 0
        self.stats.preemptions += len(out.preempted)
        loaded: dict[object, bool] = {}
        if self.connector is not None:
            self.connector.run_saves(out.saves_before)   # before this step may overwrite them
            loaded = self.connector.run_loads(out.loads)
        if not out.scheduled:
            return sched.update(out, {}, loaded)  # every schedule() is answered by one update()
        self.stats.steps += 1
        marks = self.states.begin(out.scheduled) if self.states is not None else [()] * len(out.scheduled)
        seqs = []
        for s, m in zip(out.scheduled, marks):
            tables = self.kv.block_ids(s.req.request)
            self.rows.write(s.req.request_id, tables)
            known = s.num_new_tokens - s.num_draft_tokens
            seqs.append(SequenceInput(s.token_ids(), s.start, tables, state_key=s.req.request_id,
                                      snapshot_from=s.start + known if s.num_draft_tokens else None,
                                      state_marks=m))
        meta = build_step_metadata(seqs, self.kv.config, self.device, group_indices=self.target_groups)
        capture = self.drafter.capture_layers if self.drafter is not None else ()
        hidden, captured = self.model.run(meta, self.cache, capture)

        # rows whose logits are needed: the last known token + drafts (all rows when recording)
        picks: list[tuple[int, int]] = []
        for i, s in enumerate(out.scheduled):
            rows = meta.seq_rows[i]
            known = s.num_new_tokens - s.num_draft_tokens
            if self.record_logits:
                picks.append((rows.start, rows.stop))
            elif s.samples:
                picks.append((rows.start + known - 1, rows.stop))
            else:
                picks.append((rows.stop, rows.stop))
        idx = torch.cat([torch.arange(a, b) for a, b in picks]).to(hidden.device)
        logits = self.model.compute_logits(hidden[idx]) if idx.numel() else hidden.new_empty((0, 0))
        greedy = logits.argmax(-1).tolist() if idx.numel() else []

        sampled: dict[object, list[int]] = {}
        step_reqs: list[StepRequest] = []
        offset = 0
        for i, s in enumerate(out.scheduled):
            a, b = picks[i]
            mine = greedy[offset:offset + (b - a)]
            my_logits = logits[offset:offset + (b - a)]
            offset += b - a
            known = s.num_new_tokens - s.num_draft_tokens
            self.stats.computed_tokens += known
            req = s.req.request
            toks: list[int] = []
            accepted = 0
            if s.samples:
                g = mine[known - 1:] if self.record_logits else mine
                drafts = s.token_ids()[known:]
                while accepted < len(drafts) and drafts[accepted] == g[accepted]:
                    accepted += 1
                toks = drafts[:accepted] + [g[accepted]]
                if drafts and self.states is None:  # recurrent state: keep only the accepted tokens
                    self.model.accept_state(s.req.request_id, s.start + known + accepted)
                sampled[s.req.request_id] = toks
                self.stats.draft_tokens += len(drafts)
                self.stats.accepted_tokens += accepted
            if self.states is not None:  # the pool: exports + the state at the accepted length
                self.states.finish(s, s.start + known + accepted)
            if self.record_logits:
                self.records.setdefault(s.req.request_id, LogitsRecord()).add(
                    s.start, my_logits[:known + accepted])
            all_tokens = list(req.token_ids) + toks
            step_reqs.append(StepRequest(s, meta.seq_rows[i], all_tokens, toks,
                                         useful_drafts(s.req, self.k, sched.max_model_len, len(all_tokens))
                                         if toks else 0))

        drafts = self.drafter.propose(step_reqs, hidden, captured) if self.drafter is not None else {}
        if self.connector is not None:
            self.connector.run_saves(out.saves_after)
        finished = sched.update(out, sampled, loaded)
        for r in finished:
            self.rows.release(r.request_id)
            self.model.release_state(r.request_id)
        self.stats.finished += len(finished)
        for s in out.scheduled:
            r = s.req
            if r.status is RequestStatus.RUNNING and drafts.get(r.request_id):
                r.spec_token_ids = list(drafts[r.request_id][:self.k])
        return finished

    def run(self, max_steps: int | None = None) -> list[EngineRequest]:
        """Step until every request finished (or ``max_steps``); returns the finished ones."""
        done: list[EngineRequest] = []
        n = idle = 0
        while self.has_unfinished() and (max_steps is None or n < max_steps):
            before = self.stats.steps
            done.extend(self.step())
            n += 1
            idle = idle + 1 if self.stats.steps == before else 0
            if idle > 1000:
                raise RuntimeError("the scheduler scheduled nothing for 1000 steps while requests "
                                   "are unfinished")
        if self.connector is not None and not self.has_unfinished():
            self.connector.flush()  # blocks cached when the last requests finished
        return done
