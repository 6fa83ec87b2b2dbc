"""What a run prints: the summary table, the gap explanation and plots, the next steps.

* :mod:`~hybridkv.sim.report.summary` — the summary table, the gap explanation, plots.
* :mod:`~hybridkv.sim.report.advice` — the next steps (instances that keep up, cache size).
* :mod:`~hybridkv.sim.report.hints` — the hint table and plot.
"""

from __future__ import annotations

from hybridkv.sim.lazy import lazy_exports

#: name -> the submodule that defines it; loaded on first use (the submodules import the
#: simulator, which imports some of them: an eager import here would be a circle)
_EXPORTS = {'summary_table': 'summary',
            'explain_gap': 'summary',
            'format_next_steps': 'summary',
            'plot_run': 'summary',
            'plot_cluster': 'summary',
            'plot_sweep': 'summary',
            'plot_policies': 'summary',
            'instances_needed': 'advice',
            'next_steps': 'advice',
            'RETAINED_SHARE': 'advice',
            'TAIL_TTFT_S': 'advice',
            'hint_summary': 'hints',
            'hint_sweep_table': 'hints',
            'plot_hint_sweep': 'hints'}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
