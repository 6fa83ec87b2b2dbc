"""``hybridkv simulate``: trace-driven simulation of a model's prefix cache and latency.

Options -> :class:`~hybridkv.sim.simulator.SimConfig` (:mod:`hybridkv.cli.sim_options`) ->
one :class:`~hybridkv.sim.simulator.Simulator` run, or with ``--instances`` / ``--router`` a
cluster (:mod:`hybridkv.cli.cluster`) -> the summary table, ``--json``, ``--plot``.

Capacity, in order of precedence: ``--num-blocks`` (pool blocks), ``--cache-tokens`` (KV memory
for that many tokens of the preset, all groups counted), ``--gpu-memory-fraction`` (that share
of the GPUs' memory minus the weights). The default is 150k tokens: the default chat
workload's working set does not fit, so eviction shows.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from hybridkv.cli import cluster
from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.output import progress_bar, write_json, write_output
from hybridkv.cli.sim_options import (DEFAULT_WORKLOAD, OPTION_NAMES, add_capacity_options,
                                      add_common_options, build_config, check_options, cost_source,
                                      load_items)
from hybridkv.cli.tier_options import add_tier_options
from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.workitems import WorkItem


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_options(p)
    add_capacity_options(p)
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--plot", help="write a PNG of hit rate and cache usage over time")
    cluster.add_cluster_options(p)
    add_tier_options(p)


def run_one(cfg: SimConfig, items: list[WorkItem], show_progress: bool, label: str,
            setup: Callable[[Simulator], None] | None = None) -> SimResult:
    """One simulation with a progress bar; ``setup(sim)`` runs before it starts."""
    progress, close = progress_bar(show_progress, label)
    try:
        sim = Simulator(cfg, progress=progress)
        if setup is not None:
            setup(sim)
        res = sim.run(items)
    finally:
        close()
    return res


def describe(cfg: SimConfig, args: argparse.Namespace, n_items: int) -> str:
    source = f"trace {args.trace}" if args.trace else f"workload {args.workload or DEFAULT_WORKLOAD}"
    spec = f", spec {cfg.spec.method}:{cfg.spec.num_speculative_tokens}" if cfg.spec else ""
    mode = "sequential" if cfg.sequential else f"{cfg.num_gpus} x {cfg.gpu.name}"
    return (f"hybridkv simulate: {cfg.preset.name} on {source} ({n_items} requests), "
            f"{cfg.num_blocks - 1:,} blocks (~{cfg.cache_tokens:,} tokens), block {cfg.preset.block_size}, "
            f"retention {cfg.retention_interval}{spec}, {mode}")


def tier_baseline(cfg: SimConfig, items: list[WorkItem], args: argparse.Namespace,
                  res: SimResult) -> dict | None:
    """With tiers: the same run without them (unless ``--no-baseline``); prints the tier table
    and returns the baseline's hit rate and TTFT for the JSON."""
    import dataclasses
    from hybridkv.sim.tier_report import tier_summary
    base = None
    if not args.no_baseline:
        base = run_one(dataclasses.replace(cfg, tiers=None, optimum=False), items,
                       not args.no_progress, "without tiers")
    print(tier_summary(res, base))
    if base is None:
        return None
    d = base.to_json()
    return {k: d[k] for k in ("hit_rate", "block_hit_rate", "ttft_p50_s", "ttft_p90_s",
                              "ttft_p99_s", "throughput_tok_s", "makespan_s")}


def run(args: argparse.Namespace) -> int:
    from hybridkv.sim.report import explain_gap, plot_run, summary_table
    from hybridkv.sim.workload_fit import check_fits
    check_options(args)
    cluster.check_args(args)              # before the trace is read
    items = load_items(args)
    cfg = build_config(args)
    default_capacity = all(getattr(args, o) is None
                           for o in ("cache_tokens", "num_blocks", "gpu_memory_fraction"))
    warning = check_fits(cfg, items, default_capacity)   # the longest request fits, before a run
    if warning:
        print(f"hybridkv simulate: {warning}", file=sys.stderr)
    if cluster.is_cluster(args):
        progress, close = progress_bar(not args.no_progress, "simulate")
        try:
            result = cluster.run_cluster(args, cfg, items, progress)
        finally:
            close()
        if args.json:
            write_json(args.json, result.to_json())
        return 0
    print(describe(cfg, args, len(items)))
    if not cfg.sequential:
        print(f"  step times: {cost_source(cfg)}")
    load = cluster.warn_capacity(cfg, items, 1)
    with cluster.publishers(args, 1) as pubs:
        res = run_one(cluster.events_config(cfg, args), items, not args.no_progress, "simulate",
                      setup=(lambda sim: cluster.attach_single(sim, pubs[0])) if pubs else None)
    extra = {"kv_events_published": pubs[0].published if pubs else 0,
             "offered_load": load.to_json() if load else None}
    if pubs:
        print(f"  KV events: {extra['kv_events_published']} batches published")
    print(summary_table(res))
    why = explain_gap(res)
    if why:
        print(why)
    if res.tiers is not None:
        extra["without_tiers"] = tier_baseline(cfg, items, args, res)
    if res.rejected == res.requests:
        print(f"hybridkv simulate: warning: all {res.requests} requests were rejected "
              f"(prompt >= --max-model-len {cfg.max_model_len})", file=sys.stderr)
    if args.json:
        write_json(args.json, {**res.to_json(), **extra})
    if args.plot:
        title = describe(cfg, args, len(items)).split(": ", 1)[1]
        print(f"wrote {write_output(args.plot, lambda p: plot_run(res, p, title=title), 'the plot')}")
    return 0


COMMANDS.register("simulate", Command(
    help="trace-driven simulation: hit rates, latency, the optimum", add_arguments=add_arguments,
    run=run, description=__doc__, option_names=OPTION_NAMES))

__all__ = ["add_arguments", "describe", "run", "run_one"]
