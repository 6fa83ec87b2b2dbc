"""What the simulator serves: traces, generated workloads and the work items made of them.

* :mod:`~hybridkv.sim.traffic.traces` — Mooncake and token-JSONL loaders, the bundled traces
  (``data/``: Mooncake FAST'25, Apache-2.0); :mod:`~hybridkv.sim.traffic.workloads` — seeded
  generators (chat, shared system prompt, agentic loop, replay), shaped by the records of
  :mod:`~hybridkv.sim.traffic.workload_shapes`.
* :mod:`~hybridkv.sim.traffic.workitems` — work items (:func:`items_from_trace`,
  :func:`items_from_mooncake`) and the served workload (the one ``max_model_len`` rule).
* :mod:`~hybridkv.sim.traffic.workload_fit` — the longest request fits the pool, checked first.
* :mod:`~hybridkv.sim.traffic.hint_synthesis` — what-if hints from a trace's future.
"""

from __future__ import annotations

from hybridkv.sim.lazy import lazy_exports

#: name -> the submodule that defines it; loaded on first use (the submodules import the
#: simulator, which imports some of them: an eager import here would be a circle)
_EXPORTS = {'WorkItem': 'workitems',
            'ServedItem': 'workitems',
            'items_from_trace': 'workitems',
            'items_from_mooncake': 'workitems',
            'served_workload': 'workitems',
            'BUNDLED_TRACES': 'bundled',
            'resolve_trace': 'bundled',
            'get_workload': 'workloads',
            'WORKLOADS': 'workloads',
            'ChatWorkload': 'workload_shapes',
            'AgentWorkload': 'workload_shapes',
            'SystemPromptWorkload': 'workload_shapes',
            'HintSpec': 'hint_synthesis',
            'synthesize_hints': 'hint_synthesis'}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
