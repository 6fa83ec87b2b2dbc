"""Trace-driven simulator: workloads, model/GPU presets, cost model and offline-optimal bounds.

The simulator itself is exported here (``from hybridkv.sim import Simulator, SimConfig,
items_from_trace``); the submodules:

* :mod:`hybridkv.sim.simulator` — :class:`Simulator`, :class:`SimConfig`, :class:`SimResult`.
* :mod:`hybridkv.sim.workitems` — the work items (:func:`items_from_trace` for in-memory
  requests, :func:`items_from_mooncake` for a Mooncake file) and the served workload.
* :mod:`hybridkv.sim.traces` — real traces (bundled Mooncake copies, token JSONL);
  :mod:`hybridkv.sim.workloads` — seeded generators.
* :mod:`hybridkv.sim.optimal` — block-level LRU and Belady; the simulator's offline optimum.
* :mod:`hybridkv.sim.presets` — model presets (KV-cache groups, layer shapes in
  :mod:`hybridkv.sim.shapes`) and GPU presets.
* :mod:`hybridkv.sim.calibrated` — the calibrated per-step time (the default);
  :mod:`hybridkv.sim.costmodel` — the roofline; :mod:`hybridkv.sim.profile` — profile files,
  the shipped H100 calibration and :func:`~hybridkv.sim.profile.cost_model`;
  :mod:`hybridkv.sim.calibration_fit` — the fit; :mod:`hybridkv.sim.grid` — the step syntax;
  :mod:`hybridkv.sim.transfer` — host <-> device copy times.
* :mod:`hybridkv.sim.cluster`, :mod:`hybridkv.sim.routing` — N instances behind a router.
"""

from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.workitems import WorkItem, items_from_mooncake, items_from_trace

__all__ = ["SimConfig", "SimResult", "Simulator", "WorkItem", "items_from_mooncake", "items_from_trace"]
