"""``hybridkv cost``: what one engine step costs, and why.

``--step`` names one step's work: comma-separated items ``N@C`` (a prefill chunk of ``N`` new
tokens after ``C`` cached ones) and ``N@CxB`` (``B`` such requests; ``1@CxB`` is ``B`` decodes
with ``C`` cached tokens each). ``--step`` may repeat; each step is costed on its own.

For every step it prints the time under the selected cost model (calibrated by default: see
``hybridkv.cost.calibrated``) with its split: the GEMMs' compute-bound and weight-read shares,
attention, and the fixed per-step overhead, and which term bounds it; then the roofline's time
for comparison. ``--json`` prints one object instead: ``time_s`` (all steps together), the
model, and per step the same fields. With ``--profile`` the times are on the profile's device
(``device`` in the JSON; a CPU profile gives CPU times, and the header names it), the roofline's
too; a profile measured on another model than ``--preset`` is warned about.
"""

from __future__ import annotations

import argparse

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.options import int_in, step_argument
from hybridkv.cli.output import print_json
from hybridkv.cli.sim_options import (DEFAULT_PRESET, add_cost_model_options, check_cost_model_options,
                                      profile_warning, warn)
from hybridkv.cost.grid import format_step
from hybridkv.cost.hardware import fewest_gpus
from hybridkv.cost.presets import GPU_PRESETS, get_gpu, get_preset
from hybridkv.cost.profile import cost_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step", type=step_argument, action="append", required=True, metavar="N@C[xB],...",
                   help="one step's work, e.g. 2048@4096,1@1024x64 (a 2048-token prefill chunk "
                        "after 4096 cached tokens plus 64 decodes at 1024); repeat for more steps")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"model preset (default {DEFAULT_PRESET}; see `hybridkv presets`)")
    p.add_argument("--gpu", default="h100", help=f"GPU preset: {', '.join(GPU_PRESETS)}")
    p.add_argument("--gpus", type=int_in(1, 1024),
                   help="GPUs serving the model, ideal tensor parallel (default: the fewest, a "
                        "power of two, whose 90%% less an activation reserve holds the weights, "
                        "as simulate's)")
    add_cost_model_options(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def run(args: argparse.Namespace) -> int:
    check_cost_model_options(args)
    preset = get_preset(args.preset)
    gpu = get_gpu(args.gpu)
    gpus = args.gpus or fewest_gpus(preset, gpu)
    if gpus is None:
        raise ValueError(f"{preset.name}'s weights do not fit even 1024 x {gpu.name}; use a larger --gpu")
    warning = profile_warning(args.profile, preset)
    if warning:
        warn(args, warning)
    model = cost_model(preset, gpu, gpus, args.profile, args.cost_model)
    # with a profile, time is the profile's device's (a CPU profile: the CPU), not --gpu's
    device = args.profile.gpu_preset() if args.profile is not None else gpu
    roof = cost_model(preset, device, gpus, kind="roofline")
    steps = []
    for work in args.step:
        c = model.step(work)
        r = roof.step(work)
        steps.append({"step": format_step(work), "requests": len(work),
                      "new_tokens": sum(n for n, _ in work), **c.to_json(),
                      "roofline": None if model.kind == "roofline" else r.to_json()})
    out = {"preset": preset.name, "gpu": gpu.name, "device": device.name, "num_gpus": gpus,
           "cost_model": model.kind,
           "source": model.source, "time_s": sum(s["time_s"] for s in steps), "steps": steps}
    if args.json:
        print_json(out)
        return 0
    where = f"{gpus} x {device.name}"
    if device.name != gpu.name:
        where += f" (the profile's device; --gpu {gpu.name} only sizes memory)"
    print(f"{preset.name} on {where}; {model.source}")
    for s in steps:
        reqs = f"{s['requests']} request" + ("s" if s["requests"] != 1 else "")
        print(f"step {s['step']} ({reqs}, {s['new_tokens']:,} new tokens): "
              f"{_ms(s['time_s'])}, bound by {s['bound']}")
        if model.kind == "calibrated":
            print(f"  GEMM compute {_ms(s['compute_s'])} + weight reads {_ms(s['memory_s'])} "
                  f"(blended) + attention {_ms(s['attention_s'])} + overhead {_ms(s['overhead_s'])}")
        else:
            print(f"  max(compute {_ms(s['compute_s'])}, memory {_ms(s['memory_s'])}) "
                  f"+ overhead {_ms(s['overhead_s'])}")
        print(f"  {s['flops'] / 1e12:.2f} TFLOP, {s['bytes'] / 1e9:.2f} GB moved")
        if s["roofline"] is not None:
            r = s["roofline"]
            print(f"  roofline: {_ms(r['time_s'])} (compute {_ms(r['compute_s'])}, memory "
                  f"{_ms(r['memory_s'])}, bound by {r['bound']})")
    if len(steps) > 1:
        print(f"total: {_ms(out['time_s'])}")
    return 0


COMMANDS.register("cost", Command(
    help="what one engine step costs (time, compute / memory / attention split)",
    add_arguments=add_arguments, run=run, description=__doc__))

__all__ = ["add_arguments", "run"]
