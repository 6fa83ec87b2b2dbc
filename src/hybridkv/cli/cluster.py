"""The cluster and KV-events options of ``hybridkv simulate``, and the cluster report.

``--instances N --router R`` simulates N instances (each with the cache, GPUs and batching of
the other options) behind router R, reported like one run (the offline optimum over all
instances, evictions, throughput, next steps) plus per-instance rows, routing and queueing.
``--kv-events-endpoint EP`` publishes every instance's KV events over ZMQ in vLLM 0.33's
format (instance i as data-parallel rank i: tcp ports offset by i, as vLLM does). Both paths warn when prompts arrive faster than the instances can prefill.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import socket
import sys
from typing import Iterator

import math

from hybridkv.cli.options import int_in, non_negative_number, parse_max_skew
from hybridkv.cli.sim_options import cost_source
from hybridkv.sim.cluster.loop import ClusterResult, ClusterSimulator, OfferedLoad, offered_load
from hybridkv.sim.failures import ChildProcessDied
from hybridkv.sim.interrupt import RunInterrupted, sigint_deferred
from hybridkv.sim.cluster.routing import DEFAULT_MAX_SKEW, DEFAULT_OVERLAP_WEIGHT, ROUTERS, RouterTuning
from hybridkv.sim.simulator import SimConfig, Simulator
from hybridkv.sim.traffic.workitems import WorkItem

DEFAULT_ROUTER = "kv-aware"


MAX_INSTANCES = 1024
SHOWN_INSTANCES = 16
"""Per-instance rows printed; more instances print the first and last few (all are in --json)."""


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    """The cluster and KV-events options of ``simulate``."""
    g = p.add_argument_group("cluster and KV events")
    g.add_argument("--instances", type=int_in(1, MAX_INSTANCES), default=1,
                   help=f"engine instances behind one router, in [1, {MAX_INSTANCES}] (default 1)")
    g.add_argument("--router", choices=ROUTERS.names(),
                   help=f"routing policy with --instances (default {DEFAULT_ROUTER})")
    g.add_argument("--router-overlap-weight", type=non_negative_number,
                   help="kv-aware/approximate: weight of a request's uncached prefill against "
                        f"queued prefill tokens (default {DEFAULT_OVERLAP_WEIGHT:g})")
    add_max_skew_option(g)
    g.add_argument("--kv-events-endpoint",
                   help="publish KV events (vLLM 0.33 ZMQ format) here, e.g. tcp://*:5557 (bind) "
                        "or tcp://host:5557 (connect to a bound subscriber)")
    g.add_argument("--kv-events-replay-endpoint",
                   help="ROUTER endpoint serving replays of buffered batches, e.g. tcp://*:5558")


MAX_SKEW_HELP = (
    "kv-aware/approximate: bound on load skew, >= 1, or none: an instance takes a request only "
    "while its routed requests, with it, stay within this many times the mean of the other "
    f"instances' (the least-routed always may; default {DEFAULT_MAX_SKEW:g}: with 2 instances "
    "at most 2/3 of the requests go to one)")


def add_max_skew_option(g) -> None:
    """``--router-max-skew`` (``simulate`` and ``sweep``)."""
    g.add_argument("--router-max-skew", type=parse_max_skew, help=MAX_SKEW_HELP)


def max_skew(args: argparse.Namespace) -> float | None:
    """The routers' load-skew bound from ``--router-max-skew`` (None: ``none``, no bound)."""
    v = getattr(args, "router_max_skew", None)
    if v is None:
        return DEFAULT_MAX_SKEW
    return None if math.isinf(v) else v


def check_max_skew_option(args: argparse.Namespace, router: str, cluster: bool, where: str) -> None:
    """``--router-max-skew`` only where a KV-aware router reads it (ValueError)."""
    v = getattr(args, "router_max_skew", None)
    if v is None:
        return
    readers = [n for n in ROUTERS.names() if ROUTERS.get(n).bounds_skew]
    if not cluster or router not in readers:
        got = f"--router {router}" if cluster else "one instance"
        raise ValueError(f"--router-max-skew {'none' if math.isinf(v) else f'{v:g}'} is read only by "
                         f"--router {' or '.join(readers)} with {where}; got {got}")


def is_cluster(args: argparse.Namespace) -> bool:
    return args.instances != 1 or args.router is not None


def router_name(args: argparse.Namespace) -> str:
    return args.router or DEFAULT_ROUTER


def overlap_weight(args: argparse.Namespace) -> float:
    w = getattr(args, "router_overlap_weight", None)
    return DEFAULT_OVERLAP_WEIGHT if w is None else w


def check_args(args: argparse.Namespace) -> None:
    """Every rule of these options, checked before the trace is read (``ValueError``)."""
    if args.kv_events_replay_endpoint is not None and args.kv_events_endpoint is None:
        raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
    if args.kv_events_endpoint is not None:
        check_endpoints(args.kv_events_endpoint, args.kv_events_replay_endpoint)
    weight = getattr(args, "router_overlap_weight", None)
    if weight is not None:
        readers = [n for n in ROUTERS.names() if ROUTERS.get(n).uses_overlap_weight]
        if not is_cluster(args) or router_name(args) not in readers:
            got = f"--router {router_name(args)}" if is_cluster(args) else "one instance"
            raise ValueError(f"--router-overlap-weight {weight:g} is read only by --router "
                             f"{' or '.join(readers)} with --instances N; got {got}")
    check_max_skew_option(args, router_name(args), is_cluster(args), "--instances N")
    if (args.kv_events_endpoint is not None or is_cluster(args)) and args.sequential:
        raise ValueError("--sequential has no clock: it applies neither to --instances nor to "
                         "--kv-events-endpoint")


def check_endpoints(endpoint: str, replay: str | None) -> None:
    """The events extras are installed, both endpoints are well formed and a host to connect
    to resolves, naming the option."""
    try:
        from hybridkv.events.publisher import KVEventsConfig, is_bind_endpoint
    except ImportError as exc:
        raise ValueError(f"--kv-events-endpoint needs the events extras (missing: "
                         f"{exc.name or exc}): pip install \"hybridkv[events]\"") from None
    try:
        KVEventsConfig(endpoint=endpoint)
    except ValueError as exc:
        raise ValueError(f"--kv-events-endpoint: {exc}") from None
    if replay is not None:
        try:
            KVEventsConfig(endpoint=endpoint, replay_endpoint=replay)
        except ValueError as exc:
            raise ValueError(f"--kv-events-replay-endpoint: {exc}") from None
    if endpoint.startswith("tcp://") and not is_bind_endpoint(endpoint):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        host = host.strip("[]")
        try:
            socket.getaddrinfo(host, int(port))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--kv-events-endpoint {endpoint!r}: cannot resolve host {host!r} "
                             f"({getattr(exc, 'strerror', None) or exc}); give a reachable host "
                             "or bind with tcp://*:PORT") from None


def warn_capacity(cfg: SimConfig, items: list[WorkItem], instances: int) -> OfferedLoad | None:
    """Print the offered-load warning (stderr) when it applies; returns the load."""
    if cfg.sequential or len(items) < 2:
        return None
    load = offered_load(cfg, items, instances)
    msg = load.warning()
    if msg:
        print(msg, file=sys.stderr)
    return load


def events_config(cfg: SimConfig, args: argparse.Namespace) -> SimConfig:
    """``cfg`` with events recorded and sha256 hashes when ``--kv-events-endpoint`` is given."""
    if args.kv_events_endpoint is None:
        return cfg
    return dataclasses.replace(cfg, enable_events=True, hash_algo="sha256")


@contextlib.contextmanager
def publishers(args: argparse.Namespace, num: int) -> Iterator[list | None]:
    """One started :class:`ZmqEventPublisher` per instance (rank i), or None without
    ``--kv-events-endpoint``; all are shut down (drained) on exit."""
    if args.kv_events_endpoint is None:
        yield None
        return
    from hybridkv.events.publisher import KVEventsConfig, ZmqEventPublisher
    pubs: list = []
    try:
        for i in range(num):
            pubs.append(ZmqEventPublisher(KVEventsConfig(
                endpoint=args.kv_events_endpoint, replay_endpoint=args.kv_events_replay_endpoint,
                data_parallel_rank=i)))
        yield pubs
    finally:
        for pub in pubs:
            pub.shutdown()


def attach_single(sim: Simulator, pub) -> None:
    """Publish ``sim``'s events after every step (timestamps: the simulated clock)."""
    from hybridkv.events.stream import KVEventStream
    stream = KVEventStream(sim.kv, pub)
    sim.step_hooks.append(lambda start, end, out: stream.flush(end))


def balance_line(res: ClusterResult) -> str:
    """The requests' balance: the busiest instance's share, max / mean, and the bound the
    router honoured."""
    shares = res.request_shares
    busiest = max(range(len(shares)), key=shares.__getitem__) if shares else 0
    bound = ("no bound" if res.max_skew is None else
             f"bound: each instance within {res.max_skew:g}x the others' mean")
    return (f"requests max / mean {res.request_skew:.3f} (instance {busiest}: "
            f"{100 * shares[busiest] if shares else 0:.1f}% of them); {bound}")


def format_cluster(res: ClusterResult) -> str:
    """The per-instance table (at most :data:`SHOWN_INSTANCES` rows), the cluster's summary
    (the single run's table over all instances) and its routing and queueing line."""
    from hybridkv.sim.report.summary import summary_table
    d = res.to_json()

    def f(v: float | None, unit: str = " s") -> str:
        return "n/a" if v is None else f"{v:.4g}{unit}"
    per = d["per_instance"]
    shown = per if len(per) <= SHOWN_INSTANCES else per[:SHOWN_INSTANCES // 2] + per[-SHOWN_INSTANCES // 2:]
    lines = [f"  {'instance':>8} {'requests':>9} {'prompt tok':>12} {'hit rate':>9} {'evictions':>10} "
             f"{'TTFT p50':>10} {'TTFT p99':>10} {'queue p50':>10} {'queue p99':>10}"]
    for k, p in enumerate(shown):
        if len(shown) < len(per) and k == SHOWN_INSTANCES // 2:
            lines.append(f"  {'...':>8} ({len(per) - len(shown):,} more instances in --json)")
        lines.append(f"  {p['instance']:>8} {p['routed_requests']:>9,} {p['routed_prompt_tokens']:>12,} "
                     f"{p['hit_rate']:>9.4f} {p['evictions']:>10,} {f(p['ttft_p50_s']):>10} "
                     f"{f(p['ttft_p99_s']):>10} {f(p['queue_p50_s']):>10} {f(p['queue_p99_s']):>10}")
    lines.append("all instances:")
    lines.append(summary_table(res.overall))
    lines.append(f"  {'routing':<24}  load imbalance (max / mean prompt tokens) {d['load_imbalance']:.3f}; "
                 f"queue p50 / p99 {f(d['queue_p50_s'])} / {f(d['queue_p99_s'])}")
    lines.append(f"  {'balance':<24}  {balance_line(res)}")
    return "\n".join(lines)


def run_cluster(args: argparse.Namespace, cfg: SimConfig, items: list[WorkItem],
                progress=None, budget=None) -> tuple[ClusterResult, ChildProcessDied | None]:
    """``simulate --instances N --router R``: run and print the per-instance table (the caller
    writes ``--json``). Returns the result and, when the optimum's child died, that failure
    (the result is then the online run's, without the bound)."""
    router = router_name(args)
    n = args.instances
    spec = f", spec {cfg.spec.method}:{cfg.spec.num_speculative_tokens}" if cfg.spec else ""
    print(f"hybridkv simulate: {n} x {cfg.preset.name} on {cfg.num_gpus} x {cfg.gpu.name} each, "
          f"~{cfg.cache_tokens:,} cache tokens each, router {router}, {len(items)} requests{spec}")
    if cfg.deployment is not None:
        print(f"  deployment: {cfg.deployment.describe()}")
    if budget is not None:
        from hybridkv.cli.capacity import is_default_size
        if is_default_size(args):
            print(f"  KV cache per instance: what its GPUs leave: {budget.describe()}")
    print(f"  step times: {cost_source(cfg)}")
    load = warn_capacity(cfg, items, n)
    cfg = events_config(cfg, args)
    with publishers(args, n) as pubs:
        sinks = None
        if pubs is not None:
            from hybridkv.events.wire import WireMapper
            mapper = WireMapper(cfg.preset.kv_config(num_blocks=cfg.num_blocks))
            sinks = [(lambda start, end, events, p=p: p.publish(mapper.batch(events, end)))
                     for p in pubs]
        sim = ClusterSimulator(cfg, n, router, RouterTuning(overlap_weight(args), max_skew(args)),
                               event_sinks=sinks, progress=progress)
        failure = None
        try:
            res = sim.run(items)
        except RunInterrupted as exc:
            exc.partial.offered = load
            raise
        except ChildProcessDied as exc:   # the online run finished: report it, then fail
            if exc.partial is None:
                raise
            res, failure = exc.partial, exc
    if pubs is not None:
        res.kv_events_published = sum(p.published for p in pubs)
    res.offered = load
    print(format_cluster(res))
    if pubs is not None:
        print(f"  KV events: {res.kv_events_published} batches published")
    return res, failure


def instances_option(args: argparse.Namespace):
    """``f(n)`` -> the options that run ``n`` instances of this run's deployment: ``--instances
    n`` when it was given, ``--dp n`` (``--gpus`` n x tp) for replicas of a deployment; None for
    fewer ranks of data-parallel attention than run (they may not hold the experts)."""
    dep = getattr(args, "deployment", None)
    if dep is None or dep.reason.startswith("--instances"):
        return lambda n: f"--instances {n}"
    if dep.dp_attention:
        return lambda n: (f"--tp {dep.tp} --dp {n} --ep {n * dep.tp}" if n >= dep.dp else None)
    return lambda n: f"--tp {dep.tp} --dp {n}"


def run_cluster_command(args: argparse.Namespace, cfg: SimConfig, items: list[WorkItem],
                        budget=None) -> int:
    """The cluster branch of ``simulate``: run, report, next steps, ``--json``, ``--plot``;
    Ctrl-C writes the partial result to ``--json``. When the optimum's child died, the online
    result is still reported and written (its JSON's ``error`` says why the bound is missing),
    then :class:`~hybridkv.sim.failures.ChildProcessDied` is raised again (exit status 1)."""
    from hybridkv.cli.capacity import larger_cache
    from hybridkv.cli.output import progress_bar, write_json, write_output
    from hybridkv.cli.sim_options import options_preset
    from hybridkv.sim.report.advice import next_steps
    from hybridkv.sim.report.summary import explain_gap, format_next_steps, plot_cluster
    progress, close = progress_bar(not args.no_progress, "simulate")
    extra = {"hardware": budget.to_json()} if budget is not None else {}
    try:
        result, failure = run_cluster(args, cfg, items, progress, budget)
    except RunInterrupted as exc:
        close()
        if args.json and exc.partial is not None:
            with sigint_deferred():
                write_json(args.json, {**exc.partial.to_json(), **extra}, "the partial JSON result")
        raise
    finally:
        close()
    if result.overall.tiers is not None:
        from hybridkv.sim.tiers.report import tier_summary
        result.overall.config.setdefault("cache_tokens", cfg.cache_tokens)
        print(tier_summary(result.overall).replace(
            "KV tiers (", f"KV tiers of each of the {args.instances} instances, counts summed (", 1))
    has_state = cfg.preset.kv_config(num_blocks=cfg.num_blocks).has_state
    why = explain_gap(result.overall, has_state)
    if why:
        print(why)
    steps = format_next_steps(next_steps(result.overall, result.offered, args.instances,
                                         larger_cache(args, options_preset(args)), has_state,
                                         instances_option(args)))
    if steps:
        print(steps)
    if failure is not None:
        extra["error"] = str(failure)
    overall = result.overall
    if overall.requests and overall.rejected == overall.requests:
        print(f"hybridkv simulate: warning: all {overall.requests} requests were rejected "
              f"(prompt >= --max-model-len {cfg.max_model_len})", file=sys.stderr)
    if args.json:
        write_json(args.json, {**result.to_json(), **extra})
    if args.plot:
        print(f"wrote {write_output(args.plot, lambda p: plot_cluster(result, p), 'the plot')}")
    if failure is not None:
        raise failure
    return 0
