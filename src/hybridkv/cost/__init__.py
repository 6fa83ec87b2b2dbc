"""The step-time model: what one engine step costs on a GPU, and the presets it reads.

Its front door is :func:`cost_model` (the calibrated model by default, the roofline on
request) with the presets it is built from (:func:`get_preset`, :func:`get_gpu`); it imports
only :mod:`hybridkv.core`, and the simulator, the cluster, the tiers, the CLI and the profiler
(:mod:`hybridkv.profiling`, which measures what :mod:`hybridkv.cost.calibration_fit` fits) use it.

* :mod:`hybridkv.cost.presets` — model presets (KV-cache groups; layer shapes in
  :mod:`hybridkv.cost.shapes`) and GPU presets; :mod:`hybridkv.cost.hardware` — the KV memory
  a GPU leaves (vLLM's rule).
* :mod:`hybridkv.cost.calibrated` — the calibrated per-step time (the default);
  :mod:`hybridkv.cost.costmodel` — the contract and the roofline.
* :mod:`hybridkv.cost.profile` — profile files, the shipped H100 calibration and
  :func:`cost_model`; :mod:`hybridkv.cost.calibration_fit` — the fit and its held-out checks;
  :mod:`hybridkv.cost.grid` — the step syntax; :mod:`hybridkv.cost.transfer` — host <-> device
  copy times.
"""

from hybridkv.cost.costmodel import CostModel, StepCost
from hybridkv.cost.presets import GpuPreset, ModelPreset, get_gpu, get_preset
from hybridkv.cost.profile import cost_model

__all__ = ["CostModel", "GpuPreset", "ModelPreset", "StepCost", "cost_model", "get_gpu", "get_preset"]
