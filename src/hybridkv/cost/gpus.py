"""GPU presets for the cost models, from the vendors' datasheets, and the weight dtypes a model
can run in. Every number cites its source beside it. :mod:`hybridkv.cost.presets` re-exports
these names.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU_PRESETS", "WEIGHT_DTYPES", "GpuPreset", "get_gpu"]

WEIGHT_DTYPES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}
"""Weight dtypes a preset can be run in (:meth:`~hybridkv.cost.presets.ModelPreset.with_weight_dtype`), with their
bytes per parameter. ``fp8`` is W8A8 as vLLM and SGLang run FP8 checkpoints on Hopper and
Blackwell: weights and activations in FP8, the GEMMs on the FP8 tensor cores."""


@dataclass(frozen=True, slots=True)
class GpuPreset:
    """One accelerator for the roofline cost model.

    Attributes:
        name: preset name.
        memory_bytes: HBM capacity (the H100's as CUDA reports it; the others' datasheet).
        mem_bw: peak HBM bandwidth in bytes/s.
        flops: peak dense BF16 tensor FLOP/s (no sparsity).
        source: datasheet the numbers come from.
        fp8_flops: peak dense FP8 tensor FLOP/s (no sparsity), or None where the preset does
            not know it (a profile's own device).
    """

    name: str
    memory_bytes: int
    mem_bw: float
    flops: float
    source: str = ""
    fp8_flops: float | None = None

    def gemm_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s of a GEMM in ``dtype`` (a key of :data:`WEIGHT_DTYPES`)."""
        if dtype == "bf16":
            return self.flops
        if dtype == "fp8":
            if self.fp8_flops is None:
                raise ValueError(f"GPU {self.name!r} has no FP8 peak; use a GPU preset "
                                 f"({', '.join(GPU_PRESETS)}) or weight dtype bf16")
            return self.fp8_flops
        raise ValueError(f"unknown weight dtype {dtype!r}; valid: {', '.join(WEIGHT_DTYPES)}")


GPU_PRESETS: dict[str, GpuPreset] = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5: 80 GB HBM3, 3.35 TB/s,
    # BF16 1,979 TFLOPS *with sparsity* -> 989 TFLOPS dense; FP8 3,958 TFLOPS with sparsity ->
    # 1,979 dense. Memory: what CUDA reports and vLLM's
    # gpu_memory_utilization multiplies, 79.18 GiB (vLLM start-up logs on an H100 80GB HBM3,
    # llm-d-benchmark config_explorer/empirical-vllm-memory-results.md), not the datasheet's 80 GB.
    "h100": GpuPreset("h100", int(79.18 * 2**30), 3.35e12, 989e12,
                      "NVIDIA H100 datasheet (SXM); memory as CUDA reports it (vLLM logs)", 1979e12),
    # NVIDIA H800 SXM5 (the H100 for China, same GH100 die): the H100 SXM's 80 GB HBM3 at
    # 3.35 TB/s and its BF16/FP8 tensor peaks; NVLink cut from 900 to 400 GB/s and FP64 cut
    # (NVIDIA's H800 specification as quoted in philisun.com "NVIDIA H800 vs H100: a technical
    # deep dive"; DeepEP docs/legacy.md measures "~160 GB/s" NVLink on H800). Its collectives:
    # hybridkv.cost.collectives ("nvlink-h800"). Memory as CUDA reports the H100's.
    "h800": GpuPreset("h800", int(79.18 * 2**30), 3.35e12, 989e12,
                      "NVIDIA H800 SXM5 (H100 SXM compute and HBM, NVLink 400 GB/s)", 1979e12),
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, same compute as H100 (989 TFLOPS
    # dense BF16, 1,979 dense FP8).
    "h200": GpuPreset("h200", 141 * 10**9, 4.8e12, 989e12, "NVIDIA H200 datasheet (SXM)", 1979e12),
    # NVIDIA Blackwell B200 (GTC 2024 announcement / DGX B200): 192 GB HBM3e, 8 TB/s,
    # FP16/BF16 4.5 PFLOPS with sparsity -> 2.25 PFLOPS dense; FP8 9 PFLOPS with sparsity ->
    # 4.5 dense. (The HGX B200 datasheet lists 180 GB / 7.7 TB/s usable per GPU in some SKUs.)
    "b200": GpuPreset("b200", 192 * 10**9, 8.0e12, 2250e12, "NVIDIA B200 / DGX B200 specifications",
                      4500e12),
}
"""GPU presets by name."""


def get_gpu(name: str) -> GpuPreset:
    """The GPU preset ``name``; raises ValueError listing the valid names."""
    try:
        return GPU_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown GPU preset {name!r}; valid GPUs: {', '.join(GPU_PRESETS)}") from None
