"""An embedded in-process CPU tier: an LRU of byte payloads bounded by a byte budget.

Its replacement rule is :class:`hybridkv.tiers.SizedLRU`'s, the same object the simulator's
tiers hold, so the simulated CPU tier and this one keep the same blocks.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from hybridkv.tiers.lru import SizedLRU

from .base import MISS, WRONG_SIZE, KVStore, Payload

__all__ = ["LocalCPUStore"]


class LocalCPUStore(KVStore):
    """LRU byte store held in this process's memory.

    Invariants (kept under ``self._lock``):

    * ``used_bytes == sum(len(v) for v in entries) <= capacity_bytes``;
    * ``_entries`` (a :class:`~hybridkv.tiers.lru.SizedLRU`) is ordered oldest-first by last put
      or get hit; ``batch_exists`` and a read of the wrong size do not reorder.

    A put evicts least-recently-used entries until the payload fits; a payload larger than the
    whole budget is dropped without evicting anything. Re-putting a key replaces its payload and
    makes it most recent.
    """

    def __init__(self, capacity_bytes: int) -> None:
        """Args:
            capacity_bytes: the byte budget, counting payload bytes only.

        Raises:
            ValueError: ``capacity_bytes`` is not positive.
        """
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        super().__init__()
        self.capacity_bytes = int(capacity_bytes)
        self._entries: SizedLRU[bytes, bytes] = SizedLRU(self.capacity_bytes)
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        """Payload bytes currently held."""
        return self._entries.used

    def __len__(self) -> int:
        return len(self._entries)

    def batch_exists(self, keys: Sequence[bytes]) -> list[bool]:
        with self._lock:
            return [bytes(k) in self._entries for k in keys]

    def batch_put(self, keys: Sequence[bytes], payloads: Sequence[Payload]) -> list[bool]:
        self._check_lengths(keys, payloads, "payloads")
        sizes = [len(memoryview(p).cast("B")) for p in payloads]
        if any(s == 0 for s in sizes):
            raise ValueError("payloads must not be empty")
        results: list[bool] = []
        stored = stored_bytes = dropped = evicted = 0
        with self._lock:
            if self._closed:
                self._count(drops=len(keys), unavailable=len(keys))
                return [False] * len(keys)
            for key, payload, size in zip(keys, payloads, sizes):
                held, victims = self._entries.put(bytes(key), bytes(payload), size)
                if not held:
                    dropped += 1
                    results.append(False)
                    continue
                evicted += len(victims)
                stored += 1
                stored_bytes += size
                results.append(True)
        self._count(puts=stored, put_bytes=stored_bytes, drops=dropped, evictions=evicted)
        return results

    def batch_get(
        self, keys: Sequence[bytes], expected_sizes: Sequence[int] | None = None
    ) -> list[bytes | None]:
        if expected_sizes is not None:
            self._check_lengths(keys, expected_sizes, "expected_sizes")
        return [None if isinstance(p, int) else p for p in self._read(keys, expected_sizes)]

    def _get_sized(self, keys: Sequence[bytes], sizes: Sequence[int]) -> list[bytes | int]:
        return self._read(keys, sizes)

    def _read(self, keys: Sequence[bytes], expected_sizes: Sequence[int] | None
              ) -> list[bytes | int]:
        """Per key its payload, :data:`MISS`, or :data:`WRONG_SIZE` (counted)."""
        out: list[bytes | int] = []
        hits = hit_bytes = mismatches = 0
        with self._lock:
            for i, key in enumerate(keys):
                key = bytes(key)
                entry = self._entries.peek(key)
                if entry is None:
                    out.append(MISS)
                    continue
                payload = entry[0]
                if expected_sizes is not None and len(payload) != expected_sizes[i]:
                    mismatches += 1
                    out.append(WRONG_SIZE)
                else:
                    self._entries.touch(key)
                    hits += 1
                    hit_bytes += len(payload)
                    out.append(payload)
        self._count(
            gets=len(keys), hits=hits, misses=len(keys) - hits, get_bytes=hit_bytes,
            size_mismatches=mismatches,
        )
        return out

    def remove(self, keys: Sequence[bytes]) -> int:
        removed = 0
        with self._lock:
            for key in keys:
                if self._entries.pop(bytes(key)) is not None:
                    removed += 1
        self._count(removes=removed)
        return removed

    def close(self) -> None:
        """Drop every entry; later puts are dropped and gets miss."""
        with self._lock:
            self._entries.clear()
            super().close()
