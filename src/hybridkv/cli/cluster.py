"""The cluster and KV-events options of ``hybridkv simulate``, and the cluster report.

``--instances N --router R`` simulates N instances (each with the cache, GPUs and batching of
the other options) behind router R; ``--kv-events-endpoint EP`` publishes every instance's KV
events over ZMQ in vLLM 0.33's format (instance i as data-parallel rank i: tcp ports offset by
i, as vLLM does). Both paths warn when prompts arrive faster than the instances can prefill.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Iterator

from hybridkv.cli.options import int_in, non_negative_number
from hybridkv.cli.sim_options import cost_source
from hybridkv.sim.cluster import ClusterResult, ClusterSimulator, OfferedLoad, offered_load
from hybridkv.sim.routing import DEFAULT_OVERLAP_WEIGHT, ROUTERS
from hybridkv.sim.simulator import SimConfig, Simulator
from hybridkv.sim.workitems import WorkItem

DEFAULT_ROUTER = "kv-aware"


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    """The cluster and KV-events options of ``simulate``."""
    g = p.add_argument_group("cluster and KV events")
    g.add_argument("--instances", type=int_in(1), default=1,
                   help="engine instances behind one router (default 1)")
    g.add_argument("--router", choices=ROUTERS.names(),
                   help=f"routing policy with --instances (default {DEFAULT_ROUTER})")
    g.add_argument("--router-overlap-weight", type=non_negative_number, default=DEFAULT_OVERLAP_WEIGHT,
                   help="kv-aware/approximate: weight of a request's uncached prefill against "
                        f"queued prefill tokens (default {DEFAULT_OVERLAP_WEIGHT:g})")
    g.add_argument("--kv-events-endpoint",
                   help="publish KV events (vLLM 0.33 ZMQ format) here, e.g. tcp://*:5557 (bind) "
                        "or tcp://host:5557 (connect to a bound subscriber)")
    g.add_argument("--kv-events-replay-endpoint",
                   help="ROUTER endpoint serving replays of buffered batches, e.g. tcp://*:5558")


def is_cluster(args: argparse.Namespace) -> bool:
    return args.instances != 1 or args.router is not None


def check_args(args: argparse.Namespace) -> None:
    """Every rule of these options, checked before the trace is read (``ValueError``)."""
    if args.kv_events_replay_endpoint and not args.kv_events_endpoint:
        raise ValueError("--kv-events-replay-endpoint needs --kv-events-endpoint")
    if args.kv_events_endpoint:
        check_endpoints(args.kv_events_endpoint, args.kv_events_replay_endpoint)
    if is_cluster(args) and getattr(args, "plot", None):
        raise ValueError("--plot draws one instance's run; it does not apply with --instances "
                         "or --router (use --json for the per-instance results)")
    if (args.kv_events_endpoint or is_cluster(args)) and args.sequential:
        raise ValueError("--sequential has no clock: it applies neither to --instances nor to "
                         "--kv-events-endpoint")


def check_endpoints(endpoint: str, replay: str | None) -> None:
    """The events extras are installed and both endpoints are well formed, naming the option."""
    try:
        from hybridkv.events.publisher import KVEventsConfig
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
    if not args.kv_events_endpoint:
        return cfg
    return dataclasses.replace(cfg, enable_events=True, hash_algo="sha256")


@contextlib.contextmanager
def publishers(args: argparse.Namespace, num: int) -> Iterator[list | None]:
    """One started :class:`ZmqEventPublisher` per instance (rank i), or None without
    ``--kv-events-endpoint``; all are shut down (drained) on exit."""
    if not args.kv_events_endpoint:
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


def format_cluster(res: ClusterResult) -> str:
    d = res.to_json()
    o = d["overall"]

    def f(v: float | None, unit: str = " s") -> str:
        return "n/a" if v is None else f"{v:.4g}{unit}"
    lines = [f"  {'instance':>8} {'requests':>9} {'prompt tok':>12} {'hit rate':>9} "
             f"{'TTFT p50':>10} {'TTFT p99':>10} {'queue p50':>10} {'queue p99':>10}"]
    for p in d["per_instance"]:
        lines.append(f"  {p['instance']:>8} {p['routed_requests']:>9,} {p['routed_prompt_tokens']:>12,} "
                     f"{p['hit_rate']:>9.4f} {f(p['ttft_p50_s']):>10} {f(p['ttft_p99_s']):>10} "
                     f"{f(p['queue_p50_s']):>10} {f(p['queue_p99_s']):>10}")
    lines.append(f"  {'overall':>8} {o['requests']:>9,} {o['prompt_tokens']:>12,} "
                 f"{o['hit_rate']:>9.4f} {f(o['ttft_p50_s']):>10} {f(o['ttft_p99_s']):>10} "
                 f"{f(o['queue_p50_s']):>10} {f(o['queue_p99_s']):>10}")
    lines.append(f"  load imbalance (max / mean prompt tokens) {o['load_imbalance']:.3f}; "
                 f"block hit rate {o['block_hit_rate']:.4f}; preemptions {o['preemptions']}; "
                 f"wall {d['wall_s']:.1f} s")
    return "\n".join(lines)


def run_cluster(args: argparse.Namespace, cfg: SimConfig, items: list[WorkItem],
                progress=None) -> ClusterResult:
    """``simulate --instances N --router R``: run and print the per-instance table (the caller
    writes ``--json``)."""
    router = args.router or DEFAULT_ROUTER
    n = args.instances
    tokens = cfg.cache_tokens
    print(f"hybridkv simulate: {n} x {cfg.preset.name} on {cfg.num_gpus} x {cfg.gpu.name} each, "
          f"~{tokens:,} cache tokens each, router {router}, {len(items)} requests")
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
        sim = ClusterSimulator(cfg, n, router, overlap_weight=args.router_overlap_weight,
                               event_sinks=sinks, progress=progress)
        res = sim.run(items)
    if pubs is not None:
        res.kv_events_published = sum(p.published for p in pubs)
    res.offered = load
    print(format_cluster(res))
    if pubs is not None:
        print(f"  KV events: {res.kv_events_published} batches published")
    return res
