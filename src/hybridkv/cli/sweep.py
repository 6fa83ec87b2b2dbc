"""``hybridkv sweep``: hit rate against cache size, retention interval or instance count,
with the offline optimum.

A sweep varies one thing: cache sizes (``--cache-tokens-list``, the default), retention
intervals (``--retention-intervals``), instance counts (``--instances-list``, a cluster of N
behind ``--router``) or the CPU tier's size (``--cpu-cache-tokens-list``;
:mod:`hybridkv.cli.tier_options`), the last three at one cache size (``--cache-tokens`` / ``--num-blocks``, or
what the GPUs leave); with ``--eviction-policies`` every size once per policy. The hardware
options are ``simulate``'s (:mod:`hybridkv.cli.capacity`): without ``--gpus`` every row runs on
the fewest GPUs that hold the largest size. For a preset with recurrent-state groups the
retention interval is where checkpoints are written, so ``--retention-intervals`` measures hit
rate against checkpoint memory, with vLLM's forced-block "align" mode as the baseline
(:mod:`hybridkv.sim.state_sweep`). Jobs run on an executor (:mod:`hybridkv.sim.executors`):
serially, in local processes or as Ray tasks. Ctrl-C stops every executor within seconds and
writes the finished rows to ``--json`` as ``{"partial": true, "rows": [...], "unfinished": [...]}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.capacity import add_size_options, capacity_blocks, plan_gpus, requested_bytes, size_option
from hybridkv.cli.cluster import (DEFAULT_ROUTER, MAX_INSTANCES, add_max_skew_option,
                                  check_max_skew_option, max_skew)
from hybridkv.cli.hint_options import add_hint_options, apply_hints
from hybridkv.cli.options import (int_in, name_options, non_negative_number, parse_count_list, parse_int_list,
                                  parse_policy_list, parse_retention_list, sweepable_policies)
from hybridkv.cli.output import json_to_stdout, progress_bar, write_json, write_output
from hybridkv.cli.sim_options import (OPTION_NAMES, add_common_options, build_config, check_options,
                                      cost_source, load_items, options_preset, profile_warning,
                                      warn)
from hybridkv.cli.tier_options import add_tier_options, tier_config
from hybridkv.core.specs import is_state
from hybridkv.sim.interrupt import RunInterrupted, sigint_deferred
from hybridkv.sim.cluster.routing import DEFAULT_OVERLAP_WEIGHT, ROUTERS
from hybridkv.sim.simulator import SimConfig, SimResult
from hybridkv.sim.traffic.workitems import WorkItem

DEFAULT_SIZES = (10**6, 3 * 10**6, 10**7)
DESCRIPTION = """Sweep one thing and print a row per value: cache sizes (--cache-tokens-list, default
1M,3M,10M), retention intervals (--retention-intervals) or instance counts (--instances-list),
with the offline optimum beside each online hit rate; --eviction-policies runs every size once
per policy. Without --gpus every row runs on the fewest GPUs that hold the weights and the
largest size (--gpu-memory-fraction, default 0.9, as in vLLM). Ctrl-C stops the sweep on any
executor: exit status 130, and --json gets the finished rows as
{"partial": true, "rows": [...], "unfinished": [...]}.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hybridkv.sim.executors import EXECUTORS
    add_common_options(p)
    what = p.add_argument_group("what to sweep (one of them)")
    what.add_argument("--cache-tokens-list", type=parse_count_list,
                      help="comma-separated cache sizes in tokens (default 1M,3M,10M)")
    what.add_argument("--retention-intervals", type=parse_retention_list, metavar="N,N,...",
                      help="comma-separated intervals, e.g. none,0,1024; for a preset with "
                           "recurrent-state groups, checkpoint intervals against checkpoint "
                           "memory, with vLLM's forced-block 'align' mode as the baseline")
    what.add_argument("--instances-list", type=parse_int_list(1, MAX_INSTANCES), metavar="N,N,...",
                      help="comma-separated instance counts, e.g. 1,2,4: a cluster of N behind "
                           "--router per row, each instance with the cache and GPUs of the options")
    add_size_options(p, "the cache of a retention or instances sweep")
    cl = p.add_argument_group("clusters")
    cl.add_argument("--instances", type=int_in(1, MAX_INSTANCES),
                    help="run every row as a cluster of this many instances behind --router")
    cl.add_argument("--router", choices=ROUTERS.names(),
                    help=f"routing policy of a cluster row (default {DEFAULT_ROUTER})")
    cl.add_argument("--router-overlap-weight", type=non_negative_number,
                    help="kv-aware/approximate: weight of a request's uncached prefill against "
                         f"queued prefill tokens (default {DEFAULT_OVERLAP_WEIGHT:g})")
    add_max_skew_option(cl)
    p.add_argument("--json", help="write the rows as JSON to this path (- : standard output)")
    p.add_argument("--plot", help="write a plot (PNG, or another suffix matplotlib writes) of hit "
                                  "rate against the swept value")
    ex = p.add_argument_group("executors")
    ex.add_argument("--executor", choices=EXECUTORS, default="serial",
                    help="serial (default): one configuration after another; processes: local "
                         "processes; ray: one Ray task per configuration (pip install 'hybridkv[ray]')")
    ex.add_argument("--workers", type=int_in(1),
                    help="processes, or local Ray CPUs (default: the usable cores)")
    ex.add_argument("--ray-address",
                    help="Ray cluster to submit to (ray.init address, e.g. auto or ray://HOST:10001); "
                         "default: a local Ray")
    p.add_argument("--eviction-policies", type=parse_policy_list, metavar="A,B,C|all",
                   help=f"sweep these policies too (all = {','.join(sweepable_policies())}); prints "
                        "policy x cache size -> hit rate and fraction of the optimum")
    add_tier_options(p, sweep=True)
    add_hint_options(p, sweep=True)


def _swept(args: argparse.Namespace) -> list[str]:
    return [o for o, v in (("--cache-tokens-list", args.cache_tokens_list),
                           ("--retention-intervals", args.retention_intervals),
                           ("--instances-list", args.instances_list),
                           ("--cpu-cache-tokens-list", args.cpu_cache_tokens_list)) if v is not None]


def is_cluster(args: argparse.Namespace) -> bool:
    return args.instances_list is not None or (args.instances or 1) > 1 or args.router is not None


def check_sweep_options(args: argparse.Namespace) -> None:
    """A sweep varies one thing; refuse options the chosen sweep would ignore (before the
    trace is read)."""
    swept = _swept(args)
    if len(swept) > 1:
        raise ValueError(f"sweep one thing at a time: {' or '.join(swept)} (with --cache-tokens "
                         "or --num-blocks for the size of a retention or instances sweep)")
    size = size_option(args)
    if size is not None and swept in ([], ["--cache-tokens-list"]):
        raise ValueError(f"{size.split()[0]} sets the cache size of a retention, instances or "
                         "CPU-tier sweep (--retention-intervals, --instances-list, "
                         "--cpu-cache-tokens-list); to sweep sizes use --cache-tokens-list, e.g. 1M,3M")
    if args.eviction_policies and swept not in ([], ["--cache-tokens-list"]):
        raise ValueError(f"sweep one thing at a time: --eviction-policies sweeps cache sizes "
                         f"(--cache-tokens-list), not {swept[0]}")
    hinted = "--hints" if args.hints is not None else "--pins" if args.pins is not None else None
    if hinted and (swept not in ([], ["--cache-tokens-list"]) or args.eviction_policies):
        raise ValueError(f"sweep one thing at a time: {hinted} sweeps hints at each size of "
                         "--cache-tokens-list (not with --retention-intervals, --instances-list, "
                         "--cpu-cache-tokens-list or --eviction-policies)")
    if args.instances is not None and args.instances_list is not None:
        raise ValueError("--instances-list sweeps the instance count; drop --instances")
    weight = args.router_overlap_weight
    if weight is not None:
        readers = [n for n in ROUTERS.names() if ROUTERS.get(n).uses_overlap_weight]
        if not is_cluster(args) or (args.router or DEFAULT_ROUTER) not in readers:
            got = f"--router {args.router or DEFAULT_ROUTER}" if is_cluster(args) else "one instance"
            raise ValueError(f"--router-overlap-weight {weight:g} is read only by --router "
                             f"{' or '.join(readers)} with --instances or --instances-list; got {got}")
    check_max_skew_option(args, args.router or DEFAULT_ROUTER, is_cluster(args),
                          "--instances or --instances-list")
    if is_cluster(args) and args.sequential:
        raise ValueError("--sequential has no clock: it does not apply to a cluster "
                         "(--instances, --instances-list, --router)")
    if args.workers is not None and args.executor == "serial":    # executors, before the trace
        raise ValueError(f"--workers {args.workers} needs --executor processes or ray")
    if args.ray_address is not None and args.executor != "ray":
        raise ValueError(f"--ray-address {args.ray_address} needs --executor ray")
    if args.executor == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError('--executor ray needs Ray: pip install "hybridkv[ray]"')


def warn_workers(args: argparse.Namespace) -> None:
    """More local workers than usable cores share them: say so (stderr)."""
    from hybridkv.sim.executors import default_workers
    cores = default_workers()
    if args.workers is not None and args.workers > cores and args.ray_address is None:
        print(f"hybridkv sweep: warning: --workers {args.workers} is more than the {cores} usable "
              f"cores; the runs share them and finish no sooner than with --workers {cores}",
              file=sys.stderr)


def _is_state_sweep(args: argparse.Namespace, preset) -> bool:
    return args.retention_intervals is not None and any(is_state(g.spec)
                                                        for g in preset.groups)


def _plan(args: argparse.Namespace, preset) -> None:
    """Check the hardware against the largest size of the sweep; pick ``--gpus``."""
    if args.retention_intervals is None and args.instances_list is None and args.cpu_cache_tokens_list is None:
        sizes = args.cache_tokens_list if args.cache_tokens_list is not None else DEFAULT_SIZES
        asked = [(f"--cache-tokens-list item {s:,}", requested_bytes(args, preset, s)) for s in sizes]
    else:
        asked = [(size_option(args) or "", requested_bytes(args, preset))]
    plan_gpus(args, preset, asked)


def run(args: argparse.Namespace) -> int:
    with json_to_stdout(args.json):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    check_options(args)
    check_sweep_options(args)
    preset = options_preset(args)
    _plan(args, preset)
    state = _is_state_sweep(args, preset)
    if state:
        check_state_sweep_options(args)
    warn_workers(args)
    items = load_items(args)
    from hybridkv.sim.traffic.workload_fit import context_warning
    for warning in (context_warning(preset, items, args.max_model_len),
                    profile_warning(args.profile, preset)):
        if warning:
            warn(args, name_options(warning, OPTION_NAMES))
    if not args.no_optimum and not state:          # each configuration's optimum, one at a time
        from hybridkv.cli.simulate import optimum_memory_warning
        from hybridkv.sim.bounds.optimum_memory import available_memory_bytes
        warning = optimum_memory_warning(SimConfig(preset=preset, gpu=args.gpu, num_blocks=2),
                                         items, available_memory_bytes())
        if warning:
            print(f"hybridkv sweep: {warning} (per process running a configuration)", file=sys.stderr)
    try:
        if state:
            return sweep_state(args, items, preset)
        if args.cpu_cache_tokens_list is not None:
            return sweep_tiers(args, items, preset)
        if args.hints is not None or args.pins is not None:
            return sweep_hints(args, items, preset)
        return _sweep(args, items, preset)
    except RunInterrupted as exc:
        if args.json:
            done = exc.partial or []
            with sigint_deferred():
                write_json(args.json, {"partial": True, "rows": [r for _, r in done if r],
                                       "unfinished": [v for v, r in done if not r]},
                           "the partial JSON rows")
        raise


def _sweep(args: argparse.Namespace, items: list[WorkItem], preset) -> int:
    """A sweep of attention presets (sizes, retention intervals, instances, policies)."""
    from hybridkv.sim.cluster.loop import ClusterJob
    from hybridkv.sim.report.summary import plot_sweep
    if args.retention_intervals is not None:
        blocks = capacity_blocks(args, preset)
        runs = [(v, build_config(args, num_blocks=blocks, retention=v)) for v in args.retention_intervals]
        xlabel, log_x = "retention interval (tokens; none plotted as 0)", False
    elif args.instances_list is not None:
        cfg = build_config(args, num_blocks=capacity_blocks(args, preset))
        runs = [(n, cfg) for n in args.instances_list]
        xlabel, log_x = "instances", False
    else:
        sizes = args.cache_tokens_list if args.cache_tokens_list is not None else DEFAULT_SIZES
        runs = [(s, apply_hints(build_config(args, num_blocks=capacity_blocks(args, preset, s)),
                                args, items)) for s in sizes]
        xlabel, log_x = "KV cache size (tokens)", True
    if is_cluster(args):
        weight = args.router_overlap_weight
        job = lambda v, c: ClusterJob(  # noqa: E731
            c, v if args.instances_list is not None else (args.instances or 1),
            args.router or DEFAULT_ROUTER, DEFAULT_OVERLAP_WEIGHT if weight is None else weight,
            max_skew(args))
        runs = [(v, job(v, c)) for v, c in runs]
    print(_header(args, preset, runs, len(items)))
    first = getattr(runs[0][1], "config", runs[0][1])
    if not first.sequential:
        print(f"step times: {cost_source(first)}")
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
            log_x=log_x), "the plot"))
    if failed:
        print(f"hybridkv sweep: {failed} of {len(runs)} configurations failed (see above)", file=sys.stderr)
        return 1
    return 0


def _header(args: argparse.Namespace, preset, runs: list, n_items: int) -> str:
    cfg = runs[0][1]
    cfg = getattr(cfg, "config", cfg)
    where = f"{args.gpus} x {args.gpu.name}" + (" per instance" if is_cluster(args) else "")
    n = len(runs) * (len(args.eviction_policies) if args.eviction_policies else 1)
    return (f"hybridkv sweep: {preset.name}, {n_items} requests, {n} configuration"
            f"{'' if n == 1 else 's'} on {where} ({args.executor})")


def run_configs(args: argparse.Namespace, runs: list[tuple[object, object]],
                items: list[WorkItem], tags: list[dict] | None = None
                ) -> tuple[list[dict], dict[int, SimResult], int]:
    """Run the sweep on the chosen executor; print each row as it finishes. ``tags``: per
    configuration, keys added to its row (a failed one too) and named in its printed line
    before the value (e.g. ``{"eviction_policy": "lru"}`` prints ``lru @ 200000``). Returns
    the JSON rows in configuration order (a failed one is ``{"value", "error"}``, plus the online
    run's keys when only its optimum's child died), the results by index
    (a cluster's combined result) and the number of failures. Ctrl-C: the executor stops its
    workers, then :class:`RunInterrupted` carries ``(value, row)`` per configuration (row
    ``{}``: unfinished)."""
    from hybridkv.sim.executors import execute
    bar, close_bar = progress_bar(not args.no_progress, f"sweep ({args.executor})")
    rows: list[dict] = [{} for _ in runs]
    results: dict[int, SimResult] = {}
    failed = 0
    counts: dict[int, tuple[int, int]] = {}

    def progress(index: int, done: int, total: int) -> None:
        counts[index] = (done, total)
        if bar:
            bar(sum(d for d, _ in counts.values()),
                sum(counts.get(i, (0, len(items)))[1] for i in range(len(runs))))
    def label(index: int, value: object) -> str:
        tag = " ".join(str(v) for v in tags[index].values()) if tags else ""
        return f"{tag} @ {_label(value)}" if tag else _label(value)
    outcomes = execute([cfg for _, cfg in runs], items, args.executor, args.workers,
                       args.ray_address, progress=progress)
    try:
        if bar:
            bar(0, len(runs) * len(items))
        for out in outcomes:
            value = runs[out.index][0]
            if out.result is None or out.error is not None:
                failed += 1
                row = {"value": value, "error": out.error, **(tags[out.index] if tags else {})}
                if out.result is not None:      # the online run finished (its optimum's child died)
                    row = {**out.result.to_json(), **row}
                rows[out.index] = row
                print(f"  {label(out.index, value):>10}: error: {out.error}", file=sys.stderr, flush=True)
            else:
                combined = getattr(out.result, "overall", None) or out.result
                results[out.index] = combined
                d = out.result.to_json()
                d["value"] = value
                d.update(tags[out.index] if tags else {})
                rows[out.index] = d
                opt = d["optimal_block_hit_rate"]
                hz = d["hazard_bound_block_hit_rate"]
                ttft = "n/a" if d["ttft_p50_s"] is None else f"{d['ttft_p50_s']:.3f} s"   # --sequential
                print(f"  {label(out.index, value):>10}: block hit rate {d['block_hit_rate']:.4f}, token hit rate "
                      f"{d['hit_rate']:.4f}, optimum {'n/a' if opt is None else f'{opt:.4f}'}, "
                      f"non-anticipative {'n/a' if hz is None else f'{hz:.4f}'}, "
                      f"TTFT p50 {ttft}, evictions {d['evictions']:,}, "
                      f"wall {d['wall_s']:.1f} s", flush=True)
    except KeyboardInterrupt:
        with sigint_deferred():
            outcomes.close()          # the executor stops what still runs
            close_bar()
        raise RunInterrupted([(v, r) for (v, _), r in zip(runs, rows)]) from None
    finally:
        close_bar()
    return rows, results, failed


def _label(value: object) -> str:
    """A swept value as the option spells it (retention None is ``none``)."""
    return "none" if value is None else str(value)


# ---- --hints -------------------------------------------------------------------------------------


def sweep_hints(args: argparse.Namespace, items: list[WorkItem], preset) -> int:
    """Every hint accuracy of ``args.hints`` (or the trace's own hints), each with every pin
    kind of ``--pins`` (default: as the hints say), and the run without hints, at every cache
    size; print the hints x size table, write ``--json`` (each row's ``hints``: the spec or
    null, ``pins``: the kind or null) and ``--plot`` (hit rate, and TTFT when timed, against
    accuracy; one pin kind only)."""
    from hybridkv.sim.report.hints import hint_sweep_table, plot_hint_sweep
    sizes = args.cache_tokens_list if args.cache_tokens_list is not None else DEFAULT_SIZES
    specs = list(args.hints.specs) if args.hints is not None else [None]
    pins = list(args.pins) if args.pins is not None else [None]
    if args.hints is None and not any(it.hint is not None for it in items):
        raise ValueError("--pins compares pin kinds of hints, but the workload carries none; "
                         "add --hints (e.g. --hints ttl=300:1)")
    if args.plot and len(pins) > 1:
        raise ValueError("--plot draws hint accuracy for one pin kind; give one --pins kind or drop --plot")
    runs = []
    for size in sizes:
        base = build_config(args, num_blocks=capacity_blocks(args, preset, size))
        runs.append((size, dataclasses.replace(base, hints=None, trace_hints=False, drop_trace_hints=True)))
        runs += [(size, dataclasses.replace(apply_hints(base, args, items, spec), retention=kind))
                 for spec in specs for kind in pins]
    timed = not runs[0][1].sequential
    if timed:
        print(f"step times: {cost_source(runs[0][1])}")
    given = args.hints if args.hints is not None else "of the trace"
    kinds = f", pins {','.join(args.pins)}" if args.pins is not None else ""
    print(f"{preset.name}: {len(items)} requests, hints {given}{kinds} and none, at "
          f"{', '.join(f'{s:,}' for s in sizes)} tokens", flush=True)
    rows, results, failed = run_configs(args, runs, items)
    labels = ["none"] + [" ".join(str(x) for x in (s if s is not None else "trace", k) if x is not None)
                         for s in specs for k in pins]
    for row, (_, cfg) in zip(rows, runs):
        row["hints"] = None if cfg.hints is None else str(cfg.hints)
        row["pins"] = cfg.retention
    print(hint_sweep_table(sizes, labels, rows, timed))
    if args.json:
        write_json(args.json, rows, "the JSON rows")
    if args.plot and not failed and args.hints is not None:
        title = f"{preset.name}, {args.trace or args.workload or 'chat'}, hints {args.hints}"
        print("wrote " + write_output(args.plot, lambda p: plot_hint_sweep(
            sizes, [s.accuracy for s in specs], rows, p, title, timed), "the plot"))
    if failed:
        print(f"hybridkv sweep: {failed} of {len(runs)} configurations failed (see above)", file=sys.stderr)
        return 1
    return 0


# ---- --cpu-cache-tokens-list --------------------------------------------------------------------


def sweep_tiers(args: argparse.Namespace, items: list[WorkItem], preset) -> int:
    """Every CPU tier size of ``args.cpu_cache_tokens_list`` at one GPU size; print the
    buyer's table (hit rate per tier, TTFT, loads), write ``--json`` and ``--plot``."""
    from hybridkv.sim.tiers.report import plot_tier_sweep, tier_sweep_table
    base = build_config(args, num_blocks=capacity_blocks(args, preset))
    gpu_tokens = base.cache_tokens
    sizes = args.cpu_cache_tokens_list
    runs = [(s, dataclasses.replace(base, tiers=tier_config(args, preset, cpu_tokens=s))) for s in sizes]
    print(f"{preset.name}: {len(items)} requests, GPU cache {gpu_tokens:,} tokens on {args.gpus} x "
          f"{args.gpu.name}, CPU tier sizes {', '.join(f'{s:,}' for s in sizes)}", flush=True)
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
    :func:`hybridkv.sim.policy_cost.op_cost`) and, with ``--plot``, draw it. Each row's line
    names its policy (``lru @ 200000``). Returns the JSON rows (each with ``eviction_policy``, a
    failed one too) and the number of failed configurations."""
    from hybridkv.sim.policy_cost import op_cost
    from hybridkv.sim.report.summary import plot_policies
    names = args.eviction_policies
    all_runs = [(v, _with_policy(cfg, p)) for p in names for v, cfg in runs]
    rows, _, failed = run_configs(args, all_runs, items,
                                  [{"eviction_policy": p} for p in names for _ in runs])
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
    lines += _reference_rows(rows, len(values))
    print("\n".join(lines))
    if args.plot and not failed:
        print("wrote " + write_output(args.plot, lambda path: plot_policies(
            names, values, rows, path, title=args.trace or args.workload), "the plot"))
    return rows, failed


def _reference_rows(rows: list[dict], n: int) -> list[str]:
    """The bounds of each size (the first successful row of it), aligned with the policy
    table: Belady, the non-anticipative hazard-rate reference (:mod:`hybridkv.sim.bounds.hazard`) and
    the unlimited cache, each as block hit rate / fraction of Belady."""
    out = []
    for key, name in (("optimal_block_hit_rate", "optimum"), ("hazard_bound_block_hit_rate", "hazard"),
                      ("unlimited_cache_block_hit_rate", "no limit")):
        cells = []
        for j in range(n):
            r = next((r for r in rows[j::n] if "error" not in r), {})
            v, opt = r.get(key), r.get("optimal_block_hit_rate")
            cells.append(f"{'-':>21}" if v is None else f"{v:>13.4f} / {v / opt:>5.3f}" if opt
                         else f"{v:>21.4f}")
        out.append(f"{name:>8} " + " ".join(cells))
    out.append("(optimum: Belady; hazard: the non-anticipative reference, ranking by age x turn; "
               "no limit: an unlimited cache)")
    return out


def _with_policy(job, policy: str):
    """``job`` (a SimConfig or a ClusterJob) under another eviction policy."""
    if isinstance(job, SimConfig):
        return dataclasses.replace(job, eviction_policy=policy)
    return dataclasses.replace(job, config=dataclasses.replace(job.config, eviction_policy=policy))


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
    print the checkpoint table, write ``--json`` (Ctrl-C: :class:`RunInterrupted` with the
    finished rows)."""
    from hybridkv.cost.presets import vllm_align_block_size
    from hybridkv.sim.state_sweep import run_checkpoint_config
    args.no_optimum = True
    blocks = capacity_blocks(args, preset)
    runs: list[tuple[str, SimConfig]] = [
        (f"N={'every ' + str(preset.block_size) if n is None else n}",
         build_config(args, num_blocks=blocks, retention=n)) for n in args.retention_intervals]
    align = vllm_align_block_size(preset)
    aligned = preset.with_block_size(align)
    memory = (blocks - 1) * preset.kv_config(num_blocks=2).block_bytes
    align_blocks = (capacity_blocks(args, aligned, args.cache_tokens) if args.cache_tokens is not None
                    else aligned.kv_config(memory_bytes=memory).num_blocks + 1)
    saved = args.block_size, args.vllm_compat
    args.block_size, args.vllm_compat = align, True
    try:
        base = build_config(args, num_blocks=align_blocks, retention=0)
    finally:
        args.block_size, args.vllm_compat = saved
    runs.append((f"vLLM align (block {align})", base))
    if getattr(args, "checkpoint_marks", False):
        # fixed intervals and the baseline without the marks; one more row with them
        runs = [(label, dataclasses.replace(cfg, checkpoint_marks=False)) for label, cfg in runs]
        runs.append(("N=0 + marks", dataclasses.replace(
            build_config(args, num_blocks=blocks, retention=0), checkpoint_marks=True)))
    print(f"{preset.name}: {len(items)} requests, {memory / 1e9:,.2f} GB of KV memory per "
          f"configuration ({(blocks - 1) * preset.block_size:,} tokens at block {preset.block_size}) "
          f"on {args.gpus} x {args.gpu.name}")
    print(f"  {'configuration':<26} {'token hit rate':>14} {'checkpoints':>11} "
          f"{'GB written':>11} {'GB resident mean':>17} {'peak':>7} {'GB/state':>9} "
          f"{'evictions':>10} {'TTFT p50':>9}", flush=True)
    rows: list[dict] = []
    for label, cfg in runs:
        try:
            row = run_checkpoint_config(label, cfg, items)
        except KeyboardInterrupt:
            done = [(lab, r) for (lab, _), r in zip(runs, rows)]
            raise RunInterrupted(done + [(lab, {}) for lab, _ in runs[len(rows):]]) from None
        rows.append(dataclasses.asdict(row))
        print(f"  {label:<26} {row.token_hit_rate:>14.4f} {row.checkpoints_written:>11} "
              f"{row.checkpoint_bytes_written / 1e9:>11.1f} {row.checkpoint_bytes_mean / 1e9:>17.2f} "
              f"{row.checkpoint_bytes_peak / 1e9:>7.2f} {row.checkpoint_bytes_per_state / 1e9:>9.4f} "
              f"{row.evictions:>10} "
              f"{'n/a' if row.ttft_p50_s is None else f'{row.ttft_p50_s:.3f} s':>9}", flush=True)
    if args.json:
        write_json(args.json, rows, "the JSON rows")
    return 0


COMMANDS.register("sweep", Command(
    help="hit rate against cache size, retention interval or instance count",
    add_arguments=add_arguments, run=run, description=DESCRIPTION, option_names=OPTION_NAMES))

__all__ = ["add_arguments", "check_sweep_options", "run", "run_configs", "sweep_hints", "sweep_policies", "sweep_state",
           "sweep_tiers"]
