"""What a run prints: the summary table, the gap explanation and plots, the next steps.

* :mod:`~hybridkv.sim.report.summary` — the summary table, the gap explanation, plots.
* :mod:`~hybridkv.sim.report.advice` — the next steps (instances that keep up, cache size).
* :mod:`~hybridkv.sim.report.hints` — the hint table and plot.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
