"""A simulated cluster: N engine instances behind one router.

Each instance is a :class:`~hybridkv.sim.simulator.Simulator` (its own scheduler, manager and
cost model; the same step as a single-instance run). One event loop takes the requests in
arrival order; before routing a request that arrives at ``t`` it advances every instance until
its clock reaches ``t`` (an idle instance jumps to ``t``), so the router sees each instance's
queue as it is at ``t``. After every step an instance's KV events go to the cluster's
:class:`~hybridkv.events.KVEventIndex` (in process; the same events a ZMQ publisher would send)
when the router needs them, and to a publisher when one is attached.

Reported per instance and overall: token and block hit rates, TTFT p50/p99, queueing (arrival
to first scheduled step) p50/p99, requests and prompt tokens routed, and load imbalance (the
busiest instance's prompt tokens over the mean).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from hybridkv.core.hashing import BlockHasher, coarse_view
from hybridkv.core.request import Request
from hybridkv.core.rules import make_rule
from hybridkv.core.validation import check_int
from hybridkv.events.index import KVEventIndex
from hybridkv.sched import EngineRequest
from hybridkv.sim.cluster.routing import (DEFAULT_MAX_SKEW, DEFAULT_OVERLAP_WEIGHT, InstanceLoad, RouterSetup,
                                  RouterTuning, make_router)
from hybridkv.sim.interrupt import RunInterrupted
from hybridkv.sim.failures import ChildProcessDied
from hybridkv.sim.bounds.optimal import OnlineHits
from hybridkv.sim.bounds.optimum_job import OptimumJob
from hybridkv.cost.deployment import Deployment
from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.bounds.whatif import WHAT_IF
from hybridkv.sim.traffic.workitems import WorkItem, served_workload
from hybridkv.sim.tiers.runtime import TierReport

CLUSTER_HASH_SEED = "hybridkv-cluster"


def _pct(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if len(xs) else None


PEAK_WINDOW_S = 60.0
"""The window of :attr:`OfferedLoad.peak_prompt_tok_s`: the busiest minute of arrivals."""


@dataclass(frozen=True, slots=True)
class OfferedLoad:
    """The workload's prompt-token arrival rate against what the instances can prefill.

    ``capacity_tok_s`` is one instance's prefill rate: a full step of the token budget at the
    context of the middle of a mean prompt, by the cost model. ``needed_hit_rate`` is the
    prefix-hit rate at which the uncached prompt tokens just match the capacity.
    ``peak_prompt_tok_s`` is the busiest window's rate: the most prompt tokens arriving within
    ``peak_window_s`` (:data:`PEAK_WINDOW_S`, or the whole duration when shorter) of one
    arrival, over that window (None: no duration).
    """

    requests: int
    duration_s: float
    arrival_rate_req_s: float
    prompt_tok_s: float
    instances: int
    capacity_tok_s: float
    peak_prompt_tok_s: float | None = None
    peak_window_s: float = 0.0

    @property
    def cluster_capacity_tok_s(self) -> float:
        return self.instances * self.capacity_tok_s

    @property
    def needed_hit_rate(self) -> float:
        if self.prompt_tok_s <= 0:
            return 0.0
        return max(0.0, 1.0 - self.cluster_capacity_tok_s / self.prompt_tok_s)

    @property
    def overloaded(self) -> bool:
        return self.prompt_tok_s > self.cluster_capacity_tok_s

    def warning(self) -> str | None:
        """A warning sentence when prompts arrive faster than the instances prefill them."""
        if not self.overloaded:
            return None
        need = self.needed_hit_rate
        return (f"warning: offered load exceeds capacity: {self.requests:,} requests over "
                f"{self.duration_s:,.0f} s = {self.arrival_rate_req_s:.2f} req/s, "
                f"{self.prompt_tok_s:,.0f} prompt tok/s; {self.instances} instance(s) prefill "
                f"about {self.cluster_capacity_tok_s:,.0f} tok/s ({self.capacity_tok_s:,.0f} each). "
                + (f"Only a prefix-hit rate above {need:.0%} keeps up; " if need < 1 else "")
                + "otherwise queues grow for the whole run and TTFT measures the backlog "
                  "(add instances with --instances, or GPUs with --gpus).")

    def to_json(self) -> dict:
        return {"requests": self.requests, "duration_s": self.duration_s,
                "arrival_rate_req_s": self.arrival_rate_req_s, "prompt_tok_s": self.prompt_tok_s,
                "instances": self.instances, "capacity_tok_s_per_instance": self.capacity_tok_s,
                "cluster_capacity_tok_s": self.cluster_capacity_tok_s,
                "needed_hit_rate": self.needed_hit_rate, "overloaded": self.overloaded,
                "peak_prompt_tok_s": self.peak_prompt_tok_s, "peak_window_s": self.peak_window_s}


def offered_load(cfg: SimConfig, items: Sequence[WorkItem], instances: int) -> OfferedLoad:
    """:class:`OfferedLoad` of ``items`` on ``instances`` instances of ``cfg``."""
    from hybridkv.cost.profile import cost_model
    n = len(items)
    total = sum(it.prompt_len for it in items)
    duration = (items[-1].arrival_s - items[0].arrival_s) if n > 1 else 0.0
    budget = cfg.sched.max_num_batched_tokens
    mean_prompt = total / n if n else 0.0
    cost = cost_model(cfg.preset, cfg.gpu, cfg.num_gpus, cfg.profile, cfg.cost_model, cfg.deployment)
    step = cost.step_time_arrays(np.array([float(budget)]), np.array([mean_prompt / 2]))
    capacity = budget / step if step > 0 else math.inf
    rate = total / duration if duration > 0 else 0.0
    window = min(PEAK_WINDOW_S, duration)
    peak = None
    if window > 0:
        most, tokens, j = 0, 0, 0
        for i, it in enumerate(items):        # items are in arrival order
            while j < n and items[j].arrival_s <= it.arrival_s + window:
                tokens += items[j].prompt_len
                j += 1
            most = max(most, tokens)
            tokens -= it.prompt_len
        peak = most / window
    return OfferedLoad(n, duration, n / duration if duration > 0 else 0.0, rate, instances, capacity,
                       peak, window)


@dataclass(slots=True)
class ClusterResult:
    """Per-instance results plus routing and queueing measurements.

    :attr:`overall` combines the instances into one :class:`SimResult` (counts summed, latency
    samples pooled, the makespan the longest), with the cluster's offline optimum and gap
    report when it was computed, so :meth:`to_json` has the keys of a single run's JSON plus
    the cluster's own (``router``, ``num_instances``, ``load_imbalance``, the balance of
    requests: ``request_shares`` per instance, ``request_skew`` = max / mean, and the bound the
    router honoured, ``router_max_skew`` (None: none or not a KV-aware router), queueing,
    ``per_instance``). ``predicted_hit_tokens`` sums the router's predictions (0 in the partial
    result of an interrupted run).
    """

    router: str
    instances: list[SimResult]
    queue_s: list[list[float]]
    routed_requests: list[int]
    routed_prompt_tokens: list[int]
    predicted_hit_tokens: int = 0
    offered: OfferedLoad | None = None
    kv_events_published: int = 0
    index_blocks: int = 0
    wall_s: float = 0.0
    config: dict = field(default_factory=dict)
    overall: SimResult | None = None
    partial: bool = False
    max_skew: float | None = None

    @property
    def request_shares(self) -> list[float]:
        """Each instance's share of the routed requests (all 0.0 before any was routed)."""
        total = sum(self.routed_requests)
        return [n / total if total else 0.0 for n in self.routed_requests]

    @property
    def request_skew(self) -> float:
        """Busiest instance's routed requests over the mean (1.0 = perfectly even)."""
        n = self.routed_requests
        mean = sum(n) / len(n) if n else 0.0
        return max(n) / mean if mean else 1.0

    @staticmethod
    def _queue(queues: Sequence[float]) -> dict:
        return {"queue_p50_s": _pct(queues, 50), "queue_p99_s": _pct(queues, 99),
                "queue_mean_s": float(np.mean(queues)) if len(queues) else None}

    @property
    def load_imbalance(self) -> float:
        """Busiest instance's routed prompt tokens over the mean (1.0 = perfectly even)."""
        toks = self.routed_prompt_tokens
        mean = sum(toks) / len(toks) if toks else 0.0
        return max(toks) / mean if mean else 1.0

    def to_json(self) -> dict:
        overall = self.overall if self.overall is not None else combine(self.instances)
        d = overall.to_json()
        d.update(self._queue([q for qs in self.queue_s for q in qs]))
        per = []
        for i, (r, qs) in enumerate(zip(self.instances, self.queue_s)):
            p = {k: v for k, v in r.to_json().items()
                 if k not in ("config", "gap", "what_if", "retained_blocks")}
            p.update(self._queue(qs), instance=i, routed_requests=self.routed_requests[i],
                     routed_prompt_tokens=self.routed_prompt_tokens[i])
            per.append(p)
        d.update({"router": self.router, "num_instances": len(self.instances),
                  "load_imbalance": self.load_imbalance, "request_shares": self.request_shares,
                  "request_skew": self.request_skew, "router_max_skew": self.max_skew,
                  "per_instance": per,
                  "predicted_hit_tokens": self.predicted_hit_tokens,
                  "offered_load": self.offered.to_json() if self.offered else None,
                  "kv_events_published": self.kv_events_published, "wall_s": self.wall_s,
                  "partial": self.partial, "config": dict(self.config)})
        return d


def combine(results: Sequence[SimResult]) -> SimResult:
    """The instances' results as one :class:`SimResult`: counts summed (the tiers' too),
    TTFT and inter-token samples pooled, the longest makespan, mean usage averaged and peak the
    highest, retained blocks and the per-group hit counters summed per group (no timeline, no
    optimum)."""
    out = SimResult()
    for r in results:
        for name in ("requests", "rejected", "prompt_tokens", "hit_tokens", "gpu_hit_tokens", "prompt_blocks",
                     "hit_blocks", "output_tokens", "steps", "preemptions", "evictions"):
            setattr(out, name, getattr(out, name) + getattr(r, name))
        out.ttft_s.extend(r.ttft_s)
        out.itl_s.extend(r.itl_s)
        out.makespan_s = max(out.makespan_s, r.makespan_s)
        out.peak_usage = max(out.peak_usage, r.peak_usage)
        for g, n in r.retained_blocks.items():
            out.retained_blocks[g] = out.retained_blocks.get(g, 0) + n
        for mine, theirs in ((out.group_query_blocks, r.group_query_blocks),
                             (out.group_hit_blocks, r.group_hit_blocks)):
            for g, n in theirs.items():
                mine[g] = mine.get(g, 0) + n
    tiers = [r.tiers for r in results if r.tiers is not None]
    if tiers:
        out.tiers = TierReport.merge(tiers)
    out.mean_usage = sum(r.mean_usage for r in results) / len(results) if results else 0.0
    out.partial = any(r.partial for r in results)
    return out


class _Instance:
    """One engine of the cluster: a Simulator stepped by the cluster's loop."""

    __slots__ = ("idx", "sim", "res", "clock", "queue_s", "pending", "routed", "routed_tokens",
                 "finished")

    def __init__(self, idx: int, sim: Simulator) -> None:
        self.idx = idx
        self.sim = sim
        self.res = SimResult()
        self.clock = 0.0
        self.queue_s: list[float] = []
        self.pending: list[tuple[EngineRequest, int]] = []  # (request, predicted uncached tokens)
        self.routed = 0
        self.routed_tokens = 0
        self.finished = 0

    def advance(self, t: float) -> None:
        """Step until the clock reaches ``t`` or the instance runs out of work."""
        sched = self.sim.scheduler
        while self.clock < t and sched.has_unfinished():
            self.clock, done = self.sim.step(self.res, self.clock)
            self.finished += done
        if not sched.has_unfinished() and self.clock < t:
            self.clock = t

    def drain(self, report: Callable[[], None] | None = None) -> None:
        """Step until every request has finished (``report()`` every 2048 steps)."""
        sched = self.sim.scheduler
        while sched.has_unfinished():
            self.clock, done = self.sim.step(self.res, self.clock)
            self.finished += done
            if report is not None and self.res.steps % 2048 == 0:
                report()

    def outstanding(self) -> int:
        """Uncomputed prompt tokens of requests that have not produced their first token."""
        keep = []
        total = 0
        for er, predicted in self.pending:
            if er.num_output_tokens > 0 or er.status.finished:
                continue
            keep.append((er, predicted))
            done = er.num_computed_tokens
            total += predicted if done == 0 else max(0, er.num_prompt_tokens - done)
        self.pending = keep
        return total


class ClusterSimulator:
    """N instances of ``config`` behind the router ``router`` (a name in
    :data:`~hybridkv.sim.cluster.routing.ROUTERS`).

    Args:
        config: each instance's configuration (cache size, model, GPU, batching, KV tiers:
            each instance has its own CPU and disk tiers of the configured sizes, while a
            remote tier is one store all instances share, as a Mooncake Store is).
        num_instances: >= 1.
        router: routing policy name.
        tuning: the KV-aware routers' overlap weight and load-skew bound
            (:class:`~hybridkv.sim.cluster.routing.RouterTuning`; default its defaults). Routers
            that do not score overlap ignore it.
        event_sinks: optional per-instance callables ``sink(start_s, end_s, events)`` receiving
            each step's core KV events (a ZMQ publisher per instance, for example).
        progress: ``progress(done, total)`` now and then.
    """

    def __init__(self, config: SimConfig, num_instances: int, router: str = "kv-aware",
                 tuning: RouterTuning | None = None,
                 event_sinks: Sequence[Callable[[float, float, list], None]] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        check_int("num_instances", num_instances, 1)
        tuning = tuning if tuning is not None else RouterTuning()
        if config.sequential:
            raise ValueError("a cluster simulation is timed; --sequential does not apply")
        if event_sinks is not None and len(event_sinks) != num_instances:
            raise ValueError(f"need one event sink per instance ({num_instances}), got {len(event_sinks)}")
        kv_cfg = config.preset.kv_config(num_blocks=config.num_blocks)
        groups = kv_cfg.groups
        full = [i for i, g in enumerate(groups) if make_rule(g.spec).downward_closed and not g.is_draft]
        self.key_group = full[0] if full else 0
        self.key_block = groups[self.key_group].spec.block_size
        self.index = KVEventIndex()
        # the approximate router's LRU: the pool's share of one group (exact for one group)
        self.router_name = router
        self.router = make_router(router, RouterSetup(
            num_instances=num_instances, block_size=self.key_block,
            capacity_blocks=max(1, (config.num_blocks - 1) // len(groups)),
            index=self.index, group=self.key_group, overlap_weight=tuning.overlap_weight,
            max_skew=tuning.max_skew, tier_holds=self._tier_holds if config.tiers is not None else None))
        self.max_skew = tuning.max_skew if self.router.bounds_skew else None
        self.event_sinks = list(event_sinks) if event_sinks is not None else None
        wants_events = self.router.needs_events or self.event_sinks is not None
        cfg = dataclasses.replace(config, hash_seed=config.hash_seed or CLUSTER_HASH_SEED,
                                  enable_events=wants_events or config.enable_events,
                                  optimum=False)
        self.want_optimum = config.optimum   # computed once, over the whole cluster
        self.config = cfg
        self.progress = progress
        self.instances = [_Instance(i, Simulator(cfg)) for i in range(num_instances)]
        kv0 = self.instances[0].sim.kv
        h = kv0.hasher
        self.hasher = BlockHasher(h.block_size, h.algo, h.seed, h.lookahead)
        self.scale = self.key_block // kv_cfg.hash_block_size
        for inst in self.instances:
            inst.sim.step_hooks.append(self._hook(inst))
        self.shared_remote = 0              # key blocks of a remote tier the instances share
        first = self.instances[0].sim.tiers
        if first is not None and "remote" in first.names:
            for inst in self.instances[1:]:
                inst.sim.tiers.share_tier("remote", first)      # type: ignore[union-attr]
            self.shared_remote = first.key_capacity_blocks("remote")

    def _optimum_capacity(self) -> int:
        """The bound's capacity: every instance's GPU share and tiers, a shared remote tier
        once."""
        n = len(self.instances)
        return self.instances[0].sim.optimum_capacity * n - (n - 1) * self.shared_remote

    def _tier_holds(self, instance: int, group: int, block_hash: bytes) -> bool:
        """Whether instance ``instance``'s KV tiers hold the block (a tier-aware router's view)."""
        tiers = self.instances[instance].sim.tiers
        return tiers is not None and tiers.hierarchy.contains(group, block_hash)

    def _hook(self, inst: _Instance) -> Callable[[float, float, object], None]:
        index = self.index if self.router.needs_events else None
        key_group = self.key_group
        sink = self.event_sinks[inst.idx] if self.event_sinks is not None else None
        kv = inst.sim.kv
        idx = inst.idx

        def on_step(start: float, end: float, out) -> None:
            for r in out.admitted:
                if r.request.num_preemptions == 0:
                    inst.queue_s.append(start - r.arrival_time)
            if index is None and sink is None:
                return
            events = kv.take_events()
            if not events:
                return
            if index is not None:
                for ev in events:      # AllBlocksCleared has no group: it clears the instance
                    if getattr(ev, "group_idx", key_group) == key_group:
                        index.apply(idx, ev)
            if sink is not None:
                sink(start, end, events)
        return on_step

    def _hashes(self, item: WorkItem) -> tuple[Request, list[bytes]]:
        req = Request(item.request_id, item.prompt())
        self.hasher.update(req)
        return req, list(coarse_view(req.block_hashes, self.scale))

    def run(self, items: Sequence[WorkItem]) -> ClusterResult:
        """Route and simulate ``items`` (sorted by arrival) to completion.

        With the config's ``optimum`` the offline bound is Belady over all served requests at
        the instances' capacity summed (a bound on every router and policy: the union of the
        instances' caches is one cache of that size), with the gap report (``routed``: a block
        computed on another instance) and the what-if answers. Ctrl-C raises
        :class:`~hybridkv.sim.interrupt.RunInterrupted` with the result so far (``partial``).
        When the optimum's forked child dies, :class:`~hybridkv.sim.failures.ChildProcessDied`
        carries the finished online result (``partial``, without the bound).
        """
        t0 = time.perf_counter()
        items = list(items)
        insts = self.instances
        # The one max_model_len rule of the single simulator: over-long prompts are rejected
        # (counted on instance 0), the rest are routed with their allowed output length.
        served, rejected = served_workload(items, insts[0].sim.scheduler.max_model_len)
        insts[0].res.rejected = rejected
        n = len(served)
        for inst in insts:   # per-request online record, indexed by the served position
            inst.sim._online = OnlineHits([0] * n, [0.0] * n, [math.inf] * n,
                                          [0] * n if inst.sim._probe_groups else None)
        sim0 = insts[0].sim
        optimum = (OptimumJob(served, sim0.key_block, self._optimum_capacity(),
                              self.config.parallel_optimum, extra=WHAT_IF)
                   if self.want_optimum else None)
        routed_to = [0] * n
        try:
            predicted = self._route_all(served, routed_to)
        except BaseException as exc:
            if optimum is not None:
                optimum.cancel()
            if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, RunInterrupted):
                res = self._result(0, t0, partial=True)
                raise RunInterrupted(res) from None
            raise
        res = self._result(predicted, t0)
        if optimum is not None:
            online = self._merged_online(routed_to)
            overall = res.overall
            try:
                overall.optimal_hit_blocks, overall.gap, overall.what_if, overall.hazard = optimum.result(online)
                overall.bounds_s, overall.bounds_reused = optimum.seconds, optimum.reused
            except ChildProcessDied as exc:      # the online run stands: hand it over
                res.wall_s = time.perf_counter() - t0
                exc.partial = res
                raise
            if not overall.hit_blocks <= overall.optimal_hit_blocks <= overall.prompt_blocks:
                raise RuntimeError(
                    f"offline optimum {overall.optimal_hit_blocks} blocks outside [online hits "
                    f"{overall.hit_blocks}, prompt blocks {overall.prompt_blocks}]; please report "
                    "this workload")
        res.wall_s = time.perf_counter() - t0
        return res

    def _route_all(self, served: list, routed_to: list[int]) -> int:
        """Route every served request, then drain; returns the predicted hit tokens."""
        insts = self.instances
        router = self.router
        predicted_total = 0
        total = len(served)

        def report() -> None:
            if self.progress:
                self.progress(sum(i.finished for i in insts), total)
        for n, s_item in enumerate(served):
            item = s_item.item
            t = item.arrival_s
            for inst in insts:
                inst.advance(t)
            _, hashes = self._hashes(item)
            loads = [InstanceLoad(i.idx, i.outstanding(), len(i.pending)) for i in insts]
            d = router.route(hashes, item.prompt_len, loads)
            inst = insts[d.instance]
            routed_to[n] = d.instance
            er = inst.sim._new_request(s_item, n)
            inst.sim.scheduler.add_request(er)
            inst.pending.append((er, max(0, item.prompt_len - d.predicted_hit_tokens)))
            inst.routed += 1
            inst.routed_tokens += item.prompt_len
            predicted_total += d.predicted_hit_tokens
            if n % 256 == 0:
                report()
        for inst in insts:
            inst.drain(report)
        if self.progress:
            self.progress(total, total)
        return predicted_total

    def _merged_online(self, routed_to: list[int]) -> OnlineHits:
        """One :class:`OnlineHits` over all served requests, each from its instance."""
        ons = [inst.sim._online for inst in self.instances]
        pick = lambda field: [getattr(ons[i], field)[r] for r, i in enumerate(routed_to)]  # noqa: E731
        att = ([(ons[i].attention_blocks or ons[i].hit_blocks)[r] for r, i in enumerate(routed_to)]
               if any(o.attention_blocks is not None for o in ons) else None)
        return OnlineHits(pick("hit_blocks"), pick("admitted_t"), pick("finished_t"), att,
                          list(routed_to))

    def _result(self, predicted: int, t0: float, partial: bool = False) -> ClusterResult:
        """The per-instance results as they stand (``partial``: interrupted)."""
        insts = self.instances
        results = []
        for inst in insts:
            res = inst.res
            sim = inst.sim
            res.makespan_s = inst.clock if res.steps else 0.0
            sim._finish_usage(res)
            stats = sim.kv.stats()
            res.requests = inst.routed + res.rejected
            res.gpu_hit_tokens = res.hit_tokens = stats.hits
            if sim.tiers is not None:                 # as Simulator._fill counts them
                res.tiers = sim.tiers.finish()
                res.gpu_hit_tokens += res.tiers.gpu_hit_tokens
                res.hit_tokens += sum(res.tiers.hit_tokens.values()) + res.tiers.gpu_hit_tokens
            res.preemptions = sim.scheduler.num_preemptions
            res.evictions = stats.evictions
            res.set_group_counts([g.name for g in sim.kv.config.groups], stats)
            res.retained_blocks = sim.retained_blocks()
            res.partial = partial
            results.append(res)
        cfg = self.config
        dep = cfg.deployment if cfg.deployment is not None else Deployment(cfg.num_gpus, reason="one engine")
        if dep.dp != len(insts) and not dep.dp_attention:       # instances of one engine each
            dep = dataclasses.replace(dep, dp=len(insts))
        dep = dep.to_json()
        config = {"preset": cfg.preset.name, "weight_dtype": cfg.preset.gemm_dtype, "gpu": cfg.gpu.name,
                  "num_gpus": cfg.num_gpus,
                  "deployment": dep, "spec": (f"{cfg.spec.method}:{cfg.spec.num_speculative_tokens}"
                                                    if cfg.spec else None),
                  "num_blocks_per_instance": cfg.num_blocks, "block_size": cfg.preset.block_size,
                  "cache_tokens": cfg.cache_tokens, "key_block_size": insts[0].sim.key_block,
                  "optimum_capacity_blocks": self._optimum_capacity(),
                  "instances": len(insts), "router": self.router_name,
                  "router_max_skew": self.max_skew,
                  "retention_interval": cfg.retention_interval,
                  "eviction_policy": insts[0].sim.kv.eviction_policy,
                  "prefix_retention": (None if cfg.prefix_retention is None
                                       else str(cfg.prefix_retention)),
                  "max_num_batched_tokens": cfg.sched.max_num_batched_tokens,
                  "max_num_seqs": cfg.sched.max_num_seqs, "seed": cfg.seed,
                  "tiers": None if insts[0].sim.tiers is None else insts[0].sim.tiers.report.config}
        overall = combine(results)
        overall.config = config
        overall.wall_s = time.perf_counter() - t0
        return ClusterResult(
            router=self.router_name, instances=results, queue_s=[i.queue_s for i in insts],
            routed_requests=[i.routed for i in insts],
            routed_prompt_tokens=[i.routed_tokens for i in insts],
            predicted_hit_tokens=predicted, index_blocks=sum(
                self.index.num_blocks(i.idx) for i in insts),
            wall_s=time.perf_counter() - t0, config=config, overall=overall, partial=partial,
            max_skew=self.max_skew)


@dataclass(frozen=True, slots=True)
class ClusterJob:
    """A cluster to simulate as one job of a sweep: ``instances`` instances of ``config``
    behind ``router`` (picklable, so a worker process or a Ray task can run it)."""

    config: SimConfig
    instances: int
    router: str = "kv-aware"
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    max_skew: float | None = DEFAULT_MAX_SKEW

    def simulator(self, progress: Callable[[int, int], None] | None = None) -> ClusterSimulator:
        return ClusterSimulator(self.config, self.instances, self.router,
                                RouterTuning(self.overlap_weight, self.max_skew), progress=progress)
