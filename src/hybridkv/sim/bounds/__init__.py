"""What a run is measured against: offline and reference caches over the served requests.

* :mod:`~hybridkv.sim.bounds.optimal` — block-level LRU and Belady (the per-key reference
  models) and the gap report; :mod:`~hybridkv.sim.bounds.key_stream`,
  :mod:`~hybridkv.sim.bounds.stream_caches`, :mod:`~hybridkv.sim.bounds.hazard_stream` and
  :mod:`~hybridkv.sim.bounds.bound_inputs` — the same bounds from one pass over the served keys.
* :mod:`~hybridkv.sim.bounds.optimum_job` — :class:`OptimumJob`: the bounds of one run, in a
  forked child beside the step loop for large runs; :mod:`~hybridkv.sim.bounds.optimum_memory`
  — what that child will need.
* :mod:`~hybridkv.sim.bounds.hybrid_bound` — the bound that knows windows and checkpoints.
* :mod:`~hybridkv.sim.bounds.hazard` — the non-anticipative hazard-rate reference.
* :mod:`~hybridkv.sim.bounds.whatif` — block-level what-ifs beside the optimum.
"""

from __future__ import annotations

from hybridkv.sim.lazy import lazy_exports

#: name -> the submodule that defines it; loaded on first use (the submodules import the
#: simulator, which imports some of them: an eager import here would be a circle)
_EXPORTS = {'OptimumJob': 'optimum_job',
            'GapReport': 'optimal',
            'OnlineHits': 'optimal',
            'belady_block_hit_rate': 'optimal',
            'lru_block_hit_rate': 'optimal',
            'infinite_block_hit_rate': 'optimal',
            'HazardBound': 'hazard',
            'WhatIf': 'whatif',
            'WHAT_IF': 'whatif'}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
