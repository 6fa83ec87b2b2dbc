"""What one simulation measured: :class:`SimResult` (hit rates, latency, the bounds, the
report's inputs) and its JSON (:meth:`SimResult.to_json`, :data:`TIMING_KEYS`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from hybridkv.cost.deployment import Deployment
from hybridkv.sim.bounds.hazard import HazardBound
from hybridkv.sim.bounds.optimal import GapReport
from hybridkv.sim.bounds.whatif import WhatIf
from hybridkv.sim.tiers.runtime import TierReport
from hybridkv.sim.config import SimConfig

__all__ = ["SimResult", "TIMING_KEYS", "deployment_json"]

#: The keys of :meth:`SimResult.to_json` that measure the simulator's own process (its speed,
#: and whether its bounds came from an earlier run): they differ between two runs of the same
#: configuration; every other key is reproducible.
TIMING_KEYS = ("wall_s", "sim_s", "sim_steps_per_s", "sim_requests_per_s", "bounds_s",
               "bounds_reused")


@dataclass(slots=True)
class SimResult:
    """Measured results of one simulation (see :meth:`to_json` for the stable keys)."""

    requests: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    prompt_blocks: int = 0
    hit_blocks: int = 0
    output_tokens: int = 0
    optimal_hit_blocks: int | None = None
    gap: GapReport | None = None
    hazard: HazardBound | None = None
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    makespan_s: float = 0.0
    steps: int = 0
    preemptions: int = 0
    evictions: int = 0
    mean_usage: float = 0.0
    peak_usage: float = 0.0
    retained_blocks: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, float, float]] = field(default_factory=list)  # (t, hit rate, usage)
    wall_s: float = 0.0
    sim_s: float = 0.0      # the step loop alone (no trace loading, no offline bound)
    config: dict = field(default_factory=dict)
    gpu_hit_tokens: int = 0
    tiers: TierReport | None = None
    what_if: WhatIf | None = None    # block-level answers beside the optimum (sim.whatif)
    partial: bool = False            # interrupted: counts cover the requests admitted so far
    hints: dict | None = None        # the hints served and what the pool's hint layer did
    hybrid_bound_hit_blocks: int | None = None   # sim.hybrid_bound (hybrid configs, with the optimum)
    hybrid_unservable_blocks: int | None = None  # unlimited-cache hits no cache of the config serves
    # per KV group (PrefixCacheStats): the blocks a hit could cover, and those of its own hit
    group_query_blocks: dict[str, int] = field(default_factory=dict)
    group_hit_blocks: dict[str, int] = field(default_factory=dict)
    bounds_s: dict[str, float] = field(default_factory=dict)  # seconds by bound (sim.optimum_job)
    bounds_reused: bool = False      # the bounds came from an earlier run (same workload and size)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def block_hit_rate_by_group(self) -> dict[str, float]:
        """Per KV group, the blocks of the group's *own* hit (what its rule alone serves) over
        the blocks a hit could cover (:attr:`hybridkv.core.events.PrefixCacheStats.
        block_hit_rate_by_group`): a group below the others is the one that cut the hit."""
        return {g: (self.group_hit_blocks.get(g, 0) / q if q else 0.0)
                for g, q in self.group_query_blocks.items()}

    def set_group_counts(self, names, stats) -> None:
        """Read the per-group counters of a manager's ``stats()`` (groups named ``names``)."""
        self.group_query_blocks = dict(zip(names, stats.group_query_blocks))
        self.group_hit_blocks = dict(zip(names, stats.group_hit_blocks))

    @property
    def optimal_block_hit_rate(self) -> float | None:
        if self.optimal_hit_blocks is None:
            return None
        return self.optimal_hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def hybrid_bound_block_hit_rate(self) -> float | None:
        """The hybrid bound (:mod:`hybridkv.sim.bounds.hybrid_bound`) as a block hit rate (None: not
        a hybrid config, or no optimum computed)."""
        if self.hybrid_bound_hit_blocks is None:
            return None
        return self.hybrid_bound_hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def hazard_block_hit_rate(self) -> float | None:
        """The non-anticipative reference (:mod:`hybridkv.sim.bounds.hazard`), as a block hit rate
        over this run's prompt blocks."""
        if self.hazard is None or not self.prompt_blocks:
            return None
        return self.hazard.relaxed_hits / self.prompt_blocks

    def to_json(self) -> dict:
        """A JSON-ready summary (no timeline).

        The keys of :data:`TIMING_KEYS` measure this process, not the simulated system:
        ``wall_s`` the whole run (the offline bound included), ``sim_s`` the step loop alone,
        ``sim_steps_per_s`` / ``sim_requests_per_s`` the simulator's throughput (engine steps
        and served requests per second of ``sim_s``), ``bounds_s`` the seconds each bound took
        by name, in this process or the optimum's child (only what this run computed;
        ``bounds_reused``: the bounds came from an earlier run over the same workload and
        size, so only the gap report was made). All other keys are deterministic.
        """
        def pct(q: float, xs: list[float] | None = None) -> float | None:
            xs = self.ttft_s if xs is None else xs
            return float(np.percentile(xs, q)) if xs else None
        opt = self.optimal_block_hit_rate
        hz = self.hazard_block_hit_rate
        by_tier = {"gpu": self.gpu_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0}
        if self.tiers is not None:
            by_tier.update({n: v / self.prompt_tokens if self.prompt_tokens else 0.0
                            for n, v in self.tiers.hit_tokens.items()})
        return {
            "requests": self.requests,
            "rejected": self.rejected,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "hit_rate_by_tier": by_tier,
            "load_s_total": self.tiers.load_s_total if self.tiers is not None else 0.0,
            "tiers": self.tiers.to_json() if self.tiers is not None else None,
            "prompt_blocks": self.prompt_blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_rate": self.block_hit_rate,
            "block_hit_rate_by_group": dict(self.block_hit_rate_by_group),
            "optimal_block_hit_rate": opt,
            "fraction_of_optimal": (self.block_hit_rate / opt) if opt else None,
            "unlimited_cache_block_hit_rate": (self.gap.ceiling_blocks / self.prompt_blocks
                                               if self.gap and self.prompt_blocks else None),
            "hybrid_bound_block_hit_rate": self.hybrid_bound_block_hit_rate,
            "fraction_of_hybrid_bound": (self.block_hit_rate / self.hybrid_bound_block_hit_rate
                                         if self.hybrid_bound_block_hit_rate else None),
            "hybrid_unservable_blocks": self.hybrid_unservable_blocks,
            "hazard_bound_block_hit_rate": hz,
            "fraction_of_hazard_bound": (self.block_hit_rate / hz) if hz else None,
            "gap": dataclasses.asdict(self.gap) if self.gap else None,
            "output_tokens": self.output_tokens,
            "ttft_mean_s": float(np.mean(self.ttft_s)) if self.ttft_s else None,
            "ttft_p50_s": pct(50),
            "ttft_p90_s": pct(90),
            "ttft_p99_s": pct(99),
            "itl_mean_s": float(np.mean(self.itl_s)) if self.itl_s else None,
            **{f"itl_p{q}_s": pct(q, self.itl_s) for q in (50, 90, 99)},   # per-request means
            "throughput_tok_s": self.output_tokens / self.makespan_s if self.makespan_s else None,
            "makespan_s": self.makespan_s,
            "steps": self.steps,
            "preemptions": self.preemptions,
            "evictions": self.evictions,
            "mean_cache_usage": self.mean_usage,
            "peak_cache_usage": self.peak_usage,
            "what_if": dataclasses.asdict(self.what_if) if self.what_if else None,
            "partial": self.partial,
            "retained_blocks": dict(self.retained_blocks),
            "hints": None if self.hints is None else dict(self.hints),
            "wall_s": self.wall_s,
            "sim_s": self.sim_s,
            "sim_steps_per_s": self.steps / self.sim_s if self.sim_s else None,
            "sim_requests_per_s": (self.requests - self.rejected) / self.sim_s if self.sim_s else None,
            "bounds_s": dict(self.bounds_s),
            "bounds_reused": self.bounds_reused,
            "config": dict(self.config),
        }


def deployment_json(cfg: SimConfig) -> dict:
    """``cfg``'s deployment as JSON (``tp``, ``dp``, ``ep``, ``gpus``, ...); without one, a single
    engine over ``num_gpus``."""
    dep = cfg.deployment if cfg.deployment is not None else Deployment(cfg.num_gpus, reason="one engine")
    return dep.to_json()


#: The hash seed of a simulator given none: fixed, so every process hashes (and samples) alike.
