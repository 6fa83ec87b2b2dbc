"""The block pool's hash -> block index type, as the pure-Python build runs it.

:class:`HashIndex` is a ``dict`` plus :meth:`~HashIndex.prefetch`, which does nothing here. The
compiled build's pool uses :mod:`hybridkv.core.hash_index_native` instead: the same mapping in
a native table whose ``prefetch`` overlaps the cache misses of a batch of operations. This
class is the reference that one is tested against (``tests/core/test_hash_index.py``).
"""

from __future__ import annotations

from typing import Any, Union

#: What the index holds for a hash: the block id, or a dict of the ids of several blocks that
#: hold the same content.
IndexValue = Union[int, dict[int, None]]


class HashIndex(dict[bytes, IndexValue]):
    """``hash -> block id`` (or a dict of block ids) of one KV-cache group."""

    __slots__ = ()

    def prefetch(self, keys: list[Any]) -> None:
        """Called before a batch of operations on ``keys`` (a list of hashable keys); no
        effect on any result."""

    def copy(self) -> HashIndex:
        return HashIndex(self)
