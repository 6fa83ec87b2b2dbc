"""`hybridkv sweep` with each executor, side by side in one run: wall time, CPU, same results.

    python benchmarks/bench_sweep.py                      # 12 sizes, first 2,000 requests
    python benchmarks/bench_sweep.py --limit 0 --executors serial,processes

Runs the same sweep (the Mooncake conversation trace, 12 cache sizes 1M..12M tokens, timed
mode, the offline optimum included) once per executor as a separate ``hybridkv`` process,
in the order given, and prints each one's wall seconds, CPU seconds (its processes and all
their children) and speedup against the first, then checks that every JSON row equals the
first executor's except ``wall_s``. The load average before and after is printed: on a shared
machine compare the ratios, not the absolute times. The first 2,000 requests hold 27 M prompt
tokens, above the 20 M at which ``simulate``/serial sweeps compute the optimum in a second
process, so the serial baseline already uses two cores for part of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACE = "mooncake-conversation"   # bundled with the package (or give a path)


def run(executor: str, args: argparse.Namespace, out: Path) -> tuple[float, float, int]:
    cmd = [sys.executable, "-m", "hybridkv.cli", "sweep", "--trace", str(args.trace), "--preset", args.preset,
           "--cache-tokens-list", args.sizes, "--executor", executor, "--no-progress",
           "--json", str(out)]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if executor != "serial":
        cmd += ["--workers", str(args.workers)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr, sep="\n", file=sys.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--preset", default="llama-3.1-8b", help="model preset (default llama-3.1-8b)")
    ap.add_argument("--limit", type=int, default=2000, help="first N requests (0: all)")
    ap.add_argument("--sizes", default=",".join(f"{m}M" for m in range(1, 13)))
    ap.add_argument("--executors", default="serial,processes,ray")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    executors = args.executors.split(",")
    print(f"sweep: {args.trace.name}, limit {args.limit or 'none'}, sizes {args.sizes}, "
          f"workers {args.workers}; {os.cpu_count()} cores, load average {os.getloadavg()}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = None
        for e in executors:
            out = Path(tmp) / f"{e}.json"
            wall, cpu, rc = run(e, args, out)
            base = base or wall
            rows[e] = ([{k: v for k, v in r.items() if k != "wall_s"} for r in json.loads(out.read_text())]
                       if out.exists() else None)
            print(f"{e:>10}: wall {wall:7.1f} s  cpu {cpu:7.1f} s  exit {rc}  "
                  f"speedup vs {executors[0]}: {base / wall:.2f}x  load {os.getloadavg()}", flush=True)
    ref = rows[executors[0]]
    for e in executors[1:]:
        print(f"{e} rows equal {executors[0]}'s (all but wall_s): {rows[e] == ref}")


if __name__ == "__main__":
    main()
