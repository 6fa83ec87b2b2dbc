"""Accuracy of the step-time models on the measured H100 steps: roofline vs calibrated.

    python3 benchmarks/costmodel_accuracy.py [--steps FILE.jsonl] [--json OUT.json]
    python3 benchmarks/costmodel_accuracy.py --write-default   # rebuild the shipped profile

For each of the 24 steps (Llama-3.1-8B shapes, one H100 SXM, PyTorch 2.11 kernels; a copy is
kept in tests/data/h100-llama-3.1-8b.jsonl) the table gives the measured median and, as
predicted / measured: the roofline (mfu 0.5, mbu 0.8, 2 ms per step), the shipped calibrated
model (fitted to all 24: in-sample), and the calibrated model fitted to the other 23 steps
(leave-one-out: what a step it has not seen should expect). The summary gives mean and max
|error| of each.

``--write-default`` refits the shipped profile (hybridkv/sim/data/h100-llama-3.1-8b.profile.json)
from tests/data/h100-llama-3.1-8b.jsonl and tests/data/h100-pcie.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hybridkv.sim.calibration_fit import leave_one_out
from hybridkv.sim.costmodel import CostModel
from hybridkv.sim.presets import get_gpu, get_preset
from hybridkv.sim.profile import (DEFAULT_PROFILE_PATH, cost_model, default_profile,
                                  profile_from_measurements)

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "tests" / "data" / "h100-llama-3.1-8b.jsonl"
COPIES = ROOT / "tests" / "data" / "h100-pcie.jsonl"

SOFTWARE = {"torch": "2.11.0+cu130", "driver": "580",
            "attention": "scaled_dot_product_attention, FlashAttention-class backend, native GQA"}
METHOD = {"dtype": "bfloat16", "weights": "random", "timer": "cuda-events", "prefill": "eager",
          "decode": "cuda-graph",
          "statistic": "median (and minimum) of 6-20 repetitions after 2-3 warm-ups",
          "kernels": "cuBLAS GEMMs (unfused QKV / O / gate-up / down), RMSNorm and SiLU as separate "
                     "ops, SDPA with a lower-right causal mask over context + new tokens, KV written "
                     "in place, no RoPE, LM head on the last prefill position and every decode row"}


def write_default() -> None:
    prof = profile_from_measurements(
        STEPS, "llama-3.1-8b", "h100", "NVIDIA H100 80GB HBM3 (SXM)", transfer=COPIES,
        transfer_source="measured on one H100 SXM machine (PyTorch 2.11, pinned host memory, PCIe)",
        software=SOFTWARE, method=METHOD)
    prof.save(DEFAULT_PROFILE_PATH)
    print(f"wrote {DEFAULT_PROFILE_PATH}: in-sample max {prof.fit['max_abs_error']:.1%}, "
          f"leave-one-out max {prof.fit['loo']['max_abs_error']:.1%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default=str(STEPS), help="measured steps (JSON lines)")
    ap.add_argument("--json", help="write the rows and the summary as JSON to this path")
    ap.add_argument("--write-default", action="store_true", help="rebuild the shipped profile and exit")
    args = ap.parse_args(argv)
    if args.write_default:
        write_default()
        return 0
    steps = Path(args.steps)
    prof = (default_profile() if steps.resolve() == STEPS.resolve()
            else profile_from_measurements(steps, "llama-3.1-8b", "h100", "H100"))
    preset, gpu = get_preset("llama-3.1-8b"), get_gpu("h100")
    points = prof.points
    roof = CostModel(preset, gpu)
    cal_model = cost_model(preset, gpu, profile=prof)
    loo = leave_one_out(preset, gpu, points)
    rows = []
    for p, lo in zip(points, loo):
        rows.append({"step": p.step, "kind": p.kind, "measured_s": p.median_s,
                     "roofline": roof.step_time(p.work()) / p.median_s,
                     "calibrated": cal_model.step_time(p.work()) / p.median_s, "calibrated_loo": lo})
    print(f"{'step':<14} {'kind':<8} {'measured':>9}  {'roofline':>8} {'calibrated':>10} {'LOO':>7}")
    for r in rows:
        print(f"{r['step']:<14} {r['kind']:<8} {r['measured_s'] * 1e3:>7.2f}ms  {r['roofline']:>8.3f} "
              f"{r['calibrated']:>10.3f} {r['calibrated_loo']:>7.3f}")
    summary = {}
    for key in ("roofline", "calibrated", "calibrated_loo"):
        err = np.abs(np.array([r[key] for r in rows]) - 1)
        summary[key] = {"mean_abs_error": float(err.mean()), "max_abs_error": float(err.max())}
    print(f"\n{'model':<34} {'mean |error|':>12} {'max |error|':>11}")
    labels = {"roofline": "roofline (mfu 0.5, mbu 0.8, 2 ms)", "calibrated": "calibrated, in-sample",
              "calibrated_loo": "calibrated, leave-one-out"}
    for key, s in summary.items():
        print(f"{labels[key]:<34} {s['mean_abs_error']:>12.1%} {s['max_abs_error']:>11.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
