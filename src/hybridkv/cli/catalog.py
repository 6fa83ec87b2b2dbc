"""``hybridkv presets`` and ``hybridkv traces``: what the simulator ships with."""

from __future__ import annotations

import argparse

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.output import print_json
from hybridkv.cost.presets import GPU_PRESETS, MODEL_PRESETS, get_preset
from hybridkv.sim.traffic.traces import BUNDLED_TRACES, MOONCAKE_BLOCK_TOKENS


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def run_presets(args: argparse.Namespace) -> int:
    """List the model presets (KV bytes per token, per group) and the GPU presets."""
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
    gpus = {n: {"memory_bytes": g.memory_bytes, "mem_bw": g.mem_bw, "flops": g.flops, "fp8_flops": g.fp8_flops}
            for n, g in GPU_PRESETS.items()}
    if args.json:
        print_json({"models": rows, "gpus": gpus})
        return 0
    print("model presets (KV bytes per token, per group):")
    for name, r in rows.items():
        groups = ", ".join(f"{g['name']} {g['type']} x{g['layers']} bs{g['block_size']} "
                           f"{g['kv_bytes_per_token']:,} B" for g in r["groups"])
        print(f"  {name:<20} {r['kv_bytes_per_token']:>9,} B/token   {groups}")
    print("GPU presets:")
    for n, g in GPU_PRESETS.items():
        print(f"  {n:<6} {g.memory_bytes / 1e9:.0f} GB, {g.mem_bw / 1e12:.2f} TB/s, "
              f"{g.flops / 1e12:.0f} TFLOP/s bf16 dense"
              + ("" if g.fp8_flops is None else f", {g.fp8_flops / 1e12:.0f} fp8"))
    return 0


def run_traces(args: argparse.Namespace) -> int:
    """List the bundled traces: name, requests, compressed size, licence, source, and their
    granularity (tokens per hash id, ``block_tokens`` in the JSON)."""
    rows = [{"name": t.name, "requests": t.requests, "bytes": t.path.stat().st_size if t.path.is_file() else None,
             "format": "mooncake", "block_tokens": MOONCAKE_BLOCK_TOKENS, "licence": t.licence, "description": t.description,
             "source": t.source, "path": str(t.path)} for t in BUNDLED_TRACES.values()]
    if args.json:
        print_json(rows)
        return 0
    print(f"{'name':<24} {'requests':>9} {'size':>9}  {'licence':<11} description")
    for r in rows:
        size = "missing" if r["bytes"] is None else f"{r['bytes'] / 1e3:,.0f} kB"
        print(f"{r['name']:<24} {r['requests']:>9,} {size:>9}  {r['licence']:<11} {r['description']}")
    print(f"granularity: one hash id per {MOONCAKE_BLOCK_TOKENS} prompt tokens (no tokens): a "
          f"--block-size below {MOONCAKE_BLOCK_TOKENS} cuts the ids and is warned about (README: "
          "Granularity of a Mooncake trace)")
    print("source: " + BUNDLED_TRACES[next(iter(BUNDLED_TRACES))].source.split(" conversation")[0]
          + "; use a name with --trace, e.g. hybridkv simulate --trace mooncake-conversation "
            "--preset llama-3.1-8b --cache-tokens 3M --limit 500")
    return 0


COMMANDS.register("presets", Command(
    help="list model and GPU presets with KV bytes per token", add_arguments=add_json_flag,
    run=run_presets))
COMMANDS.register("traces", Command(
    help="list the request traces bundled with the package", add_arguments=add_json_flag,
    run=run_traces))

__all__ = ["run_presets", "run_traces"]
