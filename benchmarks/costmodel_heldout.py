"""Judge the shipped cost model against a profile measured on a GPU, without refitting.

    python3 benchmarks/costmodel_heldout.py PROFILE.json [--json OUT.json]

For every step the profile measured, the shipped default model (``--gpu`` = the profile's GPU
preset, default calibration) predicts a time, and the table shows measured vs predicted. Steps
the shipped calibration was fitted to are marked ``fit``: their two measurements (the shipped
one and the profile's) show how closely two runs of the same step agree; every other step is
``held-out``. The verdict line is the acceptance test of the shipped model: every held-out step
within 10 %. Subsets (mixed prefill + decode steps, prefill after >= 16k cached tokens, decode)
are summarised on their own, and the profile's own refit with leave-one-out shows whether the
model's form fits the new data even where the shipped constants do not.

Exit status: 0 when every held-out step is within 10 %, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hybridkv.sim.calibration_fit import leave_one_out
from hybridkv.sim.presets import get_gpu
from hybridkv.sim.profile import cost_model, default_profile, load_profile

TOLERANCE = 0.10


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", help="a profile file written by `hybridkv profile` on a GPU")
    ap.add_argument("--json", help="also write the rows and the summary as JSON to this path")
    ap.add_argument("--no-loo", action="store_true", help="skip the profile's own leave-one-out refit")
    args = ap.parse_args(argv)
    try:
        prof = load_profile(args.profile)
    except ValueError as exc:
        print(f"costmodel_heldout: {exc}", file=sys.stderr)
        return 2
    shipped = default_profile()
    gpu_name = prof.device.get("gpu") or shipped.device["gpu"]
    if prof.model.get("preset") != shipped.model["preset"] or prof.model.get("trim", {}).get("width_divisor", 1) != 1:
        print(f"costmodel_heldout: the profile measured {prof.label} (trim {prof.model.get('trim')}); the "
              f"shipped model describes {shipped.label} at full size", file=sys.stderr)
    model = cost_model(shipped.model_preset(), get_gpu(gpu_name))
    fitted = {p.step: p for p in shipped.points}
    rows = []
    for p in prof.points:
        pred = model.step_time(p.work())
        ctx = max(p.context if p.new_tokens else 0, p.decode_context if p.decode_batch else 0)
        row = {"step": p.step, "kind": p.kind, "measured_s": p.median_s, "predicted_s": pred,
               "ratio": pred / p.median_s, "set": "fit" if p.step in fitted else "held-out",
               "long_context_prefill": bool(p.new_tokens and p.context >= 16384), "max_context": ctx}
        if p.step in fitted:
            row["shipped_measured_s"] = fitted[p.step].median_s
            row["run_agreement"] = p.median_s / fitted[p.step].median_s
        rows.append(row)

    print(f"profile: {prof.label}; {len(prof.points)} steps measured "
          f"({prof.software.get('torch', '?')}, method {prof.method.get('decode', '?')} decode)")
    print(f"model:   {model.source}")
    print(f"{'step':<24} {'kind':<8} {'set':<9} {'measured':>10} {'predicted':>10} {'ratio':>7}  note")
    for r in rows:
        note = (f"shipped run {r['shipped_measured_s'] * 1e3:.2f} ms (runs agree to {r['run_agreement'] - 1:+.1%})"
                if "run_agreement" in r else ("long-context prefill" if r["long_context_prefill"] else ""))
        flag = " *" if r["set"] == "held-out" and abs(r["ratio"] - 1) > TOLERANCE else ""
        print(f"{r['step']:<24} {r['kind']:<8} {r['set']:<9} {r['measured_s'] * 1e3:>8.2f}ms "
              f"{r['predicted_s'] * 1e3:>8.2f}ms {r['ratio']:>7.3f}{flag}  {note}")

    def summary(sel: list[dict]) -> dict:
        if not sel:
            return {"steps": 0}
        err = np.abs(np.array([r["ratio"] for r in sel]) - 1)
        return {"steps": len(sel), "mean_abs_error": float(err.mean()), "max_abs_error": float(err.max()),
                "within_10pct": int((err <= TOLERANCE).sum())}

    held = [r for r in rows if r["set"] == "held-out"]
    subsets = {"held-out": held, "held-out mixed": [r for r in held if r["kind"] == "mixed"],
               "held-out long-context prefill": [r for r in held if r["long_context_prefill"]],
               "held-out prefill": [r for r in held if r["kind"] == "prefill"],
               "held-out decode": [r for r in held if r["kind"] == "decode"],
               "fit (repeated steps)": [r for r in rows if r["set"] == "fit"]}
    out = {"profile": str(args.profile), "model": model.source, "rows": rows,
           "summary": {k: summary(v) for k, v in subsets.items()}}
    print()
    for name, s in out["summary"].items():
        if s["steps"]:
            print(f"{name:<30} {s['steps']:>3} steps: mean |error| {s['mean_abs_error']:.1%}, max "
                  f"{s['max_abs_error']:.1%}, {s['within_10pct']}/{s['steps']} within 10%")
    agree = [r["run_agreement"] for r in rows if "run_agreement" in r]
    if agree:
        dev = np.abs(np.array(agree) - 1)
        print(f"{'repeated steps, profile vs shipped run':<30} {len(agree):>3} steps: mean |difference| "
              f"{dev.mean():.1%}, max {dev.max():.1%}")
        out["summary"]["run_agreement"] = {"steps": len(agree), "mean_abs": float(dev.mean()),
                                           "max_abs": float(dev.max())}
    if not args.no_loo and len(prof.points) > 2:
        stored = prof.fit.get("loo", {}).get("ratios")
        ratios = stored or leave_one_out(prof.model_preset(), prof.gpu_preset(), prof.points)
        err = np.abs(np.array(ratios) - 1)
        print(f"{'profile refit, leave-one-out':<30} {len(ratios):>3} steps: mean |error| {err.mean():.1%}, "
              f"max {err.max():.1%}")
        out["summary"]["profile_loo"] = {"mean_abs_error": float(err.mean()), "max_abs_error": float(err.max())}
    ok = bool(held) and all(abs(r["ratio"] - 1) <= TOLERANCE for r in held)
    worst = max(held, key=lambda r: abs(r["ratio"] - 1)) if held else None
    print(f"verdict: {'PASS' if ok else 'FAIL'}: {len(held)} held-out steps"
          + (f", worst {worst['step']} at {worst['ratio'] - 1:+.1%}" if worst else ", none measured"))
    out["verdict"] = "pass" if ok else "fail"
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
