"""N simulated instances behind a router.

* :mod:`~hybridkv.sim.cluster.loop` — one event loop over N simulators
  (:class:`ClusterSimulator`, :class:`ClusterJob`), the instances' KV events feeding the
  router's index.
* :mod:`~hybridkv.sim.cluster.routing` — the router contract, the :data:`ROUTERS` registry and
  the routers.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
