"""Typed references to one block of one KV-cache group, as they travel between layers.

A block is named in two ways, before and after allocation::

    TableRef(group, position, block_hash)   "block `position` of the request's table of `group`"
        lookup time: ExternalHit.loads names the blocks a tier must supply; no block id exists yet
          │  the request's blocks are allocated: tables[group][position] is its block id
          ▼  TableRef.resolve(tables)
    BlockRef(group, block_id, block_hash)   "pool block `block_id` of `group`, holding `block_hash`"
        KVLoad.blocks (load into it), the connector's saves (save from it), KVTransfer.save/load

Both are NamedTuples, so the field order is fixed and the same everywhere (group first, hash
last), they cost what a tuple costs, and they still unpack as ``g, x, h = ref``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["BlockRef", "TableRef"]


class BlockRef(NamedTuple):
    """A pool block of one group and the hash of the tokens its KV holds.

    Attributes:
        group: index of the group in ``KVCacheConfig.groups``.
        block_id: the block's id in the pool (never the null block 0 for a real transfer).
        block_hash: the chained block hash of its content (the core's hash at the group's block
            size); with the group and the layout it is the block's key in an external tier.
    """

    group: int
    block_id: int
    block_hash: bytes


class TableRef(NamedTuple):
    """A block of a request by its place in the request's block table of one group.

    Attributes:
        group: index of the group in ``KVCacheConfig.groups``.
        position: index in the group's block table; block ``position`` covers tokens
            ``[position * block_size, (position + 1) * block_size)`` of the request.
        block_hash: the chained hash of those tokens.
    """

    group: int
    position: int
    block_hash: bytes

    def resolve(self, tables: Sequence[Sequence[int]]) -> BlockRef:
        """The pool block that holds this position once the request's blocks are allocated
        (``tables`` = the manager's ``block_ids(request)``)."""
        return BlockRef(self.group, tables[self.group][self.position], self.block_hash)
