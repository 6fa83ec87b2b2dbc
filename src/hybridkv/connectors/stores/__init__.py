"""Storage tiers of the KV connector: byte payloads under ``bytes`` keys.

* :class:`KVStore` - the interface and its contracts (:mod:`.base`).
* :class:`LocalCPUStore` - embedded in-process LRU tier with a byte budget (:mod:`.local`).
* :class:`MooncakeStore` - Mooncake Store over TCP (:mod:`.mooncake`; needs the ``mooncake``
  extra).

Test infrastructure (a local Mooncake cluster, a loopback-only network namespace, a raw store
benchmark) lives in :mod:`hybridkv.testing`. The Mooncake module imports ``mooncake`` lazily,
so this package imports without it.
"""

from .base import MISS, WRONG_SIZE, HostBuffer, KVStore, StoreStats
from .local import LocalCPUStore
from .mooncake import MooncakeStore
from .mooncake_config import MooncakeStoreConfig

__all__ = [
    "MISS",
    "WRONG_SIZE",
    "HostBuffer",
    "KVStore",
    "LocalCPUStore",
    "MooncakeStore",
    "MooncakeStoreConfig",
    "StoreStats",
]
