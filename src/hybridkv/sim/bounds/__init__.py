"""What a run is measured against: offline and reference caches over the served requests.

* :mod:`~hybridkv.sim.bounds.optimal` — block-level LRU and Belady, the offline optimum
  (:class:`OptimumJob`, in a forked child for large runs) and the gap report;
  :mod:`~hybridkv.sim.bounds.optimum_memory` — what that child will need.
* :mod:`~hybridkv.sim.bounds.hybrid_bound` — the bound that knows windows and checkpoints.
* :mod:`~hybridkv.sim.bounds.hazard` — the non-anticipative hazard-rate reference.
* :mod:`~hybridkv.sim.bounds.whatif` — block-level what-ifs beside the optimum.
"""

from __future__ import annotations

import importlib

#: name -> the submodule that defines it; loaded on first use (the submodules import the
#: simulator, which imports some of them: an eager import here would be a circle)
_EXPORTS = {'OptimumJob': 'optimal',
            'GapReport': 'optimal',
            'OnlineHits': 'optimal',
            'belady_block_hit_rate': 'optimal',
            'lru_block_hit_rate': 'optimal',
            'infinite_block_hit_rate': 'optimal',
            'HazardBound': 'hazard',
            'WhatIf': 'whatif',
            'what_if': 'whatif'}


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
