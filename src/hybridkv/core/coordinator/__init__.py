"""Cross-group lookup, allocation and caching: :class:`KVCacheCoordinator`.

Per request and per group the coordinator keeps a positional block table: entry j holds the
group's tokens ``[j*bs, (j+1)*bs)``, or the null block 0 where the tokens left the window::

    full (bs 16)     [ 7][ 8][ 9][10][11][12]             tokens 0..95
    sliding (bs 32)  [ 0][ 0][21][22]      window W=40 -> blocks 0,1 freed, now null
                      ^^^^^^ below the window: never read again

One class, one module per seam (each a subclass of :class:`~.base.CoordinatorBase`, which
holds the state they share, so each seam reads as a class of its own):

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

:class:`KVCacheCoordinator` joins the seams into one flat class, as if their methods were
written in one class body, and refuses a name two seams define. (A class inheriting from the
six would read the same, but look every attribute up along an MRO of eight classes: CPython
caches those lookups per type, yet walks the MRO on each cache miss, on the hot path too.)
Its one base is :class:`~.base._Fields`, the fields a step reads: an extension type in the
compiled core, so seam methods that declare ``self`` of that type read them as C struct members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridkv.core.coordinator.allocate import Allocation
from hybridkv.core.coordinator.base import CoordinatorBase, CoordinatorModes, _Fields
from hybridkv.core.coordinator.lookup import Lookup
from hybridkv.core.coordinator.records import (AllocationPlan, CacheHit, ExternalHit, GroupPlan,
                                               StateBlocks, StateExport)
from hybridkv.core.coordinator.release import Release
from hybridkv.core.coordinator.states import StateGroups
from hybridkv.core.coordinator.write import WritePath


def _join(name: str, doc: str, *seams: type, bases: tuple[type, ...] = ()) -> type:
    """A class named ``name`` (its bases: ``bases``) whose namespace holds what each of
    ``seams`` defines itself (methods and ``__init__``; not its class bookkeeping); a name two
    seams define is refused, so no seam silently overrides another."""
    namespace: dict[str, object] = {"__module__": __name__, "__qualname__": name, "__doc__": doc}
    for seam in seams:
        for key, value in vars(seam).items():
            if key.startswith("__") and key.endswith("__") and key != "__init__":
                continue                          # the seam class's own bookkeeping
            if key in namespace:
                raise TypeError(f"{seam.__name__} and another seam both define {key!r}")
            namespace[key] = value
    return type(name, bases, namespace)


if TYPE_CHECKING:
    class KVCacheCoordinator(Lookup, Allocation, WritePath, Release, StateGroups):
        """What the type checker sees: the seams as one class (the joined class's methods
        and attributes are exactly theirs)."""
else:
    #: Lookup, allocation and caching over all groups of one pool (the constructor's arguments:
    #: :class:`~hybridkv.core.coordinator.base.CoordinatorBase`).
    KVCacheCoordinator = _join(
        "KVCacheCoordinator",
        "Lookup, allocation and caching over all groups of one pool: the seams of "
        "hybridkv.core.coordinator in one class (arguments: CoordinatorBase).",
        CoordinatorBase, Lookup, Allocation, WritePath, Release, StateGroups, bases=(_Fields,))


__all__ = ["AllocationPlan", "CacheHit", "CoordinatorModes", "ExternalHit", "GroupPlan",
           "KVCacheCoordinator", "StateBlocks", "StateExport"]
