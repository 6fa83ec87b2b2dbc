"""Storage tiers of the KV connector: byte payloads under ``bytes`` keys.

* :class:`KVStore` - the interface and its contracts (:mod:`.base`).
* :class:`LocalCPUStore` - embedded in-process LRU tier with a byte budget (:mod:`.local`).
* :class:`MooncakeStore` - Mooncake Store over TCP (:mod:`.mooncake`; needs the ``mooncake``
  extra); :class:`MooncakeCluster` starts a local master and storage nodes
  (:mod:`.mooncake_server`).
* :func:`loopback_netns` - run Mooncake isolated from every interface but loopback (:mod:`.netns`).

The Mooncake modules import ``mooncake`` lazily, so this package imports without it.
"""

from .base import MISS, HostBuffer, KVStore, StoreStats
from .local import LocalCPUStore
from .mooncake import MooncakeStore, MooncakeStoreConfig
from .mooncake_server import MooncakeCluster
from .netns import loopback_netns

__all__ = [
    "MISS",
    "HostBuffer",
    "KVStore",
    "LocalCPUStore",
    "MooncakeCluster",
    "MooncakeStore",
    "MooncakeStoreConfig",
    "StoreStats",
    "loopback_netns",
]
