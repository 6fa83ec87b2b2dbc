"""Trace-driven simulator: workloads, model/GPU presets, cost model and offline-optimal bounds.

The simulator itself is exported here (``from hybridkv.sim import Simulator, SimConfig,
items_from_trace``); the submodules:

* :mod:`hybridkv.sim.simulator` — :class:`Simulator`, :class:`SimConfig`, :class:`SimResult`.
* :mod:`hybridkv.sim.workitems` — the work items (:func:`items_from_trace` for in-memory
  requests, :func:`items_from_mooncake` for a Mooncake file) and the served workload.
* :mod:`hybridkv.sim.traces` — real traces (bundled Mooncake copies, token JSONL);
  :mod:`hybridkv.sim.workloads` — seeded generators.
* :mod:`hybridkv.sim.optimal` — block-level LRU and Belady; the simulator's offline optimum.
* :mod:`hybridkv.sim.presets` — model presets (KV-cache groups) and GPU presets.
* :mod:`hybridkv.sim.costmodel` — roofline per-step time.
* :mod:`hybridkv.sim.cluster`, :mod:`hybridkv.sim.routing` — N instances behind a router.
"""

from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.workitems import WorkItem, items_from_mooncake, items_from_trace

__all__ = ["SimConfig", "SimResult", "Simulator", "WorkItem", "items_from_mooncake", "items_from_trace"]
