"""KV tiers below the GPU in the simulator (cpu, disk, remote).

* :mod:`~hybridkv.sim.tiers.config` — :class:`TierConfig`: sizes, links and their sources.
* :mod:`~hybridkv.sim.tiers.runtime` — the tiers as the scheduler's connector: transfer
  times and the overlap model (what a tier holds is :mod:`hybridkv.tiers`).
* :mod:`~hybridkv.sim.tiers.report` — the per-tier table, the CPU-size sweep's table and plot.
"""

from __future__ import annotations

from hybridkv.sim.lazy import lazy_exports

#: name -> the submodule that defines it; loaded on first use (the submodules import the
#: simulator, which imports some of them: an eager import here would be a circle)
_EXPORTS = {'link_with': 'config',
            'TierConfig': 'config',
            'TIER_NAMES': 'config',
            'ADDRESSABLE_BYTES': 'config',
            'DISK_LINK': 'config',
            'REMOTE_LINK': 'config',
            'FREE_LINK': 'config',
            'entry_bytes': 'runtime',
            'TierReport': 'runtime',
            'TierRuntime': 'runtime',
            'tier_summary': 'report',
            'tier_sweep_table': 'report',
            'plot_tier_sweep': 'report'}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
