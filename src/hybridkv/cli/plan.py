"""``hybridkv plan``: the cheapest deployment that meets a latency SLO on a trace, what it costs,
each deployment's goodput and what a CPU tier, hints and KV-aware routing save.

Every option ``plan`` does not know is ``simulate``'s (the workload and the model: ``--trace``,
``--limit``, ``--preset``, ``--block-size``, ...): it is checked by ``simulate``'s own parser
and heads every candidate's command. ``plan`` owns what it searches (``--gpu`` kinds, the
options' value lists) and each candidate is one ``hybridkv simulate`` command line, parsed
and configured exactly as ``simulate`` does (:func:`job_of`), so rerunning a candidate's
``command`` gives its numbers. The search is :mod:`hybridkv.sim.plan`'s; simulations run on
the sweep executors (:mod:`hybridkv.sim.executors`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Sequence

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.options import int_in, non_negative_number, parse_policy_list
from hybridkv.cli.output import check_output_path, check_plot_path, json_to_stdout, write_json, write_output
from hybridkv.sim.plan.pricing import GPU_HOUR_USD
from hybridkv.sim.plan.slo import SLO
from hybridkv.sim.plan.space import Candidate, Space

DESCRIPTION = """\
Find the cheapest deployment that meets a latency SLO on a workload: searches GPU kinds (--gpu
h100,h200), GPU counts (instances behind a router, up to --max-gpus), the cache's memory
fraction, a CPU tier, the eviction policy, hints and the router, simulating each candidate at
the trace's load (cheapest first, pruned by a prefill-rate bound), then prints the choice and
its $/M tokens, the highest load each deployment meets the SLO at (goodput: --rate-scale x the
trace's), what a CPU tier, hints and KV-aware routing save (the same search without each), and
how many simulations ran. Options it does not know are simulate's (--trace, --limit,
--duration, --preset, --block-size, ...) and head every candidate's `hybridkv simulate`
command in --json. --plot draws output tokens/s per GPU against tokens/s per user.
"""

#: The CPU tier a plan tries by default, GB per GPU: within the host memory per GPU of the
#: priced VMs (:data:`hybridkv.sim.plan.pricing.HOST_GB_PER_GPU`).
DEFAULT_CPU_GB = 200.0

#: simulate options a plan searches or sets itself -> the plan option to use instead.
OWNED = {"--gpu": "--gpu KIND,KIND", "--gpus": "--gpus-per-instance", "--instances": "--max-gpus",
         "--tp": "--gpus-per-instance", "--dp": "--max-gpus", "--ep": "(not searched)",
         "--router": "--routers", "--gpu-memory-fraction": "--gpu-memory-fractions",
         "--cpu-cache-gb": "--cpu-cache-gb GB,GB", "--cpu-cache-tokens": "--cpu-cache-gb GB,GB",
         "--hints": "--hints none,KIND", "--eviction-policy": "--eviction-policies",
         "--json": "--json", "--plot": "--plot", "--rate-scale": "its goodput search",
         "--no-optimum": "(always on)", "--sequential": "(a plan is timed)",
         "--cache-tokens": "--gpu-memory-fractions", "--num-blocks": "--gpu-memory-fractions",
         "--kv-events-endpoint": "(not in a plan)", "--no-baseline": "(always)"}


def _list(kind, what: str):
    def parse(text: str) -> list:
        out = []
        for i, item in enumerate(str(text).split(","), 1):
            if not item.strip():
                raise argparse.ArgumentTypeError(f"item {i} of {text!r} is empty ({what})")
            out.append(kind(item.strip()))
        return list(dict.fromkeys(out))
    return parse


def _gpu_kind(text: str) -> str:
    from hybridkv.cost.presets import GPU_PRESETS
    if text not in GPU_PRESETS:
        raise argparse.ArgumentTypeError(f"unknown GPU {text!r}; valid: {', '.join(GPU_PRESETS)}")
    return text


def _fraction(text: str) -> float:
    v = non_negative_number(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"a memory fraction must be in (0, 1], got {text!r}")
    return v


def _hint(text: str) -> str | None:
    from hybridkv.cli.hint_options import parse_hint_spec
    if text == "none":
        return None
    parse_hint_spec(text)
    return text


def _price(text: str) -> tuple[str, float]:
    kind, sep, usd = str(text).partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KIND=USD, got {text!r} (e.g. h100=2.49)")
    return _gpu_kind(kind.strip()), non_negative_number(usd)


def _router(text: str) -> str:
    from hybridkv.sim.cluster.routing import ROUTERS
    if text not in ROUTERS.names():
        raise argparse.ArgumentTypeError(f"unknown router {text!r}; valid: {', '.join(ROUTERS.names())}")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hybridkv.sim.executors import EXECUTORS
    p.allow_abbrev = False            # every other option is simulate's: never guess a prefix
    p.add_argument("--slo", type=_slo, required=True, metavar="METRIC-pNN=TIME,...",
                   help="the targets: ttft-pNN and itl-pNN (NN 50, 90 or 99; ITL: a request's mean "
                        "time per output token), e.g. ttft-p99=2s,itl-p99=100ms")
    s = p.add_argument_group("what to search")
    s.add_argument("--gpu", type=_list(_gpu_kind, "GPU kinds"), default=["h100"], metavar="KIND,KIND",
                   help="GPU kinds to try (default h100), e.g. h100,h200")
    s.add_argument("--gpus-per-instance", type=_list(int_in(1, 64), "GPU counts"), metavar="N,N",
                   help="GPUs of one instance to try (tensor parallel, communication priced; default: the fewest that "
                        "hold the weights and each power of two above it, up to --max-gpus)")
    s.add_argument("--max-gpus", type=int_in(1, 256), default=16,
                   help="the most GPUs of one deployment (default 16)")
    s.add_argument("--gpu-memory-fractions", type=_list(_fraction, "fractions"), default=[0.9],
                   metavar="F,F", help="the cache's share of GPU memory to try (default 0.9)")
    s.add_argument("--cpu-cache-gb", type=_list(non_negative_number, "GB per GPU"),
                   metavar="GB,GB", help="CPU tier sizes per GPU to try, 0: none (default 0,200, "
                                         "0 on a preset with recurrent-state groups; one instance only)")
    s.add_argument("--hints", type=_list(_hint, "hints"),
                   metavar="none,KIND", help="hints to try (simulate --hints values; none: "
                                             "without; default none,session-end, none with "
                                             "--vllm-compat or recurrent-state groups; one "
                                             "instance only)")
    s.add_argument("--eviction-policies", type=parse_policy_list, default=["lru"], metavar="A,B",
                   help="eviction policies to try (default lru)")
    s.add_argument("--routers", type=_list(_router, "routers"), default=["kv-aware", "least-loaded"],
                   metavar="A,B", help="routers to try with several instances (default "
                                       "kv-aware,least-loaded)")
    s.add_argument("--gpu-hour-usd", type=_price, action="append", metavar="KIND=USD",
                   help="a GPU-hour price (repeat per kind; defaults: "
                        + ", ".join(f"{k} {v:g}" for k, v in GPU_HOUR_USD.items()) + ")")
    g = p.add_argument_group("goodput")
    g.add_argument("--goodput-rows", type=int_in(0), default=3,
                   help="deployments whose goodput is measured, the dearest up to the choice (default 3)")
    g.add_argument("--goodput-runs", type=int_in(1), default=3,
                   help="simulations per deployment's goodput search (default 3)")
    g.add_argument("--goodput-precision", type=non_negative_number, default=1.25,
                   help="stop when the bracket's ends are within this ratio (default 1.25)")
    o = p.add_argument_group("output and executors")
    o.add_argument("--json", help="write the plan as JSON to this path (- : standard output)")
    o.add_argument("--plot", help="plot output tokens/s per GPU against tokens/s per user")
    o.add_argument("--no-progress", action="store_true", help="no progress lines")
    o.add_argument("--executor", choices=EXECUTORS, default="serial",
                   help="serial (default), processes or ray, as sweep's")
    o.add_argument("--workers", type=int_in(1), help="processes, or local Ray CPUs")
    o.add_argument("--ray-address", help="Ray cluster to submit to (with --executor ray)")
    p.set_defaults(accepts_any_arguments=True)


def _slo(text: str) -> SLO:
    try:
        return SLO.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Refuse(argparse.ArgumentParser):
    """simulate's parser for a plan: a usage error is a ValueError (one line from ``plan``)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(f"{message} (plan passes the options it does not know to simulate; see "
                         "hybridkv plan --help and hybridkv simulate --help)")


def _simulate_parser() -> argparse.ArgumentParser:
    from hybridkv.cli import simulate
    p = _Refuse(prog="hybridkv simulate", allow_abbrev=False)
    simulate.add_arguments(p)
    return p


#: simulate option prefixes a plan cannot pass to every candidate: tiers and routers exist on
#: some candidates only (one instance / several), KV events are not simulated in a plan.
PER_CANDIDATE = ("--cpu-", "--disk-", "--remote-", "--tier-", "--free-transfers", "--router-",
                 "--kv-events")


def check_passthrough(extra: Sequence[str]) -> None:
    """Refuse simulate options a plan searches or sets (naming the plan option instead), and
    those that apply to some candidates only."""
    for word in extra:
        opt = word.split("=", 1)[0]
        if opt in OWNED:
            raise ValueError(f"{opt} is what a plan searches or sets; use {OWNED[opt]}")
        if opt.startswith(PER_CANDIDATE):
            raise ValueError(f"{opt} applies to some of a plan's candidates only (tiers: one "
                             "instance; routers: several); a plan takes the simulator's defaults "
                             "for it")


def job_of(argv: list[str], items):
    """A candidate's ``simulate`` command line (without ``hybridkv simulate``) as the job the
    executors run: parsed, checked and configured as ``simulate`` does."""
    from hybridkv.cli import cluster
    from hybridkv.cli.capacity import plan_from_options
    from hybridkv.cli.hint_options import apply_hints
    from hybridkv.cli.sim_options import build_config, check_options, options_preset
    from hybridkv.sim.cluster.loop import ClusterJob
    from hybridkv.sim.traffic.workload_fit import check_fits
    ns = _simulate_parser().parse_args(argv)
    ns.command = "simulate"
    check_options(ns)
    cluster.check_args(ns)
    plan_from_options(ns, options_preset(ns))
    cfg = apply_hints(build_config(ns), ns, items)
    check_fits(cfg, items, True)
    if cluster.is_cluster(ns):
        return ClusterJob(cfg, ns.instances, cluster.router_name(ns), cluster.overlap_weight(ns),
                          cluster.max_skew(ns))
    return cfg


def run(args: argparse.Namespace) -> int:
    with json_to_stdout(args.json):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from hybridkv.cli.sim_options import load_items, options_preset
    from hybridkv.cost.hardware import fewest_gpus
    from hybridkv.cost.presets import get_gpu
    from hybridkv.sim.plan.planning import GoodputSearch, make_plan
    from hybridkv.sim.plan.report import Window, format_plan, limits, plot_front, to_json
    from hybridkv.sim.plan.search import Planner
    from hybridkv.sim.traffic.workitems import served_workload
    t0 = time.perf_counter()
    extra = list(getattr(args, "extra_arguments", None) or [])
    check_passthrough(extra)
    check_output_path(args.json, "--json", allow_stdout=True)
    check_plot_path(args.plot, {"--json": args.json})
    if args.goodput_precision <= 1:
        raise ValueError(f"--goodput-precision must be > 1, got {args.goodput_precision:g}")
    if args.workers is not None and args.executor == "serial":
        raise ValueError(f"--workers {args.workers} needs --executor processes or ray")
    sim = _simulate_parser().parse_args(extra + ["--gpu", args.gpu[0], "--no-optimum"])
    sim.command = "plan"
    preset = options_preset(sim)
    prices = {**GPU_HOUR_USD, **dict(args.gpu_hour_usd or [])}
    state = preset.kv_config(num_blocks=2).has_state
    if args.cpu_cache_gb is None:       # tiers hold no recurrent-state checkpoint
        args.cpu_cache_gb = [0.0] if state else [0.0, DEFAULT_CPU_GB]
    if args.hints is None:              # compat mode pins vLLM's LRU; no hints on state groups
        args.hints = [None] if sim.vllm_compat or state else [None, "session-end"]
    sizes = {}
    for kind in args.gpu:
        if args.gpus_per_instance:
            sizes[kind] = list(args.gpus_per_instance)
            continue
        n = fewest_gpus(preset, get_gpu(kind), max(args.gpu_memory_fractions))
        if n is None:
            raise ValueError(f"{preset.name}'s weights fit no count of {kind}: drop it from --gpu")
        sizes[kind] = [n << k for k in range(9) if n << k <= args.max_gpus]
    space = Space(sizes, args.max_gpus, prices, tuple(args.gpu_memory_fractions),
                  tuple(args.cpu_cache_gb), tuple(args.eviction_policies), tuple(args.hints),
                  tuple(args.routers))
    items = load_items(sim)
    base = ["hybridkv", "simulate", *extra]
    jobs = {c: job_of(extra + c.flags(), items) for c in space.candidates()}   # all refused now
    served, _ = served_workload(items, sim.max_model_len)
    if not served:
        raise ValueError("every request of the workload is rejected (prompt >= --max-model-len)")
    window = Window(len(served), served[-1].item.arrival_s - served[0].item.arrival_s,
                    sum(s.item.prompt_len for s in served), sum(s.max_tokens for s in served))
    first = next(iter(jobs.values()))
    cfg0 = getattr(first, "config", first)
    bound, pb, models = _bound(preset, served, cfg0, sizes)
    ttft = [t for t in args.slo.targets if t.metric == "ttft"]
    if ttft:
        from hybridkv.sim.plan.early import StopAtMiss
        stop = (tuple(t.limit_s for t in ttft), tuple(pb.over(t.percentile, len(served)) for t in ttft))
        jobs = {c: StopAtMiss(j, *stop) for c, j in jobs.items()}
    say = None if args.no_progress else (lambda m: print(f"hybridkv plan: {m}", file=sys.stderr))
    planner = Planner(space, args.slo, _evaluator(jobs, items, args), bound, say)
    sources = {k: models[(k, ns[0])].source for k, ns in sizes.items()}
    search = GoodputSearch(args.goodput_rows, args.goodput_precision, args.goodput_runs)
    result = make_plan(planner, window, base, limits(sources, space, window), search)
    src = f"trace {sim.trace}" if sim.trace else f"workload {sim.workload or 'chat'}"
    title = f"hybridkv plan: {preset.name} on {src}, SLO {args.slo}"
    print(format_plan(result, title))
    print(f"plan took {time.perf_counter() - t0:,.1f} s")
    if args.json:
        data = to_json(result)
        data["search"]["plan_wall_s"] = time.perf_counter() - t0
        write_json(args.json, data)
    if args.plot:
        print(f"wrote {write_output(args.plot, lambda p: plot_front(result, p, title), 'the plot')}")
    return 0


def _bound(preset, served, cfg, sizes: dict):
    """The planner's TTFT lower bound (:mod:`hybridkv.sim.plan.bound`) over the served requests,
    with one cost model per GPU kind and GPUs per instance; returns it, the
    :class:`~hybridkv.sim.plan.bound.PrefillBound` and the cost models."""
    from hybridkv.cost.presets import get_gpu
    from hybridkv.cost.profile import cost_model
    from hybridkv.sim.bounds.bound_inputs import reuse_ceiling_tokens
    from hybridkv.sim.bounds.optimum_memory import key_block_size
    from hybridkv.sim.plan.bound import PrefillBound, peak_prefill_rate
    key_block = key_block_size(preset.kv_config(num_blocks=cfg.num_blocks))
    pb = PrefillBound.of([s.item.arrival_s for s in served], [s.item.prompt_len for s in served],
                         reuse_ceiling_tokens(served, key_block))
    models = {(k, n): cost_model(preset, get_gpu(k), n, cfg.profile, cfg.cost_model)
              for k, ns in sizes.items() for n in ns}
    budget = cfg.sched.max_num_batched_tokens
    rate = {key: peak_prefill_rate(m, budget) for key, m in models.items()}
    floors = {key: pb.request_floors(m, budget) for key, m in models.items()}

    def bound(c: Candidate, scale: float, pct: int) -> float:
        key = (c.deployment.gpu, c.deployment.gpus_per_instance)
        return pb.ttft_lower_bound(rate[key] * c.deployment.instances, pct, scale, floors[key])
    return bound, pb, models


def _evaluator(jobs: dict, items: list, args: argparse.Namespace):
    """The planner's evaluator: each rate scale's pairs as one batch on the executor."""
    from hybridkv.sim.executors import execute
    from hybridkv.sim.plan.search import Measured
    from hybridkv.sim.traffic.workitems import scale_rate

    def evaluate(pairs: Sequence[tuple[Candidate, float]]) -> list[Measured]:
        out: list[Measured | None] = [None] * len(pairs)
        by_scale: dict[float, list[int]] = defaultdict(list)
        for i, (_, s) in enumerate(pairs):
            by_scale[s].append(i)
        for s, idx in by_scale.items():
            batch = [jobs[pairs[i][0]] for i in idx]
            last = time.perf_counter()
            for o in execute(batch, scale_rate(items, s), args.executor, args.workers,
                             args.ray_address):
                now = time.perf_counter()
                d = o.result.to_json() if o.result is not None else None
                wall = (d or {}).get("wall_s") or now - last   # a stopped run: until it stopped
                out[idx[o.index]] = Measured(d, o.error, float(wall))
                last = now
        return [m if m is not None else Measured(None, "not run") for m in out]
    return evaluate


COMMANDS.register("plan", Command(
    help="the cheapest deployment meeting a latency SLO: cost, goodput, what features save",
    add_arguments=add_arguments, run=run, description=DESCRIPTION))

__all__ = ["DESCRIPTION", "OWNED", "PER_CANDIDATE", "add_arguments", "check_passthrough", "job_of", "run"]
