"""Where a `hybridkv simulate` run's CPU time goes, by compiled function (Linux `perf`).

    python benchmarks/profile_functions.py [--top 25] -- simulate --trace mooncake-conversation \
        --limit 4000 --preset llama-3.1-8b --cache-tokens 3M --no-optimum --cost-model roofline

Runs the command (the arguments after ``--``, given to ``hybridkv``) with the installed or
``PYTHONPATH`` tree under ``perf record`` (call stacks sampled at ``--freq`` Hz, nothing
instrumented) and counts each sample for the innermost function of the compiled build on its
stack, with the C runtime it was in (a dict probe, an allocation, a call into Python): what that
function costs, callees that are themselves compiled excepted. Samples with no compiled
function on the stack (the interpreter's start, the pure-Python modules, numpy) are one row.
Prints each function's share of the samples, largest first. Needs the compiled build
(``pip install -e .``); the shares mean nothing for the pure-Python source.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RUNNER = "import sys; from hybridkv.cli import main; sys.exit(main(sys.argv[1:]))"
#: the hybridkv package this script runs (without importing it), read to split symbols
PACKAGE_ROOT = Path(importlib.util.find_spec("hybridkv").origin).parent   # type: ignore[arg-type,union-attr]
#: Cython's symbols for a Python-visible function (pw), its body (pf) and a C function (f)
COMPILED = re.compile(r"^__pyx_(?:pw|pf|f)_(.*)$")
NOT_COMPILED = "(no compiled function on the stack)"


def _component(rest: str) -> tuple[str, str] | None:
    """The length-prefixed name at the start of ``rest`` (``9BlockPool_...``) and what follows
    its ``_``, or None."""
    d = re.match(r"\d+", rest)
    if d is None:
        return None
    n, body = int(d.group()), rest[d.end():]
    if len(body) > n and body[n] == "_":
        return body[:n], body[n + 1:]
    return None


def readable(symbol: str, root: Path = PACKAGE_ROOT) -> str | None:
    """``module.Class.function`` (or ``module.function``) for a Cython symbol, else None.

    The symbol spells the module path as length-prefixed components (``8hybridkv_4core_4pool``,
    read against the package's files under ``root`` to find where the module ends), then a
    class the same way, then the function after an index (``15insert_run``)."""
    m = COMPILED.match(symbol.split(".")[0])
    if m is None:
        return None
    rest, path = m.group(1), []
    while True:                                  # the module: packages, then a .py file
        comp = _component(rest)
        if comp is None:
            return None
        path.append(comp[0])
        rest = comp[1]
        where = root.parent.joinpath(*path)
        if where.with_suffix(".py").is_file():
            break
        if not where.is_dir():
            return None
    comp = _component(rest)                      # a class (a capitalized name), when a method
    if comp is not None and re.match(r"_?[A-Z]", comp[0]):
        path.append(comp[0])
        rest = comp[1]
    path.append(re.sub(r"^\d+", "", rest))      # the function, after its index
    return ".".join(path)


def attribute(script: str) -> collections.Counter[str]:
    """Per sample of ``perf script -F ip,sym`` output, its innermost compiled function."""
    counts: collections.Counter[str] = collections.Counter()
    for sample in script.split("\n\n"):
        frames = [line.split(None, 1)[1] for line in sample.strip().splitlines()
                  if len(line.split(None, 1)) == 2]
        if not frames:
            continue
        name = next((n for n in map(readable, frames) if n is not None), NOT_COMPILED)
        counts[name] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=25, help="rows printed (default 25)")
    ap.add_argument("--freq", type=int, default=499, help="samples per second (default 499)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then hybridkv's arguments")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the hybridkv command after --, e.g. -- simulate --trace mooncake-conversation")
    if args.top < 1 or args.freq < 1:
        ap.error(f"--top and --freq must be >= 1, got {args.top} and {args.freq}")
    if shutil.which("perf") is None:
        ap.error("needs Linux perf on PATH (apt install linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "run.perf"
        subprocess.run(["perf", "record", "-q", "-F", str(args.freq), "--call-graph", "dwarf,16384",
                        "-o", str(data), "--", sys.executable, "-c", RUNNER, *command],
                       check=True, stdout=subprocess.DEVNULL)
        script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"], check=True,
                                capture_output=True, text=True).stdout
    counts = attribute(script)
    total = sum(counts.values())
    if not total:
        print("perf recorded no samples", file=sys.stderr)
        return 1
    print(f"{total} samples; share by innermost compiled function (with the C runtime it calls):")
    for name, n in counts.most_common(args.top):
        print(f"{100 * n / total:6.2f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
