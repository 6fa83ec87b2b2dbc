"""The coordinator's public records: a lookup's result, an external tier's extension, an
allocation plan, and what the engine reads for a state group.

They are plain immutable values (a frozen dataclass or a NamedTuple), built by the coordinator's
seams and read by the manager, the scheduler, the connector and the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hybridkv.core.blockref import TableRef


@dataclass(frozen=True, slots=True)
class CacheHit:
    """The result of a lookup: reusable tokens and, per group, the blocks that hold them.

    ``block_ids[g]`` has ``num_tokens // block_size_g`` entries; 0 marks a block outside the
    group's window (not needed). ``shared_prefix_boundary`` > 0 when a longer prefix is cached
    in some group but not servable by all: allocating this hit then promises that boundary,
    so the prefix becomes reusable (Marconi-style junction). ``request_id`` names the request
    the hit was looked up for (None for a hand-made hit); only that request can adopt it.
    A hit is a snapshot of the coordinator state ``epoch``: allocate it before other requests
    allocate, or look up again. A hit adopted after the state changed (or hand-made, epoch -1)
    is verified block by block; a block that no longer carries the request's hash for its
    position is refused.

    ``group_tokens[g]`` is group g's *own* hit: the largest hit (a multiple of the alignment,
    at most the lookup's cap) that group g's rule alone serves from what is cached, proof
    block included; ``num_tokens``, the fixed point, is at most their minimum. It tells which
    group cut a common hit (a draft group's drop, a window group's write mask); the manager
    sums it per group (:attr:`~hybridkv.core.events.PrefixCacheStats.block_hit_rate_by_group`).
    Empty for a hand-made hit (then every group's own hit reads as ``num_tokens``).
    """

    num_tokens: int
    block_ids: tuple[tuple[int, ...], ...]
    shared_prefix_boundary: int = 0
    request_id: object = None
    epoch: int = -1
    group_tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ExternalHit:
    """A prefix an external tier (CPU memory, a KV store) can extend a local hit to.

    ``num_tokens`` (> the local hit) is the end of the combined hit: the same per-type rules
    and alignment as a local hit, with each needed block either held by the local hit or
    present in the tier. ``loads`` lists a :class:`TableRef` for every block to load:
    the blocks past the local hit that the hit rule needs (for a sliding window, only the
    window before ``num_tokens``).
    """

    num_tokens: int
    local_tokens: int
    loads: tuple[TableRef, ...]


class GroupPlan(NamedTuple):
    """One group's share of an :class:`AllocationPlan`.

    Attributes:
        new_blocks: blocks the commit pops from the pool for this group's table (a state
            group: new extents, counted by head; each takes the config's extent size in
            block ids, which ``num_needed`` counts).
        touched: free (evictable) blocks of the adopted hit that the commit takes out of the
            free queue.
        released: table positions that left the window, back to front (one run without
            gaps: the entries below it are null already); the commit frees
            them (before it pops new blocks) and nulls the entries.
        freed: how many of the released blocks go back to the free queue (last reference).
    """

    new_blocks: int
    touched: int
    released: tuple[int, ...]
    freed: int


# The plan of a group that neither grows nor releases (shared: plans are immutable).
_UNCHANGED = GroupPlan(0, 0, (), 0)


class AllocationPlan(NamedTuple):
    """What an allocation would do, counted without mutating anything (a NamedTuple: built
    on every slow-path allocation, where a frozen dataclass costs microseconds).

    A plan is valid for the coordinator state it was made against (``epoch``): commit it
    before any other allocation, free or load commit, or plan again.

    Attributes:
        request_id: the request planned for.
        new_request: the request holds no blocks yet (the commit adopts ``hit``).
        hit: the lookup result a new request adopts (None: none).
        num_computed: tokens with KV after adopting the hit.
        num_tokens: ``num_computed`` + the scheduled tokens; the commit caches promised ends
            up to ``min(num_tokens, request.num_tokens)``.
        slots: tokens every group's table covers after the commit (scheduled tokens,
            lookahead slots and an external load's reservation, capped at max_model_len).
        groups: per group, a :class:`GroupPlan`.
        num_needed: blocks the commit takes out of the free queue (new blocks plus touched
            hit blocks, summed over the groups).
        num_available: free blocks when planned plus the blocks the window releases before
            new ones are popped.
        num_reserved: blocks an admission reservation wants kept available beyond the
            commit's (``plan(..., reserve_tokens=)``); never allocated by the commit.
        epoch: the coordinator's state version when planned.
    """

    request_id: object
    new_request: bool
    hit: CacheHit | None
    num_computed: int
    num_tokens: int
    slots: int
    groups: tuple[GroupPlan, ...]
    num_needed: int
    num_available: int
    num_reserved: int
    epoch: int

    @property
    def fits(self) -> bool:
        """The commit's blocks, and any reservation on top, are available."""
        return self.num_needed + self.num_reserved <= self.num_available


# Builds a NamedTuple from a tuple of all its fields in order without the generated
# keyword-handling __new__ (half the cost; plans are built on every slow-path allocation).
_make = tuple.__new__



class StateExport(NamedTuple):
    """A checkpoint the engine must write: after computing the first ``position`` tokens,
    copy the live state into ``blocks`` (an extent: head first)."""

    position: int
    blocks: tuple[int, ...]


class StateBlocks(NamedTuple):
    """What the engine needs for one state group of one request (see
    :meth:`hybridkv.core.manager.KVCacheManager.state_blocks`).

    Attributes:
        group: the state group's index.
        live: the extent holding the request's live state (after ``num_computed_tokens``).
        restore_from: the checkpoint extent to copy into ``live`` before the request's first
            step (its cache hit ends at ``restore_position``); () when it has no hit.
        restore_position: the hit's end (0 without a hit).
        exports: the checkpoints the last allocation asked for, ascending positions.
    """

    group: int
    live: tuple[int, ...]
    restore_from: tuple[int, ...]
    restore_position: int
    exports: tuple[StateExport, ...]
