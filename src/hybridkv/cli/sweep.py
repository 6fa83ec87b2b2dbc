"""``hybridkv sweep``: hit rate against cache size or retention interval, with the offline
optimum.

A sweep varies one thing: cache sizes (``--cache-tokens-list``, the default), retention
intervals (``--retention-intervals`` at one ``--cache-tokens``), the CPU tier's size
(``--cpu-cache-tokens-list`` at one ``--cache-tokens``; :mod:`hybridkv.cli.tier_options`), and
with ``--eviction-policies`` every size once per policy. For a preset with recurrent-state groups
the retention interval is where checkpoints are written, so ``--retention-intervals`` measures
hit rate against checkpoint memory, with vLLM's forced-block "align" mode as the baseline
(:mod:`hybridkv.sim.state_sweep`). Configurations run on an executor
(:mod:`hybridkv.sim.executors`): serially, in local processes or as Ray tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.options import (int_in, parse_count_list, parse_policy_list,
                                  parse_retention_list, positive_count, sweepable_policies)
from hybridkv.cli.output import progress_bar, write_json, write_output
from hybridkv.cli.sim_options import (DEFAULT_CACHE_TOKENS, OPTION_NAMES, add_common_options,
                                      build_config, capacity_blocks, check_options, cost_source, load_items,
                                      options_preset)
from hybridkv.cli.tier_options import add_tier_options, tier_config
from hybridkv.core.specs import StateSpec
from hybridkv.sim.simulator import SimConfig, SimResult
from hybridkv.sim.workitems import WorkItem

DEFAULT_SIZES = (10**6, 3 * 10**6, 10**7)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hybridkv.sim.executors import EXECUTORS
    add_common_options(p)
    p.add_argument("--cache-tokens-list", type=parse_count_list,
                   help="comma-separated cache sizes (default 1M,3M,10M)")
    p.add_argument("--retention-intervals", type=parse_retention_list, metavar="N,N,...",
                   help="comma-separated intervals, e.g. none,0,1024; for a preset with "
                        "recurrent-state groups, checkpoint intervals against checkpoint memory, "
                        "with vLLM's forced-block 'align' mode as the baseline")
    p.add_argument("--cache-tokens", type=positive_count,
                   help=f"cache size of a retention sweep (default {DEFAULT_CACHE_TOKENS:,})")
    p.add_argument("--json", help="write the rows as JSON to this path")
    p.add_argument("--plot", help="write a PNG of hit rate against the swept value")
    p.add_argument("--executor", choices=EXECUTORS, default="serial",
                   help="serial (default): one configuration after another; processes: local "
                        "processes; ray: one Ray task per configuration (pip install 'hybridkv[ray]')")
    p.add_argument("--workers", type=int_in(1),
                   help="processes, or local Ray CPUs (default: the usable cores)")
    p.add_argument("--ray-address",
                   help="Ray cluster to submit to (ray.init address, e.g. auto or ray://HOST:10001); "
                        "default: a local Ray")
    p.add_argument("--eviction-policies", type=parse_policy_list, metavar="A,B,C|all",
                   help=f"sweep these policies too (all = {','.join(sweepable_policies())}); prints "
                        "policy x cache size -> hit rate and fraction of the optimum")
    add_tier_options(p, sweep=True)


def check_sweep_options(args: argparse.Namespace) -> None:
    """A sweep varies sizes (``--cache-tokens-list``) or retention (``--retention-intervals``,
    at one ``--cache-tokens``); refuse options the chosen sweep would ignore."""
    tier_sweep = args.cpu_cache_tokens_list is not None
    if tier_sweep and (args.retention_intervals is not None or args.cache_tokens_list is not None
                       or args.eviction_policies):
        raise ValueError("sweep one thing at a time: --cpu-cache-tokens-list sweeps the CPU tier at "
                         "one --cache-tokens (not with --cache-tokens-list, --retention-intervals "
                         "or --eviction-policies)")
    if args.retention_intervals is None and args.cache_tokens is not None and not tier_sweep:
        raise ValueError("--cache-tokens sets the cache size of a retention sweep "
                         "(--retention-intervals); to sweep sizes use --cache-tokens-list, e.g. 1M,3M")
    if args.retention_intervals is not None and args.cache_tokens_list is not None:
        raise ValueError("sweep one thing at a time: --cache-tokens-list or --retention-intervals "
                         "(with --cache-tokens for its size)")
    if args.eviction_policies and args.retention_intervals is not None:
        raise ValueError("sweep one thing at a time: --eviction-policies sweeps cache sizes "
                         "(--cache-tokens-list), not --retention-intervals")
    if args.workers is not None and args.executor == "serial":    # executors, before the trace
        raise ValueError(f"--workers {args.workers} needs --executor processes or ray")
    if args.ray_address is not None and args.executor != "ray":
        raise ValueError(f"--ray-address {args.ray_address} needs --executor ray")
    if args.executor == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError('--executor ray needs Ray: pip install "hybridkv[ray]"')


def _is_state_sweep(args: argparse.Namespace, preset) -> bool:
    return args.retention_intervals is not None and any(isinstance(g.spec, StateSpec)
                                                        for g in preset.groups)


def run(args: argparse.Namespace) -> int:
    from hybridkv.sim.report import plot_sweep
    check_options(args)
    check_sweep_options(args)
    preset = options_preset(args)
    if _is_state_sweep(args, preset):
        check_state_sweep_options(args)
    items = load_items(args)
    if _is_state_sweep(args, preset):
        return sweep_state(args, items, preset)
    if args.cpu_cache_tokens_list is not None:
        return sweep_tiers(args, items, preset)
    if args.retention_intervals is not None:
        blocks = capacity_blocks(args, preset, args.cache_tokens if args.cache_tokens is not None
                                 else DEFAULT_CACHE_TOKENS)
        runs = [(v, build_config(args, num_blocks=blocks, retention=v)) for v in args.retention_intervals]
        xlabel = "retention interval (tokens; none plotted as 0)"
    else:
        sizes = args.cache_tokens_list if args.cache_tokens_list is not None else DEFAULT_SIZES
        runs = [(s, build_config(args, num_blocks=capacity_blocks(args, preset, s))) for s in sizes]
        xlabel = "KV cache size (tokens)"
    if runs and not runs[0][1].sequential:
        print(f"step times: {cost_source(runs[0][1])}")
    if args.eviction_policies:
        rows, failed = sweep_policies(args, runs, items)
        results, runs = {}, runs * len(args.eviction_policies)   # no plot here; counts all runs
    else:
        rows, results, failed = run_configs(args, runs, items)
    if args.json:
        write_json(args.json, rows, "the JSON rows")
    if args.plot and results:
        order = sorted(results)
        xs = [0 if runs[i][0] is None else runs[i][0] for i in order]
        print("wrote " + write_output(args.plot, lambda p: plot_sweep(
            xs, [results[i] for i in order], p, xlabel, title=f"{preset.name}",
            log_x=args.retention_intervals is None), "the plot"))
    if failed:
        print(f"hybridkv sweep: {failed} of {len(runs)} configurations failed (see above)", file=sys.stderr)
        return 1
    return 0


def run_configs(args: argparse.Namespace, runs: list[tuple[object, SimConfig]],
                items: list[WorkItem]) -> tuple[list[dict], dict[int, SimResult], int]:
    """Run the sweep on the chosen executor; print each row as it finishes. Returns the JSON
    rows in configuration order (a failed one is ``{"value", "error"}``), the results by index
    and the number of failures."""
    from hybridkv.sim.executors import execute
    serial = args.executor == "serial"
    show = not args.no_progress
    inner, close_inner = progress_bar(show and serial, "sweep")
    bar, close_bar = progress_bar(show and not serial, f"sweep ({args.executor})")
    rows: list[dict] = [{} for _ in runs]
    results: dict[int, SimResult] = {}
    failed = 0
    try:
        if bar:
            bar(0, len(runs))
        outcomes = execute([cfg for _, cfg in runs], items, args.executor, args.workers,
                           args.ray_address, progress=inner)
        for done, out in enumerate(outcomes, 1):
            value = runs[out.index][0]
            if out.result is None:
                failed += 1
                rows[out.index] = {"value": value, "error": out.error}
                print(f"  {_label(value):>10}: error: {out.error}", file=sys.stderr, flush=True)
            else:
                results[out.index] = out.result
                d = out.result.to_json()
                d["value"] = value
                rows[out.index] = d
                opt = d["optimal_block_hit_rate"]
                ttft = "n/a" if d["ttft_p50_s"] is None else f"{d['ttft_p50_s']:.3f} s"   # --sequential
                print(f"  {_label(value):>10}: block hit rate {d['block_hit_rate']:.4f}, token hit rate "
                      f"{d['hit_rate']:.4f}, optimum {'n/a' if opt is None else f'{opt:.4f}'}, "
                      f"TTFT p50 {ttft}, "
                      f"wall {d['wall_s']:.1f} s", flush=True)
            if bar:
                bar(done, len(runs))
    finally:
        close_inner()
        close_bar()
    return rows, results, failed


def _label(value: object) -> str:
    """A swept value as the option spells it (retention None is ``none``)."""
    return "none" if value is None else str(value)


# ---- --cpu-cache-tokens-list --------------------------------------------------------------------


def sweep_tiers(args: argparse.Namespace, items: list[WorkItem], preset) -> int:
    """Every CPU tier size of ``args.cpu_cache_tokens_list`` at one GPU size; print the
    buyer's table (hit rate per tier, TTFT, loads), write ``--json`` and ``--plot``."""
    from hybridkv.sim.tier_report import plot_tier_sweep, tier_sweep_table
    gpu_tokens = args.cache_tokens if args.cache_tokens is not None else DEFAULT_CACHE_TOKENS
    blocks = capacity_blocks(args, preset, gpu_tokens)
    base = build_config(args, num_blocks=blocks)
    sizes = args.cpu_cache_tokens_list
    runs = [(s, dataclasses.replace(base, tiers=tier_config(args, preset, cpu_tokens=s))) for s in sizes]
    print(f"{preset.name}: {len(items)} requests, GPU cache {gpu_tokens:,} tokens, CPU tier sizes "
          f"{', '.join(f'{s:,}' for s in sizes)}", flush=True)
    rows, results, failed = run_configs(args, runs, items)
    print(tier_sweep_table(sizes, rows))
    if args.json:
        write_json(args.json, rows, "the JSON rows")
    if args.plot and results:
        title = f"{preset.name}, {args.trace or args.workload or 'chat'}, GPU {gpu_tokens:,} tokens"
        print("wrote " + write_output(args.plot, lambda p: plot_tier_sweep(sizes, rows, p, title),
                                      "the plot"))
    if failed:
        print(f"hybridkv sweep: {failed} of {len(runs)} configurations failed (see above)", file=sys.stderr)
        return 1
    return 0


# ---- --eviction-policies -----------------------------------------------------------------------


def sweep_policies(args: argparse.Namespace, runs: list, items: list) -> tuple[list[dict], int]:
    """Run ``runs`` (value, SimConfig) once per policy of ``args.eviction_policies``; print a
    policy x size table (with each policy's cost per pool operation against LRU, measured now,
    :func:`hybridkv.sim.policy_cost.op_cost`) and, with ``--plot``, draw it. Returns the JSON
    rows (each with ``config.eviction_policy``) and the number of failed configurations."""
    from hybridkv.sim.policy_cost import op_cost
    from hybridkv.sim.report import plot_policies
    names = args.eviction_policies
    all_runs = [(v, dataclasses.replace(cfg, eviction_policy=p)) for p in names for v, cfg in runs]
    rows, _, failed = run_configs(args, all_runs, items)
    values = [v for v, _ in runs]
    cost = op_cost(names)
    lines = ["", f"{'policy':>8} " + " ".join(f"{str(v):>22}" for v in values) + f"{'op cost':>9}",
             f"{'':>8} " + " ".join(f"{'hit rate / of optimum':>22}" for _ in values) + f"{'/ lru':>9}"]
    for i, p in enumerate(names):
        cells = []
        for j in range(len(values)):
            r = rows[i * len(values) + j]
            if "error" in r:
                cells.append(f"{'error':>22}")
            else:
                frac = r["fraction_of_optimal"]
                cells.append(f"{r['block_hit_rate']:>13.4f} / {'-' if frac is None else f'{frac:.3f}':>5}")
        lines.append(f"{p:>8} " + " ".join(cells) + f"{cost[p]:>9.2f}")
    print("\n".join(lines))
    if args.plot and not failed:
        print("wrote " + write_output(args.plot, lambda path: plot_policies(
            names, values, rows, path, title=args.trace or args.workload), "the plot"))
    return rows, failed


# ---- --retention-intervals on a preset with recurrent-state groups -----------------------------


def check_state_sweep_options(args: argparse.Namespace) -> None:
    """What a state preset's retention sweep cannot honour (before the trace is read)."""
    if args.sequential:
        raise ValueError("--retention-intervals on a preset with recurrent-state groups samples "
                         "checkpoint memory per timed step; drop --sequential")
    if args.vllm_compat:
        raise ValueError("--retention-intervals on a preset with recurrent-state groups runs the "
                         "vLLM-compatible baseline itself; drop --vllm-compat")
    if args.executor != "serial":
        raise ValueError(f"--executor {args.executor}: a preset with recurrent-state groups sweeps "
                         "--retention-intervals serially; drop --executor")
    if args.plot:
        raise ValueError("--plot draws attention-only sweeps; a preset with recurrent-state "
                         "groups prints its retention sweep as a table (use --json for the rows)")


def sweep_state(args: argparse.Namespace, items: list[WorkItem], preset) -> int:
    """Every retention interval of ``args`` plus vLLM's align baseline at the same KV memory;
    print the checkpoint table, write ``--json``."""
    from hybridkv.sim.presets import vllm_align_block_size
    from hybridkv.sim.state_sweep import run_checkpoint_config
    cache_tokens = args.cache_tokens if args.cache_tokens is not None else DEFAULT_CACHE_TOKENS
    args.no_optimum = True
    blocks = capacity_blocks(args, preset, cache_tokens)
    runs: list[tuple[str, SimConfig]] = [
        (f"N={'every ' + str(preset.block_size) if n is None else n}",
         build_config(args, num_blocks=blocks, retention=n)) for n in args.retention_intervals]
    align = vllm_align_block_size(preset)
    saved = args.block_size, args.vllm_compat
    args.block_size, args.vllm_compat = align, True
    try:
        base = build_config(args, num_blocks=capacity_blocks(args, preset.with_block_size(align),
                                                             cache_tokens), retention=0)
    finally:
        args.block_size, args.vllm_compat = saved
    runs.append((f"vLLM align (block {align})", base))
    print(f"{preset.name}: {len(items)} requests, {cache_tokens:,} tokens of attention KV "
          f"memory per configuration")
    print(f"  {'configuration':<26} {'token hit rate':>14} {'checkpoints':>11} "
          f"{'GB written':>11} {'GB resident mean':>17} {'peak':>7} {'GB/state':>9} "
          f"{'evictions':>10}", flush=True)
    rows = []
    for label, cfg in runs:
        row = run_checkpoint_config(label, cfg, items)
        rows.append(dataclasses.asdict(row))
        print(f"  {label:<26} {row.token_hit_rate:>14.4f} {row.checkpoints_written:>11} "
              f"{row.checkpoint_bytes_written / 1e9:>11.1f} {row.checkpoint_bytes_mean / 1e9:>17.2f} "
              f"{row.checkpoint_bytes_peak / 1e9:>7.2f} {row.checkpoint_bytes_per_state / 1e9:>9.4f} "
              f"{row.evictions:>10}", flush=True)
    if args.json:
        write_json(args.json, rows, "the JSON rows")
    return 0


COMMANDS.register("sweep", Command(
    help="hit rate against cache size or retention interval", add_arguments=add_arguments,
    run=run, option_names=OPTION_NAMES))

__all__ = ["add_arguments", "check_sweep_options", "run", "run_configs", "sweep_policies", "sweep_state",
           "sweep_tiers"]
