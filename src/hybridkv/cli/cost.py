"""``hybridkv cost``: what one engine step costs, and why.

Without ``--tp`` (alias ``--gpus``) or ``--ep`` the step is one instance's of the deployment
``simulate`` runs by default (:func:`hybridkv.cost.deployment.default_deployment`); with them,
one TP engine (``--ep``: experts sharded in it, or data-parallel attention over ``--ep`` GPUs).
Communication is included in every time and shown (``comm_s`` in the JSON).

``--step`` names one step's work: comma-separated items ``N@C`` (a prefill chunk of ``N`` new
tokens after ``C`` cached ones) and ``N@CxB`` (``B`` such requests; ``1@CxB`` is ``B`` decodes
with ``C`` cached tokens each). ``--step`` may repeat; each step is costed on its own.

For every step it prints the time under the selected cost model (calibrated by default: see
``hybridkv.cost.calibrated``) with its split: the GEMMs' compute-bound and weight-read shares,
attention, and the fixed per-step overhead, and which term bounds it; then the roofline's time
for comparison. ``--json`` prints one object instead: ``time_s`` (all steps together), the
model, and per step the same fields. With ``--profile`` the times are on the profile's device
(``device`` in the JSON; a CPU profile gives CPU times, and the header names it), the roofline's
too; a profile measured on another model than ``--preset`` is warned about. ``--weight-dtype
fp8`` runs the preset's weights in FP8 (1 byte each, GEMMs at the GPU's FP8 peak; ``weight_dtype``
in the JSON).
"""

from __future__ import annotations

import argparse

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.capacity import add_weight_dtype_option
from hybridkv.cli.options import add_gpu_option, int_in, step_argument
from hybridkv.cli.output import print_json
from hybridkv.cli.sim_options import (DEFAULT_PRESET, add_cost_model_options, check_cost_model_options,
                                      profile_warning, warn)
from hybridkv.cost.grid import format_step
from hybridkv.cost.deployment import DEFAULT_GPUS_PER_NODE, Deployment, default_deployment, expert_params
from hybridkv.cost.hardware import fewest_gpus
from hybridkv.cost.presets import get_preset
from hybridkv.cost.profile import cost_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step", type=step_argument, action="append", required=True, metavar="N@C[xB],...",
                   help="one step's work, e.g. 2048@4096,1@1024x64 (a 2048-token prefill chunk "
                        "after 4096 cached tokens plus 64 decodes at 1024); repeat for more steps")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"model preset (default {DEFAULT_PRESET}; see `hybridkv presets`)")
    add_gpu_option(p)
    add_weight_dtype_option(p)
    p.add_argument("--gpus", "--tp", dest="gpus", type=int_in(1, 1024),
                   help="tensor-parallel GPUs of the engine (default: one instance of simulate's "
                        "default deployment over the fewest GPUs, a power of two, whose 90%% less "
                        "an activation reserve holds the weights; DeepSeek-class: a rank of DP "
                        "attention + EP over them); their "
                        "all-reduces are priced over NVLink, over the inter-node link when wider "
                        "than --gpus-per-node")
    p.add_argument("--ep", type=int_in(1, 1024), default=1,
                   help="expert-parallel GPUs of a MoE preset (default 1): --ep equal to --tp "
                        "shards the experts inside the TP group; a multiple of it runs "
                        "data-parallel attention over --ep GPUs; priced with their all-to-all")
    p.add_argument("--gpus-per-node", type=int_in(1, 1024), default=DEFAULT_GPUS_PER_NODE,
                   help=f"GPUs one node joins with NVLink (default {DEFAULT_GPUS_PER_NODE})")
    add_cost_model_options(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def run(args: argparse.Namespace) -> int:
    check_cost_model_options(args)
    preset = get_preset(args.preset).with_weight_dtype(args.weight_dtype)
    gpu = args.gpu
    gpus = args.gpus or fewest_gpus(preset, gpu)
    if gpus is None:
        raise ValueError(f"{preset.name}'s weights do not fit even 1024 x {gpu.name}; use a larger --gpu")
    warning = profile_warning(args.profile, preset)
    if warning:
        warn(args, warning)
    if args.gpus is None and args.ep == 1:      # the instance simulate's default deployment runs
        dep = default_deployment(preset, gpu, gpus, gpus_per_node=args.gpus_per_node)
        gpus = dep.tp
    else:
        dep = cost_deployment(preset, gpus, args.ep, args.gpus_per_node)
    model = cost_model(preset, gpu, gpus, args.profile, args.cost_model, deployment=dep)
    # with a profile, time is the profile's device's (a CPU profile: the CPU), not --gpu's
    device = args.profile.gpu_preset() if args.profile is not None else gpu
    roof = cost_model(preset, device, gpus, kind="roofline", deployment=dep)
    steps = []
    for work in args.step:
        c = model.step(work)
        r = roof.step(work)
        steps.append({"step": format_step(work), "requests": len(work),
                      "new_tokens": sum(n for n, _ in work), **c.to_json(),
                      "roofline": None if model.kind == "roofline" else r.to_json()})
    out = {"preset": preset.name, "weight_dtype": preset.gemm_dtype, "gpu": gpu.name,
           "device": device.name, "num_gpus": gpus,
           "deployment": dep.to_json(), "cost_model": model.kind,
           "source": model.source, "time_s": sum(s["time_s"] for s in steps), "steps": steps}
    if args.json:
        print_json(out)
        return 0
    where = f"{dep.gpus} x {device.name}" if dep.gpus == 1 else f"{dep.name}, {dep.gpus} x {device.name}"
    if device.name != gpu.name:
        where += f" (the profile's device; --gpu {gpu.name} only sizes memory)"
    weights = "" if preset.gemm_dtype == "bf16" else f" ({preset.gemm_dtype} weights)"
    print(f"{preset.name}{weights} on {where}; {model.source}")
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
        if s["comm_s"]:
            print(f"  communication {_ms(s['comm_s'])} (included; {comm_words(model)})")
        print(f"  {s['flops'] / 1e12:.2f} TFLOP, {s['bytes'] / 1e9:.2f} GB moved")
        if s["roofline"] is not None:
            r = s["roofline"]
            print(f"  roofline: {_ms(r['time_s'])} (compute {_ms(r['compute_s'])}, memory "
                  f"{_ms(r['memory_s'])}, bound by {r['bound']})")
    if len(steps) > 1:
        print(f"total: {_ms(out['time_s'])}")
    return 0


def cost_deployment(preset, tp: int, ep: int, gpus_per_node: int) -> Deployment:
    """The deployment ``cost`` prices: one TP-``tp`` engine; ``ep``: equal to ``tp``, experts
    sharded inside it; a multiple of it, data-parallel attention over ``ep`` GPUs (ValueError
    for anything else, or ``ep`` on a dense preset)."""
    if ep > 1 and expert_params(preset) == 0:
        raise ValueError(f"--ep {ep}: {preset.name} has no routed experts; drop --ep")
    if ep <= 1:
        return Deployment(tp, 1, 1, gpus_per_node, reason="as given")
    if ep == tp:
        return Deployment(tp, 1, ep, gpus_per_node, reason="as given")
    if ep % tp:
        raise ValueError(f"--ep {ep} must equal --tp {tp} (experts sharded in the TP group) or be a "
                         f"multiple of it (data-parallel attention over --ep GPUs)")
    return Deployment(tp, ep // tp, ep, gpus_per_node, True, reason="as given")


def comm_words(model) -> str:
    """What the communication term counts, in words."""
    c = getattr(model, "counts", None)
    dep = getattr(model, "deployment", None)
    if c is None or dep is None:
        return "none"
    from hybridkv.cost.comm import link_for
    parts = []
    if c.all_reduces:
        parts.append(f"{c.all_reduces} all-reduces + 1 logits all-gather over "
                     f"{link_for(model.gpu, dep.tp, dep.gpus_per_node).name}")
    if c.a2a_layers:
        parts.append(f"{c.a2a_layers} MoE layers' dispatch + combine all-to-all over "
                     f"{link_for(model.gpu, dep.ep, dep.gpus_per_node).name}")
    return "; ".join(parts) + ", no overlap"


COMMANDS.register("cost", Command(
    help="what one engine step costs (time, compute / memory / attention split)",
    add_arguments=add_arguments, run=run, description=__doc__))

__all__ = ["add_arguments", "comm_words", "cost_deployment", "run"]
