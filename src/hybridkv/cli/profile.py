"""``hybridkv profile``: measure a preset's step times on this machine and fit the cost model.

Builds the preset's layers with random weights on ``--device`` (no download), times a grid of
prefill, decode and mixed steps (``--point`` adds steps in ``hybridkv cost --step`` syntax),
the attention kernels of the preset's other attention kinds, and host <-> device copies (CUDA),
fits the calibrated model and writes a profile file (format: ``hybridkv.cost.profile``) that
``simulate``, ``sweep`` and ``cost`` read with ``--profile FILE``.

On a CPU the preset is shrunk (2 layers per group, widths / 16, a 512-token vocabulary) unless
``--full-size``; the point is a quick end-to-end check, not a CPU cost model. On CUDA the full
shapes run in bfloat16, decode steps as CUDA graphs, and each timed step is queued behind a
GPU sleep so the GPU's time is measured, not the host's issue rate. ``--refit FILE`` fits a profile again from
its grid alone (no torch, no device).
"""

from __future__ import annotations

import argparse
import re

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.options import add_gpu_option, int_in, non_negative_number, step_argument
from hybridkv.cli.output import check_output_path
from hybridkv.cli.sim_options import DEFAULT_PRESET


def _repeats(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if m is None or not 1 <= int(m[1]) <= int(m[2]):
        raise argparse.ArgumentTypeError(f"must be MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return int(m[1]), int(m[2])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"model preset (default {DEFAULT_PRESET})")
    p.add_argument("--out", required=True, help="the profile file to write (JSON)")
    p.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (default: cuda when torch sees one)")
    add_gpu_option(p, None, "GPU preset whose datasheet peaks the fitted efficiencies refer to",
                   "none: the profile's measured reference GEMM and copy rates")
    p.add_argument("--point", type=step_argument, action="append", default=[], metavar="N@C[xB],...",
                   help="add a step to the grid (one prefill shape and/or one decode shape), e.g. "
                        "2048@4096,1@1024x64; repeat for more")
    p.add_argument("--grid", choices=("default", "none"), default="default",
                   help="start from the device's default grid (default) or from --point alone")
    p.add_argument("--full-size", action="store_true", help="on a CPU, keep the preset's real shapes")
    p.add_argument("--layers", type=int_in(1), help="layers kept per KV group (default: all; CPU: 2)")
    p.add_argument("--no-kernels", action="store_true", help="skip the attention-kernel points")
    p.add_argument("--no-transfer", action="store_true", help="skip the host <-> device copies")
    p.add_argument("--no-graph", action="store_true", help="time decode steps eagerly, not as CUDA graphs")
    p.add_argument("--no-queue-ahead", action="store_true",
                   help="on CUDA, start timing each step as soon as the host issues it (the host's "
                        "issue rate then gates eager steps) instead of queueing it behind a GPU sleep")
    p.add_argument("--time-budget", type=non_negative_number, metavar="SECONDS",
                   help="start no grid point after this many seconds (the rest are recorded as skipped)")
    p.add_argument("--warmup", type=int_in(0, 100), help="warm-up runs per point (default 2; CPU 1)")
    p.add_argument("--repeats", type=_repeats, metavar="MIN:MAX",
                   help="timed repetitions per point (default 6:20; CPU 3:10)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), help="default bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--threads", type=int_in(1), help="CPU threads for torch (default 1 on a CPU device)")
    p.add_argument("--loo", action="store_true", help="also report leave-one-out errors of the fit")
    p.add_argument("--refit", metavar="FILE", help="fit FILE's grid again (no measurement) and write --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _print_summary(prof, out: str) -> None:
    fit = prof.fit
    print(f"{prof.label}: {len(prof.points)} steps, {len(prof.kernels)} kernel points"
          + (f", {len(prof.method.get('skipped', []))} skipped" if prof.method.get("skipped") else "")
          + (f", {prof.method['wall_s']:.0f} s" if "wall_s" in prof.method else ""))
    print(f"  fit: in-sample error mean {fit['mean_abs_error']:.1%}, max {fit['max_abs_error']:.1%}"
          + (f"; leave-one-out mean {fit['loo']['mean_abs_error']:.1%}, max {fit['loo']['max_abs_error']:.1%}"
             if "loo" in fit else ""))
    cal = prof.calibration
    print(f"  GEMMs {cal.gemm_efficiency:.0%} of peak, weights read at {cal.weight_bw_efficiency:.0%}, "
          f"attention {cal.attn_causal_efficiency:.0%} (causal) / {cal.attn_context_efficiency:.0%} "
          f"(after a context) of peak, KV read at {cal.attn_bw_efficiency:.0%}; overhead "
          f"{cal.graph_overhead_s * 1e3:.2f} ms per step, host {cal.eager_host_s * 1e3:.2f} ms per eager "
          f"step")
    for s in prof.method.get("skipped", []):
        print(f"  skipped {s['step']}: {s['reason']}")
    print(f"wrote {out}")


def run(args: argparse.Namespace) -> int:
    check_output_path(args.out, "--out")
    if args.refit is not None:
        from hybridkv.cost.profile import load_profile
        prof = load_profile(args.refit).refit(loo=args.loo)
        prof.save(args.out)
        _print_summary(prof, args.out)
        return 0
    if args.grid == "none" and not args.point:
        raise ValueError("--grid none needs at least one --point")
    try:
        import torch
    except ImportError:
        raise ValueError('hybridkv profile needs PyTorch: pip install "hybridkv[engine]"') from None
    from hybridkv.profiling.runner import CPU_TRIM, ProfileRequest, default_grid, run_profile
    from hybridkv.profiling.timing import TimingOptions
    from hybridkv.cost.grid import GridPoint, format_step
    from hybridkv.cost.shapes import Trim
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu = device == "cpu"
    base = Trim() if (args.full_size or not cpu) else CPU_TRIM
    trim = Trim(layers_per_group=args.layers or base.layers_per_group,
                width_divisor=base.width_divisor, vocab_size=base.vocab_size)
    points = list(default_grid("cpu" if cpu else "cuda")) if args.grid == "default" else []
    points += [GridPoint.from_step(format_step(w)) for w in args.point]
    timing = None
    if args.warmup is not None or args.repeats is not None or args.no_queue_ahead:
        d = TimingOptions(1, 3, 10, 0.05) if cpu else TimingOptions()
        lo, hi = args.repeats or (d.min_repeats, d.max_repeats)
        timing = TimingOptions(d.warmup if args.warmup is None else args.warmup, lo, hi, d.target_s,
                               queue_ahead=not args.no_queue_ahead)
    gpu = None if args.gpu is None else args.gpu.name
    req = ProfileRequest(args.preset, device=device, gpu=gpu, trim=trim, points=tuple(points),
                         kernels=not args.no_kernels, timing=timing, decode_graph=not args.no_graph,
                         transfer=not args.no_transfer, time_budget_s=args.time_budget,
                         dtype=args.dtype, threads=args.threads, loo=args.loo)
    prof = run_profile(req, out=args.out, progress=not args.no_progress)
    _print_summary(prof, args.out)
    return 0


COMMANDS.register("profile", Command(
    help="measure step times of a preset on this machine and fit the cost model",
    add_arguments=add_arguments, run=run, description=__doc__))

__all__ = ["add_arguments", "run"]
