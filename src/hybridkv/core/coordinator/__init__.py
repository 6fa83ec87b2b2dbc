"""Cross-group lookup, allocation and caching: :class:`KVCacheCoordinator`.

Per request and per group the coordinator keeps a positional block table: entry j holds the
group's tokens ``[j*bs, (j+1)*bs)``, or the null block 0 where the tokens left the window::

    full (bs 16)     [ 7][ 8][ 9][10][11][12]             tokens 0..95
    sliding (bs 32)  [ 0][ 0][21][22]      window W=40 -> blocks 0,1 freed, now null
                      ^^^^^^ below the window: never read again

One class, one module per seam (each a subclass of :class:`~.base.CoordinatorBase`, which
holds the state they share):

=============  ================  ==========================================================
module         seam              job
=============  ================  ==========================================================
records.py     (values)          ``CacheHit``, ``ExternalHit``, ``GroupPlan``,
                                 ``AllocationPlan``, ``StateBlocks``, ``StateExport``
base.py        state             per-group facts from the config; per-request tables
lookup.py      ``Lookup``        local and external fixed point, the per-request memo
allocate.py    ``Allocation``    plan, then commit; admission reservation; decode fast path
write.py       ``WritePath``     promised ends, compat masks and limits, caching
release.py     ``Release``       window release, free, retention marks
states.py      ``StateGroups``   live extents, checkpoints, exports (recurrent layers)
=============  ================  ==========================================================
"""

from __future__ import annotations

from hybridkv.core.coordinator.allocate import Allocation
from hybridkv.core.coordinator.lookup import Lookup
from hybridkv.core.coordinator.records import (AllocationPlan, CacheHit, ExternalHit, GroupPlan,
                                               StateBlocks, StateExport)
from hybridkv.core.coordinator.release import Release
from hybridkv.core.coordinator.states import StateGroups
from hybridkv.core.coordinator.write import WritePath


class KVCacheCoordinator(Lookup, Allocation, WritePath, Release, StateGroups):
    """Lookup, allocation and caching over all groups of one pool (the constructor's
    arguments: :class:`~hybridkv.core.coordinator.base.CoordinatorBase`)."""


__all__ = ["AllocationPlan", "CacheHit", "ExternalHit", "GroupPlan", "KVCacheCoordinator",
           "StateBlocks", "StateExport"]
