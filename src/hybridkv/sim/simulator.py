"""The trace-driven simulator: the real scheduler and KV-cache manager, a cost model for time.

::

    workload ──► arrivals ──► Scheduler ──schedule()──► KVCacheManager (real lookups, blocks)
                                  │                          │
                                  ▼                          ▼
                       cost model step(work) ──► clock   hits, usage, evictions
                                  │
                        update(sampled: 1 + accepted drafts per decode, AcceptanceModel)

Timed mode advances a clock by the cost model's step time and admits requests when they
arrive. Sequential mode (``sequential=True``) serves one request at a time with no timing, the
setting of the block-level harness in :mod:`hybridkv.sim.bounds.optimal`.

The work items and the ``max_model_len`` rule are :mod:`hybridkv.sim.traffic.workitems`'s; the offline
optimum, the other bounds and the gap report (:class:`~hybridkv.sim.bounds.optimum_job.OptimumJob`)
are computed on the same served workload, beside the step loop (``SimResult.bounds_s``: what
each took).

KV tiers below the GPU (``SimConfig.tiers``: CPU, disk, remote) are the scheduler's connector
(:class:`~hybridkv.sim.tiers.runtime.TierRuntime`): a hit in a lower tier is loaded, and its
transfer time overlaps compute layer by layer (the overlap model is that module's). The
offline optimum then bounds the whole hierarchy: Belady over the GPU's share plus the tiers'
bytes, with free transfers.

Output tokens are the workload's own (``TraceRequest.output_ids``, which the chat and agentic
generators set so the next turn repeats the answer) or else pseudo tokens unique to their
request (they enter block hashes like real ones but never match another prompt).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, Iterable

import numpy as np

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

from hybridkv.core.manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.core.rules import make_rule
from hybridkv.sched import AcceptanceModel, Scheduler, useful_drafts
from hybridkv.sched.request import EngineRequest
from hybridkv.sim.traffic.hint_synthesis import synthesize_hints, workload_sessions
from hybridkv.sim.interrupt import RunInterrupted
from hybridkv.sim.failures import ChildProcessDied
from hybridkv.sim.bounds.optimum_memory import key_block_size
from hybridkv.sim.bounds.hybrid_bound import (hybrid_bound_hit_blocks, is_hybrid, servable_key_blocks,
                                       unservable_blocks)
from hybridkv.sim.bounds.optimal import OnlineHits, optimum_capacity_blocks
from hybridkv.sim.bounds.optimum_job import OptimumJob, SideTask
from hybridkv.sim.config import PrefixRetention, SimConfig
from hybridkv.sim.result import TIMING_KEYS, SimResult, deployment_json
from hybridkv.cost.profile import cost_model
from hybridkv.sim.tiers.runtime import TierGeometry, TierRuntime
from hybridkv.cost.transfer import DEFAULT_TRANSFER
from hybridkv.sim.bounds.whatif import WHAT_IF
from hybridkv.sim.traffic.workitems import OUTPUT_TOKEN_BASE, ServedItem, WorkItem, served_workload
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

__all__ = ["SIM_HASH_SEED", "TIMING_KEYS", "PrefixRetention", "SimConfig", "SimResult", "Simulator",
           "deployment_json"]

#: The hash seed of a simulator given none: fixed, so every process hashes (and samples) alike.
SIM_HASH_SEED = "hybridkv-simulator"


class _Live:
    """Per-request measurement state (kept on ``EngineRequest.user_data``)."""

    __slots__ = ("item", "index", "first_token_t", "outputs")

    def __init__(self, item: WorkItem, index: int) -> None:
        self.item = item
        self.index = index  # position in the served workload
        self.first_token_t = -1.0
        ids = item.output_ids
        self.outputs: list[int] | None = ids.tolist() if ids is not None else None


class Simulator:
    """Drive the real scheduler and manager over a workload.

    Args:
        config: what to simulate.
        progress: called as ``progress(done_requests, total_requests)`` now and then.
    """

    def __init__(self, config: SimConfig,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.config = config
        self.progress = progress
        kv_config = config.preset.kv_config(num_blocks=config.num_blocks)
        self.hash_seed = config.hash_seed if config.hash_seed is not None else SIM_HASH_SEED
        self.kv = KVCacheManager(kv_config, CacheOptions(
            spec_decode=config.spec, retention_interval=config.retention_interval,
            max_model_len=config.max_model_len, vllm_compat=config.vllm_compat, hash_algo=config.hash_algo,
            hash_seed=self.hash_seed, enable_events=config.enable_events,
            max_in_flight_tokens=config.sched.max_num_batched_tokens,
            eviction_policy=config.eviction_policy, hints=config.manager_hints), clock=self._clock)
        self.now = 0.0      # the retention clock: simulated time (sequential: arrival times)
        self._hints: list | None = None      # per served request (run() sets it)
        if config.prefix_retention is not None and not self.kv.uses_retention:
            raise ValueError(f"prefix_retention needs eviction_policy='priority', got "
                             f"{config.eviction_policy!r} (it ignores retention configs)")
        sched_cfg = config.sched
        if config.sequential:
            sched_cfg = dataclasses.replace(sched_cfg, max_num_seqs=1)
        # Block counts and the optimum use the block size of the full-attention groups (or
        # the alignment when there are none).
        groups = kv_config.groups
        full = [g.spec.block_size for g in groups if make_rule(g.spec).downward_closed]
        self.key_block = key_block_size(kv_config)     # max(full), else the alignment
        self.tiers = self._tier_runtime(config)
        self.scheduler = Scheduler(self.kv, sched_cfg, self.tiers)
        self.cost = cost_model(config.preset, config.gpu, config.num_gpus, config.profile,
                               config.cost_model, config.deployment)
        spec = config.spec
        self.k = spec.num_speculative_tokens if spec else 0
        self.acceptance = (AcceptanceModel(self.k, rate=config.acceptance_rate, seed=config.seed)
                           if spec else None)
        self.optimum_capacity = optimum_capacity_blocks(kv_config, config.num_blocks, self.key_block)
        if self.tiers is not None:
            self.optimum_capacity += self.tiers.key_capacity_blocks()
        # With window, chunked or state groups beside them, the full-attention groups' own hit
        # at admission is probed too (the gap report's "retained" cause).
        rules = [make_rule(g.spec) for g in groups]
        self._probe_groups = ([i for i, r in enumerate(rules) if r.downward_closed]
                              if full and not all(r.downward_closed for r in rules) else [])
        self._admitted = 0
        # Called as hook(start_s, end_s, output) after every timed step (event publishers).
        self.step_hooks: list[Callable[[float, float, object], None]] = []

    def _clock(self) -> float:
        return self.now

    def _tier_runtime(self, config: SimConfig) -> TierRuntime | None:
        tiers = config.tiers
        if tiers is None or not tiers.names:
            return None
        preset = config.preset
        per_token = preset.kv_bytes_per_token()["total"]
        tiers.check(per_token, preset.name)
        cpu_link = config.profile.transfer if config.profile is not None else DEFAULT_TRANSFER
        geometry = TierGeometry(per_token, preset.num_layers, self.key_block, num_gpus=config.num_gpus)
        return TierRuntime(self.kv, tiers, geometry, cpu_link)

    # ---- the run ------------------------------------------------------------------------------
    def run(self, items: Iterable[WorkItem]) -> SimResult:
        """Simulate ``items`` (sorted by arrival) to completion and return the measurements.

        Raises:
            ChildProcessDied: the offline optimum's forked child died (killed, out of memory);
                its ``partial`` is the finished online run's result, without the bound.
        """
        items = items if isinstance(items, list) else list(items)   # identity keeps the memos
        cfg = self.config
        res = SimResult()
        t0 = time.perf_counter()
        capacity = self.optimum_capacity
        served, res.rejected = served_workload(items, self.scheduler.max_model_len)
        hybrid = (SideTask(functools.partial(self._hybrid_bound, served, capacity), self._hybrid_key())
                  if is_hybrid(self.kv.config) else None)
        optimum = (OptimumJob(served, self.key_block, capacity, cfg.parallel_optimum, extra=WHAT_IF,
                              side=hybrid)
                   if cfg.optimum else None)
        n = len(served)
        self._hints = self._workload_hints(served)
        self._online = OnlineHits([0] * n, [0.0] * n, [math.inf] * n,
                                  [0] * n if self._probe_groups else None)
        t_sim = time.perf_counter()
        try:
            if cfg.sequential:
                self._run_sequential(served, res)
            else:
                self._run_timed(served, res)
            res.sim_s = time.perf_counter() - t_sim
        except BaseException as exc:
            if optimum is not None:
                optimum.cancel()
            if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, RunInterrupted):
                res.partial = True
                res.makespan_s = self.now
                self._finish_usage(res)
                self._fill(res, items, t0, capacity)
                raise RunInterrupted(res) from None
            raise
        self._fill(res, items, t0, capacity)
        if optimum is not None:
            try:
                res.optimal_hit_blocks, res.gap, res.what_if, res.hazard = optimum.result(self._online)
                res.bounds_s, res.bounds_reused = optimum.seconds, optimum.reused
            except ChildProcessDied as exc:      # the online run stands: hand it over
                res.wall_s = time.perf_counter() - t0
                exc.partial = res
                raise
        if res.optimal_hit_blocks is not None and not res.hit_blocks <= res.optimal_hit_blocks <= res.prompt_blocks:
            raise RuntimeError(  # a bug in the simulator or the bound, never a result to print
                f"offline optimum {res.optimal_hit_blocks} blocks outside [online hits "
                f"{res.hit_blocks}, prompt blocks {res.prompt_blocks}]; please report this workload")
        if res.optimal_hit_blocks is not None and hybrid is not None:
            res.hybrid_bound_hit_blocks, res.hybrid_unservable_blocks = optimum.side_result
            if not res.hit_blocks <= res.hybrid_bound_hit_blocks <= res.optimal_hit_blocks:
                raise RuntimeError(  # a bug in the simulator or the bound
                    f"hybrid bound {res.hybrid_bound_hit_blocks} blocks outside [online hits "
                    f"{res.hit_blocks}, optimum {res.optimal_hit_blocks}]; please report this workload")
        res.wall_s = time.perf_counter() - t0
        return res

    def _hybrid_key(self) -> tuple:
        """Everything but the workload and capacity the hybrid bound depends on."""
        cfg = self.config
        return (self.kv.config.groups, cfg.spec, cfg.retention_interval, cfg.hash_algo,
                self.hash_seed)

    def _hybrid_bound(self, served: list[ServedItem], capacity: int) -> tuple[int, int]:
        """:mod:`hybridkv.sim.bounds.hybrid_bound` on the served requests, at the optimum's capacity:
        its hit blocks and the unlimited cache's hits no cache of this config serves."""
        cfg = self.config
        hits = CacheOptions(spec_decode=cfg.spec, retention_interval=cfg.retention_interval,
                            hash_algo=cfg.hash_algo, hash_seed=self.hash_seed)
        servable = servable_key_blocks(served, self.kv.config, self.key_block, hits)
        return (hybrid_bound_hit_blocks(served, self.key_block, capacity, servable),
                unservable_blocks(served, self.key_block, servable))

    def _fill(self, res: SimResult, items: list[WorkItem], t0: float, capacity: int) -> None:
        """The counts read from the manager and the config record (also of a partial run)."""
        cfg = self.config
        kv = self.kv
        stats = kv.stats()
        res.requests = self._admitted + res.rejected if res.partial else len(items)
        res.gpu_hit_tokens = stats.hits
        res.hit_tokens = stats.hits
        if self.tiers is not None:
            res.tiers = self.tiers.finish()
            res.gpu_hit_tokens += res.tiers.gpu_hit_tokens
            res.hit_tokens += sum(res.tiers.hit_tokens.values()) + res.tiers.gpu_hit_tokens
        res.preemptions = self.scheduler.num_preemptions
        res.evictions = stats.evictions
        res.set_group_counts([g.name for g in kv.config.groups], stats)
        res.retained_blocks = self.retained_blocks()
        if kv.hints:
            res.hints = self._hint_report()
        res.wall_s = time.perf_counter() - t0
        res.config = {"preset": cfg.preset.name, "weight_dtype": cfg.preset.gemm_dtype, "gpu": cfg.gpu.name,
                      "num_gpus": cfg.num_gpus, "deployment": deployment_json(cfg),
                      "cost_model": self.cost.source,
                      "num_blocks": cfg.num_blocks, "cache_tokens": cfg.cache_tokens,
                      "block_size": cfg.preset.block_size,
                      "optimum_capacity_blocks": capacity, "key_block_size": self.key_block,
                      "max_model_len": self.scheduler.max_model_len,
                      "retention_interval": cfg.retention_interval,
                      "spec": (f"{cfg.spec.method}:{cfg.spec.num_speculative_tokens}"
                               if cfg.spec else None),
                      "acceptance_rate": cfg.acceptance_rate if cfg.spec else None,
                      "sequential": cfg.sequential, "seed": cfg.seed,
                      "vllm_compat": cfg.vllm_compat,
                      "eviction_policy": self.kv.eviction_policy,
                      "prefix_retention": (None if cfg.prefix_retention is None
                                           else str(cfg.prefix_retention)),
                      "max_num_batched_tokens": self.scheduler.config.max_num_batched_tokens,
                      "max_num_seqs": self.scheduler.config.max_num_seqs,
                      "tiers": None if self.tiers is None else self.tiers.report.config,
                      "hints": (str(cfg.hints) if cfg.hints is not None
                                else "trace" if cfg.trace_hints else None),
                      "retention": cfg.retention,
                      "checkpoint_marks": cfg.checkpoint_marks}

    def retained_blocks(self) -> dict[str, int]:
        """Hashed (cached) blocks per group now."""
        kv = self.kv
        return {g.name: sum(1 if v.__class__ is int else len(v) for v in kv.pool.index[i].values())
                for i, g in enumerate(kv.config.groups)}

    # ---- hints --------------------------------------------------------------------------------
    def _workload_hints(self, served: list[ServedItem]) -> list | None:
        """Per served request, the hint it carries: synthesised (``SimConfig.hints``), the
        trace's (``trace_hints``), or None for all. Refuses a workload whose own hints would be
        ignored, and a pin the pool cannot hold."""
        hints = self._given_hints(served)
        soft = self.config.retention
        if hints is None or soft is None:
            return hints
        soft = soft == "soft"
        return [h if h is None or h.pin_s is None or h.soft == soft else dataclasses.replace(h, soft=soft)
                for h in hints]

    def _given_hints(self, served: list[ServedItem]) -> list | None:
        """:meth:`_workload_hints` before ``SimConfig.retention`` is applied."""
        cfg = self.config
        items = [s.item for s in served]
        if cfg.hints is not None:
            sessions = workload_sessions(items, self.key_block)
            return synthesize_hints(cfg.hints, sessions, [it.arrival_s for it in items], cfg.seed)
        carried = [it.hint for it in items]
        if not cfg.trace_hints:
            if not cfg.drop_trace_hints and any(h is not None for h in carried):
                raise ValueError("the workload's requests carry hints; serve them with "
                                 "SimConfig(trace_hints=True) (or synthesise others with hints=)")
            return None
        kv = self.kv
        for it, h in zip(items, carried):
            if h is not None and h.pin_tokens is not None:
                need = kv.blocks_for_request(kv.config, h.pin_tokens,
                                             retention_interval=kv.retention_interval)
                if need > kv.config.num_blocks - 1:
                    where = (f"line {it.source.lineno}" if hasattr(it.source, "lineno")
                             else f"request {it.request_id!r}")
                    raise ValueError(f"{where}: hint pin_tokens={h.pin_tokens} needs {need} blocks, "
                                     f"more than the cache holds ({kv.config.num_blocks - 1})")
        return carried

    def _hint_report(self) -> dict:
        """The JSON of the hints served and what the pool's hint layer did with them."""
        hints = self._hints or []
        given = [h for h in hints if h is not None]
        stats = self.kv.hint_stats()
        return {"source": (str(self.config.hints) if self.config.hints is not None else "trace"),
                "requests": len(given),
                "last_turn_hints": sum(1 for h in given if h.ends),
                "pin_hints": sum(1 for h in given if h.pin_s is not None),
                "resume_hints": sum(1 for h in given if h.resume_s is not None),
                "soft_pin_hints": sum(1 for h in given if h.soft),
                **dataclasses.asdict(stats)}

    def _new_request(self, served: ServedItem, index: int) -> EngineRequest:
        item = served.item
        pin = self.config.prefix_retention
        prompt = item.prompt()
        req = Request(item.request_id, prompt, RequestCacheParams(
            retention=None if pin is None else pin.config(len(prompt)),
            hint=self._hints[index] if self._hints is not None else None,
            checkpoints=item.checkpoints if self.config.checkpoint_marks else ()))
        er = EngineRequest(req, served.max_tokens, arrival_time=item.arrival_s)
        er.user_data = _Live(item, index)
        return er

    def _on_admitted(self, er: EngineRequest, res: SimResult, clock: float) -> None:
        """First admission: count prompt tokens and blocks and the hit."""
        bs = self.key_block
        p = er.request.num_prompt_tokens
        res.prompt_tokens += p
        res.prompt_blocks += -(-p // bs)
        hit = (er.num_cached_tokens + er.num_external_tokens) // bs
        res.hit_blocks += hit
        i = er.user_data.index  # type: ignore[union-attr]
        self._online.hit_blocks[i] = hit
        self._online.admitted_t[i] = clock
        self._admitted += 1
        if self._probe_groups:
            self._online.attention_blocks[i] = self._attention_hit(er.request, hit, (p - 1) // bs)

    def _attention_hit(self, req: Request, hit: int, limit: int) -> int:
        """Leading key blocks of ``req`` (from ``hit`` on, at most ``limit``) that every
        full-attention group holds now, read from the pool's hash index."""
        hashes = req.block_hashes
        step = self.key_block // self.kv.config.hash_block_size
        index = self.kv.pool.index
        idxs = [index[g] for g in self._probe_groups]
        a = hit
        while a < limit:
            j = (a + 1) * step - 1
            if j >= len(hashes):
                break
            h = hashes[j]
            if not all(h in ix for ix in idxs):
                break
            a += 1
        return a

    def _run_sequential(self, items: list[ServedItem], res: SimResult) -> None:
        sched = self.scheduler
        for n, item in enumerate(items):
            self.now = max(self.now, item.item.arrival_s)
            er = self._new_request(item, n)
            sched.add_request(er)
            while sched.has_unfinished():
                out = sched.schedule()
                for r in out.admitted:
                    if r.request.num_preemptions == 0:
                        self._on_admitted(r, res, float(n))
                res.steps += 1
                self._sample_usage(res, float(n))
                loaded = (self.tiers.run_step(out, 0.0, 0.0, timed=False)[1]
                          if self.tiers is not None else None)
                self._update(out, res, float(n), loaded)
            res.output_tokens += er.num_output_tokens
            if self.progress and n % 256 == 0:
                self.progress(n, len(items))
        if self.progress:
            self.progress(len(items), len(items))
        self._finish_usage(res)

    def _run_timed(self, items: list[ServedItem], res: SimResult) -> None:
        sched = self.scheduler
        clock = 0.0
        nxt = 0
        total = len(items)
        done = 0
        while nxt < total or sched.has_unfinished():
            while nxt < total and items[nxt].item.arrival_s <= clock:
                sched.add_request(self._new_request(items[nxt], nxt))
                nxt += 1
            if not sched.has_unfinished():
                clock = items[nxt].item.arrival_s
                continue
            clock, finished = self.step(res, clock)
            done += finished
            if self.progress and res.steps % 2048 == 0:
                self.progress(done, total)
        if self.progress:
            self.progress(total, total)
        res.makespan_s = clock
        self._finish_usage(res)

    def step(self, res: SimResult, clock: float) -> tuple[float, int]:
        """One timed step starting at ``clock`` (the scheduler has work): schedule, advance the
        clock by the cost model, sample. Returns the new clock and how many requests finished."""
        self.now = clock
        out = self.scheduler.schedule()
        if out.admitted:
            for r in out.admitted:
                if r.request.num_preemptions == 0:
                    self._on_admitted(r, res, clock)
        start = clock
        compute = self.cost.step_time_arrays(out.num_new_tokens, out.starts)
        loaded = None
        if self.tiers is None:
            clock += compute
        else:
            clock, loaded = self.tiers.run_step(out, start, compute)
        res.steps += 1
        self._sample_usage(res, clock)
        finished = self._update(out, res, clock, loaded)
        if self.step_hooks:
            for hook in self.step_hooks:
                hook(start, clock, out)
        return clock, finished

    @cython.locals(reqs=list, num_drafts=list, samples=list, sampled=list, outputs=list,
                   j=cython.Py_ssize_t, d=cython.Py_ssize_t, done=cython.Py_ssize_t,
                   a=cython.Py_ssize_t, r=EngineRequest, live=_Live)
    def _update(self, out, res: SimResult, clock: float,
                loaded: dict[object, bool] | None = None) -> int:
        """Sample tokens for the step, apply them (and the step's tier loads), propose drafts;
        returns finished count. Tokens go to the scheduler as one list entry per batch slot
        (no per-request dict)."""
        acc = self.acceptance
        reqs = out.requests
        num_drafts = out.num_draft_tokens
        samples = out.samples
        sampled = [None] * len(reqs)
        timed = not self.config.sequential
        ttft = res.ttft_s
        for j in range(len(reqs)):
            if not samples[j]:                 # only the slots that sample
                continue
            r = reqs[j]
            live = r.user_data
            d = num_drafts[j]
            a = min(acc.draw(), d) if d else 0  # type: ignore[union-attr]
            outputs = live.outputs
            if outputs is not None:   # the workload's answer (the next turn repeats it)
                done = r.num_output_tokens
                sampled[j] = outputs[done:done + a + 1] or [OUTPUT_TOKEN_BASE]
            else:
                base = OUTPUT_TOKEN_BASE + len(r.request.token_ids)
                sampled[j] = list(range(base, base + a + 1)) if a else [base]
            if live.first_token_t < 0 and timed:
                live.first_token_t = clock
                ttft.append(clock - live.item.arrival_s)
        finished = self.scheduler.update(out, sampled, loaded)
        for load in out.loads:          # a loading request is admitted once its load ends
            r = load.req
            first = r.request.num_preemptions == 0
            self.tiers.credit(r.request_id, first)      # type: ignore[union-attr]
            if first:
                self._on_admitted(r, res, clock)
        if finished:
            finished_t = self._online.finished_t
            for r in finished:
                live = r.user_data  # type: ignore[assignment]
                finished_t[live.index] = clock
                res.output_tokens += r.num_output_tokens if timed else 0
                if r.num_output_tokens > 1 and clock > live.first_token_t >= 0:
                    res.itl_s.append((clock - live.first_token_t) / (r.num_output_tokens - 1))
        if self.k:
            k = self.k
            max_len = self.scheduler.max_model_len
            for r in self.scheduler.running:
                req = r.request
                if req.num_computed_tokens + 1 == req.num_tokens:  # decoding
                    n = useful_drafts(r, k, max_len)
                    if n > 0:
                        r.spec_token_ids = [0] * n
        return len(finished)

    # ---- usage timeline -----------------------------------------------------------------------
    def _sample_usage(self, res: SimResult, t: float) -> None:
        u = self.kv.pool.usage
        res.mean_usage += u
        if u > res.peak_usage:
            res.peak_usage = u
        res.timeline.append((t, res.hit_blocks / res.prompt_blocks if res.prompt_blocks else 0.0, u))

    def _finish_usage(self, res: SimResult) -> None:
        n = len(res.timeline)
        res.mean_usage = res.mean_usage / n if n else 0.0
        cap = self.config.timeline_points
        if n > cap:
            idx = np.linspace(0, n - 1, cap).round().astype(int)
            res.timeline = [res.timeline[i] for i in idx]
