"""Published serving measurements, reproduced with the simulator (BENCHMARKS.md, "Published
serving results").

    python3 benchmarks/published_results.py [--rows ID,...] [--markdown] [--json OUT.json]

Each row is one measurement someone published with its whole setup (model, GPUs, parallelism,
engine and version, lengths, concurrency), its source URL, and the numbers published: output
throughput (all GPUs), mean TTFT and mean TPOT (time per output token after the first, the
inter-token latency a request sees). Rows the simulator cannot model say why and are not run.

A row is reproduced with a synthetic workload as the benchmark client draws it: random token
ids (no prefix is shared), prompt and output lengths uniform in ``[ratio x L, L]``, ``N``
requests, seeded. The client runs a closed loop of ``C`` requests in flight; the simulator is
open-loop, so requests arrive evenly spaced at the rate that keeps ``C`` in flight by Little's
law: the rate at which ``rate x mean end-to-end latency = C``, found by bisection over the rate
(seven passes after one that serves requests one at a time; the pass closest to ``C`` in
flight is reported). Each pass is one ``hybridkv simulate`` run (printed), without the offline
optimum and without speculative decoding.

A row published at request rate inf (every request at once, the engine's own batch limits
deciding) is run once with every request arriving at 0.

Errors are predicted / published - 1, per metric; the summary gives their mean absolute value
and the worst.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from hybridkv.cli import main

# InferenceMAX's client (github.com/InferenceMAX/InferenceMAX README, "Benchmark Client
# Configuration"): random dataset, --random-range-ratio 0.8, --num-prompts CONC x 10,
# --max-concurrency CONC, --request-rate inf, --ignore-eos.
_IMAX = "random lengths in [0.8 L, L], 10 x C prompts, closed loop of C, ignore-eos"

ROWS = [
    # SemiAnalysis InferenceX issue #870, run 22737795957 (2026-03-05): DeepSeek-R1-0528 FP8,
    # SGLang v0.5.7, 8 x H200, TP=8 EP=1, concurrency 4. Published: output tput/GPU, mean TTFT,
    # mean TPOT per ISL/OSL.
    dict(id="dsr1-h200-1k1k", source="https://github.com/SemiAnalysisAI/InferenceX/issues/870",
         setup="DeepSeek-R1-0528 FP8, SGLang v0.5.7, 8 x H200, TP-8 EP-1, ISL/OSL 1k/1k, C=4; " + _IMAX,
         preset="deepseek-v3", gpu="h200", deploy=["--tp", "8", "--dp", "1"], isl=1024, osl=1024,
         ratio=0.8, conc=4, prompts=40, tput=21.2 * 8, ttft_ms=267.3, tpot_ms=22.73),
    dict(id="dsr1-h200-1k8k", source="https://github.com/SemiAnalysisAI/InferenceX/issues/870",
         setup="as above, ISL/OSL 1k/8k", preset="deepseek-v3", gpu="h200", deploy=["--tp", "8", "--dp", "1"],
         isl=1024, osl=8192, ratio=0.8, conc=4, prompts=40, tput=45.0 * 8, ttft_ms=204.1, tpot_ms=10.93),
    dict(id="dsr1-h200-8k1k", source="https://github.com/SemiAnalysisAI/InferenceX/issues/870",
         setup="as above, ISL/OSL 8k/1k", preset="deepseek-v3", gpu="h200", deploy=["--tp", "8", "--dp", "1"],
         isl=8192, osl=1024, ratio=0.8, conc=4, prompts=40, tput=38.9 * 8, ttft_ms=474.3, tpot_ms=12.05),
    # vLLM PR #23696 ("[Kernel][B200] mxfp4 fused cutlass moe", August 2025), FlashInfer
    # backend: `vllm serve gpt-oss-120b --max-model-len 32768 -tp 8` on 8 x B200, `vllm bench
    # serve --dataset-name sharegpt` (1000 prompts, request rate inf): 215,312 input and 197,144
    # output tokens; output 7,404.72 tok/s, mean TTFT 3,449.17 ms, mean TPOT 94.12 ms.
    dict(id="gptoss-b200-sharegpt", source="https://github.com/vllm-project/vllm/pull/23696",
         setup="gpt-oss-120b, vLLM (Aug 2025, FlashInfer MXFP4 MoE), 8 x B200, TP-8, ShareGPT 1000 "
               "prompts at rate inf; reproduced with the published mean lengths (215 in, 197 out), "
               "all arriving at once", preset="gpt-oss-120b", gpu="b200", deploy=["--tp", "8", "--dp", "1"],
         offline=True, prompts=1000, isl=215, osl=197, tput=7404.72, ttft_ms=3449.17, tpot_ms=94.12),
    # Out of scope (stated, not run):
    dict(id="dsv3-h800-tp16", source="https://github.com/sgl-project/sglang/issues/3812",
         setup="DeepSeek-V3 FP8, SGLang (EP PR #3602), 2 x 8 H800 over RoCE, TP-16, random 180/400, rate 40",
         out_of_scope="H800 is not a GPU preset (NVLink 400 GB/s, another collective table)"),
    dict(id="minimax-h100-tp4", source="https://github.com/SemiAnalysisAI/InferenceX/pull/832",
         setup="MiniMax-M2.5 FP8, vLLM, 4 x H100, TP-4 EP-4, 1k/1k, C=4",
         out_of_scope="MiniMax-M2.5 is not a model preset"),
    dict(id="llama8b-mlperf-h100", source="https://www.redhat.com/en/blog/efficient-and-reproducible-llm-inference-red-hat-mlperf-inference-v51-results",
         setup="MLPerf Inference v5.1, Llama-3.1-8B FP8, vLLM 0.10.0, 1 x H100: 5,777 tok/s offline, 5,103 server",
         out_of_scope="FP8 weights (the preset is the BF16 checkpoint) and MLPerf's CNN/DailyMail lengths are not bundled"),
    dict(id="llama8b-sharegpt", source="https://github.com/vllm-project/vllm/pull/18566",
         setup="Llama-3.1-8B-Instruct, vLLM (May 2025), ShareGPT 1000 prompts, rate inf",
         out_of_scope="the GPU is not stated, and the ShareGPT lengths are not bundled"),
]


def write_trace(path: Path, row: dict, rate: float | None, seed: int = 0) -> None:
    """The row's synthetic workload as a token JSONL trace, arrivals ``1 / rate`` apart (None:
    all at 0)."""
    rng = np.random.default_rng(seed)
    ratio = row.get("ratio", 1.0)
    lo_in, lo_out = int(ratio * row["isl"]), int(ratio * row["osl"])
    with path.open("w") as f:
        for i in range(row["prompts"]):
            n_in = int(rng.integers(lo_in, row["isl"] + 1))
            n_out = int(rng.integers(lo_out, row["osl"] + 1))
            prompt = rng.integers(0, 100_000, n_in).tolist()
            f.write(json.dumps({"prompt_token_ids": prompt, "output_len": n_out,
                                "arrival_s": 0.0 if rate is None else i / rate,
                                "request_id": f"r{i}"}) + "\n")


def simulate(row: dict, trace: Path, out: Path) -> dict:
    argv = ["simulate", "--trace", str(trace), "--preset", row["preset"], "--gpu", row["gpu"],
            *row["deploy"], "--spec", "none", "--no-optimum", "--no-progress", "--json", str(out)]
    print("  hybridkv " + " ".join(argv), file=sys.stderr)
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    if rc != 0:
        raise SystemExit(f"row {row['id']}: simulate exited {rc}")
    return json.loads(out.read_text())


def reproduce(row: dict, passes: int = 7) -> dict:
    """Run the row (module docstring); returns its predicted metrics and errors."""
    with tempfile.TemporaryDirectory() as tmp:
        trace, out = Path(tmp) / "trace.jsonl", Path(tmp) / "out.json"
        if row.get("offline"):                   # rate inf: every request at t = 0
            write_trace(trace, row, None)
            d = simulate(row, trace, out)
            return _result(row, d, None, None)
        mean_out = (row["ratio"] * row["osl"] + row["osl"]) / 2
        conc = row["conc"]

        def at(rate: float) -> tuple[dict, float]:
            write_trace(trace, row, rate)
            d = simulate(row, trace, out)
            return d, rate * (d["ttft_mean_s"] + (mean_out - 1) * d["itl_mean_s"])   # in flight

        # one request at a time (1 / 1000 of the rate one would guess) bounds the latency
        # below: C over it is a rate with at least C in flight; then bisect (geometrically).
        d, _ = at(conc / (mean_out * 20.0) / 1000)
        hi = conc / (d["ttft_mean_s"] + (mean_out - 1) * d["itl_mean_s"])
        lo = hi / (4 * conc)
        best = None
        for _ in range(passes):
            mid = (lo * hi) ** 0.5
            d, inflight = at(mid)
            if best is None or abs(inflight - conc) < abs(best[1] - conc):
                best = (d, inflight, mid)
            lo, hi = (mid, hi) if inflight < conc else (lo, mid)
    d, inflight, rate = best
    return _result(row, d, inflight, rate)


def _result(row: dict, d: dict, inflight: float | None, rate: float | None) -> dict:
    pred = {"tput": d["throughput_tok_s"], "ttft_ms": d["ttft_mean_s"] * 1e3, "tpot_ms": d["itl_mean_s"] * 1e3}
    return {"id": row["id"], "predicted": pred, "in_flight": inflight, "rate_req_s": rate,
            "published": {k: row[k] for k in ("tput", "ttft_ms", "tpot_ms")},
            "error": {k: pred[k] / row[k] - 1 for k in pred},
            "command": f"python3 benchmarks/published_results.py --rows {row['id']}"}


def markdown(results: list[dict]) -> str:
    lines = ["| row | setup | source | output tok/s pred / pub | TTFT ms pred / pub | TPOT ms pred / pub |",
             "| --- | --- | --- | --- | --- | --- |"]
    by_id = {r["id"]: r for r in results}
    for row in ROWS:
        if "out_of_scope" in row:
            lines.append(f"| {row['id']} | {row['setup']} | {row['source']} | out of scope: "
                         f"{row['out_of_scope']} | | |")
            continue
        r = by_id.get(row["id"])
        if r is None:
            continue
        p, q, e = r["predicted"], r["published"], r["error"]
        lines.append(f"| {row['id']} | {row['setup']} | {row['source']} | "
                     f"{p['tput']:,.0f} / {q['tput']:,.0f} ({e['tput']:+.0%}) | "
                     f"{p['ttft_ms']:,.0f} / {q['ttft_ms']:,.0f} ({e['ttft_ms']:+.0%}) | "
                     f"{p['tpot_ms']:.2f} / {q['tpot_ms']:.2f} ({e['tpot_ms']:+.0%}) |")
    if results:
        for k, name in (("tput", "output throughput"), ("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            errs = [abs(r["error"][k]) for r in results]
            lines.append(f"\n{name}: mean |error| {np.mean(errs):.0%}, worst {max(errs):.0%} "
                         f"({len(errs)} rows)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", help="comma-separated row ids (default: every row in scope)")
    p.add_argument("--markdown", action="store_true", help="print the BENCHMARKS.md table")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ids = set(args.rows.split(",")) if args.rows else None
    known = {r["id"] for r in ROWS}
    if ids and not ids <= known:
        print(f"unknown row(s) {', '.join(sorted(ids - known))}; valid: {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    results = []
    for row in ROWS:
        if "out_of_scope" in row or (ids and row["id"] not in ids):
            continue
        print(f"{row['id']}: {row['setup']}", file=sys.stderr)
        results.append(reproduce(row))
        print(json.dumps(results[-1]), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results) if args.markdown else json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run())
