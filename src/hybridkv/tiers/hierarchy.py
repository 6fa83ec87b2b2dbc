"""Tiers below the GPU and what moves between them, as (group, block hash) entries.

::

    GPU pool (the manager) ──save / offload──► tier 0 (cpu) ──► tier 1 (disk) ──► tier 2 (remote)
            ▲                                     │                │                  │
            └────────────── load (a hit past the local hit) ◄──────┴──────────────────┘

Each tier is a :class:`~hybridkv.tiers.lru.SizedLRU` of entries ``(group index, block hash)``,
one per block and group, of ``entry_bytes[group]`` bytes (one block of the group over all its
layers): the unit the connector stores (:mod:`hybridkv.connectors.transfer`).

Write policies:

* ``write-through`` (SGLang HiCache's ``write_through``; vLLM's OffloadingConnector, LMCache and
  hybridkv's own connector store what they compute too): every block the GPU caches is written
  to every tier, in group order (the connector's save order). A block loaded from a lower tier
  passes through host memory and is kept in every faster tier (inclusive).
* ``offload-on-evict`` (TensorRT-LLM's host cache, ``host_cache_size``): a block is written to
  tier 0 when its last GPU copy is evicted; an entry a tier evicts moves to the next tier, and
  the last tier's evictions are lost. A load moves the blocks up: they leave their tier
  (exclusive, as TensorRT-LLM's onboarding swaps a host block into GPU memory).
* ``lazy-offload`` (LMCache's eviction-aware lazy offload, LMCache#4499; vLLM#43946's
  eviction-triggered store): a block is written only when the GPU is about to evict it, as with
  offload-on-evict (what the GPU keeps reusing is never written), but the tier keeps its copy
  when a load reads it (inclusive, as write-through). The simulator times the write as issued
  ahead of the eviction (:mod:`hybridkv.sim.tiers.runtime`).

Admission (``admit_after``, :class:`~hybridkv.tiers.admission.FrequencyAdmission`): under any
policy a block is written only at its ``admit_after``-th sighting (write-through: the GPU cached
it that many times; on evict: evicted that many times); 1 admits every block.

Load rule (the connector's, :meth:`KVTransfer.load`): the blocks of a load are read in runs of
one group, in the given order; each block comes from the fastest tier that holds it and is made
newest there; a run with a block no tier holds fails the load, and later runs are not read. A
failed load changes nothing else (the tokens are recomputed). With offload-on-evict the GPU and
the tiers hold disjoint blocks, so a load may also name blocks the GPU still holds (past the
local hit, e.g. a full-attention block whose sliding-window partner was evicted): those are
copied within the GPU (``served`` :data:`FROM_GPU`), as TensorRT-LLM's block tree matches
primary and host blocks alike.

Which blocks reach a tier at all is the core's write path: a sliding-window group caches only
blocks inside some promised window, so only those are saved or offloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from .admission import FrequencyAdmission
from .lru import SizedLRU

__all__ = ["EVICT_POLICIES", "FROM_GPU", "LAZY_OFFLOAD", "OFFLOAD_ON_EVICT", "TIER_POLICIES",
           "WRITE_THROUGH", "LoadResult", "TierHierarchy"]

WRITE_THROUGH = "write-through"
OFFLOAD_ON_EVICT = "offload-on-evict"
LAZY_OFFLOAD = "lazy-offload"
TIER_POLICIES = (WRITE_THROUGH, OFFLOAD_ON_EVICT, LAZY_OFFLOAD)
EVICT_POLICIES = (OFFLOAD_ON_EVICT, LAZY_OFFLOAD)
"""The policies that write a block when the GPU evicts it (:meth:`TierHierarchy.offload`)."""
"""The write policies (module docstring)."""

Key = tuple[int, bytes]

FROM_GPU = -2
"""``LoadResult.served`` of a block copied from a GPU block that holds it (offload-on-evict)."""


@dataclass(slots=True)
class LoadResult:
    """What a load found.

    Attributes:
        ok: every block was found (the load commits).
        served: per block read, in order, the index of the tier that served it, :data:`FROM_GPU`,
            or -1 (held nowhere); blocks after the first failing run are not read and not listed.
        written: bytes written per tier by the load (write-through keeps a block from a lower
            tier in the faster ones).
    """

    ok: bool
    served: list[int]
    written: list[int] = field(default_factory=list)


class TierHierarchy:
    """Tiers fastest first (semantics: module docstring).

    Args:
        capacities: each tier's budget in bytes (>= 0).
        entry_bytes: per group index, the bytes of one block's entry (> 0).
        policy: one of :data:`TIER_POLICIES`.
        admit_after: write a block only at its ``admit_after``-th sighting (>= 1; module
            docstring).

    Raises:
        ValueError: no tier, a negative capacity, a non-positive entry size, an unknown
            policy or an ``admit_after`` below 1.
    """

    def __init__(self, capacities: Sequence[int], entry_bytes: Sequence[int],
                 policy: str = WRITE_THROUGH, admit_after: int = 1) -> None:
        if policy not in TIER_POLICIES:
            raise ValueError(f"unknown tier policy {policy!r}; valid: {', '.join(TIER_POLICIES)}")
        if not capacities:
            raise ValueError("a tier hierarchy needs at least one tier")
        if not entry_bytes or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0
                                  for b in entry_bytes):
            raise ValueError(f"entry_bytes must be positive integers, one per group, got {entry_bytes!r}")
        self.tiers: list[SizedLRU[Key, None]] = [SizedLRU(c) for c in capacities]
        self.entry_bytes = tuple(entry_bytes)
        self.policy = policy
        entries = sum(capacities) // min(self.entry_bytes)
        self.admission = FrequencyAdmission(admit_after, max(1024, min(4 * entries, 1 << 24)))

    # ---- presence -----------------------------------------------------------------------------
    def find(self, group: int, block_hash: bytes) -> int:
        """The fastest tier holding the block, or -1 (does not reorder)."""
        key = (group, block_hash)
        for i, tier in enumerate(self.tiers):
            if key in tier:
                return i
        return -1

    def contains(self, group: int, block_hash: bytes) -> bool:
        """Whether some tier holds the block (the ``contains`` of
        :meth:`KVCacheManager.lookup_external`)."""
        key = (group, block_hash)
        return any(key in tier for tier in self.tiers)

    def keys(self, tier: int) -> list[Key]:
        """The entries of one tier, oldest first."""
        return list(self.tiers[tier].keys())

    # ---- writes -------------------------------------------------------------------------------
    def admit(self, blocks: Iterable[Key]) -> list[Key]:
        """The blocks the admission filter lets through now (each one sighted once more)."""
        see = self.admission.see
        return [key for key in blocks if see(key)]

    def save(self, blocks: Iterable[Key], admitted: bool = False) -> list[int]:
        """Write-through: write each admitted block (``admitted``: the blocks already passed
        :meth:`admit`) to every tier, in group order (stable). Returns the bytes written per
        tier (a block larger than a tier is not written there)."""
        written = [0] * len(self.tiers)
        if not admitted:
            blocks = self.admit(blocks)
        for key in sorted(blocks, key=lambda k: k[0]):
            size = self.entry_bytes[key[0]]
            for i, tier in enumerate(self.tiers):
                if tier.put(key, None, size)[0]:
                    written[i] += size
        return written

    def offload(self, group: int, block_hash: bytes) -> list[int]:
        """Offload on evict or lazy offload (:data:`EVICT_POLICIES`): write the block to tier 0; whatever a tier evicts for it moves to
        the next tier (an entry too large for a tier goes on down). Returns bytes written per
        tier (none when the admission filter refuses the block)."""
        written = [0] * len(self.tiers)
        if not self.admission.see((group, block_hash)):
            return written
        moving = [((group, block_hash), self.entry_bytes[group])]
        for i, tier in enumerate(self.tiers):
            passed: list[tuple[Key, int]] = []
            for key, size in moving:
                held, evicted = tier.put(key, None, size)
                if held:
                    written[i] += size
                    passed.extend((k, s) for k, _, s in evicted)
                else:
                    passed.append((key, size))
            moving = passed
            if not moving:
                break
        return written

    # ---- loads --------------------------------------------------------------------------------
    def load(self, blocks: Sequence[Key],
             on_gpu: Callable[[int, bytes], bool] | None = None) -> LoadResult:
        """Read a load's blocks by the load rule (module docstring) and apply the policy;
        ``on_gpu(group, hash)`` says whether the GPU holds a block (offload-on-evict only)."""
        served: list[int] = []
        ok = True
        tiers = self.tiers
        for _, run in groupby(blocks, key=lambda k: k[0]):
            failed = False
            for key in run:
                for i, tier in enumerate(tiers):
                    if key in tier:
                        tier.touch(key)
                        served.append(i)
                        break
                else:
                    if on_gpu is not None and on_gpu(*key):
                        served.append(FROM_GPU)
                        continue
                    served.append(-1)
                    failed = True
            if failed:
                ok = False
                break
        written = [0] * len(tiers)
        if ok:
            for key, t in zip(blocks, served):
                if t == FROM_GPU:
                    continue
                if self.policy == OFFLOAD_ON_EVICT:
                    tiers[t].pop(key)
                else:
                    size = self.entry_bytes[key[0]]
                    for i in range(t):
                        if tiers[i].put(key, None, size)[0]:
                            written[i] += size
        return LoadResult(ok, served, written)
