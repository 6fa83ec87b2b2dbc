"""The ``simulate``, ``sweep``, ``presets`` and ``traces`` commands: options -> :class:`SimConfig`
-> report.

Capacity, in order of precedence: ``--num-blocks`` (pool blocks), ``--cache-tokens`` (KV memory
for that many tokens of the preset, all groups counted), ``--gpu-memory-fraction`` (that share
of the GPUs' memory minus the weights). The default is 150k tokens for ``simulate`` (the default
chat workload's working set does not fit, so eviction shows) and 3M for a retention sweep.

Every option is validated where it is parsed (the "Validation" section: one argparse type per
kind of value, each naming the bad value and the valid range) or, for rules that involve
several options, in :func:`check_options` before anything runs; output paths are checked
before a run and a finished result is never lost (:func:`write_output`). Errors are
``ValueError`` (a usage error: exit 2 in :mod:`hybridkv.cli`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

from hybridkv.core.spec_decode import SPEC_OFF, SpecDecode, parse_spec
from hybridkv.options import int_in, parse_retention
from hybridkv.sched import SchedulerConfig
from hybridkv.sim.presets import GPU_PRESETS, MODEL_PRESETS, get_gpu, get_preset
from hybridkv.sim.simulator import (SimConfig, SimResult, Simulator, WorkItem, items_from_mooncake,
                                    items_from_trace)
from hybridkv.sim.traces import (BUNDLED_TRACES, WORKLOADS, get_workload, load_token_trace,
                                 resolve_trace, trace_format)

DEFAULT_PRESET = "deepseek-v4-style"
DEFAULT_WORKLOAD = "chat"
DEFAULT_CACHE_TOKENS = 3_000_000
DEFAULT_SIMULATE_CACHE_TOKENS = 150_000
"""The default ``simulate`` run: the chat workload's working set (~300k tokens) does not fit,
so eviction and per-group retention show (pass ``--cache-tokens`` or ``--gpu-memory-fraction``
for a real deployment's size)."""
DEFAULT_ACCEPTANCE_RATE = 0.7
MAX_SPEC_TOKENS = 64
"""Largest ``--spec METHOD:K`` (EAGLE uses 1-5, DFlash 7-15; each token is a lookahead slot
that every running request holds in every group)."""
MAX_BLOCK_SIZE = 4096
_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


# ---- Validation: one argparse type per kind of value -------------------------------------------


def parse_count(text: str) -> int:
    """``"3M"`` -> 3000000, ``"500k"`` -> 500000, ``"1.5G"``, ``"1e9"``; plain integers too.

    Refuses non-numbers, NaN, infinities, negative and fractional counts (0 is allowed here;
    :func:`positive_count` refuses it).
    """
    t = text.strip().lower().replace("_", "")
    mult = 1
    if t and t[-1] in _SUFFIX:
        mult = _SUFFIX[t[-1]]
        t = t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 4096, 500k, 3M, 1e9)") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite count: {text!r}")
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a non-negative whole count: {text!r}")
    return int(value)


def positive_count(text: str) -> int:
    """:func:`parse_count` that also refuses 0 (a size the user gives is never replaced)."""
    value = parse_count(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def fraction(lo_open: bool) -> Callable[[str], float]:
    """An argparse type: a float in ``(0, 1]`` (``lo_open``) or ``[0, 1]``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        ok = (0 < value <= 1) if lo_open else (0 <= value <= 1)
        if not ok:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(f"must be in {'(0, 1]' if lo_open else '[0, 1]'}, got {text!r}")
        return value
    parse.__name__ = "fraction"
    return parse


def parse_block_size(text: str) -> int:
    """A power of two in ``[1, MAX_BLOCK_SIZE]``."""
    value = int_in(1, MAX_BLOCK_SIZE)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(
            f"must be a power of two in [1, {MAX_BLOCK_SIZE}] (e.g. 16, 64, 256), got {text!r}")
    return value


def parse_count_list(text: str) -> list[int]:
    """``"1M,3M,10M"`` -> sizes (each >= 1); an empty item is named."""
    items = text.split(",")
    out = []
    for i, item in enumerate(items, 1):
        if not item.strip():
            raise argparse.ArgumentTypeError(f"item {i} of {text!r} is empty (example: 1M,3M,10M)")
        try:
            out.append(positive_count(item))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"item {i} of {text!r}: {exc}") from None
    return out


def parse_retention_list(text: str) -> list[int | None]:
    """``"none,0,1024"`` -> retention intervals; an empty item is named."""
    out = []
    for i, item in enumerate(text.split(","), 1):
        if not item.strip():
            raise argparse.ArgumentTypeError(f"item {i} of {text!r} is empty (example: none,0,1024)")
        out.append(parse_retention(item))
    return out


def check_output_path(path: str | None, option: str) -> None:
    """Refuse, before a run, an output path that cannot be written (missing folder, a folder)."""
    if path is None:
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"{option} {path!r} is a folder; give a file name")
    if not parent.is_dir():
        raise ValueError(f"{option} {path!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{option} {path!r} is not writable")


def write_output(path: str, write: Callable[[str], None], what: str) -> str:
    """Write a finished result with ``write(path)``; if that fails, write it to a temporary file
    instead and say where (a finished run is never lost). Returns the path written."""
    try:
        write(path)
        return path
    except OSError as exc:
        fd, fallback = tempfile.mkstemp(prefix="hybridkv-", suffix=Path(path).suffix or ".out")
        os.close(fd)
        write(fallback)
        print(f"hybridkv: could not write {what} to {path!r} ({exc.strerror or exc}); "
              f"saved it to {fallback}", file=sys.stderr)
        return fallback


def default_gpus(preset, gpu) -> int:
    """The fewest GPUs (a power of two) whose memory, less 10%, holds the preset's weights."""
    n = 1
    while n < 1024 and preset.weight_bytes > 0.9 * n * gpu.memory_bytes:
        n *= 2
    return n


def check_options(args: argparse.Namespace) -> None:
    """Rules involving several options, checked before anything runs (``ValueError``)."""
    from hybridkv.sim.eviction_cli import check_args as check_policy_args
    check_policy_args(args)
    if getattr(args, "num_blocks", None) is not None and args.num_blocks < 2:
        raise ValueError(f"--num-blocks must be >= 2, got {args.num_blocks}")
    for option in ("json", "plot"):
        value = getattr(args, option, None)
        if isinstance(value, str):
            check_output_path(value, f"--{option}")
    if getattr(args, "plot", None):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError('--plot needs matplotlib: pip install "hybridkv[sim]"') from None
    if args.acceptance_rate is not None:
        preset = get_preset(args.preset)
        if args.spec == SPEC_OFF or (args.spec is None and preset.spec_decode is None):
            why = ("--spec none turns it off" if args.spec == SPEC_OFF
                   else f"{preset.name} has no default method")
            raise ValueError(f"--acceptance-rate {args.acceptance_rate} has no effect without "
                             f"speculative decoding ({why}); add --spec METHOD:K, e.g. eagle:3")


def check_spec_fits(cfg: SimConfig) -> None:
    """Refuse a speculative decoding whose lookahead slots alone cannot fit (before allocating)."""
    spec = cfg.spec
    if spec is None:
        return
    need = sum(-(-(spec.num_speculative_tokens + 1) // g.spec.block_size) for g in cfg.preset.groups)
    if need > cfg.num_blocks - 1:
        raise ValueError(
            f"--spec {spec.method}:{spec.num_speculative_tokens}: one request's lookahead needs "
            f"{need} blocks but the pool has {cfg.num_blocks - 1}; use fewer speculative tokens "
            "or a larger cache")
    max_len = cfg.max_model_len
    if max_len is not None and spec.num_speculative_tokens + 1 >= max_len:
        raise ValueError(
            f"--spec {spec.method}:{spec.num_speculative_tokens} needs more than "
            f"--max-model-len {max_len} tokens per request")


def spec_argument(text: str) -> SpecDecode | str:
    """``--spec``: :func:`hybridkv.core.spec_decode.parse_spec`'s grammar; ``none`` stays
    :data:`SPEC_OFF` here (it turns a preset's method off; no option means the preset's)."""
    try:
        spec = parse_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if spec is not None and not 1 <= spec.num_speculative_tokens <= MAX_SPEC_TOKENS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: K (speculative tokens per step) must be in [1, {MAX_SPEC_TOKENS}]")
    return SPEC_OFF if spec is None else spec


def add_common_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``simulate`` and ``sweep``."""
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"model preset (default {DEFAULT_PRESET}; see `hybridkv presets`)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", help=f"built-in workload: {', '.join(WORKLOADS)} (default {DEFAULT_WORKLOAD})")
    src.add_argument("--trace", help="a bundled trace (" + ", ".join(BUNDLED_TRACES) + "; see "
                     "`hybridkv traces`) or a JSONL file (.gz/.xz too): Mooncake format (hash_ids) "
                     "or token ids (prompt_token_ids)")
    p.add_argument("--limit", type=positive_count, help="use only the first N requests of the trace")
    p.add_argument("--gpu", default="h100", help=f"GPU preset for the cost model: {', '.join(GPU_PRESETS)}")
    p.add_argument("--gpus", type=int_in(1, 1024),
                   help="GPUs serving the model, ideal tensor parallel (default: the fewest, a "
                        "power of two, whose memory less 10%% holds the weights)")
    p.add_argument("--block-size", type=parse_block_size,
                   help=f"tokens per block of the main group, a power of two in [1, {MAX_BLOCK_SIZE}] "
                        "(preset default otherwise)")
    p.add_argument("--retention-interval", type=parse_retention, default=0,
                   help="sliding-window retention: none (dense), 0 (replay boundaries, default) or N")
    p.add_argument("--spec", type=spec_argument,
                   help="speculative decoding METHOD:K, e.g. eagle:3 (default: the preset's, "
                        "e.g. mtp:1 for deepseek-v4-style); none turns it off")
    p.add_argument("--acceptance-rate", type=fraction(lo_open=False),
                   help=f"per-draft acceptance probability in [0, 1] of the seeded acceptance model "
                        f"(default {DEFAULT_ACCEPTANCE_RATE}); needs speculative decoding")
    p.add_argument("--max-num-batched-tokens", type=int_in(1), default=8192, help="token budget per step")
    p.add_argument("--max-num-seqs", type=int_in(1), default=256, help="requests running at once")
    p.add_argument("--max-model-len", type=int_in(2),
                   help="tokens per request (prompt + output); a request whose prompt reaches it is "
                        "rejected and counted, the others' outputs are cut to fit")
    p.add_argument("--sequential", action="store_true", help="one request at a time, no timing")
    p.add_argument("--vllm-compat", action="store_true", help="run the manager in vLLM-0.33-compatible mode")
    p.add_argument("--no-optimum", action="store_true", help="skip the offline (Belady) bound")
    p.add_argument("--seed", type=int_in(0), default=0, help="seed of generators and the acceptance model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    from hybridkv.sim.eviction_cli import add_policy_option   # -- eviction policies --
    add_policy_option(p)


def add_capacity_options(p: argparse.ArgumentParser) -> None:
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--cache-tokens", type=positive_count,
                     help=f"KV cache size in tokens, e.g. 3M or 1e9 (default {DEFAULT_SIMULATE_CACHE_TOKENS:,})")
    cap.add_argument("--num-blocks", type=positive_count, help="KV cache size in blocks (>= 2, the null block included)")
    cap.add_argument("--gpu-memory-fraction", type=fraction(lo_open=True),
                     help="cache = this share in (0, 1] of GPU memory minus the weights")


def add_executor_options(p: argparse.ArgumentParser) -> None:
    """Where ``sweep`` runs its configurations (see :mod:`hybridkv.sim.executors`)."""
    from hybridkv.sim.executors import EXECUTORS
    p.add_argument("--executor", choices=EXECUTORS, default="serial",
                   help="serial (default): one configuration after another; processes: local "
                        "processes; ray: one Ray task per configuration (pip install 'hybridkv[ray]')")
    p.add_argument("--workers", type=int_in(1),
                   help="processes, or local Ray CPUs (default: the usable cores)")
    p.add_argument("--ray-address",
                   help="Ray cluster to submit to (ray.init address, e.g. auto or ray://HOST:10001); "
                        "default: a local Ray")


def load_items(args: argparse.Namespace) -> list[WorkItem]:
    """The workload of the options: a trace file or a built-in generator."""
    limit = args.limit
    if args.trace is not None:
        path = resolve_trace(args.trace)
        if trace_format(path) == "mooncake":
            return items_from_mooncake(str(path), limit)
        items = items_from_trace(load_token_trace(path))
        return items[:limit] if limit is not None else items
    items = items_from_trace(get_workload(args.workload or DEFAULT_WORKLOAD, seed=args.seed))
    return items[:limit] if limit is not None else items


def capacity_blocks(args: argparse.Namespace, preset, cache_tokens: int | None = None) -> int:
    """Pool size in blocks (including the null block) from the capacity options."""
    if cache_tokens is None and getattr(args, "num_blocks", None) is not None:
        return args.num_blocks                  # >= 2: check_options
    if cache_tokens is None and getattr(args, "gpu_memory_fraction", None) is not None:
        frac = args.gpu_memory_fraction
        if not 0 < frac <= 1:
            raise ValueError(f"--gpu-memory-fraction must be in (0, 1], got {frac}")
        gpu = get_gpu(args.gpu)
        if args.gpus is None:
            args.gpus = default_gpus(preset, gpu)
        memory = frac * gpu.memory_bytes * args.gpus - preset.weight_bytes
        if memory <= 0:
            raise ValueError(
                f"{preset.name} weights ({preset.weight_bytes / 1e9:.1f} GB) do not fit in "
                f"{frac:.0%} of {args.gpus} x {gpu.name} ({gpu.memory_bytes / 1e9:.0f} GB); "
                "raise --gpus or --gpu-memory-fraction")
        return preset.kv_config(memory_bytes=int(memory)).num_blocks
    if cache_tokens is None:
        cache_tokens = getattr(args, "cache_tokens", None)
        if cache_tokens is None:  # only an absent option takes the default, never a given 0
            cache_tokens = DEFAULT_SIMULATE_CACHE_TOKENS
    if cache_tokens < 1:
        raise ValueError(f"cache size must be >= 1 token, got {cache_tokens}")
    per_token = preset.kv_bytes_per_token()["total"]
    block_bytes = preset.kv_config(num_blocks=2).block_bytes
    if cache_tokens * per_token < 2 * block_bytes:
        raise ValueError(f"a cache of {cache_tokens:,} tokens holds no block of {preset.name} "
                         f"(give at least {-(-2 * block_bytes // per_token):,} tokens)")
    return preset.kv_config(memory_bytes=cache_tokens * per_token).num_blocks + 1  # + the null block


def build_config(args: argparse.Namespace, num_blocks: int | None = None,
                 retention: object = "args") -> SimConfig:
    """A :class:`SimConfig` from parsed options (``num_blocks``/``retention`` override them)."""
    preset = get_preset(args.preset)
    if args.block_size is not None:
        preset = preset.with_block_size(args.block_size)
    gpu = get_gpu(args.gpu)
    if args.gpus is None:
        args.gpus = default_gpus(preset, gpu)
    if num_blocks is None:
        num_blocks = capacity_blocks(args, preset)
    spec = args.spec
    if spec is None and preset.spec_decode is not None:
        spec = SpecDecode(*preset.spec_decode)
    elif spec == SPEC_OFF:
        spec = None
    sched = SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                            max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    rate = args.acceptance_rate if args.acceptance_rate is not None else DEFAULT_ACCEPTANCE_RATE
    cfg = SimConfig(preset=preset, gpu=gpu, num_blocks=num_blocks,
                    retention_interval=args.retention_interval if retention == "args" else retention,
                    spec=spec, acceptance_rate=rate, sched=sched,
                    sequential=args.sequential, seed=args.seed, vllm_compat=args.vllm_compat,
                    max_model_len=args.max_model_len, optimum=not args.no_optimum,
                    num_gpus=args.gpus, eviction_policy=getattr(args, "eviction_policy", "lru"),
                    prefix_retention=getattr(args, "prefix_retention", None))
    check_spec_fits(cfg)
    return cfg


def _progress(enabled: bool, label: str) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        def report(done: int, total: int) -> None:
            print(f"\r{label}: {done}/{total} requests", end="", file=sys.stderr, flush=True)
        return report, lambda: print(file=sys.stderr)
    bar = tqdm(desc=label, unit="req", file=sys.stderr, leave=False, delay=0.5)  # after the header

    def update(done: int, total: int) -> None:
        if done < bar.n or total != bar.total:   # the next run of a sweep: its own rate and ETA
            bar.reset(total=total)
        bar.n = done
        bar.refresh()
    return update, bar.close


def run_one(cfg: SimConfig, items: list[WorkItem], show_progress: bool, label: str,
            setup: Callable[[Simulator], None] | None = None) -> SimResult:
    progress, close = _progress(show_progress, label)
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
    tokens = cfg.cache_tokens
    spec = f", spec {cfg.spec.method}:{cfg.spec.num_speculative_tokens}" if cfg.spec else ""
    mode = "sequential" if cfg.sequential else f"{cfg.num_gpus} x {cfg.gpu.name}"
    return (f"hybridkv simulate: {cfg.preset.name} on {source} ({n_items} requests), "
            f"{cfg.num_blocks - 1:,} blocks (~{tokens:,} tokens), block {cfg.preset.block_size}, "
            f"retention {cfg.retention_interval}{spec}, {mode}")


def cmd_simulate(args: argparse.Namespace) -> int:
    from hybridkv.sim.report import explain_gap, plot_run, summary_table
    from hybridkv.sim import cluster_cli
    check_options(args)
    cluster_cli.check_args(args)              # before the trace is read
    items = load_items(args)
    if not items:
        raise ValueError("the workload has no requests")
    cfg = build_config(args)
    from hybridkv.sim.workload_fit import check_fits   # the longest request fits, before a run
    default_capacity = all(getattr(args, o) is None
                           for o in ("cache_tokens", "num_blocks", "gpu_memory_fraction"))
    warning = check_fits(cfg, items, default_capacity)
    if warning:
        print(f"hybridkv simulate: {warning}", file=sys.stderr)
    # -- cluster and KV events (hybridkv.sim.cluster_cli) --
    if cluster_cli.is_cluster(args):
        progress, close = _progress(not args.no_progress, "simulate")
        try:
            cluster = cluster_cli.run_cluster(args, cfg, items, progress)
        finally:
            close()
        if args.json:
            text = json.dumps(cluster.to_json(), indent=2) + "\n"
            print(f"wrote {write_output(args.json, lambda p: Path(p).write_text(text), 'the JSON result')}")
        return 0
    print(describe(cfg, args, len(items)))
    load = cluster_cli.warn_capacity(cfg, items, 1)
    with cluster_cli.publishers(args, 1) as pubs:
        res = run_one(cluster_cli.events_config(cfg, args), items, not args.no_progress, "simulate",
                      setup=(lambda sim: cluster_cli.attach_single(sim, pubs[0])) if pubs else None)
    extra = {"kv_events_published": pubs[0].published if pubs else 0,
             "offered_load": load.to_json() if load else None}
    if pubs:
        print(f"  KV events: {extra['kv_events_published']} batches published")
    # -- end cluster and KV events --
    print(summary_table(res))
    why = explain_gap(res)
    if why:
        print(why)
    if res.rejected == res.requests:
        print(f"hybridkv simulate: warning: all {res.requests} requests were rejected "
              f"(prompt >= --max-model-len {cfg.max_model_len})", file=sys.stderr)
    if args.json:
        text = json.dumps({**res.to_json(), **extra}, indent=2) + "\n"
        print(f"wrote {write_output(args.json, lambda p: Path(p).write_text(text), 'the JSON result')}")
    if args.plot:
        title = describe(cfg, args, len(items)).split(": ", 1)[1]
        print(f"wrote {write_output(args.plot, lambda p: plot_run(res, p, title=title), 'the plot')}")
    return 0


def check_sweep_options(args: argparse.Namespace) -> None:
    """A sweep varies sizes (``--cache-tokens-list``) or retention (``--retention-intervals``,
    at one ``--cache-tokens``); refuse options the chosen sweep would ignore."""
    if getattr(args, "checkpoint_intervals", None) is not None:
        if args.retention_intervals is not None or args.cache_tokens_list is not None:
            raise ValueError("sweep one thing at a time: --checkpoint-intervals (with "
                             "--cache-tokens for its size) or --retention-intervals or "
                             "--cache-tokens-list")
        return
    if args.retention_intervals is None and args.cache_tokens is not None:
        raise ValueError("--cache-tokens sets the cache size of a retention sweep "
                         "(--retention-intervals); to sweep sizes use --cache-tokens-list, e.g. 1M,3M")
    if args.retention_intervals is not None and args.cache_tokens_list is not None:
        raise ValueError("sweep one thing at a time: --cache-tokens-list or --retention-intervals "
                         "(with --cache-tokens for its size)")
    if args.workers is not None and args.executor == "serial":    # -- executors, before the trace --
        raise ValueError(f"--workers {args.workers} needs --executor processes or ray")
    if args.ray_address is not None and args.executor != "ray":
        raise ValueError(f"--ray-address {args.ray_address} needs --executor ray")
    if args.executor == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError('--executor ray needs Ray: pip install "hybridkv[ray]"')


def cmd_sweep(args: argparse.Namespace) -> int:
    from hybridkv.sim.report import plot_sweep
    check_options(args)
    check_sweep_options(args)
    items = load_items(args)
    if not items:
        raise ValueError("the workload has no requests")
    if getattr(args, "checkpoint_intervals", None) is not None:   # -- state groups --
        from hybridkv.sim.state_sweep import sweep_checkpoints
        return sweep_checkpoints(args, items, build_config, capacity_blocks,
                                 args.cache_tokens if args.cache_tokens is not None
                                 else DEFAULT_CACHE_TOKENS)
    preset = get_preset(args.preset)
    if args.block_size is not None:
        preset = preset.with_block_size(args.block_size)
    runs: list[tuple[object, SimConfig]] = []
    if args.retention_intervals is not None:
        values = args.retention_intervals
        blocks = capacity_blocks(args, preset, args.cache_tokens if args.cache_tokens is not None
                                 else DEFAULT_CACHE_TOKENS)
        runs = [(v, build_config(args, num_blocks=blocks, retention=v)) for v in values]
        xlabel = "retention interval (tokens; none plotted as 0)"
    else:
        sizes = args.cache_tokens_list if args.cache_tokens_list is not None else [10**6, 3 * 10**6, 10**7]
        runs = [(s, build_config(args, num_blocks=capacity_blocks(args, preset, s))) for s in sizes]
        xlabel = "KV cache size (tokens)"
    if getattr(args, "eviction_policies", None):              # -- eviction policies --
        from hybridkv.sim.eviction_cli import sweep_policies
        rows, failed = sweep_policies(args, runs, items, _run_sweep, write_output)
        results, runs = {}, runs * len(args.eviction_policies)   # no plot; counts all runs
    else:
        rows, results, failed = _run_sweep(args, runs, items)
    if args.json:
        text = json.dumps(rows, indent=2) + "\n"
        print(f"wrote {write_output(args.json, lambda p: Path(p).write_text(text), 'the JSON rows')}")
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


def _run_sweep(args: argparse.Namespace, runs: list[tuple[object, SimConfig]],
               items: list[WorkItem]) -> tuple[list[dict], dict[int, SimResult], int]:
    """Run the sweep on the chosen executor; print each row as it finishes. Returns the JSON
    rows in configuration order (a failed one is ``{"value", "error"}``), the results by index
    and the number of failures."""
    from hybridkv.sim.executors import execute
    serial = args.executor == "serial"
    show = not args.no_progress
    inner, close_inner = _progress(show and serial, "sweep")
    bar, close_bar = _progress(show and not serial, f"sweep ({args.executor})")
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


def cmd_presets(args: argparse.Namespace) -> int:
    rows = {}
    for name in MODEL_PRESETS:
        p = get_preset(name)
        per = p.kv_bytes_per_token()
        rows[name] = {
            "groups": [{"name": g.name, "type": type(g.spec).__name__, "block_size": g.spec.block_size,
                        "layers": len(g.layer_names), "draft": g.is_draft,
                        "kv_bytes_per_token": per[g.name]} for g in p.groups],
            "kv_bytes_per_token": per["total"],
            "spec_decode": p.spec_decode,
            "source": p.source,
        }
    gpus = {n: {"memory_bytes": g.memory_bytes, "mem_bw": g.mem_bw, "flops": g.flops}
            for n, g in GPU_PRESETS.items()}
    if args.json:
        json.dump({"models": rows, "gpus": gpus}, sys.stdout, indent=2)
        print()
        return 0
    print("model presets (KV bytes per token, per group):")
    for name, r in rows.items():
        groups = ", ".join(f"{g['name']} {g['type']} x{g['layers']} bs{g['block_size']} "
                           f"{g['kv_bytes_per_token']:,} B" for g in r["groups"])
        print(f"  {name:<20} {r['kv_bytes_per_token']:>9,} B/token   {groups}")
    print("GPU presets:")
    for n, g in GPU_PRESETS.items():
        print(f"  {n:<6} {g.memory_bytes / 1e9:.0f} GB, {g.mem_bw / 1e12:.2f} TB/s, "
              f"{g.flops / 1e12:.0f} TFLOP/s bf16 dense")
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    """List the bundled traces: name, requests, compressed size, licence, source."""
    rows = [{"name": t.name, "requests": t.requests, "bytes": t.path.stat().st_size if t.path.is_file() else None,
             "format": "mooncake", "licence": t.licence, "description": t.description,
             "source": t.source, "path": str(t.path)} for t in BUNDLED_TRACES.values()]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'name':<24} {'requests':>9} {'size':>9}  {'licence':<11} description")
    for r in rows:
        size = "missing" if r["bytes"] is None else f"{r['bytes'] / 1e3:,.0f} kB"
        print(f"{r['name']:<24} {r['requests']:>9,} {size:>9}  {r['licence']:<11} {r['description']}")
    print("source: " + BUNDLED_TRACES[next(iter(BUNDLED_TRACES))].source.split(" conversation")[0]
          + "; use a name with --trace, e.g. hybridkv simulate --trace mooncake-conversation "
            "--preset llama-3.1-8b --cache-tokens 3M --limit 500")
    return 0


#: The simulator's config field names as ``simulate`` / ``sweep`` options, for the errors of the
#: layers below (``hybridkv.cli.run_command`` applies it; ``hybridkv.options.name_options``).
OPTION_NAMES = {"num_blocks": "--num-blocks or --cache-tokens", "block_size": "--block-size",
                "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
                "max_num_seqs": "--max-num-seqs", "retention_interval": "--retention-interval"}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``simulate``, ``sweep``, ``presets`` and ``traces``."""
    p = sub.add_parser("simulate", help="trace-driven simulation: hit rates, latency, the optimum",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p)
    add_capacity_options(p)
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--plot", help="write a PNG of hit rate and cache usage over time")
    from hybridkv.sim.cluster_cli import add_cluster_options
    add_cluster_options(p)
    p.set_defaults(func=cmd_simulate, option_names=OPTION_NAMES)

    p = sub.add_parser("sweep", help="hit rate against cache size or retention interval")
    add_common_options(p)
    p.add_argument("--cache-tokens-list", type=parse_count_list,
                   help="comma-separated cache sizes (default 1M,3M,10M)")
    p.add_argument("--retention-intervals", type=parse_retention_list,
                   help="comma-separated intervals, e.g. none,0,1024")
    p.add_argument("--cache-tokens", type=positive_count,
                   help=f"cache size of a retention sweep (default {DEFAULT_CACHE_TOKENS:,})")
    from hybridkv.sim.state_sweep import add_sweep_option as add_checkpoint_option
    add_checkpoint_option(p, parse_retention_list)
    p.add_argument("--json", help="write the rows as JSON to this path")
    p.add_argument("--plot", help="write a PNG of hit rate against the swept value")
    add_executor_options(p)
    from hybridkv.sim.eviction_cli import add_sweep_option
    add_sweep_option(p)
    p.set_defaults(func=cmd_sweep, option_names=OPTION_NAMES)

    p = sub.add_parser("presets", help="list model and GPU presets with KV bytes per token")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("traces", help="list the request traces bundled with the package")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_traces)
