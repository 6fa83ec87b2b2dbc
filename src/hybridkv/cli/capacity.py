"""The hardware and cache-size options of ``simulate`` and ``sweep``, checked against each other.

``--gpu``, ``--gpus``, ``--gpu-memory-fraction`` and ``--tp`` / ``--dp`` / ``--ep`` /
``--gpus-per-node`` describe the deployment (:func:`choose_deployment`: by default what serving
engines run, :func:`hybridkv.cost.deployment.default_deployment`); by default each instance's KV
cache is what vLLM would leave of its GPUs (:mod:`hybridkv.cost.hardware`: the fraction of the GPUs'
memory, less the weights and an activation reserve). ``--cache-tokens`` or ``--num-blocks``
(one of the two) give the pool size instead; it must fit that memory. Without ``--gpus`` the
run takes the fewest GPUs, a power of two, that hold the weights and the largest size asked
for. Weights that do not fit, or a size the GPUs cannot hold, are refused before anything runs.
"""

from __future__ import annotations

import argparse
import math

from hybridkv.cli.options import add_gpu_option, fraction, int_in, positive_count
from hybridkv.cost.deployment import (DEFAULT_GPUS_PER_NODE, Deployment, default_deployment,
                                     expert_params, instance_budget)
from hybridkv.cost.hardware import (DEFAULT_GPU_MEMORY_FRACTION, MAX_GPUS, KVBudget, fewest_gpus,
                                   kv_budget)
from hybridkv.cost.presets import WEIGHT_DTYPES, ModelPreset

def add_hardware_options(p: argparse.ArgumentParser) -> None:
    """``--gpu``, ``--gpus``, ``--gpu-memory-fraction`` (``simulate`` and ``sweep``)."""
    g = p.add_argument_group("hardware (the KV cache is what it leaves, as in vLLM)")
    add_gpu_option(g)
    add_weight_dtype_option(g)
    g.add_argument("--gpus", type=int_in(1, MAX_GPUS),
                   help="GPUs of the deployment (default: the fewest, a power of two, that hold the "
                        "weights and any --cache-tokens / --num-blocks); without --tp/--dp they run "
                        "what serving engines run: the smallest power-of-two TP in a node that holds "
                        "the weights and a useful cache, the rest as replicas behind --router "
                        "(DeepSeek-class MoE: DP attention + EP over all of them); with --instances "
                        "N: the GPUs of each instance")
    g.add_argument("--tp", type=int_in(1, MAX_GPUS),
                   help="tensor-parallel GPUs per instance (their all-reduces priced over NVLink, "
                        "over the inter-node link when wider than --gpus-per-node)")
    g.add_argument("--dp", type=int_in(1, MAX_GPUS),
                   help="data-parallel instances (replicas, each with its own cache, behind --router)")
    g.add_argument("--ep", type=int_in(1, MAX_GPUS),
                   help="expert-parallel GPUs of a MoE preset: --tp (experts sharded inside each "
                        "instance) or --tp x --dp (data-parallel attention); priced with the "
                        "all-to-all")
    g.add_argument("--gpus-per-node", type=int_in(1, MAX_GPUS), default=DEFAULT_GPUS_PER_NODE,
                   help=f"GPUs one node joins with NVLink (default {DEFAULT_GPUS_PER_NODE})")
    g.add_argument("--gpu-memory-fraction", type=fraction(lo_open=True),
                   default=DEFAULT_GPU_MEMORY_FRACTION,
                   help="share of GPU memory the engine may use, vLLM's gpu_memory_utilization "
                        f"(default {DEFAULT_GPU_MEMORY_FRACTION:g}); the KV cache is this share "
                        "less the weights and a 6 GiB-per-GPU activation reserve")


def add_weight_dtype_option(g: argparse._ActionsContainer) -> None:
    """``--weight-dtype`` (``simulate``, ``sweep``, ``cost``):
    :meth:`~hybridkv.cost.presets.ModelPreset.with_weight_dtype`."""
    g.add_argument("--weight-dtype", choices=list(WEIGHT_DTYPES),
                   help="run the preset's weights in this dtype (fp8: W8A8 as engines run FP8 "
                        "checkpoints: 1 byte per weight, GEMMs at the GPU's FP8 peak; default: the "
                        "preset's)")


def add_size_options(p: argparse.ArgumentParser, what: str = "the KV cache") -> None:
    """``--cache-tokens`` or ``--num-blocks``: ``what`` is set explicitly (checked against the
    hardware)."""
    g = p.add_argument_group("cache size (one of them, instead of what the GPUs leave)")
    g = g.add_mutually_exclusive_group()
    g.add_argument("--cache-tokens", type=positive_count,
                   help=f"size of {what} in tokens of the preset, e.g. 3M or 1e9 (default: what "
                        "the GPUs leave)")
    g.add_argument("--num-blocks", type=positive_count,
                   help=f"size of {what} in blocks, >= 2 with the null block (default: what the "
                        "GPUs leave)")


def _token_bytes(preset: ModelPreset) -> int:
    return preset.kv_bytes_per_token()["total"]


def requested_bytes(args: argparse.Namespace, preset: ModelPreset,
                    cache_tokens: int | None = None) -> int | None:
    """KV bytes of an explicit size (``cache_tokens``, else ``--cache-tokens`` / ``--num-blocks``);
    None when the hardware decides."""
    if cache_tokens is None:
        cache_tokens = getattr(args, "cache_tokens", None)
        blocks = getattr(args, "num_blocks", None)
        if cache_tokens is None and blocks is not None:
            return blocks * preset.kv_config(num_blocks=2).block_bytes
    return None if cache_tokens is None else cache_tokens * _token_bytes(preset)


def plan_gpus(args: argparse.Namespace, preset: ModelPreset,
              sizes: list[tuple[str, int | None]]) -> KVBudget:
    """Choose the deployment of the options (``args.deployment``; ``args.gpus`` becomes one
    instance's GPUs and ``args.instances`` its instance count) and return one instance's KV
    budget (:func:`choose_deployment`). ``ValueError`` (one line) when nothing fits."""
    dep = getattr(args, "deployment", None)
    if dep is not None:                   # planned already (a second call)
        return instance_budget(preset, args.gpu, dep, args.gpu_memory_fraction)
    return choose_deployment(args, preset, sizes)


def choose_deployment(args: argparse.Namespace, preset: ModelPreset,
                      sizes: list[tuple[str, int | None]]) -> KVBudget:
    """The deployment rules:

    * ``--tp`` / ``--dp`` / ``--ep``: as given (``--gpus``, when given too, must be their product);
    * ``--instances N`` (or ``--router``), ``--sequential``, an explicit cache size, KV tiers,
      hints, or a sweep:
      each instance one TP engine over ``--gpus`` (default the fewest that hold the weights and
      the size);
    * otherwise: :func:`~hybridkv.cost.deployment.default_deployment` over ``--gpus`` (default
      the fewest that hold the weights).
    """
    tp, dp, ep = getattr(args, "tp", None), getattr(args, "dp", None), getattr(args, "ep", None)
    per_node = getattr(args, "gpus_per_node", None) or DEFAULT_GPUS_PER_NODE
    gpu = args.gpu
    frac = args.gpu_memory_fraction
    instances = getattr(args, "instances", None) or 1
    if tp is not None or dp is not None or ep is not None:
        if instances != 1:
            raise ValueError("--instances N is --dp N; give one of them")
        if ep is not None and ep > 1 and expert_params(preset) == 0:
            raise ValueError(f"--ep {ep}: {preset.name} has no routed experts; drop --ep")
        total = args.gpus
        if tp is None:
            d = dp or 1
            if total is not None and total % d:
                raise ValueError(f"--gpus {total} is not a multiple of --dp {d}")
            tp = total // d if total is not None else None
        if dp is None:
            dp = total // tp if total is not None and tp else 1
        if tp is None:
            tp = fewest_gpus(preset, gpu, frac) or 1
        if total is not None and total != tp * dp:
            raise ValueError(f"--gpus {total} must be --tp {tp} x --dp {dp} = {tp * dp}")
        ep = ep or 1
        single = _single_instance_options(args)
        if dp > 1 and single:
            raise ValueError(f"{single} simulate one instance; drop --dp {dp} or {single}")
        dep = Deployment(tp, dp, ep, per_node, ep > tp, "as given")
        budget = instance_budget(preset, gpu, dep, frac)
        if not budget.fits:
            raise ValueError(f"{preset.name} does not fit {dep.name}: each instance: {budget.describe()}; "
                             "use a larger --tp or --gpu")
        _check_sizes(sizes, budget, dep)
        return _set(args, dep, budget)
    legacy = (instances != 1 or getattr(args, "router", None) is not None or getattr(args, "sequential", False)
              or _single_instance_options(args) is not None
              or any(b is not None for _, b in sizes) or getattr(args, "command", None) == "sweep")
    if legacy:
        budget = _plan_engine(args, preset, sizes)
        why = (f"--instances {instances}, each one TP engine over --gpus" if instances != 1
               else "one TP engine over the GPUs (a cache size, --sequential, --router, tiers, "
                    "hints or a sweep)")
        dep = Deployment(args.gpus, instances, 1, per_node, reason=why)
        return _set(args, dep, budget)
    _plan_engine(args, preset, sizes)    # the fewest GPUs that hold the weights, or --gpus checked
    dep = default_deployment(preset, gpu, args.gpus, frac, per_node)
    return _set(args, dep, instance_budget(preset, gpu, dep, frac))


def _single_instance_options(args: argparse.Namespace) -> str | None:
    """The options given that simulate one instance only (KV tiers, hints), or None."""
    from hybridkv.cli.tier_options import has_tiers
    if has_tiers(args):
        return "KV tiers"
    if getattr(args, "hints", None) is not None or getattr(args, "trace_hints", False):
        return "hints"
    return None


def _check_sizes(sizes, budget: KVBudget, dep: Deployment) -> None:
    asked = [(text, b) for text, b in sizes if b is not None]
    for text, need in asked:
        if need > budget.kv_bytes:
            raise ValueError(f"{text} needs {need / 1e9:,.1f} GB of KV memory but each instance of "
                             f"{dep.name} leaves {max(0, budget.kv_bytes) / 1e9:,.1f} GB "
                             f"({budget.describe()}); give a smaller size or a larger --tp")


def _set(args: argparse.Namespace, dep: Deployment, budget: KVBudget) -> KVBudget:
    args.deployment = dep
    args.gpus = dep.tp
    if dep.dp > 1:
        args.instances = dep.dp
    return budget


def _plan_engine(args: argparse.Namespace, preset: ModelPreset,
                 sizes: list[tuple[str, int | None]]) -> KVBudget:
    """Check the hardware of the options against ``preset`` and the sizes asked for
    (``(option text, bytes or None)``), set ``args.gpus`` when it was not given, and return the
    budget. ``ValueError`` (one line, naming the GPUs that would do) when the weights do not fit
    or a size is more than the GPUs hold."""
    gpu = args.gpu
    frac = args.gpu_memory_fraction
    asked = [(text, b) for text, b in sizes if b is not None]
    largest = max(asked, key=lambda s: s[1], default=None)
    need = largest[1] if largest else 1
    if args.gpus is None:
        n = fewest_gpus(preset, gpu, frac, need)
        if n is None:
            top = kv_budget(preset, gpu, MAX_GPUS, frac)
            what = (f"{largest[0]} needs {need / 1e9:,.1f} GB of KV memory" if largest
                    else f"{preset.name} needs {preset.weight_bytes / 1e9:,.1f} GB of weights")
            raise ValueError(f"{what}: even {MAX_GPUS} x {gpu.name} leave {max(0, top.kv_bytes) / 1e9:,.1f} GB "
                             f"({top.describe()}); give a smaller size, a larger --gpu or "
                             "--gpu-memory-fraction")
        args.gpus = n
        return kv_budget(preset, gpu, n, frac)
    budget = kv_budget(preset, gpu, args.gpus, frac)
    if not budget.fits:
        n = fewest_gpus(preset, gpu, frac)
        fix = f"use --gpus {n} (the fewest that hold it)" if n else "use a larger --gpu"
        share = (preset.weight_bytes + budget.reserve_bytes) / (args.gpus * gpu.memory_bytes)
        if share < 0.995:        # a larger share of these GPUs would do
            fix += f" or --gpu-memory-fraction {math.ceil(share * 100 + 0.5) / 100:g} or more"
        raise ValueError(f"{preset.name} does not fit {args.gpus} x {gpu.name}: {budget.describe()}; "
                         f"{fix}")
    if largest and need > budget.kv_bytes:
        n = fewest_gpus(preset, gpu, frac, need)
        fix = f"use --gpus {n} or a smaller size" if n else "give a smaller size"
        raise ValueError(f"{largest[0]} needs {need / 1e9:,.1f} GB of KV memory but --gpus {args.gpus} "
                         f"leave {budget.kv_bytes / 1e9:,.1f} GB ({budget.tokens():,} tokens: "
                         f"{budget.describe()}); {fix}")
    return budget


def size_option(args: argparse.Namespace) -> str | None:
    """The explicit size as typed (``--cache-tokens 3M`` as ``--cache-tokens 3,000,000``)."""
    if getattr(args, "cache_tokens", None) is not None:
        return f"--cache-tokens {args.cache_tokens:,}"
    if getattr(args, "num_blocks", None) is not None:
        return f"--num-blocks {args.num_blocks:,}"
    return None


def plan_from_options(args: argparse.Namespace, preset: ModelPreset) -> KVBudget:
    """:func:`plan_gpus` for the size the options give (``--cache-tokens`` / ``--num-blocks``)."""
    return plan_gpus(args, preset, [(size_option(args) or "", requested_bytes(args, preset))])


def capacity_blocks(args: argparse.Namespace, preset: ModelPreset, cache_tokens: int | None = None) -> int:
    """Pool size in blocks (the null block included) for ``preset``: ``cache_tokens``, else
    ``--cache-tokens`` / ``--num-blocks``, else what the GPUs leave (``args.gpus`` set by
    :func:`plan_gpus`)."""
    if cache_tokens is None and getattr(args, "cache_tokens", None) is None:
        if getattr(args, "num_blocks", None) is not None:
            if args.num_blocks < 2:
                raise ValueError(f"--num-blocks must be >= 2, got {args.num_blocks}")
            return args.num_blocks
        dep = getattr(args, "deployment", None)
        budget = (instance_budget(preset, args.gpu, dep, args.gpu_memory_fraction) if dep is not None
                  else kv_budget(preset, args.gpu, args.gpus, args.gpu_memory_fraction))
        block_bytes = preset.kv_config(num_blocks=2).block_bytes
        if budget.kv_bytes < 2 * block_bytes:
            raise ValueError(f"{args.gpus} x {args.gpu.name} leave {max(0, budget.kv_bytes):,} bytes of KV "
                             f"memory, less than two blocks of {preset.name} ({budget.describe()}); "
                             "raise --gpus or --gpu-memory-fraction")
        return preset.kv_config(memory_bytes=budget.kv_bytes).num_blocks
    if cache_tokens is None:
        cache_tokens = args.cache_tokens
    if cache_tokens < 1:
        raise ValueError(f"cache size must be >= 1 token, got {cache_tokens}")
    per_token = _token_bytes(preset)
    block_bytes = preset.kv_config(num_blocks=2).block_bytes
    if cache_tokens * per_token < 2 * block_bytes:
        raise ValueError(f"a cache of {cache_tokens:,} tokens holds no block of {preset.name} "
                         f"(give at least {-(-2 * block_bytes // per_token):,} tokens)")
    return preset.kv_config(memory_bytes=cache_tokens * per_token).num_blocks + 1  # + the null block


def more_gpus(args: argparse.Namespace, preset: ModelPreset, kv_bytes: int) -> str:
    """How to get ``kv_bytes`` of KV memory from the hardware: the ``--gpus`` that leave it."""
    n = fewest_gpus(preset, args.gpu, args.gpu_memory_fraction, kv_bytes)
    if n is None:
        return f"no count of {args.gpu.name} up to {MAX_GPUS} holds it at --gpu-memory-fraction {args.gpu_memory_fraction:g}"
    return f"give --gpus {n} (the fewest {args.gpu.name} that hold it)"


def larger_cache(args: argparse.Namespace, preset: ModelPreset):
    """``f(tokens)`` -> the options that ask for a cache of ``tokens`` tokens of ``preset`` on
    this hardware (``--cache-tokens X``, plus the ``--gpus`` that hold it when more are needed)."""
    from hybridkv.sim.traffic.workload_fit import round_up

    def options(tokens: int) -> str:
        text = f"--cache-tokens {round_up(tokens)}"
        need = tokens * _token_bytes(preset)
        dep = getattr(args, "deployment", None)
        if dep is not None and (dep.dp > 1 or dep.ep > 1):        # keep the deployment: name it
            flags = f" --tp {dep.tp} --dp {dep.dp}" + (f" --ep {dep.ep}" if dep.ep > 1 else "")
            if instance_budget(preset, args.gpu, dep, args.gpu_memory_fraction).kv_bytes >= need:
                return text + flags
            return f"{text}{flags} (more than each instance of {dep.name} holds: a larger --gpu)"
        if kv_budget(preset, args.gpu, args.gpus, args.gpu_memory_fraction).kv_bytes >= need:
            return text
        n = fewest_gpus(preset, args.gpu, args.gpu_memory_fraction, need)
        return f"{text} --gpus {n}" if n else f"{text} (more than {MAX_GPUS} x {args.gpu.name})"
    return options


def is_default_size(args: argparse.Namespace) -> bool:
    """True when the hardware sets the size (no ``--cache-tokens`` / ``--num-blocks``)."""
    return getattr(args, "cache_tokens", None) is None and getattr(args, "num_blocks", None) is None


__all__ = ["add_hardware_options", "add_size_options", "add_weight_dtype_option", "capacity_blocks", "choose_deployment", "is_default_size",
           "larger_cache", "more_gpus", "plan_from_options", "plan_gpus", "requested_bytes", "size_option"]
