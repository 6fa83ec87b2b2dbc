"""Is the recommended eviction policy ever worse than LRU? Every workload this script can make,
at every cache size where LRU reaches 0.5-0.9 of the offline optimum.

    python benchmarks/bench_recommended.py [--policies a,b,c] [--seeds 0,1]
        [--hints session-end:0.5,0.8,1 --hints ttl:0.5,1 --hints resume:0.5,1]

Workloads (``hybridkv sweep --sequential``, Llama-3.1-8B, 16-token blocks): the built-in
``chat``, ``system-prompt``, ``agentic`` and ``replay`` generators, and two generated here as
token traces: ``tree`` (a branching tree of shared prefixes: a system prompt, branches,
sub-branches, leaves asked again in a skewed random order) and ``dead-time`` (conversations that
come back only after many others, like the Mooncake conversation trace). Sizes: a grid per
workload; LRU runs first and the sizes where its fraction of the optimum is in [0.5, 0.9] are
kept; every policy then runs there. Prints policy x (workload, size) -> fraction of the optimum,
marks every cell below LRU's hit rate with ``<``, and exits 1 if ``recommended`` has one.
``--hints KIND:A,B`` (repeatable) adds, at the same cells, ``recommended`` served hints
synthesised from the workload's future at each accuracy (``sweep --hints``): each is a column
``KIND:A`` that counts as ``recommended`` (below LRU: exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hybridkv.cli import main as cli  # noqa: E402
from hybridkv.core.eviction import POLICIES, RECOMMENDED  # noqa: E402

GRID = ["5k", "10k", "20k", "30k", "50k", "100k", "200k"]


def tree_trace(path: Path, seed: int) -> None:
    """A branching tree: 1 system prompt (600 tokens) x 6 branches (800) x 4 sub-branches (400);
    each request picks a leaf (Zipf-like weights) and asks a fresh 60-token question."""
    rng = np.random.default_rng(seed)
    def toks(n):
        return rng.integers(1, 30000, n).tolist()
    root = toks(600)
    leaves = []
    for _ in range(6):
        branch = root + toks(800)
        leaves += [branch + toks(400) for _ in range(4)]
    w = 1.0 / np.arange(1, len(leaves) + 1) ** 0.8
    w /= w.sum()
    with path.open("w") as f:
        for _ in range(600):
            leaf = leaves[int(rng.choice(len(leaves), p=w))]
            f.write(json.dumps({"prompt_token_ids": leaf + toks(60), "output_len": 16}) + "\n")


def dead_time_trace(path: Path, seed: int) -> None:
    """Conversations that return only after others: 150 sessions, each turn appends 300 tokens
    and its 100-token answer; a session comes back 8-40 requests later, 60% of the time."""
    rng = np.random.default_rng(seed)
    system = rng.integers(1, 30000, 200).tolist()
    pending: list[tuple[int, list[int]]] = []     # (due request index, prompt so far)
    rows = []
    started = 0
    while len(rows) < 900:
        i = len(rows)
        due = [k for k, (t, _) in enumerate(pending) if t <= i]
        if due:
            _, ctx = pending.pop(due[0])
        else:
            ctx = list(system)
            started += 1
        prompt = ctx + rng.integers(1, 30000, 300).tolist()
        answer = rng.integers(1, 30000, 100).tolist()
        rows.append({"prompt_token_ids": prompt, "output_len": 0})
        if rng.random() < 0.6 and len(prompt) < 6000:
            pending.append((i + int(rng.integers(8, 41)), prompt + answer))
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def sweep(source: list[str], sizes: list[str], policies: list[str], hints: str | None = None) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rows.json"
        which = (["--eviction-policies", ",".join(policies)] if hints is None
                 else ["--eviction-policy", "recommended", "--hints", hints])
        argv = ["sweep", *source, "--preset", "llama-3.1-8b", "--sequential", "--no-progress",
                "--cache-tokens-list", ",".join(sizes), *which, "--json", str(out)]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = cli(argv)
        if not out.exists():                       # failed runs are rows with an "error"
            raise SystemExit(f"hybridkv {' '.join(argv)} failed ({rc})")
        return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default=",".join(p for p in POLICIES if p not in ("lru", "recommended")))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--hints", action="append", default=[], metavar="KIND:A,B,...")
    args = ap.parse_args()
    policies = [p.strip() for p in args.policies.split(",")]
    hinted: list[str] = []
    if RECOMMENDED != "lru" and RECOMMENDED not in policies:
        policies.append(RECOMMENDED)
    tmp = Path(tempfile.mkdtemp(prefix="hybridkv-recommended-"))
    sources: list[tuple[str, list[str]]] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for w in ("chat", "system-prompt", "agentic", "replay"):
            sources.append((f"{w}/{seed}", ["--workload", w, "--seed", str(seed)]))
        for name, make in (("tree", tree_trace), ("dead-time", dead_time_trace)):
            path = tmp / f"{name}-{seed}.jsonl"
            make(path, seed)
            sources.append((f"{name}/{seed}", ["--trace", str(path)]))
    cells: list[tuple[str, str, dict[str, dict]]] = []
    for label, source in sources:
        lru = sweep(source, GRID, ["lru"])
        keep = [r for r in lru if "error" not in r and r["fraction_of_optimal"] is not None
                and 0.5 <= r["fraction_of_optimal"] <= 0.9]
        print(f"{label:>18}: LRU 0.5-0.9 of the optimum at "
              f"{', '.join(str(r['value']) for r in keep) or 'no size of the grid'}", flush=True)
        if not keep:
            continue
        sizes = [str(r["value"]) for r in keep]
        rows = sweep(source, sizes, policies)
        for j, r in enumerate(keep):
            by = {"lru": r}
            for i, p in enumerate(policies):
                by[p] = rows[i * len(keep) + j]
            cells.append((label, str(r["value"]), by))
        for spec in args.hints:            # rows: per size, no hints then each accuracy
            kind, _, accs = spec.partition(":")
            per = 1 + len(accs.split(","))
            rows = sweep(source, sizes, [], spec)
            for j, (_, _, by) in enumerate(cells[-len(keep):]):
                for k, a in enumerate(accs.split(","), 1):
                    name = f"{kind}:{a}"
                    by[name] = rows[j * per + k]
                    if name not in hinted:
                        hinted.append(name)
    names = ["lru"] + policies + hinted
    print(f"\n{'workload':>18} {'cache':>8} " + " ".join(f"{n:>9}" for n in names))
    worse = {n: 0 for n in names}
    for label, size, by in cells:
        base = by["lru"]["block_hit_rate"]
        row = []
        for n in names:
            r = by[n]
            if "error" in r:
                row.append(f"{'error':>9}")
                worse[n] += 1
                continue
            mark = "<" if r["block_hit_rate"] < base - 1e-12 else " "
            worse[n] += mark == "<"
            row.append(f"{r['fraction_of_optimal']:>8.3f}{mark}")
        print(f"{label:>18} {size:>8} " + " ".join(row))
    print(f"\ncells below LRU (of {len(cells)}): " + ", ".join(f"{n} {worse[n]}" for n in names[1:]))
    rec = RECOMMENDED
    bad = worse[rec] + sum(worse[n] for n in hinted) if rec != "lru" else sum(worse[n] for n in hinted)
    print(f"recommended = {rec}" + (" (with and without hints)" if hinted else "") + ": "
          + ("never below LRU" if bad == 0 else f"BELOW LRU in {bad} cells"))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
