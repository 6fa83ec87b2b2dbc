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
deciding) is run once with every request arriving at 0. A row published at a finite request
rate with no concurrency cap (``rate``) is run once with Poisson arrivals at that rate, as the
benchmark clients draw them (seeded).

A published metric the row does not record (None) is shown as such and left out of the
summary.

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
# FP8 checkpoints (DeepSeek's block-scaled FP8): 1-byte weights, GEMMs at the FP8 peak.
_FP8 = ["--weight-dtype", "fp8"]
# TensorRT-LLM's published throughput tables, at the commit they were read from.
_TRTLLM = ("https://github.com/NVIDIA/TensorRT-LLM/blob/00f37686aa854010d68bcbd0f4ab000221541ca6/"
           "docs/source/performance/perf-overview.md")

ROWS = [
    # SemiAnalysis InferenceX issue #870, run 22737795957 (2026-03-05): DeepSeek-R1-0528 FP8,
    # SGLang v0.5.7, 8 x H200, TP=8 EP=1, concurrency 4. Published: output tput/GPU, mean TTFT,
    # mean TPOT per ISL/OSL.
    dict(id="dsr1-h200-1k1k", source="https://github.com/SemiAnalysisAI/InferenceX/issues/870",
         setup="DeepSeek-R1-0528 FP8, SGLang v0.5.7, 8 x H200, TP-8 EP-1, ISL/OSL 1k/1k, C=4; " + _IMAX,
         preset="deepseek-v3", gpu="h200", deploy=["--tp", "8", "--dp", "1", *_FP8], isl=1024, osl=1024,
         ratio=0.8, conc=4, prompts=40, tput=21.2 * 8, ttft_ms=267.3, tpot_ms=22.73),
    dict(id="dsr1-h200-1k8k", source="https://github.com/SemiAnalysisAI/InferenceX/issues/870",
         setup="as above, ISL/OSL 1k/8k", preset="deepseek-v3", gpu="h200",
         deploy=["--tp", "8", "--dp", "1", *_FP8],
         isl=1024, osl=8192, ratio=0.8, conc=4, prompts=40, tput=45.0 * 8, ttft_ms=204.1, tpot_ms=10.93),
    dict(id="dsr1-h200-8k1k", source="https://github.com/SemiAnalysisAI/InferenceX/issues/870",
         setup="as above, ISL/OSL 8k/1k", preset="deepseek-v3", gpu="h200",
         deploy=["--tp", "8", "--dp", "1", *_FP8],
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
    # SGLang issue #3812 (February 2025, the EP PR #3602's benchmark): DeepSeek-V3 FP8 on
    # 2 nodes x 8 H800 (RoCE v2 + RDMA), `--tp 16`, `sglang.bench_serving --dataset-name random
    # --num-prompts 600 --random-input 180 --random-output 400 --request-rate 40` (range ratio
    # 0 then: lengths uniform in [1, L]; the totals, 55,787 input and 120,861 output
    # tokens, are 93 and 201 per request, as that gives). Published: 600 requests in 109.94 s,
    # so 120,861 / 109.94 = 1,099.3 output tok/s. The TTFT and TPOT lines are not
    # transcribed here (None). The RoCE NIC speed is not stated: the inter-node link is
    # priced as ib-ndr (400 Gb/s per GPU).
    dict(id="dsv3-h800-tp16", source="https://github.com/sgl-project/sglang/issues/3812",
         setup="DeepSeek-V3 FP8, SGLang (EP PR #3602), 2 x 8 H800 over RoCE (priced as 400 Gb/s NDR), "
               "TP-16, random 180/400 (uniform from 1), 600 prompts, Poisson rate 40",
         preset="deepseek-v3", gpu="h800", deploy=["--tp", "16", "--dp", "1", *_FP8], isl=180, osl=400,
         ratio=0.0, rate=40.0, prompts=600, tput=120861 / 109.94, ttft_ms=None, tpot_ms=None),
    # TensorRT-LLM's performance overview (docs/source/performance/perf-overview.md at the commit
    # cited; the v1.0 tables, PyTorch backend): nvidia/Llama-3.1-8B-Instruct-FP8 on one H100 SXM
    # 80GB (DGX H100) or one H200 SXM 141GB (DGX H200), TP-1, `trtllm-bench throughput` (every
    # request queued at once) on a synthetic dataset of fixed lengths (prepare_dataset.py
    # token-norm-dist, stdev 0) with the page's request count per ISL/OSL (3,000 for 1000/1000
    # and 2048/128). Published: total output throughput, tok/s; the tables give no TTFT or TPOT
    # (None). The engine's batch limits (trtllm-bench picks them) are not stated: the rows run
    # simulate's defaults.
    dict(id="llama8b-h100-trtllm-1k1k", source=_TRTLLM,
         setup="Llama-3.1-8B-Instruct FP8, TensorRT-LLM (v1.0 perf overview, PyTorch backend), 1 x H100, "
               "TP-1, fixed ISL/OSL 1000/1000, 3,000 requests all queued at once (trtllm-bench throughput)",
         preset="llama-3.1-8b", gpu="h100", deploy=["--tp", "1", "--dp", "1", *_FP8], offline=True,
         prompts=3000, isl=1000, osl=1000, tput=15220, ttft_ms=None, tpot_ms=None),
    dict(id="llama8b-h100-trtllm-2k128", source=_TRTLLM,
         setup="as above, fixed ISL/OSL 2048/128, 3,000 requests",
         preset="llama-3.1-8b", gpu="h100", deploy=["--tp", "1", "--dp", "1", *_FP8], offline=True,
         prompts=3000, isl=2048, osl=128, tput=3450, ttft_ms=None, tpot_ms=None),
    dict(id="llama8b-h200-trtllm-1k1k", source=_TRTLLM,
         setup="as above on 1 x H200 (DGX H200), fixed ISL/OSL 1000/1000, 3,000 requests",
         preset="llama-3.1-8b", gpu="h200", deploy=["--tp", "1", "--dp", "1", *_FP8], offline=True,
         prompts=3000, isl=1000, osl=1000, tput=17744, ttft_ms=None, tpot_ms=None),
    # Out of scope (stated, not run):
    dict(id="minimax-h100-tp4", source="https://github.com/SemiAnalysisAI/InferenceX/pull/832",
         setup="MiniMax-M2.5 FP8, vLLM, 4 x H100, TP-4 EP-4, 1k/1k, C=4",
         out_of_scope="MiniMax-M2.5 is not a model preset"),
    # Red Hat's MLPerf Inference v5.1 submission (closed/RedHat/results/XE8640_4xH100_vLLM in
    # mlcommons/inference_results_v5.1; 1 of the 4 H100s used): offline 45.1334 samples/s,
    # 5,777.08 tok/s (so 128.0 output tokens per sample); server 39.56 samples/s, 5,103.99
    # tok/s, mean TTFT 359.3 ms, mean TPOT 23.11 ms, under MLPerf's server limits (loadgen
    # mlperf.conf: p99 TTFT 2 s, p99 TPOT 100 ms). Engine settings (mlcommons/inference
    # language/llama3.1-8b/README_HARNESS.md, Red Hat's harness): offline --max-num-seqs 1024
    # --max-num-batched-tokens 4096 --kv-cache-dtype fp8; server --max-num-seqs 512
    # --max-num-batched-tokens 1024 --gpu-memory-utilization 0.91, target 39.5 queries/s.
    # FP8 is modelled (--weight-dtype fp8); the prompts' lengths are not: no public source
    # found gives the CNN/DailyMail prompts' length in Llama-3.1 tokens (MLCommons' reference
    # only tokenizes them at download time).
    dict(id="llama8b-mlperf-h100", source="https://github.com/mlcommons/inference_results_v5.1/tree/main/closed/RedHat/results/XE8640_4xH100_vLLM",
         setup="MLPerf Inference v5.1, Llama-3.1-8B FP8, vLLM 0.10.0, 1 x H100: 5,777 tok/s offline; "
               "server 5,104 tok/s, mean TTFT 359 ms, mean TPOT 23.1 ms",
         out_of_scope="the CNN/DailyMail prompts' lengths in Llama-3.1 tokens were not found in a public "
                      "source (output: 128.0 tokens per sample, from the logs)"),
    dict(id="llama8b-sharegpt", source="https://github.com/vllm-project/vllm/pull/18566",
         setup="Llama-3.1-8B-Instruct, vLLM (May 2025), ShareGPT 1000 prompts, rate inf",
         out_of_scope="the GPU is not stated, and the ShareGPT lengths are not bundled"),
]


def write_trace(path: Path, row: dict, rate: float | None, seed: int = 0) -> None:
    """The row's synthetic workload as a token JSONL trace, arrivals ``1 / rate`` apart (None:
    all at 0)."""
    rng = np.random.default_rng(seed)
    ratio = row.get("ratio", 1.0)
    lo_in, lo_out = max(1, int(ratio * row["isl"])), max(1, int(ratio * row["osl"]))
    poisson = "rate" in row
    t = 0.0
    with path.open("w") as f:
        for i in range(row["prompts"]):
            n_in = int(rng.integers(lo_in, row["isl"] + 1))
            n_out = int(rng.integers(lo_out, row["osl"] + 1))
            prompt = rng.integers(0, 100_000, n_in).tolist()
            if poisson:                          # exponential gaps at the row's rate
                arrival, t = t, t + float(rng.exponential(1.0 / row["rate"]))
            else:
                arrival = 0.0 if rate is None else i / rate
            f.write(json.dumps({"prompt_token_ids": prompt, "output_len": n_out,
                                "arrival_s": arrival, "request_id": f"r{i}"}) + "\n")


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
        if row.get("offline") or "rate" in row:  # rate inf (all at t = 0), or Poisson at a rate
            write_trace(trace, row, None)
            d = simulate(row, trace, out)
            return _result(row, d, None, row.get("rate"))
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
            "error": {k: None if row[k] is None else pred[k] / row[k] - 1 for k in pred},
            "command": f"python3 benchmarks/published_results.py --rows {row['id']}"}


def _cell(pred: float, pub: float | None, err: float | None, fmt: str) -> str:
    """``pred / pub (err)``, or ``pred / not recorded`` for a metric the row lacks."""
    if pub is None or err is None:
        return f"{pred:{fmt}} / not recorded"
    return f"{pred:{fmt}} / {pub:{fmt}} ({err:+.0%})"


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
                     f"{_cell(p['tput'], q['tput'], e['tput'], ',.0f')} | "
                     f"{_cell(p['ttft_ms'], q['ttft_ms'], e['ttft_ms'], ',.0f')} | "
                     f"{_cell(p['tpot_ms'], q['tpot_ms'], e['tpot_ms'], '.2f')} |")
    if results:
        for k, name in (("tput", "output throughput"), ("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            errs = [abs(r["error"][k]) for r in results if r["error"][k] is not None]
            if errs:
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
