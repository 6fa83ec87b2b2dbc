"""The vLLM 0.33 parity matrix: hybridkv (vllm_compat=True) next to vLLM's KVCacheManager.

Every case of :func:`parity_harness.build_matrix` (full attention; full + sliding window with
windows 64-1024; SWA at block 32; two identical SWA siblings; retention None / 0 / N with N
below and above the window; EAGLE drop mode on all / only-full / only-SWA groups; lookahead
0-4; a large pool and one small enough to preempt; chat, shared-system-prompt, agent-loop and
branching-tree traces) is run through the same scheduler loop (``parity_harness.run_case``,
a mirror of vLLM's ``Scheduler.schedule``: preempt the newest running request when
``allocate_slots`` fails, admit with ``full_sequence_must_fit=True``, re-admit preempted
requests) on both managers, in one process, on the same regenerated trace.

Printed per case: exact or not (per-request hit tokens at every admission, preemptions,
re-admissions, evictions, steps), the per-request differences, and the speed ratio
vLLM / hybridkv (manager calls + request hashing, best of ``--repeats``, sides alternating,
garbage collector paused); then the ratio per class (plain/EAGLE x full/hybrid x pool) and
over the whole matrix.

Both sides admit with vLLM's admission reservation, as vLLM's scheduler does by default
(hybridkv: ``allocate(..., full_sequence_must_fit=True)``, ``--hk-reserve api``);
``--hk-reserve none`` shows hybridkv admitting on the first chunk alone.

vLLM is a benchmark-only dependency in a separate venv (run without vLLM, the script prints
the install steps):

    .venv-vllm/bin/python benchmarks/bench_vs_vllm.py                      # parity + speed
    .venv-vllm/bin/python benchmarks/bench_vs_vllm.py --record             # refresh the fixture
    .venv-vllm/bin/python benchmarks/bench_vs_vllm.py --scale 4 --repeats 3 --only eagle

``--record`` writes vLLM's results (case configs, trace seeds and vLLM's per-request hits and
counts; no tokens) to tests/parity/fixtures/vllm_0_33.json.gz, which
tests/parity/test_parity_replay.py replays against hybridkv without vLLM.

Exit status: 0 after printing, 2 when vLLM cannot be imported (with the setup steps).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# measure the checkout this script lives in, even where another copy is installed
sys.path.insert(0, str(HERE.parent / "src"))
import hybridkv  # noqa: E402,F401
import hybridkv.core  # noqa: E402

import parity_harness as P  # noqa: E402

FIXTURE = HERE.parent / "tests" / "parity" / "fixtures" / "vllm_0_33.json.gz"

SETUP = """\
vLLM is not importable from this interpreter ({err}).
This benchmark needs vLLM 0.33 in a separate venv (CPU only, ~2.5 min, ~2.2 GB); from the repo root:

    python3 -m venv .venv-vllm; P=.venv-vllm/bin/pip
    $P install --no-deps vllm==0.33.0
    $P install torch==2.13.0
    $P install --no-deps xgrammar apache-tvm-ffi
    $P install packaging numpy regex pydantic cbor2 psutil pyzmq urllib3 transformers \\
        aiohttp requests openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle \\
        uvloop py-cpuinfo prometheus_client fastapi partial-json-parser llguidance xxhash
    $P install -e . --no-deps          # or PYTHONPATH=src

then run:  .venv-vllm/bin/python benchmarks/bench_vs_vllm.py
(pip's warnings about nvidia-*, triton and the torch pin are expected)."""


def timed(fn):
    gc.collect()
    gc.disable()
    try:
        return fn()
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=1,
                    help="trace size multiplier (conversations, requests, loops, roots)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per side and case (best)")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--hk-reserve", choices=("api", "none"), default="api",
                    help="hybridkv admits with full_sequence_must_fit (default) or not")
    ap.add_argument("--record", nargs="?", const=str(FIXTURE), default=None, metavar="PATH",
                    help=f"write vLLM's results as the replay fixture (default {FIXTURE})")
    ap.add_argument("--max-diffs", type=int, default=4, help="per-request differences shown per case")
    ap.add_argument("--default-mode", action="store_true",
                    help="also run hybridkv's default mode (untimed) and compare its hit tokens")
    args = ap.parse_args(argv)
    if args.record and args.scale != 1:
        ap.error("--record writes the CI fixture: use the default --scale 1")

    t = time.perf_counter()
    try:
        import parity_vllm as PV
        V = PV.VllmModules()
    except ImportError as exc:
        print(SETUP.format(err=exc))
        return 2
    import_s = time.perf_counter() - t
    print(f"vLLM {V.version} (import {import_s:.1f} s, not timed); hybridkv from "
          f"{Path(sys.modules['hybridkv'].__file__).parent}; hybridkv vllm_compat=True, "
          f"admission reservation: {args.hk_reserve}; core compiled: {hybridkv.core.COMPILED} "
          f"(HYBRIDKV_PURE_PYTHON=1: pure Python)")
    cases = [c for c in P.build_matrix(args.scale) if args.only in c.name]
    print(f"{len(cases)} cases, scale {args.scale}, best of {args.repeats}; ratio = vLLM "
          f"(manager calls + sha256 request hashing) / hybridkv (manager calls + xxh3 hashing)")
    print()
    head = (f"{'case':<48}{'reqs':>5}{'parity':>7}{'preempt':>9}{'readmit':>9}{'evictions':>13}"
            f"{'diff reqs':>10}{'vLLM s':>8}{'hkv s':>8}{'ratio':>7}")
    print(head)
    print("-" * len(head))
    records = []
    by_class: dict[str, list[float]] = {}
    exact = 0
    details = []
    default_hits: dict[str, list[int]] = {}
    for case in cases:
        trace = case.trace()
        geo = P.geometry(case, trace)
        vbest = hbest = float("inf")
        v = h = None
        for rep in range(args.repeats):
            vr = timed(lambda: P.run_case(case, trace, PV.VllmSide(V, case, geo)))
            hr = timed(lambda: P.run_case(case, trace,
                                          P.HybridkvSide(case, geo, reserve=args.hk_reserve)))
            if v is not None and (vr.hits != v.hits or hr.hits != h.hits):
                raise RuntimeError(f"{case.name}: results changed between repeats")
            v, h = vr, hr
            vbest = min(vbest, vr.mgr_s + vr.hash_s)
            hbest = min(hbest, hr.mgr_s + hr.hash_s)
        d = P.compare(h, v.hits, v.summary())
        exact += d.exact
        if args.default_mode:
            dm = P.run_case(case, trace, P.HybridkvSide(case, geo, compat=False,
                                                        reserve=args.hk_reserve))
            acc = default_hits.setdefault(case.klass, [0, 0, 0, 0, 0])
            acc[0] += sum(x[0] for x in v.hits.values())
            acc[1] += sum(x[0] for x in dm.hits.values())
            acc[2] += v.preemptions
            acc[3] += dm.preemptions
            acc[4] += sum(1 for rid, x in dm.hits.items() if rid in v.hits and x[0] < v.hits[rid][0])
        cls = by_class.setdefault(case.klass, [0.0, 0.0, 0, 0])
        cls[0] += vbest
        cls[1] += hbest
        cls[2] += 1
        cls[3] += d.exact
        print(f"{case.name:<48}{len(trace):>5}{'exact' if d.exact else 'DIFF':>7}"
              f"{v.preemptions:>4}/{h.preemptions:<4}{v.readmissions:>4}/{h.readmissions:<4}"
              f"{v.evictions:>6}/{h.evictions:<6}{len(d.requests):>10}{vbest:>8.3f}{hbest:>8.3f}"
              f"{vbest / hbest:>6.2f}x", flush=True)
        if v.deadlock or h.deadlock:
            print(f"    deadlock: vLLM {v.deadlock!r}, hybridkv {h.deadlock!r}")
        if not d.exact:
            lines = [f"{case.name}:"]
            for what, mine, ref in d.counts:
                lines.append(f"    {what}: hybridkv {mine}, vLLM {ref}")
            for rid, mine, ref in d.requests[:args.max_diffs]:
                lines.append(f"    {rid}: hit tokens per admission hybridkv {mine}, vLLM {ref}")
            if len(d.requests) > args.max_diffs:
                lines.append(f"    ... {len(d.requests) - args.max_diffs} more requests differ")
            details.append("\n".join(lines))
        if args.record:
            records.append({
                "case": case.to_json(),
                "trace": {"requests": len(trace), "fingerprint": P.trace_fingerprint(trace)},
                "geometry": {"num_blocks": geo.num_blocks, "max_model_len": geo.max_model_len},
                "vllm": {**v.summary(), "hits": [v.hits.get(it.rid, []) for it in trace]},
            })
    print()
    print(f"parity: {exact} / {len(cases)} cases exact (per-request hits at every admission, "
          f"preemptions, re-admissions, evictions, steps)")
    if details:
        print()
        print("differences (hybridkv vs vLLM):")
        for block in details:
            print(block)
    print()
    print(f"{'class':<26}{'cases':>6}{'exact':>6}{'vLLM s':>9}{'hkv s':>9}{'vLLM/hkv':>10}")
    for name in sorted(by_class):
        vs, hs, n, ex = by_class[name]
        print(f"{name:<26}{n:>6}{ex:>6}{vs:>9.3f}{hs:>9.3f}{vs / hs:>9.2f}x")
    vs = sum(c[0] for c in by_class.values())
    hs = sum(c[1] for c in by_class.values())
    print(f"{'whole matrix':<26}{len(cases):>6}{exact:>6}{vs:>9.3f}{hs:>9.3f}{vs / hs:>9.2f}x")
    if default_hits:
        print()
        print("hybridkv default mode (vllm_compat=False) vs vLLM: first-admission hit tokens, "
              "preemptions, requests whose first hit is lower than vLLM's")
        print(f"{'class':<26}{'vLLM hits':>12}{'default hits':>14}{'gain':>8}{'preempt':>12}"
              f"{'lower':>7}")
        for name in sorted(default_hits):
            vh, dh, vp, dp, low = default_hits[name]
            print(f"{name:<26}{vh:>12,}{dh:>14,}{(dh - vh) / max(vh, 1):>+8.1%}{vp:>6}/{dp:<5}"
                  f"{low:>7}")
    if args.record:
        path = Path(args.record)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": 1, "vllm": V.version,
               "command": ".venv-vllm/bin/python benchmarks/bench_vs_vllm.py --record",
               "cases": records}
        raw = json.dumps(doc, separators=(",", ":")).encode()
        with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
            gz.write(raw)
        print(f"\nwrote {path} ({path.stat().st_size:,} bytes, {len(records)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
