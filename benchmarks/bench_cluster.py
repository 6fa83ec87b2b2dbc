"""Routers on a simulated cluster over the Mooncake traces (the issue's bar and the table).

For each trace and each instance count N: N instances of Llama-3.1-8B on one H100 each, with
``--cache-tokens`` of KV cache each, behind every router; and the reference "one pooled cache":
one instance with N times the cache and N GPUs (the same total memory and compute), whose hit
rate the kv-aware router is measured against.

    python benchmarks/bench_cluster.py --traces mooncake-conversation \
        --instances 4 --jobs 2 --json cluster.json

``--traces`` takes bundled trace names (``hybridkv traces``) or paths to Mooncake JSONL files.

Prints one markdown row per run (and the ratios kv-aware / pooled and kv-aware / round-robin).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

from hybridkv.sim.cluster.loop import ClusterSimulator
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.cluster.routing import ROUTERS
from hybridkv.sim import SimConfig, items_from_mooncake
from hybridkv.sim.traffic.traces import resolve_trace
from hybridkv.sim.cluster.routing import RouterTuning

POOLED = "pooled"


def _config(cache_tokens: float, gpus: int) -> SimConfig:
    preset = get_preset("llama-3.1-8b")
    per = preset.kv_bytes_per_token()["total"]
    blocks = preset.kv_config(memory_bytes=int(cache_tokens * per)).num_blocks + 1
    return SimConfig(preset=preset, gpu=get_gpu("h100"), num_blocks=blocks, optimum=False,
                     num_gpus=gpus)


def run_one(job: tuple[str, int, str, float, float, int | None, float | None]) -> dict:
    trace, n, router, cache_tokens, weight, limit, max_skew = job
    items = items_from_mooncake(str(resolve_trace(trace)), limit)
    t0 = time.perf_counter()
    if router == POOLED:
        res = ClusterSimulator(_config(cache_tokens * n, n), 1, "round-robin").run(items)
    else:
        res = ClusterSimulator(_config(cache_tokens, 1), n, router, RouterTuning(
            overlap_weight=weight, max_skew=max_skew)).run(items)
    d = res.to_json()
    o = d
    return {"trace": Path(trace).stem.removesuffix(".jsonl").replace("-", "_"), "instances": n, "router": router,
            "hit_rate": o["hit_rate"], "block_hit_rate": o["block_hit_rate"],
            "ttft_p50_s": o["ttft_p50_s"], "ttft_p99_s": o["ttft_p99_s"],
            "queue_p50_s": o["queue_p50_s"], "queue_p99_s": o["queue_p99_s"],
            "load_imbalance": o["load_imbalance"], "preemptions": o["preemptions"],
            "requests": o["requests"], "wall_s": time.perf_counter() - t0,
            "per_instance_hit_rate": [p["hit_rate"] for p in d["per_instance"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--instances", type=int, nargs="+", default=[4])
    ap.add_argument("--routers", nargs="+", default=[POOLED, *ROUTERS],
                    choices=[POOLED, *ROUTERS])
    ap.add_argument("--cache-tokens", type=float, default=3e6, help="per instance (3M)")
    ap.add_argument("--overlap-weight", type=float, default=4.0)
    ap.add_argument("--max-skew", default="none",
                    help="the KV-aware routers' load-skew bound, or none (default none: the "
                         "BENCHMARKS.md table predates the bound)")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    skew = None if args.max_skew == "none" else float(args.max_skew)
    jobs = [(t, n, r, args.cache_tokens, args.overlap_weight, args.limit, skew)
            for t in args.traces for n in args.instances for r in args.routers]
    rows: list[dict] = []
    print("| trace | N | router | hit rate | TTFT p50 s | TTFT p99 s | queue p50 s | queue p99 s "
          "| imbalance | wall s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with mp.get_context("fork").Pool(args.jobs) as pool:
        for row in pool.imap_unordered(run_one, jobs):
            rows.append(row)
            print(f"| {row['trace']} | {row['instances']} | {row['router']} | {row['hit_rate']:.4f} "
                  f"| {row['ttft_p50_s']:.3f} | {row['ttft_p99_s']:.2f} | {row['queue_p50_s']:.3f} "
                  f"| {row['queue_p99_s']:.2f} | {row['load_imbalance']:.3f} | {row['wall_s']:.0f} |",
                  flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    by = {(r["trace"], r["instances"], r["router"]): r for r in rows}
    for (trace, n, router), r in sorted(by.items()):
        if router != "kv-aware":
            continue
        pooled = by.get((trace, n, POOLED))
        rr = by.get((trace, n, "round-robin"))
        parts = [f"{trace} N={n}: kv-aware hit {r['hit_rate']:.4f}"]
        if pooled:
            parts.append(f"{r['hit_rate'] / pooled['hit_rate']:.3f} of pooled")
        if rr:
            parts.append(f"{r['hit_rate'] / rr['hit_rate']:.2f}x round-robin, TTFT p50 "
                         f"{r['ttft_p50_s']:.3f} vs {rr['ttft_p50_s']:.3f} s")
        print("; ".join(parts))


if __name__ == "__main__":
    main()
