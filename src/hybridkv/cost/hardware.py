"""How much KV cache a deployment holds: vLLM's rule, applied to the presets.

vLLM sizes its KV cache once, at start-up: of each GPU's memory it takes the share
``gpu_memory_utilization`` (default 0.9); from that it subtracts the weights, the peak
activation memory of a profiling forward pass over ``max_num_batched_tokens`` tokens, and the
memory outside PyTorch's allocator (NCCL buffers, CUDA graphs); the rest is the KV cache
(``Worker.determine_available_memory`` in ``vllm/v1/worker/gpu_worker.py``). Weights that do
not fit leave nothing, and vLLM refuses to start.

Here, for ``num_gpus`` GPUs of one preset (tensor parallelism: weights and cache are
split evenly)::

    kv_bytes = fraction * num_gpus * gpu.memory_bytes - preset.weight_bytes
               - num_gpus * RESERVE_BYTES_PER_GPU

:data:`RESERVE_BYTES_PER_GPU` stands for the profiled activation peak and the non-PyTorch
memory, which a simulator cannot profile. Its value, 6 GiB per GPU, is read from vLLM's own
start-up logs on one H100 (llm-d-benchmark, ``config_explorer/empirical-vllm-memory-results.md``):
for six models (Qwen3-0.6B to Llama-3.3-70B-FP8 at tensor parallel 2, max-model-len 16000,
default batching) peak activation was 4.76-7.38 GiB, non-torch memory 0.13-0.55 GiB and CUDA
graph memory -0.88-1.03 GiB, summing to 4.4-8.5 GiB per GPU (median 5.4 GiB). A deployment
that knows its own figure gives the cache directly (``--cache-tokens`` / ``--num-blocks``).

An H100's memory is what CUDA reports (79.18 GiB in the same logs), the total vLLM multiplies;
the other GPU presets carry their datasheet figure (:data:`~hybridkv.cost.presets.GPU_PRESETS`).
On Llama-3.1-8B and one H100 this gives 50.3 GiB of KV cache where vLLM logged 51.38 GiB
(``tests/sim/test_planner.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridkv.cost.presets import GpuPreset, ModelPreset

__all__ = ["DEFAULT_GPU_MEMORY_FRACTION", "MAX_GPUS", "RESERVE_BYTES_PER_GPU", "KVBudget",
           "fewest_gpus", "kv_budget"]

DEFAULT_GPU_MEMORY_FRACTION = 0.9
"""vLLM's default ``gpu_memory_utilization``."""
RESERVE_BYTES_PER_GPU = 6 * 2**30
"""Activation peak plus non-PyTorch memory per GPU (module docstring: its source)."""
MAX_GPUS = 1024
"""The largest GPU count a run may name (``--gpus``)."""


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The KV memory ``num_gpus`` GPUs leave for ``preset`` at ``fraction`` of their memory
    (``weights``: the weight bytes these GPUs hold, when not all of the preset's: an
    expert-parallel rank holds its share of the experts only)."""

    preset: ModelPreset
    gpu: GpuPreset
    num_gpus: int
    fraction: float
    weights: float | None = None

    @property
    def weight_bytes(self) -> float:
        """The weight bytes these GPUs hold."""
        return self.preset.weight_bytes if self.weights is None else self.weights

    @property
    def engine_bytes(self) -> float:
        """The engine's share of the GPUs' memory."""
        return self.fraction * self.num_gpus * self.gpu.memory_bytes

    @property
    def reserve_bytes(self) -> int:
        return self.num_gpus * RESERVE_BYTES_PER_GPU

    @property
    def kv_bytes(self) -> int:
        """What is left for the KV cache (<= 0: the weights and reserve do not fit)."""
        return int(self.engine_bytes - self.weight_bytes - self.reserve_bytes)

    @property
    def fits(self) -> bool:
        return self.kv_bytes > 0

    def tokens(self) -> int:
        """Tokens of the preset the KV memory holds (0 when nothing is left)."""
        return max(0, self.kv_bytes) // self.preset.kv_bytes_per_token()["total"]

    def describe(self) -> str:
        """``0.9 x 16 x h100 (1,152 GB) - weights 671.0 GB - reserve 103.1 GB = 378.0 GB``."""
        return (f"{self.fraction:g} x {self.num_gpus} x {self.gpu.name} "
                f"({self.engine_bytes / 1e9:,.1f} GB) - weights {self.weight_bytes / 1e9:,.1f} GB "
                f"- activation reserve {self.reserve_bytes / 1e9:,.1f} GB = {self.kv_bytes / 1e9:,.1f} GB")

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu.name, "num_gpus": self.num_gpus, "gpu_memory_fraction": self.fraction,
                "engine_bytes": self.engine_bytes, "weight_bytes": self.weight_bytes,
                "reserve_bytes": self.reserve_bytes, "kv_bytes": self.kv_bytes}


def kv_budget(preset: ModelPreset, gpu: GpuPreset, num_gpus: int,
              fraction: float = DEFAULT_GPU_MEMORY_FRACTION, weights: float | None = None) -> KVBudget:
    """The :class:`KVBudget` of ``num_gpus`` x ``gpu`` for ``preset`` (``weights``: the bytes
    they hold, default all of the preset's)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"gpu memory fraction must be in (0, 1], got {fraction!r}")
    return KVBudget(preset, gpu, num_gpus, fraction, weights)


def fewest_gpus(preset: ModelPreset, gpu: GpuPreset, fraction: float = DEFAULT_GPU_MEMORY_FRACTION,
                kv_bytes: int = 1) -> int | None:
    """The fewest GPUs, a power of two up to :data:`MAX_GPUS`, that leave at least ``kv_bytes``
    of KV memory (the default: any) after the weights and the reserve; None when none do."""
    n = 1
    while n <= MAX_GPUS:
        if kv_budget(preset, gpu, n, fraction).kv_bytes >= max(1, kv_bytes):
            return n
        n *= 2
    return None
