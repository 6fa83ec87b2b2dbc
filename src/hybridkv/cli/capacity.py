"""The hardware and cache-size options of ``simulate`` and ``sweep``, checked against each other.

``--gpu``, ``--gpus`` and ``--gpu-memory-fraction`` describe the deployment; by default the KV
cache is what vLLM would leave of it (:mod:`hybridkv.cost.hardware`: the fraction of the GPUs'
memory, less the weights and an activation reserve). ``--cache-tokens`` or ``--num-blocks``
(one of the two) give the pool size instead; it must fit that memory. Without ``--gpus`` the
run takes the fewest GPUs, a power of two, that hold the weights and the largest size asked
for. Weights that do not fit, or a size the GPUs cannot hold, are refused before anything runs.
"""

from __future__ import annotations

import argparse
import math

from hybridkv.cli.options import fraction, int_in, positive_count
from hybridkv.cost.hardware import (DEFAULT_GPU_MEMORY_FRACTION, MAX_GPUS, KVBudget, fewest_gpus,
                                   kv_budget)
from hybridkv.cost.presets import GPU_PRESETS, ModelPreset, get_gpu

DEFAULT_GPU = "h100"


def add_hardware_options(p: argparse.ArgumentParser) -> None:
    """``--gpu``, ``--gpus``, ``--gpu-memory-fraction`` (``simulate`` and ``sweep``)."""
    g = p.add_argument_group("hardware (the KV cache is what it leaves, as in vLLM)")
    g.add_argument("--gpu", default=DEFAULT_GPU,
                   help=f"GPU preset: {', '.join(GPU_PRESETS)} (default {DEFAULT_GPU})")
    g.add_argument("--gpus", type=int_in(1, MAX_GPUS),
                   help="GPUs serving one instance, ideal tensor parallel (default: the fewest, a "
                        "power of two, that hold the weights and any --cache-tokens / --num-blocks)")
    g.add_argument("--gpu-memory-fraction", type=fraction(lo_open=True),
                   default=DEFAULT_GPU_MEMORY_FRACTION,
                   help="share of GPU memory the engine may use, vLLM's gpu_memory_utilization "
                        f"(default {DEFAULT_GPU_MEMORY_FRACTION:g}); the KV cache is this share "
                        "less the weights and a 6 GiB-per-GPU activation reserve")


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
    """Check the hardware of the options against ``preset`` and the sizes asked for
    (``(option text, bytes or None)``), set ``args.gpus`` when it was not given, and return the
    budget. ``ValueError`` (one line, naming the GPUs that would do) when the weights do not fit
    or a size is more than the GPUs hold."""
    gpu = get_gpu(args.gpu)
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
        budget = kv_budget(preset, get_gpu(args.gpu), args.gpus, args.gpu_memory_fraction)
        block_bytes = preset.kv_config(num_blocks=2).block_bytes
        if budget.kv_bytes < 2 * block_bytes:
            raise ValueError(f"{args.gpus} x {args.gpu} leave {max(0, budget.kv_bytes):,} bytes of KV "
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
    n = fewest_gpus(preset, get_gpu(args.gpu), args.gpu_memory_fraction, kv_bytes)
    if n is None:
        return f"no count of {args.gpu} up to {MAX_GPUS} holds it at --gpu-memory-fraction {args.gpu_memory_fraction:g}"
    return f"give --gpus {n} (the fewest {args.gpu} that hold it)"


def larger_cache(args: argparse.Namespace, preset: ModelPreset):
    """``f(tokens)`` -> the options that ask for a cache of ``tokens`` tokens of ``preset`` on
    this hardware (``--cache-tokens X``, plus the ``--gpus`` that hold it when more are needed)."""
    from hybridkv.sim.traffic.workload_fit import round_up

    def options(tokens: int) -> str:
        text = f"--cache-tokens {round_up(tokens)}"
        need = tokens * _token_bytes(preset)
        if kv_budget(preset, get_gpu(args.gpu), args.gpus, args.gpu_memory_fraction).kv_bytes >= need:
            return text
        n = fewest_gpus(preset, get_gpu(args.gpu), args.gpu_memory_fraction, need)
        return f"{text} --gpus {n}" if n else f"{text} (more than {MAX_GPUS} x {args.gpu})"
    return options


def is_default_size(args: argparse.Namespace) -> bool:
    """True when the hardware sets the size (no ``--cache-tokens`` / ``--num-blocks``)."""
    return getattr(args, "cache_tokens", None) is None and getattr(args, "num_blocks", None) is None


__all__ = ["add_hardware_options", "add_size_options", "capacity_blocks", "is_default_size",
           "larger_cache", "more_gpus", "plan_from_options", "plan_gpus", "requested_bytes", "size_option"]
