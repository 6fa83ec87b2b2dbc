"""``hybridkv simulate``: trace-driven simulation of a model's prefix cache and latency.

Options -> :class:`~hybridkv.sim.simulator.SimConfig` (:mod:`hybridkv.cli.sim_options`, the
hardware and cache size from :mod:`hybridkv.cli.capacity`) -> one
:class:`~hybridkv.sim.simulator.Simulator` run, or with ``--instances`` / ``--router`` a cluster
(:mod:`hybridkv.cli.cluster`) -> the summary table, why online < optimum, the next steps
(:mod:`hybridkv.sim.report.advice`), ``--json``, ``--plot``. Ctrl-C writes what was measured to
``--json``, marked partial, and exits with status 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from hybridkv.cli import cluster
from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.capacity import (add_size_options, is_default_size, larger_cache, more_gpus,
                                   plan_from_options)
from hybridkv.cli.hint_options import add_hint_options, apply_hints
from hybridkv.cli.output import json_to_stdout, progress_bar, write_json, write_output
from hybridkv.cli.sim_options import (DEFAULT_WORKLOAD, OPTION_NAMES, add_common_options,
                                      build_config, check_options, cost_source, load_items,
                                      options_preset, profile_warning)
from hybridkv.cli.tier_options import add_tier_options
from hybridkv.sim.failures import ChildProcessDied
from hybridkv.cost.hardware import KVBudget
from hybridkv.sim.bounds.optimum_memory import BYTES_PER_BLOCK, available_memory_bytes
from hybridkv.sim.interrupt import RunInterrupted, sigint_deferred
from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.traffic.workitems import WorkItem

DESCRIPTION = """\
Simulate a model's prefix cache and latency over a workload: the real scheduler and KV-cache
manager over a built-in workload or a trace, step times from the calibrated cost model (fitted
to steps measured on an H100, or to --profile; --cost-model roofline: peak rates at fixed
efficiencies), and the offline optimum and an unlimited cache beside the online hit rate.

--gpus GPUs run as serving engines deploy them, unless --tp/--dp/--ep say otherwise: the
smallest power-of-two TP in a node that holds the weights and a useful cache, the rest as
replicas behind --router (DeepSeek-class MoE: data-parallel attention + expert parallelism);
every step pays its collectives. Each instance's KV cache is what its GPUs leave, as in vLLM:
--gpu-memory-fraction (default 0.9) of their memory, less the weights and a 6 GiB-per-GPU
activation reserve. Either
--cache-tokens or --num-blocks sets it instead, within that memory. The report ends with next
steps computed from the run. Ctrl-C stops a run: exit status 130, and --json gets what was
measured so far, marked "partial": true.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_options(p)
    add_size_options(p)
    p.add_argument("--json", help="write the results as JSON to this path (- : standard output, "
                                  "the report then goes to standard error)")
    p.add_argument("--plot", help="write a plot (PNG, or another suffix matplotlib writes) of hit "
                                  "rate and blocks in use over time")
    p.add_argument("--verbose", action="store_true",
                   help="also print the seconds each bound took (bounds_s in --json)")
    cluster.add_cluster_options(p)
    add_tier_options(p)
    add_hint_options(p)


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


def describe(cfg: SimConfig, args: argparse.Namespace, n_items: int,
             budget: KVBudget | None = None) -> str:
    """The run's header: the model, workload and GPUs, then the KV cache and where it comes from."""
    source = f"trace {args.trace}" if args.trace else f"workload {args.workload or DEFAULT_WORKLOAD}"
    spec = f", spec {cfg.spec.method}:{cfg.spec.num_speculative_tokens}" if cfg.spec else ""
    mode = "sequential" if cfg.sequential else f"{cfg.num_gpus} x {cfg.gpu.name}"
    head = (f"hybridkv simulate: {cfg.preset.name} on {source} ({n_items} requests), {mode}, "
            f"block {cfg.preset.block_size}, retention {cfg.retention_interval}{spec}")
    cache = f"  KV cache: {cfg.num_blocks - 1:,} blocks (~{cfg.cache_tokens:,} tokens)"
    if cfg.deployment is not None and not cfg.sequential:
        head += f"\n  deployment: {cfg.deployment.describe()}"
    if budget is not None:
        if is_default_size(args):
            cache += f", what the GPUs leave: {budget.describe()}"
        else:
            cache += f", as given (the GPUs leave {budget.kv_bytes / 1e9:,.1f} GB)"
    return f"{head}\n{cache}"


def optimum_memory_warning(cfg: SimConfig, items: list[WorkItem], available: int | None) -> str | None:
    """The warning when the offline optimum's memory estimate
    (:func:`hybridkv.sim.bounds.optimum_memory.estimate`) is more than half the ``available`` bytes;
    None otherwise, without the optimum, or when ``available`` is unknown."""
    from hybridkv.sim.bounds.optimum_memory import estimate, is_large, key_block_size
    if not cfg.optimum:
        return None
    need = estimate(items, key_block_size(cfg.preset.kv_config(num_blocks=cfg.num_blocks)))
    if not is_large(need, available):
        return None
    return (f"warning: the offline optimum needs about {need.bytes / 1e9:,.1f} GB ({need.blocks:,} "
            f"prompt blocks of {need.block_size} tokens x {BYTES_PER_BLOCK} B) and "
            f"{available / 1e9:,.1f} GB is available: it may be killed for memory; --no-optimum "
            f"skips it, a larger --block-size or a smaller --limit shrinks it")


def tier_baseline(cfg: SimConfig, items: list[WorkItem], args: argparse.Namespace,
                  res: SimResult) -> dict | None:
    """With tiers: the same run without them (unless ``--no-baseline``); prints the tier table
    and returns the baseline's hit rate and TTFT for the JSON."""
    import dataclasses
    from hybridkv.sim.tiers.report import tier_summary
    base = None
    if not args.no_baseline:
        base = run_one(dataclasses.replace(cfg, tiers=None, optimum=False), items,
                       not args.no_progress, "without tiers")
    print(tier_summary(res, base))
    return _baseline_keys(base)


def _baseline_keys(base: SimResult | None) -> dict | None:
    """The keys of a baseline run the JSON reports beside the run's own (None: no baseline)."""
    if base is None:
        return None
    d = base.to_json()
    return {k: d[k] for k in ("hit_rate", "block_hit_rate", "ttft_p50_s", "ttft_p90_s",
                              "ttft_p99_s", "throughput_tok_s", "makespan_s")}


def hint_baseline(cfg: SimConfig, items: list[WorkItem], args: argparse.Namespace,
                  res: SimResult) -> dict | None:
    """With hints: the same run without them (unless ``--no-baseline``); prints the hint lines
    and returns the baseline's hit rate and TTFT for the JSON."""
    import dataclasses
    from hybridkv.sim.report.hints import hint_summary
    base = None
    if not getattr(args, "no_baseline", False):
        bare = [dataclasses.replace(it, source=dataclasses.replace(it.source, hint=None))
                if it.hint is not None else it for it in items]      # the trace's own hints too
        base = run_one(dataclasses.replace(cfg, hints=None, trace_hints=False, optimum=False,
                                           tiers=None), bare, not args.no_progress, "without hints")
    print(hint_summary(res, base))
    return _baseline_keys(base)


def run(args: argparse.Namespace) -> int:
    with json_to_stdout(args.json):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from hybridkv.sim.report.advice import next_steps
    from hybridkv.sim.report.summary import explain_gap, format_next_steps, plot_run, summary_table
    from hybridkv.cli.options import name_options
    from hybridkv.sim.traffic.workload_fit import check_fits, context_warning
    check_options(args)
    cluster.check_args(args)              # before the trace is read
    preset = options_preset(args)
    budget = plan_from_options(args, preset)      # impossible hardware: refused here
    items = load_items(args)
    cfg = apply_hints(build_config(args), args, items)
    default = is_default_size(args)
    warning = check_fits(cfg, items, default,      # the longest request fits, before a run
                         (lambda need: more_gpus(args, preset, need.bytes)) if default else None)
    if warning:
        print(f"hybridkv simulate: {warning}", file=sys.stderr)
    warning = profile_warning(cfg.profile, preset)
    if warning:
        print(f"hybridkv simulate: warning: {warning}", file=sys.stderr)
    warning = context_warning(preset, items, cfg.max_model_len)
    if warning:
        print(f"hybridkv simulate: warning: {name_options(warning, OPTION_NAMES)}", file=sys.stderr)
    warning = optimum_memory_warning(cfg, items, available_memory_bytes())
    if warning:
        print(f"hybridkv simulate: {warning}", file=sys.stderr)
    if cluster.is_cluster(args):
        return cluster.run_cluster_command(args, cfg, items, budget)
    print(describe(cfg, args, len(items), budget))
    if not cfg.sequential:
        print(f"  step times: {cost_source(cfg)}")
    load = cluster.warn_capacity(cfg, items, 1)
    extra: dict = {"offered_load": load.to_json() if load else None, "hardware": budget.to_json()}
    failure = None
    try:
        with cluster.publishers(args, 1) as pubs:
            res = run_one(cluster.events_config(cfg, args), items, not args.no_progress, "simulate",
                          setup=(lambda sim: cluster.attach_single(sim, pubs[0])) if pubs else None)
    except RunInterrupted as exc:
        if args.json and exc.partial is not None:
            with sigint_deferred():
                write_json(args.json, {**exc.partial.to_json(), **extra}, "the partial JSON result")
        raise
    except ChildProcessDied as exc:     # the online run finished: report and write it, then fail
        if exc.partial is None:
            raise
        res, failure = exc.partial, exc
        extra["error"] = str(exc)
    extra["kv_events_published"] = pubs[0].published if pubs else 0
    if pubs:
        print(f"  KV events: {extra['kv_events_published']} batches published")
    print(summary_table(res, getattr(args, "verbose", False)))
    has_state = cfg.preset.kv_config(num_blocks=cfg.num_blocks).has_state
    why = explain_gap(res, has_state)
    if why:
        print(why)
    if res.tiers is not None:
        extra["without_tiers"] = tier_baseline(cfg, items, args, res)
    if res.hints is not None:
        extra["without_hints"] = hint_baseline(cfg, items, args, res)
    steps = format_next_steps(next_steps(res, load, 1, larger_cache(args, preset), has_state))
    if steps:
        print(steps)
    if res.rejected == res.requests:
        print(f"hybridkv simulate: warning: all {res.requests} requests were rejected "
              f"(prompt >= --max-model-len {cfg.max_model_len})", file=sys.stderr)
    if args.json:
        write_json(args.json, {**res.to_json(), **extra})
    if args.plot:
        title = describe(cfg, args, len(items)).splitlines()[0].split(": ", 1)[1]
        print(f"wrote {write_output(args.plot, lambda p: plot_run(res, p, title=title), 'the plot')}")
    if failure is not None:
        raise failure
    return 0


COMMANDS.register("simulate", Command(
    help="trace-driven simulation: hit rates, latency, the optimum, next steps",
    add_arguments=add_arguments, run=run, description=DESCRIPTION, option_names=OPTION_NAMES))

__all__ = ["DESCRIPTION", "add_arguments", "describe", "optimum_memory_warning", "run", "run_one"]
