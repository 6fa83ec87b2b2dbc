"""N simulated instances behind a router.

* :mod:`~hybridkv.sim.cluster.loop` — one event loop over N simulators
  (:class:`ClusterSimulator`, :class:`ClusterJob`), the instances' KV events feeding the
  router's index.
* :mod:`~hybridkv.sim.cluster.routing` — the router contract, the :data:`ROUTERS` registry and
  the routers.
"""

from __future__ import annotations

from hybridkv.sim.lazy import lazy_exports

#: name -> the submodule that defines it; loaded on first use (the submodules import the
#: simulator, which imports some of them: an eager import here would be a circle)
_EXPORTS = {'OfferedLoad': 'loop',
            'offered_load': 'loop',
            'ClusterResult': 'loop',
            'combine': 'loop',
            'ClusterSimulator': 'loop',
            'ClusterJob': 'loop',
            'CLUSTER_HASH_SEED': 'loop',
            'PEAK_WINDOW_S': 'loop'}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
