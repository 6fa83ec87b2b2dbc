"""Hit rate against checkpoint memory for recurrent-state hybrids (docs/state-groups.md; the
results are in BENCHMARKS.md).

    python benchmarks/bench_state_checkpoints.py                 # both presets, three workloads
    python benchmarks/bench_state_checkpoints.py --presets qwen3-next-80b-a3b --out ckpt

For each preset and workload it runs ``hybridkv sweep --retention-intervals 0,16,64,256,1024``
(one process, serial), which adds vLLM 0.33's forced-block "align" mode (1056-token blocks for
Qwen3-Next) as the baseline of the same run, at the same KV memory in bytes. Workloads: the
built-in ``chat`` (1024-token system prompt, 6 turns) and ``system-prompt`` (8 prompts of 2048
tokens), and a generated short-prompt one (``system200``: 8 system prompts of 200 tokens + 32..512
user tokens, 512 requests, written as a token trace), the case vLLM's forced block serves
not at all. Tables go to stdout, JSON rows to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from hybridkv.cli import main
from hybridkv.sim.traffic.workloads import SystemPromptWorkload, shared_system_prompt

INTERVALS = "0,16,64,256,1024"


def write_system200(path: Path) -> None:
    reqs = shared_system_prompt(SystemPromptWorkload(
        num_requests=512, num_prompts=8, system_tokens=200), seed=0)
    with path.open("w") as f:
        for r in reqs:
            f.write(json.dumps({"prompt_token_ids": [int(t) for t in r.prompt],
                                "output_len": r.output_len, "arrival_s": r.arrival_s,
                                "request_id": r.request_id}) + "\n")


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="qwen3-next-80b-a3b,nemotron-h-8b")
    ap.add_argument("--cache-tokens", default="3M")
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="ckpt-"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "system200.jsonl"
    write_system200(trace)
    workloads = {"chat": ["--workload", "chat"], "system-prompt": ["--workload", "system-prompt"],
                 "system200": ["--trace", str(trace)]}
    rc = 0
    for preset in args.presets.split(","):
        for name, src in workloads.items():
            print(f"\n## {preset} / {name}", flush=True)
            rc |= main(["sweep", "--preset", preset, *src, "--retention-intervals", INTERVALS,
                        "--cache-tokens", args.cache_tokens, "--no-progress",
                        "--json", str(out / f"{preset}-{name}.json")])
    print(f"\nJSON rows in {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main_())
