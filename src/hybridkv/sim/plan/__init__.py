"""``hybridkv plan``: what to run for a latency SLO on a traffic window, and what it costs.

* :mod:`~hybridkv.sim.plan.slo` — the SLO (``ttft-p99=2s,itl-p99=100ms``) and a run's verdict.
* :mod:`~hybridkv.sim.plan.pricing` — GPU-hour prices (cited defaults) and $/M tokens.
* :mod:`~hybridkv.sim.plan.space` — deployments, options, candidates (one ``simulate`` command
  each), ordered by cost.
* :mod:`~hybridkv.sim.plan.bound` — a lower bound on TTFT from the prefill rate, to prune.
* :mod:`~hybridkv.sim.plan.search` — the cheapest candidate, goodput, what features save.
* :mod:`~hybridkv.sim.plan.planning` — one plan end to end; :mod:`~hybridkv.sim.plan.report`
  — its tables, JSON and plot.
"""

from __future__ import annotations

from hybridkv.sim.lazy import lazy_exports

#: name -> the submodule that defines it; loaded on first use
_EXPORTS = {'SLO': 'slo',
            'Target': 'slo',
            'GPU_HOUR_USD': 'pricing',
            'token_cost': 'pricing',
            'Candidate': 'space',
            'Deployment': 'space',
            'Options': 'space',
            'Space': 'space',
            'PrefillBound': 'bound',
            'Planner': 'search',
            'Measured': 'search',
            'Plan': 'report',
            'Window': 'report',
            'make_plan': 'planning'}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
