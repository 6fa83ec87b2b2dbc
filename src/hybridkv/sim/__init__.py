"""Trace-driven simulator: a scheduler and the KV-cache manager over a workload, with the
step-time model (:mod:`hybridkv.cost`) for time, and what the run is measured against.

The simulator itself is exported here (``from hybridkv.sim import Simulator, SimConfig,
items_from_trace``). Its rooms, each behind its package's ``__init__``:

* :mod:`hybridkv.sim.simulator` — :class:`Simulator`, :class:`SimConfig`, :class:`SimResult`.
* :mod:`hybridkv.sim.traffic` — traces, generated workloads, work items, synthesized hints.
* :mod:`hybridkv.sim.bounds` — the offline optimum, the hybrid bound, the hazard reference,
  what-ifs.
* :mod:`hybridkv.sim.tiers` — KV tiers below the GPU: configuration, runtime, report.
* :mod:`hybridkv.sim.cluster` — N instances behind a router (:mod:`hybridkv.sim.cluster.routing`).
* :mod:`hybridkv.sim.report` — the summary, the next steps, the hint table.
* :mod:`hybridkv.sim.executors` (where a sweep runs), :mod:`hybridkv.sim.interrupt` (Ctrl-C),
  :mod:`hybridkv.sim.failures` (a helper process died), :mod:`hybridkv.sim.state_sweep`
  (checkpoint memory of state presets), :mod:`hybridkv.sim.policy_cost` (an eviction policy's
  cost per pool operation).
"""

from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.traffic.workitems import WorkItem, items_from_mooncake, items_from_trace

__all__ = ["SimConfig", "SimResult", "Simulator", "WorkItem", "items_from_mooncake", "items_from_trace"]
