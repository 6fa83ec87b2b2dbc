"""What a KV tier below the GPU holds, without the bytes: one semantics for the connector's CPU
store and the simulator's tiers.

* :class:`SizedLRU` - entries under a byte budget, least recently used first (:mod:`.lru`); the
  connector's :class:`~hybridkv.connectors.stores.local.LocalCPUStore` keeps its payloads in one.
* :class:`TierHierarchy` - tiers fastest first, each a :class:`SizedLRU` of (group, block hash)
  entries, with the write policies and the load rule of the connector (:mod:`.hierarchy`); the
  simulator's tiers are one; :class:`FrequencyAdmission` (:mod:`.admission`) is its
  seen-N-times admission filter.

A leaf: it imports no other hybridkv package, and both the connector and the simulator import it.
"""

from .admission import FrequencyAdmission
from .hierarchy import (EVICT_POLICIES, FROM_GPU, LAZY_OFFLOAD, OFFLOAD_ON_EVICT, TIER_POLICIES,
                        WRITE_THROUGH, LoadResult, TierHierarchy)
from .lru import SizedLRU

__all__ = ["EVICT_POLICIES", "FROM_GPU", "FrequencyAdmission", "LAZY_OFFLOAD", "OFFLOAD_ON_EVICT",
           "TIER_POLICIES", "WRITE_THROUGH", "LoadResult", "SizedLRU", "TierHierarchy"]
