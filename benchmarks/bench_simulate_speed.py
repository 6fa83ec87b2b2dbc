"""`hybridkv simulate` speed against an older commit, both compiled, side by side in one run.

    python benchmarks/bench_simulate_speed.py                       # whole Mooncake trace, 3 rounds
    python benchmarks/bench_simulate_speed.py --limit 3000 --rounds 5 --no-optimum

Builds two trees in ``--build-dir``: the old commit (``git archive``) and the current working
tree (its ``src/``, ``setup.py``, ``pyproject.toml``), each compiled in place with
``setup.py build_ext --inplace`` (Cython must be importable; a build that ends up pure
Python is refused unless ``--allow-pure``). A tree whose sources did not change since its
last build is reused. Then it runs the same ``hybridkv simulate`` command (default: the whole
Mooncake conversation trace, ``llama-3.1-8b``, a 3M-token cache on ``--gpus 8``, the offline
optimum included) with each tree, alternating which goes first in each round, and prints per round
the JSON's ``wall_s`` (``Simulator.run``: the simulation and the offline optimum, not the
interpreter start or the trace parsing), the process's elapsed seconds and its CPU seconds
(children included: the optimum's process), then the min and median of each and their
ratios old/new. The new tree runs with ``--cost-model roofline`` where it has that option (the
old tree's step-time model, so both simulate the same steps; ``--new-default-model`` runs its
default instead and checks nothing), and every deterministic JSON key of the online run must
agree (the new tree's extra keys aside), or the script exits 1; keys of the offline bounds that
differ are named (their code may change between the commits), and fail too with
``--same-bounds``. It also prints each tree's ``wall_s / sim_s`` (the run over its step loop:
what the bounds add after it) and the new tree's ``bounds_s``. On a shared machine only the
ratios mean something, and CPU seconds vary less with the load than wall seconds.

``--split`` (Linux ``perf`` must be on PATH) adds one run of each tree under ``perf record``
(call stacks sampled at 99 Hz, so nothing is instrumented) and prints how the run's CPU seconds
divide between the KV-cache manager (samples with a ``KVCacheManager`` method on the stack) and
the rest (the scheduler, the simulator's loop, the step-time model, the interpreter's start).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "8d81e41"
#: keys that measure the run itself (they differ between any two runs)
TIMING = {"wall_s", "sim_s", "sim_steps_per_s", "sim_requests_per_s", "bounds_s", "bounds_reused"}
#: keys computed by the offline bounds, not by the simulation (reported, not required equal
#: unless ``--same-bounds``)
BOUND = {"optimal_block_hit_rate", "fraction_of_optimal", "unlimited_cache_block_hit_rate", "gap",
         "hazard_bound_block_hit_rate", "fraction_of_hazard_bound", "what_if",
         "hybrid_bound_block_hit_rate", "fraction_of_hybrid_bound", "hybrid_unservable_blocks"}
RUNNER = "import sys; from hybridkv.cli import main; sys.exit(main(sys.argv[1:]))"


def source_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        if "build" in p.relative_to(root).parts:
            continue
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def export_old(commit: str, dest: Path) -> None:
    with tempfile.TemporaryFile() as fh:
        subprocess.run(["git", "-C", str(REPO), "archive", commit], stdout=fh, check=True)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(dest, filter="data")


def export_current(dest: Path) -> None:
    """Copy the working tree's sources into ``dest``, only the files that differ (fresh mtimes,
    so an incremental build recompiles just those); files gone from the tree are removed."""
    def wanted(p: Path) -> bool:
        return p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(
            (".so", ".c", ".pyd", "_compiled_sources.txt"))
    src = REPO / "src"
    mine = {p.relative_to(src) for p in src.rglob("*") if wanted(p)}
    for rel in mine:
        target = dest / "src" / rel
        if not target.exists() or target.read_bytes() != (src / rel).read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, target)
    if (dest / "src").exists():
        for p in (dest / "src").rglob("*.py"):
            if "__pycache__" not in p.parts and p.relative_to(dest / "src") not in mine:
                p.unlink()
        for p in (dest / "src").rglob("*"):        # compiled modules whose source is gone
            stem = p.name.split(".")[0]
            if p.name.endswith(tuple(EXTENSION_SUFFIXES)) and not p.with_name(stem + ".py").exists() \
                    and not p.with_name(stem + ".pyx").exists():
                p.unlink()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copyfile(REPO / name, dest / name)


def build(tree: Path, allow_pure: bool) -> None:
    """Compile ``tree`` in place unless its sources match its last compiled build."""
    marker = tree / ".bench_built"
    digest = source_digest(tree / "src")
    if not (marker.exists() and marker.read_text() == digest):
        print(f"building {tree} ...", flush=True)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                       check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    env.pop("HYBRIDKV_PURE_PYTHON", None)
    probe = ("import hybridkv.core as c, hybridkv.sched as s; "
             "print(c.COMPILED, getattr(s, 'COMPILED', 'n/a'))")
    core, sched = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                 text=True, check=True).stdout.split()
    print(f"{tree.name}: compiled core {core}, compiled scheduler {sched}")
    if core == "True":
        marker.write_text(digest)              # reuse only a build that compiled
    elif not allow_pure:
        sys.exit(f"{tree}: the core is not compiled (is Cython importable, a C compiler there?); "
                 "--allow-pure compares pure-Python builds")


def run(tree: Path, cmd: list[str], out: Path) -> tuple[float, float, dict]:
    """Run ``hybridkv cmd`` with ``tree``; returns elapsed seconds, CPU seconds (the process
    and its children: the optimum's process too) and the JSON result."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    env.pop("HYBRIDKV_PURE_PYTHON", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RUNNER, *cmd, "--json", str(out)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{tree}: hybridkv {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, json.loads(out.read_text())


def manager_share(tree: Path, cmd: list[str], tmp: Path) -> tuple[float, float]:
    """Run ``cmd`` with ``tree`` under ``perf record``; returns (CPU seconds, the fraction of
    the stack samples that are inside a ``KVCacheManager`` method)."""
    data = tmp / f"{tree.name}.perf"
    perf = ["perf", "record", "-q", "-F", "99", "--call-graph", "dwarf,16384", "-o", str(data), "--"]
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    env.pop("HYBRIDKV_PURE_PYTHON", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([*perf, sys.executable, "-c", RUNNER, *cmd, "--json", str(tmp / "split.json")],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"], check=True,
                            capture_output=True, text=True).stdout
    samples = [s for s in script.split("\n\n") if s.strip()]
    inside = sum("KVCacheManager" in s for s in samples)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, inside / len(samples)


def print_split(old: Path, new: Path, cmd: list[str], new_cmd: list[str], tmp: Path) -> None:
    """``--split``: one sampled run per tree, its CPU seconds divided, with old/new ratios."""
    rows = {}
    for name, tree, c in (("old", old, cmd), ("new", new, new_cmd)):
        cpu, share = manager_share(tree, c, tmp)
        rows[name] = {"KV-cache manager": cpu * share, "the rest": cpu * (1 - share), "CPU s": cpu}
        print(f"split {name}: {share:.1%} of the samples in the manager", flush=True)
    print("split (perf run):         old s    new s   old/new")
    for part in rows["old"]:
        o, n = rows["old"][part], rows["new"][part]
        print(f"{part:>20}: {o:9.2f} {n:8.2f} {o / n:8.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default=OLD_COMMIT, help=f"the commit to compare with (default {OLD_COMMIT})")
    ap.add_argument("--build-dir", type=Path, default=Path(tempfile.gettempdir()) / "hybridkv-bench-speed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace", default="mooncake-conversation")
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--cache-tokens", default="3M")
    ap.add_argument("--gpus", default="8",
                    help="GPUs per instance, given to both trees (default 8: the fewest H100s that "
                         "hold 3M tokens of KV; the old tree's own default, 1, simulates other steps)")
    ap.add_argument("--limit", type=int, default=0, help="first N requests (0: the whole trace)")
    ap.add_argument("--no-optimum", action="store_true", help="skip the offline bound in both runs")
    ap.add_argument("--split", action="store_true",
                    help="one perf-sampled run per tree: the manager's share of the CPU seconds")
    ap.add_argument("--allow-pure", action="store_true", help="accept builds that are not compiled")
    ap.add_argument("--same-bounds", action="store_true",
                    help="fail (exit 1) when a key of the offline bounds differs too")
    ap.add_argument("--new-default-model", action="store_true",
                    help="run the new tree with its default step-time model instead of the old "
                         "tree's roofline (different simulated work: timings only, no result check)")
    args = ap.parse_args(argv)
    if args.split and shutil.which("perf") is None:
        ap.error("--split needs Linux perf on PATH (apt install linux-perf)")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")

    old = args.build_dir / f"old-{args.old}"
    new = args.build_dir / "new"
    if not old.exists():
        old.mkdir(parents=True)
        export_old(args.old, old)
    new.mkdir(parents=True, exist_ok=True)
    export_current(new)
    for tree in (old, new):
        build(tree, args.allow_pure)

    cmd = ["simulate", "--trace", args.trace, "--preset", args.preset, "--cache-tokens",
           args.cache_tokens, "--gpus", args.gpus, "--no-progress"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if args.no_optimum:
        cmd.append("--no-optimum")
    new_cmd = list(cmd)

    def has_cost_model(tree: Path) -> bool:
        return "--cost-model" in subprocess.run(
            [sys.executable, "-c", RUNNER, "simulate", "--help"], capture_output=True, text=True,
            env=dict(os.environ, PYTHONPATH=str(tree / "src"))).stdout
    if not args.new_default_model and has_cost_model(new) and not has_cost_model(old):
        new_cmd += ["--cost-model", "roofline"]    # the old tree's step times: the same work
    print("command: hybridkv " + " ".join(cmd))
    if new_cmd != cmd:
        print("new tree: hybridkv " + " ".join(new_cmd))
    print(f"old: {args.old}   new: the working tree   load average before: {os.getloadavg()}")
    walls: dict[str, list[float]] = {"old": [], "new": []}
    loops: dict[str, list[float]] = {"old": [], "new": []}
    elapsed: dict[str, list[float]] = {"old": [], "new": []}
    cpus: dict[str, list[float]] = {"old": [], "new": []}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            order = ("old", "new") if rnd % 2 == 0 else ("new", "old")
            for name in order:
                tree = old if name == "old" else new
                e, cpu, d = run(tree, cmd if name == "old" else new_cmd, Path(tmp) / f"{name}.json")
                walls[name].append(d["wall_s"])
                loops[name].append(d.get("sim_s") or float("nan"))
                elapsed[name].append(e)
                cpus[name].append(cpu)
                results[name] = d
                extra = (f", step loop {d['sim_s']:.2f} s, {d['sim_steps_per_s']:,.0f} steps/s"
                         if "sim_s" in d else "")
                print(f"round {rnd + 1} {name}: wall_s {d['wall_s']:.2f}, process {e:.2f} s, "
                      f"CPU {cpu:.2f} s{extra}", flush=True)
        if args.split:
            print_split(old, new, cmd, new_cmd, Path(tmp))
    print(f"load average after: {os.getloadavg()}")
    for label, data in (("wall_s", walls), ("process s", elapsed), ("CPU s", cpus)):
        o_min, n_min = min(data["old"]), min(data["new"])
        o_med, n_med = statistics.median(data["old"]), statistics.median(data["new"])
        print(f"{label:>9}: old min {o_min:.2f} median {o_med:.2f} | new min {n_min:.2f} "
              f"median {n_med:.2f} | old/new: min {o_min / n_min:.2f}x, median {o_med / n_med:.2f}x")
    ratios = {k: [w / s for w, s in zip(walls[k], loops[k])] for k in walls}
    print("wall_s / sim_s (the run over its step loop): " + " | ".join(
        f"{k} median {statistics.median(r):.3f} (" + ", ".join(f"{x:.3f}" for x in r) + ")"
        for k, r in ratios.items()))
    if "bounds_s" in results["new"]:
        print("new bounds_s (last round): " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(results["new"]["bounds_s"].items(), key=lambda kv: -kv[1])))
    per_round = [o / n for o, n in zip(walls["old"], walls["new"])]
    print("per-round old/new (wall_s): " + ", ".join(f"{x:.2f}x" for x in per_round))
    a, b = results["old"], results["new"]
    if args.new_default_model:
        print(f"steps: old {a['steps']}, new {b['steps']} (different step-time models: no result check)")
        return 0
    b["config"] = {k: v for k, v in b["config"].items() if k in a["config"]}   # new options
    diff = sorted(k for k in a if k not in TIMING and a[k] != b.get(k))
    online = [k for k in diff if k not in BOUND or args.same_bounds]
    if online:
        print(f"RESULTS DIFFER between old and new: {', '.join(diff)}")
        return 1
    if diff:   # the simulated work is the same; the offline bound's code changed between them
        print(f"results: the online run's keys are equal; the offline bound's differ ({', '.join(diff)})")
    else:
        print("results: every deterministic key of the old run equals the new run's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
