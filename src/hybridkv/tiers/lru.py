"""A least-recently-used map under a byte budget: the replacement rule of a KV tier.

::

    oldest ─────────────────────────────────────► newest
    [k1: v1, 40 B][k2: v2, 40 B][k3: v3, 20 B]          used 100 B <= capacity

    put(k4, 30 B) into capacity 120: evict k1 (oldest) -> [k2][k3][k4], used 90 B

Rules (the connector's CPU store and the simulator's tiers both follow them):

* ``put`` evicts least-recently-used entries until the new one fits; an entry larger than the
  whole budget is refused and evicts nothing. Putting a key that is held replaces it and makes
  it newest (its old size is given back first, so it is never its own victim).
* ``get`` of a held key makes it newest; ``peek`` and ``in`` do not reorder.
* ``pop`` removes a key; nothing else leaves but by eviction.

Not thread-safe: a caller that shares one across threads holds its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

__all__ = ["SizedLRU"]


class SizedLRU(Generic[K, V]):
    """Entries ``key -> (value, size)`` with ``sum(size) <= capacity`` (rules: module docstring).

    Args:
        capacity: the byte budget (>= 0; 0 holds nothing).

    Raises:
        ValueError: ``capacity`` is negative or not an integer.
    """

    __slots__ = ("capacity", "_entries", "_used")

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"SizedLRU capacity must be an integer >= 0 bytes, got {capacity!r}")
        self.capacity = capacity
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._used = 0

    @property
    def used(self) -> int:
        """Bytes held."""
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> Iterator[K]:
        """Held keys, oldest first."""
        return iter(self._entries)

    def put(self, key: K, value: V, size: int) -> tuple[bool, list[tuple[K, V, int]]]:
        """Hold ``value`` (``size`` bytes, > 0) under ``key`` as the newest entry.

        Returns:
            whether it is held (False: larger than the whole budget, nothing changed) and the
            entries evicted to make room, oldest first, as ``(key, value, size)``.
        """
        if size <= 0:
            raise ValueError(f"SizedLRU entry size must be > 0 bytes, got {size!r}")
        if size > self.capacity:
            return False, []
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self._used -= old[1]
        evicted: list[tuple[K, V, int]] = []
        while self._used + size > self.capacity:
            k, (v, s) = entries.popitem(last=False)
            self._used -= s
            evicted.append((k, v, s))
        entries[key] = (value, size)
        self._used += size
        return True, evicted

    def get(self, key: K) -> tuple[V, int] | None:
        """``(value, size)`` of a held key, made newest; None if not held."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def peek(self, key: K) -> tuple[V, int] | None:
        """``(value, size)`` of a held key without reordering; None if not held."""
        return self._entries.get(key)

    def touch(self, key: K) -> None:
        """Make a held key newest (KeyError if it is not held)."""
        self._entries.move_to_end(key)

    def pop(self, key: K) -> tuple[V, int] | None:
        """Remove a key; its ``(value, size)``, or None if it was not held."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._used -= entry[1]
        return entry

    def clear(self) -> None:
        """Hold nothing."""
        self._entries.clear()
        self._used = 0
