"""Judge the calibrated cost model against a profile measured on a GPU, two ways.

    python3 benchmarks/costmodel_heldout.py PROFILE.json [--json OUT.json] [--loo] [--quiet]

The *shared grid* is the 24 steps the shipped calibration is fitted to (``fit.fit_steps`` of
hybridkv/cost/data/h100-llama-3.1-8b.profile.json); a profile taken with the default CUDA grid
repeats some or all of them.

(a) The shipped model as it is, no refit: every step of the profile predicted by the shipped
    default (the profile's GPU preset, default calibration). This mixes two things: how well
    the model predicts, and how far the profile's harness and machine are from the ones that
    measured the shipped steps. The steps both measured show that offset directly (the
    profile's time over the shipped run's, step by step). For the H100 profile the shipped
    default was fitted to (benchmarks/data), (a) and (b) are the same fit.

(b) The model itself, held out: its constants refitted to the profile's own shared-grid steps,
    predicting the profile's other steps. One harness, one machine; the error is the model's.
    Steps whose predicted GPU time is below the fitted host issue time are marked host-bound
    (an eager step the host issues more slowly than the GPU runs it: its time is the host's).

The verdict of each is PASS when every predicted step (for (a): every step the shipped
calibration was not fitted to) is within 10 %. ``--loo`` adds the profile's own leave-one-out
refit over all its steps.

Exit status: 0 when (b) passes, 1 when it fails, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hybridkv.cost.calibrated import Calibration
from hybridkv.cost.calibration_fit import held_out, leave_one_out
from hybridkv.cost.profile import Profile, cost_model, default_profile, load_profile

TOLERANCE = 0.10


def _summary(ratios: list[float]) -> dict:
    if not ratios:
        return {"steps": 0}
    err = np.abs(np.array(ratios) - 1)
    return {"steps": len(ratios), "mean_abs_error": float(err.mean()), "max_abs_error": float(err.max()),
            "within_10pct": int((err <= TOLERANCE).sum())}


def _line(name: str, s: dict) -> str:
    return (f"  {name:<40} {s['steps']:>3} steps: mean |error| {s['mean_abs_error']:.1%}, max "
            f"{s['max_abs_error']:.1%}, {s['within_10pct']}/{s['steps']} within 10%")


def _subsets(rows: list[dict]) -> dict[str, list[float]]:
    return {"all": [r["ratio"] for r in rows],
            "prefill": [r["ratio"] for r in rows if r["kind"] == "prefill"],
            "long-context prefill (>= 16k)": [r["ratio"] for r in rows if r["long_context_prefill"]],
            "decode": [r["ratio"] for r in rows if r["kind"] == "decode"],
            "mixed": [r["ratio"] for r in rows if r["kind"] == "mixed"]}


def _verdict(rows: list[dict]) -> tuple[bool, str]:
    bad = sorted((r for r in rows if abs(r["ratio"] - 1) > TOLERANCE), key=lambda r: -abs(r["ratio"] - 1))
    if not rows:
        return False, "FAIL: no step to predict"
    if not bad:
        worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
        return True, f"PASS: {len(rows)} steps within 10% (worst {worst['step']} at {worst['ratio'] - 1:+.1%})"
    listed = ", ".join(f"{r['step']} {r['ratio'] - 1:+.1%}" + (" (host-bound)" if r.get("host_bound") else "")
                       for r in bad[:8])
    return False, f"FAIL: {len(bad)} of {len(rows)} steps beyond 10%: {listed}" + (" ..." if len(bad) > 8 else "")


def _row(p, pred: float) -> dict:
    return {"step": p.step, "kind": p.kind, "measured_s": p.median_s, "predicted_s": pred,
            "ratio": pred / p.median_s, "long_context_prefill": bool(p.new_tokens and p.context >= 16384)}


def shared_steps(shipped: Profile) -> set[str]:
    """The steps the shipped calibration is fitted to."""
    return set(shipped.fit_steps or (p.step for p in shipped.points))


def protocol_a(prof: Profile, shipped: Profile) -> dict:
    """The shipped default against every step of ``prof`` (no refit)."""
    model = cost_model(shipped.model_preset(), prof.gpu_preset() if prof.device.get("gpu") else
                       shipped.gpu_preset())
    shared = shared_steps(shipped)
    fitted = {p.step: p for p in shipped.points if p.step in shared}
    rows = []
    for p in prof.points:
        row = _row(p, model.step_time(p.work()))
        row["set"] = "repeated" if p.step in fitted else "new"
        if p.step in fitted:
            row["shipped_measured_s"] = fitted[p.step].median_s
            row["run_offset"] = p.median_s / fitted[p.step].median_s
        rows.append(row)
    new = [r for r in rows if r["set"] == "new"]
    ok, text = _verdict(new)
    offsets = [r["run_offset"] for r in rows if "run_offset" in r]
    return {"model": model.source, "rows": rows,
            "summary": {k: _summary(v) for k, v in _subsets(new).items()},
            "repeated": _summary([r["ratio"] for r in rows if r["set"] == "repeated"]),
            "run_offset": ({"steps": len(offsets), "mean": float(np.mean(offsets)),
                            "min": float(np.min(offsets)), "max": float(np.max(offsets))} if offsets else None),
            "pass": ok, "verdict": text}


def protocol_b(prof: Profile, shipped: Profile) -> dict:
    """Refit on ``prof``'s shared-grid steps, predict its other steps."""
    res = held_out(prof.model_preset(), prof.gpu_preset(), prof.points, shared_steps(shipped),
                   prior=Calibration(split_kv=prof.split_kv))
    rows = []
    for p, r, g, hb in zip(res.test, res.test_ratios, res.test_gpu_s, res.test_host_bound):
        row = _row(p, r * p.median_s)
        row.update(predicted_gpu_s=g, host_bound=hb)
        if p.host_s:
            row["measured_host_s"] = p.host_s
        rows.append(row)
    ok, text = _verdict(rows)
    subsets = _subsets(rows)
    subsets["GPU-bound (predicted)"] = [r["ratio"] for r in rows if not r["host_bound"]]
    subsets["host-bound (predicted)"] = [r["ratio"] for r in rows if r["host_bound"]]
    fit_err = np.abs(np.array(res.fit_ratios) - 1)
    return {"fit_steps": [p.step for p in res.fit], "calibration": res.calibration.to_json(),
            "fit_in_sample": {"steps": len(res.fit), "mean_abs_error": float(fit_err.mean()),
                              "max_abs_error": float(fit_err.max())},
            "rows": rows, "summary": {k: _summary(v) for k, v in subsets.items()},
            "pass": ok, "verdict": text}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", help="a profile file written by `hybridkv profile` on a GPU")
    ap.add_argument("--json", help="also write the rows and the summaries as JSON to this path")
    ap.add_argument("--loo", action="store_true", help="also the profile's own leave-one-out refit")
    ap.add_argument("--quiet", action="store_true", help="summaries and verdicts only (no per-step tables)")
    args = ap.parse_args(argv)
    try:
        prof = load_profile(args.profile)
    except ValueError as exc:
        print(f"costmodel_heldout: {exc}", file=sys.stderr)
        return 2
    shipped = default_profile()
    if prof.model.get("preset") != shipped.model["preset"] or prof.model.get("trim", {}).get("width_divisor", 1) != 1:
        print(f"costmodel_heldout: the profile measured {prof.label} (trim {prof.model.get('trim')}); the "
              f"shipped model describes {shipped.label} at full size", file=sys.stderr)
    a = protocol_a(prof, shipped)
    try:
        b = protocol_b(prof, shipped)
    except ValueError as exc:
        print(f"costmodel_heldout: {exc}", file=sys.stderr)
        return 2
    timing = prof.method.get("timing", {})
    print(f"profile: {prof.label}; {len(prof.points)} steps (torch {prof.software.get('torch', '?')}, decode "
          f"{prof.method.get('decode', '?')}, queued ahead: {'yes' if timing.get('queue_ahead') else 'no'})")

    print(f"\n(a) shipped model, no refit ({a['model']})")
    if not args.quiet:
        print(f"  {'step':<24} {'kind':<8} {'set':<9} {'measured':>10} {'predicted':>10} {'ratio':>7}  "
              "this run / shipped run")
        for r in a["rows"]:
            off = f"{r['run_offset'] - 1:+.1%}" if "run_offset" in r else ""
            flag = " *" if r["set"] == "new" and abs(r["ratio"] - 1) > TOLERANCE else "  "
            print(f"  {r['step']:<24} {r['kind']:<8} {r['set']:<9} {r['measured_s'] * 1e3:>8.2f}ms "
                  f"{r['predicted_s'] * 1e3:>8.2f}ms {r['ratio']:>7.3f}{flag} {off}")
    for name, s in a["summary"].items():
        if s["steps"]:
            print(_line(f"new steps, {name}", s))
    if a["repeated"]["steps"]:
        print(_line("repeated steps", a["repeated"]))
        o = a["run_offset"]
        print(f"  this run / shipped run on the {o['steps']} repeated steps: mean {o['mean'] - 1:+.1%}, "
              f"from {o['min'] - 1:+.1%} to {o['max'] - 1:+.1%} (the harness and machine offset)")
    print(f"  verdict (a): {a['verdict']}")

    cal = b["calibration"]
    print(f"\n(b) refit on this profile's {len(b['fit_steps'])} shared-grid steps (in-sample max "
          f"{b['fit_in_sample']['max_abs_error']:.1%}), predict its {len(b['rows'])} other steps")
    after = min(cal["attn_causal_efficiency"], cal["attn_context_efficiency"])
    print(f"  constants: GEMMs {cal['gemm_efficiency']:.0%} of peak, weights at {cal['weight_bw_efficiency']:.0%}, "
          f"attention {cal['attn_causal_efficiency']:.0%} / {after:.0%} (fresh / after a context), KV at "
          f"{cal['attn_bw_efficiency']:.0%}, {cal['attn_block_s'] * 1e9:.0f} ns per attention block, "
          f"{'split-KV' if cal['split_kv'] else 'unsplit'} decode, overhead {cal['graph_overhead_s'] * 1e3:.2f} ms, "
          f"host {cal['eager_host_s'] * 1e3:.2f} ms per eager step")
    if len(b["fit_steps"]) < 12:
        print(f"  note: only {len(b['fit_steps'])} shared-grid steps to fit {len(cal) - 2} constants: the fit "
              "leans on its generic prior, so (b) says little about the model here")
    if not args.quiet:
        print(f"  {'step':<24} {'kind':<8} {'measured':>10} {'predicted':>10} {'ratio':>7}  GPU part")
        for r in b["rows"]:
            flag = " *" if abs(r["ratio"] - 1) > TOLERANCE else "  "
            note = f"{r['predicted_gpu_s'] * 1e3:.2f}ms" + (" host-bound" if r["host_bound"] else "")
            if "measured_host_s" in r:
                note += f" (host issued it in {r['measured_host_s'] * 1e3:.2f}ms)"
            print(f"  {r['step']:<24} {r['kind']:<8} {r['measured_s'] * 1e3:>8.2f}ms "
                  f"{r['predicted_s'] * 1e3:>8.2f}ms {r['ratio']:>7.3f}{flag} {note}")
    for name, s in b["summary"].items():
        if s["steps"]:
            print(_line(f"held-out, {name}", s))
    print(f"  verdict (b): {b['verdict']}")

    out = {"profile": str(args.profile), "a": a, "b": b}
    if args.loo and len(prof.points) > 2:
        ratios = leave_one_out(prof.model_preset(), prof.gpu_preset(), prof.points,
                               prior=Calibration(split_kv=prof.split_kv))
        out["profile_loo"] = _summary(ratios)
        print("\n" + _line("profile refit, leave-one-out", out["profile_loo"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if b["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
