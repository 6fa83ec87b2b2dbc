"""The storage-tier interface of the KV connector.

A :class:`KVStore` holds opaque byte payloads under opaque ``bytes`` keys. The connector uses
``key = "<block hash hex>/<group name>/<layout fingerprint>"`` and one payload per (block, group)
(see :mod:`hybridkv.connectors.transfer`), but a store knows nothing about blocks: it only moves
bytes.

Two ways to move data::

    copying API     batch_put(keys, payloads)          batch_get(keys) -> bytes | None
    zero-copy API   batch_put_from(keys, buf, offs, sizes)   batch_get_into(keys, buf, offs, sizes)
                    over a host buffer registered once with register_buffer(buf)

        registered host buffer (numpy uint8 array / torch CPU tensor / raw pointer)
        +--------+--------+--------+--------+-----
        | page 0 | page 1 | page 2 | page 3 | ...      offsets[i], sizes[i] select one payload
        +--------+--------+--------+--------+-----

Contracts shared by every store:

* **Serving never raises on store-side failures.** A lost server, a timeout, a full store or an
  evicted entry turn into misses (``None`` / negative results / ``False``) and drops (``False``)
  and are counted in :attr:`KVStore.stats`. Only *caller* errors raise (``ValueError`` /
  ``TypeError``): mismatched list lengths, empty payloads, a region outside a registered buffer,
  invalid configuration.
* **Every read may miss.** A store may evict any entry at any time, silently; ``batch_exists``
  returning ``True`` does not promise that a following get hits.
* **A size mismatch is not a hit, and is reported as such.** When the caller states the size it
  expects (always on the zero-copy path, optionally on ``batch_get``), a stored payload of any
  other size is rejected and counted in ``stats.size_mismatches``: ``batch_get_into`` answers
  :data:`WRONG_SIZE` for it (``batch_get`` answers ``None``), so a caller can tell a truncated
  or foreign payload from a plain miss; the destination bytes are then unspecified.
* **Putting an existing key is not an error.** The store may keep the old payload or replace it;
  either way the put reports success.
"""

from __future__ import annotations

import ctypes
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["MISS", "WRONG_SIZE", "HostBuffer", "KVStore", "StoreStats", "Payload"]

#: Result of :meth:`KVStore.batch_get_into` for a key that was not read (missing, evicted or
#: store failure).
MISS = -1
#: Result of :meth:`KVStore.batch_get_into` for a key that is stored with a payload of another
#: size than asked (truncated or foreign); counted in ``stats.size_mismatches``.
WRONG_SIZE = -2

Payload = bytes | bytearray | memoryview


@dataclass
class StoreStats:
    """Counters of one store; keys are counted one by one, not calls.

    ``puts + drops`` is the number of payloads offered; ``hits + misses == gets`` is the number of
    keys read (``batch_exists`` is not counted). ``errors`` counts keys whose operation failed on
    the store side (lost server, transfer failure, timeout), whether it then became a miss or a
    drop. ``unavailable`` counts keys answered without contacting the store because it was
    marked unhealthy. ``evictions`` is only known to stores that evict themselves.
    """

    puts: int = 0
    put_bytes: int = 0
    drops: int = 0
    gets: int = 0
    get_bytes: int = 0
    hits: int = 0
    misses: int = 0
    size_mismatches: int = 0
    errors: int = 0
    unavailable: int = 0
    evictions: int = 0
    removes: int = 0

    def as_dict(self) -> dict[str, int]:
        """Return a plain dict copy (JSON-friendly)."""
        return asdict(self)


@dataclass(frozen=True)
class HostBuffer:
    """A contiguous region of host memory: ``nbytes`` bytes starting at address ``ptr``.

    ``owner`` keeps the Python object that owns the memory alive as long as the handle lives.
    Build one with :meth:`of`.
    """

    ptr: int
    nbytes: int
    owner: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, obj: HostBuffer | Any) -> HostBuffer:
        """Wrap a C-contiguous numpy array or a contiguous torch CPU tensor (any dtype).

        Raises:
            TypeError: ``obj`` is none of the supported kinds.
            ValueError: it is not contiguous, not on the CPU, or empty.
        """
        if isinstance(obj, HostBuffer):
            return obj
        if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor, duck-typed
            if getattr(obj, "device", None) is not None and obj.device.type != "cpu":
                raise ValueError(f"tensor must be on the CPU, got device {obj.device}")
            if not obj.is_contiguous():
                raise ValueError("tensor must be contiguous")
            nbytes = int(obj.numel()) * int(obj.element_size())
            ptr = int(obj.data_ptr())
        elif hasattr(obj, "__array_interface__") and hasattr(obj, "ctypes"):  # numpy.ndarray
            if not obj.flags["C_CONTIGUOUS"]:
                raise ValueError("numpy array must be C-contiguous")
            nbytes = int(obj.nbytes)
            ptr = int(obj.ctypes.data)
        else:
            raise TypeError(
                "expected a numpy array, a torch CPU tensor or a HostBuffer, "
                f"got {type(obj).__name__}"
            )
        if nbytes <= 0:
            raise ValueError("buffer must not be empty")
        return cls(ptr, nbytes, obj)

    def contains(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies inside this buffer."""
        return self.ptr <= ptr and ptr + nbytes <= self.ptr + self.nbytes

    def view(self) -> memoryview:
        """A writable byte view of the whole region (valid while ``owner`` is alive)."""
        return memoryview((ctypes.c_ubyte * self.nbytes).from_address(self.ptr)).cast("B")


class KVStore(ABC):
    """Abstract byte store keyed by ``bytes``; see the module docstring for the contracts.

    Subclasses implement the copying API; the zero-copy API has a copying default built on it,
    which stores with a faster native path override. All methods are thread-safe.
    """

    #: Whether batch_put_from / batch_get_into avoid an intermediate copy.
    zero_copy: bool = False

    def __init__(self) -> None:
        self._stats = StoreStats()
        self._stats_lock = threading.Lock()
        self._buffers: list[HostBuffer] = []
        self._closed = False

    # ------------------------------------------------------------------ state
    @property
    def stats(self) -> StoreStats:
        """A snapshot copy of the counters."""
        with self._stats_lock:
            return StoreStats(**asdict(self._stats))

    @property
    def healthy(self) -> bool:
        """Whether the store currently expects to serve requests (False after close)."""
        return not self._closed

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    # ---------------------------------------------------------- copying API
    @abstractmethod
    def batch_exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is currently stored. Does not refresh recency; a True may still miss."""

    @abstractmethod
    def batch_put(self, keys: Sequence[bytes], payloads: Sequence[Payload]) -> list[bool]:
        """Store ``payloads[i]`` under ``keys[i]``; False means the payload was dropped.

        The payload bytes are copied before returning. Raises ``ValueError`` for mismatched
        lengths or an empty payload.
        """

    @abstractmethod
    def batch_get(
        self, keys: Sequence[bytes], expected_sizes: Sequence[int] | None = None
    ) -> list[bytes | None]:
        """Read each key; ``None`` for a miss.

        If ``expected_sizes`` is given, a payload of another size is a miss (and counted in
        ``stats.size_mismatches``).
        """

    @abstractmethod
    def remove(self, keys: Sequence[bytes]) -> int:
        """Remove keys if present; return how many were removed. Never raises on store failures."""

    # --------------------------------------------------------- zero-copy API
    def register_buffer(self, buffer: HostBuffer | Any) -> HostBuffer:
        """Register a host buffer for the zero-copy calls; returns its :class:`HostBuffer`.

        The caller keeps the memory alive and unchanged in place until :meth:`close`.
        Registering the same region twice is a no-op.
        """
        hb = HostBuffer.of(buffer)
        if not any(b.ptr == hb.ptr and b.nbytes == hb.nbytes for b in self._buffers):
            self._register_native(hb)
            self._buffers.append(hb)
        return hb

    def _register_native(self, buffer: HostBuffer) -> None:
        """Hook for stores that must register memory with a transfer engine."""

    def _resolve_regions(
        self,
        keys: Sequence[bytes],
        buffer: HostBuffer | Any,
        offsets: Sequence[int],
        sizes: Sequence[int],
    ) -> tuple[HostBuffer, list[int]]:
        """Validate a zero-copy request; return the buffer and the absolute address of each region.

        Raises ``ValueError`` if lengths differ, a size is not positive, or a region is not inside
        a registered buffer.
        """
        hb = HostBuffer.of(buffer)
        if not (len(keys) == len(offsets) == len(sizes)):
            raise ValueError(
                f"keys, offsets and sizes must have equal lengths, got {len(keys)}, "
                f"{len(offsets)}, {len(sizes)}"
            )
        ptrs: list[int] = []
        for off, size in zip(offsets, sizes):
            if size <= 0 or off < 0 or off + size > hb.nbytes:
                raise ValueError(
                    f"region offset={off} size={size} outside buffer of {hb.nbytes} bytes "
                    "(sizes must be positive)"
                )
            ptr = hb.ptr + off
            if not any(b.contains(ptr, size) for b in self._buffers):
                raise ValueError(
                    f"region at offset {off} ({size} bytes) is not inside a registered buffer; "
                    "call register_buffer first"
                )
            ptrs.append(ptr)
        return hb, ptrs

    def batch_put_from(
        self,
        keys: Sequence[bytes],
        buffer: HostBuffer | Any,
        offsets: Sequence[int],
        sizes: Sequence[int],
    ) -> list[bool]:
        """Store ``buffer[offsets[i] : offsets[i] + sizes[i]]`` under ``keys[i]``.

        The buffer must lie inside a registered buffer. Same results as :meth:`batch_put`.
        """
        hb, _ = self._resolve_regions(keys, buffer, offsets, sizes)
        view = hb.view()
        return self.batch_put(keys, [view[o : o + s] for o, s in zip(offsets, sizes)])

    def batch_get_into(
        self,
        keys: Sequence[bytes],
        buffer: HostBuffer | Any,
        offsets: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]:
        """Read ``keys[i]`` into ``buffer[offsets[i] : offsets[i] + sizes[i]]``.

        Returns ``sizes[i]`` for a hit, :data:`WRONG_SIZE` when the stored payload has another
        size, and :data:`MISS` otherwise (missing, evicted, store failure). When it is not a
        hit the region's bytes are unspecified.
        """
        hb, _ = self._resolve_regions(keys, buffer, offsets, sizes)
        view = hb.view()
        out: list[int] = []
        for got, off, size in zip(self._get_sized(keys, sizes), offsets, sizes):
            if isinstance(got, int):
                out.append(got)
            else:
                view[off : off + size] = got
                out.append(size)
        return out

    def _get_sized(self, keys: Sequence[bytes], sizes: Sequence[int]) -> list[bytes | int]:
        """Read keys of known sizes (counted like ``batch_get(keys, sizes)``): per key the
        payload, :data:`WRONG_SIZE` or :data:`MISS`. This default cannot tell a size mismatch
        from a miss (it answers MISS for both); stores that can override it."""
        return [MISS if p is None else p for p in self.batch_get(keys, sizes)]

    # ------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Release resources; later calls behave as on an unhealthy store. Idempotent."""
        self._closed = True
        self._buffers.clear()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- helpers
    @staticmethod
    def _check_lengths(keys: Sequence[bytes], other: Sequence[Any], what: str) -> None:
        if len(keys) != len(other):
            raise ValueError(f"got {len(keys)} keys but {len(other)} {what}")
