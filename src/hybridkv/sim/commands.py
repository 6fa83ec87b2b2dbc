"""The ``simulate``, ``sweep`` and ``presets`` commands: options -> :class:`SimConfig` -> report.

Capacity, in order of precedence: ``--num-blocks`` (pool blocks), ``--cache-tokens`` (KV memory
for that many tokens of the preset, all groups counted), ``--gpu-memory-fraction`` (that share
of the GPUs' memory minus the weights). The default is 3M tokens of cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from hybridkv.core.spec_decode import SPEC_METHODS, SpecDecode
from hybridkv.sched import SchedulerConfig
from hybridkv.sim.presets import GPU_PRESETS, MODEL_PRESETS, get_gpu, get_preset
from hybridkv.sim.simulator import (SimConfig, SimResult, Simulator, WorkItem, items_from_mooncake,
                                    items_from_trace)
from hybridkv.sim.traces import WORKLOADS, get_workload, load_token_trace

DEFAULT_PRESET = "llama-3.1-8b"
DEFAULT_WORKLOAD = "chat"
DEFAULT_CACHE_TOKENS = 3_000_000
_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9}


def parse_count(text: str) -> int:
    """``"3M"`` -> 3000000, ``"500k"`` -> 500000, ``"1.5G"``; plain integers too."""
    t = text.strip().lower().replace("_", "")
    mult = 1
    if t and t[-1] in _SUFFIX:
        mult = _SUFFIX[t[-1]]
        t = t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 4096, 500k, 3M)") from None
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a non-negative whole count: {text!r}")
    return int(value)


def parse_retention(text: str) -> int | None:
    """``none`` -> None (dense); an integer >= 0 otherwise."""
    if text.strip().lower() in ("none", "dense"):
        return None
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"retention interval must be 'none' or an integer >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"retention interval must be 'none' or an integer >= 0, got {text!r}")
    return v


SPEC_OFF = "none"


def parse_spec(text: str) -> SpecDecode | str:
    """``METHOD:K``, e.g. ``eagle:3``, ``mtp:1``, ``dflash:7``; ``none`` turns a preset's off."""
    if text.strip().lower() == SPEC_OFF:
        return SPEC_OFF
    method, sep, k = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(
            f"--spec wants METHOD:K (methods: {', '.join(SPEC_METHODS)}), got {text!r}")
    try:
        return SpecDecode(method.strip(), int(k))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_common_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``simulate`` and ``sweep``."""
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"model preset (default {DEFAULT_PRESET}; see `hybridkv presets`)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", help=f"built-in workload: {', '.join(WORKLOADS)} (default {DEFAULT_WORKLOAD})")
    src.add_argument("--trace", type=Path, help="a JSONL trace: Mooncake format (hash_ids) or token ids")
    p.add_argument("--limit", type=parse_count, help="use only the first N requests of the trace")
    p.add_argument("--gpu", default="h100", help=f"GPU preset for the cost model: {', '.join(GPU_PRESETS)}")
    p.add_argument("--gpus", type=int, default=1, help="GPUs serving the model (ideal tensor parallel)")
    p.add_argument("--block-size", type=int, help="tokens per block of the main group (preset default otherwise)")
    p.add_argument("--retention-interval", type=parse_retention, default=0,
                   help="sliding-window retention: none (dense), 0 (replay boundaries, default) or N")
    p.add_argument("--spec", type=parse_spec,
                   help="speculative decoding METHOD:K, e.g. eagle:3 (default: the preset's, "
                        "e.g. mtp:1 for deepseek-v4-style); none turns it off")
    p.add_argument("--acceptance-rate", type=float, default=0.7,
                   help="per-draft acceptance probability of the seeded acceptance model (0.7)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget per step")
    p.add_argument("--max-num-seqs", type=int, default=256, help="requests running at once")
    p.add_argument("--max-model-len", type=int, help="tokens per request (prompt + output)")
    p.add_argument("--sequential", action="store_true", help="one request at a time, no timing")
    p.add_argument("--vllm-compat", action="store_true", help="run the manager in vLLM-0.33-compatible mode")
    p.add_argument("--no-optimum", action="store_true", help="skip the offline (Belady) bound")
    p.add_argument("--seed", type=int, default=0, help="seed of generators and the acceptance model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_capacity_options(p: argparse.ArgumentParser) -> None:
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--cache-tokens", type=parse_count,
                     help=f"KV cache size in tokens, e.g. 3M (default {DEFAULT_CACHE_TOKENS:,})")
    cap.add_argument("--num-blocks", type=parse_count, help="KV cache size in blocks")
    cap.add_argument("--gpu-memory-fraction", type=float,
                     help="cache = this share of GPU memory minus the weights")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"want an integer >= 1, got {text!r}")
    return v


def add_executor_options(p: argparse.ArgumentParser) -> None:
    """Where ``sweep`` runs its configurations (see :mod:`hybridkv.sim.executors`)."""
    from hybridkv.sim.executors import EXECUTORS
    p.add_argument("--executor", choices=EXECUTORS, default="serial",
                   help="serial (default): one configuration after another; processes: local "
                        "processes; ray: one Ray task per configuration (pip install 'hybridkv[ray]')")
    p.add_argument("--workers", type=_positive_int,
                   help="processes, or local Ray CPUs (default: the usable cores)")
    p.add_argument("--ray-address",
                   help="Ray cluster to submit to (ray.init address, e.g. auto or ray://HOST:10001); "
                        "default: a local Ray")


def load_items(args: argparse.Namespace) -> list[WorkItem]:
    """The workload of the options: a trace file or a built-in generator."""
    limit = args.limit
    if args.trace is not None:
        path = args.trace
        if not path.is_file():
            raise ValueError(f"trace file {str(path)!r} does not exist")
        first = ""
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    first = line
                    break
        if '"hash_ids"' in first:
            return items_from_mooncake(str(path), limit)
        items = items_from_trace(load_token_trace(path))
        return items[:limit] if limit is not None else items
    items = items_from_trace(get_workload(args.workload or DEFAULT_WORKLOAD, seed=args.seed))
    return items[:limit] if limit is not None else items


def capacity_blocks(args: argparse.Namespace, preset, cache_tokens: int | None = None) -> int:
    """Pool size in blocks (including the null block) from the capacity options."""
    if cache_tokens is None and getattr(args, "num_blocks", None) is not None:
        if args.num_blocks < 2:
            raise ValueError(f"--num-blocks must be >= 2, got {args.num_blocks}")
        return args.num_blocks
    if cache_tokens is None and getattr(args, "gpu_memory_fraction", None) is not None:
        frac = args.gpu_memory_fraction
        if not 0 < frac <= 1:
            raise ValueError(f"--gpu-memory-fraction must be in (0, 1], got {frac}")
        gpu = get_gpu(args.gpu)
        memory = frac * gpu.memory_bytes * args.gpus - preset.weight_bytes
        if memory <= 0:
            raise ValueError(
                f"{preset.name} weights ({preset.weight_bytes / 1e9:.1f} GB) do not fit in "
                f"{frac:.0%} of {args.gpus} x {gpu.name} ({gpu.memory_bytes / 1e9:.0f} GB); "
                "raise --gpus or --gpu-memory-fraction")
        return preset.kv_config(memory_bytes=int(memory)).num_blocks
    tokens = cache_tokens if cache_tokens is not None else (
        getattr(args, "cache_tokens", None) or DEFAULT_CACHE_TOKENS)
    per_token = preset.kv_bytes_per_token()["total"]
    return preset.kv_config(memory_bytes=tokens * per_token).num_blocks + 1  # + the null block


def build_config(args: argparse.Namespace, num_blocks: int | None = None,
                 retention: object = "args") -> SimConfig:
    """A :class:`SimConfig` from parsed options (``num_blocks``/``retention`` override them)."""
    preset = get_preset(args.preset)
    if args.block_size is not None:
        preset = preset.with_block_size(args.block_size)
    gpu = get_gpu(args.gpu)
    if num_blocks is None:
        num_blocks = capacity_blocks(args, preset)
    spec = args.spec
    if spec is None and preset.spec_decode is not None:
        spec = SpecDecode(*preset.spec_decode)
    elif spec == SPEC_OFF:
        spec = None
    sched = SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                            max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    return SimConfig(preset=preset, gpu=gpu, num_blocks=num_blocks,
                     retention_interval=args.retention_interval if retention == "args" else retention,
                     spec=spec, acceptance_rate=args.acceptance_rate, sched=sched,
                     sequential=args.sequential, seed=args.seed, vllm_compat=args.vllm_compat,
                     max_model_len=args.max_model_len, optimum=not args.no_optimum,
                     num_gpus=args.gpus)


def _progress(enabled: bool, label: str) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        def report(done: int, total: int) -> None:
            print(f"\r{label}: {done}/{total} requests", end="", file=sys.stderr, flush=True)
        return report, lambda: print(file=sys.stderr)
    bar = tqdm(desc=label, unit="req", file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()
    return update, bar.close


def run_one(cfg: SimConfig, items: list[WorkItem], show_progress: bool, label: str) -> SimResult:
    progress, close = _progress(show_progress, label)
    try:
        res = Simulator(cfg, progress=progress).run(items)
    finally:
        close()
    return res


def describe(cfg: SimConfig, args: argparse.Namespace, n_items: int) -> str:
    source = str(args.trace) if args.trace else f"workload {args.workload or DEFAULT_WORKLOAD}"
    k = cfg.preset.kv_config(num_blocks=cfg.num_blocks)
    tokens = (cfg.num_blocks - 1) * k.block_bytes // cfg.preset.kv_bytes_per_token()["total"]
    spec = f", spec {cfg.spec.method}:{cfg.spec.num_speculative_tokens}" if cfg.spec else ""
    mode = "sequential" if cfg.sequential else f"{cfg.num_gpus} x {cfg.gpu.name}"
    return (f"hybridkv simulate: {cfg.preset.name} on {source} ({n_items} requests), "
            f"{cfg.num_blocks - 1:,} blocks (~{tokens:,} tokens), block {cfg.preset.block_size}, "
            f"retention {cfg.retention_interval}{spec}, {mode}")


def cmd_simulate(args: argparse.Namespace) -> int:
    from hybridkv.sim.report import plot_run, summary_table
    items = load_items(args)
    if not items:
        raise ValueError("the workload has no requests")
    cfg = build_config(args)
    print(describe(cfg, args, len(items)))
    res = run_one(cfg, items, not args.no_progress, "simulate")
    print(summary_table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot_run(res, args.plot, title=describe(cfg, args, len(items)).split(": ", 1)[1])
        print(f"wrote {args.plot}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from hybridkv.sim.report import plot_sweep
    items = load_items(args)
    if not items:
        raise ValueError("the workload has no requests")
    preset = get_preset(args.preset)
    if args.block_size is not None:
        preset = preset.with_block_size(args.block_size)
    runs: list[tuple[object, SimConfig]] = []
    if args.retention_intervals:
        values = [parse_retention(v) for v in args.retention_intervals.split(",")]
        blocks = capacity_blocks(args, preset, args.cache_tokens or DEFAULT_CACHE_TOKENS)
        runs = [(v, build_config(args, num_blocks=blocks, retention=v)) for v in values]
        xlabel = "retention interval (tokens; none plotted as 0)"
    else:
        sizes = [parse_count(v) for v in (args.cache_tokens_list or "1M,3M,10M").split(",")]
        runs = [(s, build_config(args, num_blocks=capacity_blocks(args, preset, s))) for s in sizes]
        xlabel = "KV cache size (tokens)"
    rows, results, failed = _run_sweep(args, runs, items)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot and results:
        xs = [0 if runs[i][0] is None else runs[i][0] for i in sorted(results)]
        plot_sweep(xs, [results[i] for i in sorted(results)], args.plot, xlabel, title=f"{preset.name}",
                   log_x=not args.retention_intervals)
        print(f"wrote {args.plot}")
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
                print(f"  {str(value):>10}: error: {out.error}", file=sys.stderr, flush=True)
            else:
                results[out.index] = out.result
                d = out.result.to_json()
                d["value"] = value
                rows[out.index] = d
                opt = d["optimal_block_hit_rate"]
                print(f"  {str(value):>10}: block hit rate {d['block_hit_rate']:.4f}, token hit rate "
                      f"{d['hit_rate']:.4f}, optimum {opt if opt is None else round(opt, 4)}, "
                      f"TTFT p50 {d['ttft_p50_s'] if d['ttft_p50_s'] is None else round(d['ttft_p50_s'], 3)} s, "
                      f"wall {d['wall_s']:.1f} s", flush=True)
            if bar:
                bar(done, len(runs))
    finally:
        close_inner()
        close_bar()
    return rows, results, failed


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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``simulate``, ``sweep`` and ``presets``."""
    p = sub.add_parser("simulate", help="trace-driven simulation: hit rates, latency, the optimum",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p)
    add_capacity_options(p)
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--plot", help="write a PNG of hit rate and cache usage over time")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("sweep", help="hit rate against cache size or retention interval")
    add_common_options(p)
    p.add_argument("--cache-tokens-list", help="comma-separated cache sizes (default 1M,3M,10M)")
    p.add_argument("--retention-intervals", help="comma-separated intervals, e.g. none,0,1024")
    p.add_argument("--cache-tokens", type=parse_count, help="cache size for a retention sweep")
    p.add_argument("--json", help="write the rows as JSON to this path")
    p.add_argument("--plot", help="write a PNG of hit rate against the swept value")
    add_executor_options(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("presets", help="list model and GPU presets with KV bytes per token")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)
