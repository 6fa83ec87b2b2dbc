"""The worker side of the KV connector: save blocks of the paged cache to a store, load them back.

One stored object per (block, group)::

    key      "<block hash hex>/<group name>/<fingerprint hex>"   (ASCII bytes)
    payload  [ block bytes: every layer of the group, payload order (see layout.py) ][ trailer ]
    trailer  32 bytes, little endian:
             magic "HKVT" | version u16 | reserved u16 | fingerprint u64 | data bytes u64
             | xxh3-64 of the block bytes, seeded with xxh3-64 of the key

The fingerprint hashes what the group's payload bytes mean (spec, kernel block size, and per
layer its name, dtype, run order and element order; see :class:`.layout.GroupLayout`) with a
namespace (model id, revision) and the worker's rank, so a different model, dtype, layout or
tensor-parallel shard looks up other keys and never reads foreign bytes. The seeded checksum
rejects a payload that was corrupted, truncated, or stored under another block's key
(``verify=False`` skips the checksum pass on load but keeps the size and trailer checks).

Two ways to move bytes, picked per call (``mode="auto"``)::

    CPU cache and a copying store (LocalCPUStore):
        save  b"".join(runs of the block in the cache + trailer) -> batch_put       (1 copy)
        load  batch_get -> bytes; verify; runs copied into the cache                (1 copy)
    otherwise (Mooncake, or a GPU cache), through a staging buffer registered once:
        save  gather blocks into staging rows; trailers; ONE batch_put_from
        load  ONE batch_get_into into staging rows; verify; scatter the good prefix
        (calls larger than the staging buffer are split into as few calls as fit)

Blocks are named by :class:`~hybridkv.core.blockref.BlockRef` ``(group, block_id, block_hash)``
(the group's index in the layout's ``KVCacheConfig``); a call may mix groups and makes one
store batch per run of consecutive blocks of one group.

Failure contract: store-side failures never raise. A store that is full or down drops saves
(``save`` returns False for them) and turns loads into misses; ``load`` returns how many
*leading* blocks were verified and copied, and never writes a block after the first failure.
A payload the store holds with the wrong size (:data:`~.stores.base.WRONG_SIZE`: truncated or
foreign) counts as corrupt, not as a miss. Everything is counted in :class:`ConnectorStats`.
Caller errors (not a BlockRef, unknown group, block id out of range, the null block 0, a hash
that is not bytes) raise ``ValueError``.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import groupby
from typing import Literal

import torch
import xxhash

from hybridkv.core.blockref import BlockRef
from hybridkv.core.validation import check_int

from .layout import GroupLayout, KVLayout
from .stores.base import MISS, WRONG_SIZE, HostBuffer, KVStore

__all__ = ["ConnectorStats", "KVTransfer", "TRAILER_BYTES", "TransferOptions"]

log = logging.getLogger(__name__)

_TRAILER = struct.Struct("<4sHHQQQ")
TRAILER_BYTES = _TRAILER.size  # 32
_MAGIC = b"HKVT"
_VERSION = 1
_ALIGN = 64

TransferMode = Literal["auto", "direct", "staged"]


@dataclass
class ConnectorStats:
    """Counters of one :class:`KVTransfer`, in blocks (one block = one group's payload).

    ``saved + save_dropped`` blocks were offered to ``save``. Of the blocks asked for by
    ``load``, ``loaded`` were copied into the cache and ``load_failed`` were not (missing,
    corrupt, store down, or after an earlier failure in the same call). ``load_misses`` counts
    keys the store did not return, ``corrupt`` payloads that came back but were rejected (bad
    trailer, wrong size, checksum mismatch). ``store_errors`` counts store calls that raised.
    """

    saved: int = 0
    save_dropped: int = 0
    saved_bytes: int = 0
    loaded: int = 0
    load_failed: int = 0
    load_misses: int = 0
    corrupt: int = 0
    loaded_bytes: int = 0
    store_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TransferOptions:
    """How a :class:`KVTransfer` moves blocks (checked when built).

    Attributes:
        namespace: what else must match for bytes to be shared (model id and revision, ...);
            mixed into every key.
        rank: the worker's tensor-parallel rank (each rank stores its own shard).
        staging_bytes: size of the host staging buffer of the staged path (allocated on first
            use, at least one block); a call with more blocks than fit is split.
        mode: ``"direct"`` (CPU cache, copying store API), ``"staged"`` (zero-copy store API
            through the staging buffer), or ``"auto"`` (direct for a CPU cache and a store
            without a zero-copy path, else staged).
        copy_mode: how blocks are copied to/from staging rows (see :data:`.layout.CopyMode`).
        verify: check each loaded payload's checksum (one extra read of its bytes). Without it
            loads still check the size and the trailer (magic, fingerprint, length), which
            catches truncation and foreign layouts but not flipped bits; for tiers that cannot
            corrupt data (the in-process store) where the read pass matters.
    """

    namespace: str = ""
    rank: int = 0
    staging_bytes: int = 64 << 20
    mode: TransferMode = "auto"
    copy_mode: Literal["auto", "python", "torch"] = "auto"
    verify: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "direct", "staged"):
            raise ValueError(f"mode must be 'auto', 'direct' or 'staged', got {self.mode!r}")
        check_int("staging_bytes", self.staging_bytes, 1)
        check_int("rank", self.rank, 0)


class KVTransfer:
    """Moves whole blocks of a registered paged cache to and from one :class:`KVStore`.

    Args:
        layout: the registered cache layout.
        store: the tier to save to and load from.
        options: namespace, rank, staging size, copy modes, verification
            (:class:`TransferOptions`); the defaults when None.

    Thread-safe: calls are serialized on one lock (they share the staging buffer).
    """

    def __init__(self, layout: KVLayout, store: KVStore, options: TransferOptions | None = None) -> None:
        o = options if options is not None else TransferOptions()
        if not isinstance(o, TransferOptions):
            raise ValueError(f"options must be a TransferOptions or None, got {type(o).__name__}")
        namespace, staging_bytes, mode = o.namespace, o.staging_bytes, o.mode
        if mode == "direct" and layout.device.type != "cpu":
            raise ValueError(f"mode 'direct' needs a CPU cache, the cache is on {layout.device}")
        self.options = o
        self.layout = layout
        self.store = store
        self.namespace = namespace
        self.rank = o.rank
        self.copy_mode = o.copy_mode
        self.verify = o.verify
        if mode == "auto":
            mode = "direct" if layout.device.type == "cpu" and not store.zero_copy else "staged"
        self.mode: str = mode
        self._fingerprints = {
            name: xxhash.xxh3_64_intdigest(
                f"{namespace}\x00{self.rank}\x00{g.description}".encode())
            for name, g in layout.groups.items()
        }
        self._names = [g.name for g in layout.config.groups]  # BlockRef.group -> group name
        slot = max(_slot_bytes(g.block_bytes) for g in layout.groups.values())
        self._staging_bytes = max(int(staging_bytes), slot)
        self._staging: torch.Tensor | None = None
        self._staging_hb: HostBuffer | None = None
        self._lock = threading.Lock()
        self._stats = ConnectorStats()

    # ----------------------------------------------------------------- facts
    @property
    def stats(self) -> ConnectorStats:
        """A snapshot copy of the counters."""
        with self._lock:
            return ConnectorStats(**asdict(self._stats))

    def fingerprint(self, group: str) -> int:
        """The 64-bit layout fingerprint of ``group`` (with namespace and rank)."""
        self._group(group)
        return self._fingerprints[group]

    def key(self, group: str, block_hash: bytes) -> bytes:
        """The store key of a block of ``group``."""
        self._group(group)
        return self._key(group, _check_hash(block_hash))

    def payload_bytes(self, group: str) -> int:
        """Stored bytes per block of ``group`` (block bytes + trailer)."""
        return self._group(group).block_bytes + TRAILER_BYTES

    def _key(self, group: str, block_hash: bytes) -> bytes:
        return f"{block_hash.hex()}/{group}/{self._fingerprints[group]:016x}".encode()

    def _group(self, group: str) -> GroupLayout:
        try:
            return self.layout.groups[group]
        except KeyError:
            raise ValueError(
                f"no KV-cache group named {group!r}; groups: {list(self.layout.groups)}"
            ) from None

    def _runs(self, blocks: Sequence[BlockRef]
              ) -> list[tuple[str, GroupLayout, list[bytes], list[int]]]:
        """Validate ``blocks`` and split them into runs of one group (in the given order):
        per run the group's name, layout, store keys and block ids."""
        for item in blocks:
            if not isinstance(item, BlockRef):
                raise ValueError(f"blocks must be BlockRef(group, block_id, block_hash), got {item!r}")
            if not (isinstance(item.group, int) and 0 <= item.group < len(self._names)):
                raise ValueError(f"{item!r}: group must be an index into the config's "
                                 f"{len(self._names)} groups {self._names}")
        runs = []
        for gi, run in groupby(blocks, key=lambda ref: ref.group):
            name = self._names[gi]
            g = self._group(name)
            keys, ids = [], []
            for ref in run:
                block_id = int(ref.block_id)
                if block_id == 0:
                    raise ValueError("block 0 is the null block; it is never saved or loaded")
                keys.append(self._key(name, _check_hash(ref.block_hash)))
                ids.append(block_id)
            g._check_ids(ids)
            runs.append((name, g, keys, ids))
        return runs

    # ----------------------------------------------------------- checksums
    def _trailer(self, group: str, digest: int, nbytes: int) -> bytes:
        return _TRAILER.pack(_MAGIC, _VERSION, 0, self._fingerprints[group], nbytes, digest)

    def _valid(self, group: str, key: bytes, payload: memoryview, nbytes: int) -> bool:
        """Whether ``payload`` (exactly nbytes + trailer long) is this key's block."""
        magic, version, _, fp, n, digest = _TRAILER.unpack_from(payload, nbytes)
        if magic != _MAGIC or version != _VERSION or fp != self._fingerprints[group] or n != nbytes:
            return False
        if not self.verify:
            return True
        return xxhash.xxh3_64_intdigest(payload[:nbytes], xxhash.xxh3_64_intdigest(key)) == digest

    # ------------------------------------------------------------ staging
    def _ensure_staging(self) -> tuple[torch.Tensor, HostBuffer] | None:
        """The staging buffer, registered with the store; None if the store refused it."""
        if self._staging is None:
            pin = self.layout.device.type == "cuda" and torch.cuda.is_available()
            self._staging = torch.empty(self._staging_bytes, dtype=torch.uint8, pin_memory=pin)
        if self._staging_hb is None:
            try:
                self._staging_hb = self.store.register_buffer(self._staging)
            except Exception:  # noqa: BLE001 - e.g. the transfer engine refused the memory
                log.exception("registering the %d-byte staging buffer failed", self._staging_bytes)
                self._stats.store_errors += 1
                return None
        return self._staging, self._staging_hb

    # ---------------------------------------------------------------- save
    def save(self, blocks: Sequence[BlockRef]) -> list[bool]:
        """Store the given blocks (one store batch per run of one group).

        Returns:
            per block, whether the store accepted it. False (dropped, counted) when the store is
            full, down or failing; never raises for those.

        Raises:
            ValueError: not a BlockRef, unknown group, bad block id (out of range or the null
                block 0) or hash; nothing is stored then.
        """
        runs = self._runs(blocks)
        out: list[bool] = []
        with self._lock:
            for group, g, keys, ids in runs:
                if self.mode == "direct":
                    ok = self._save_direct(group, g, keys, ids)
                else:
                    ok = self._save_staged(group, g, keys, ids)
                n_ok = sum(ok)
                self._stats.saved += n_ok
                self._stats.save_dropped += len(ok) - n_ok
                self._stats.saved_bytes += n_ok * g.block_bytes
                out.extend(ok)
        return out

    def _save_direct(self, group: str, g: GroupLayout, keys: list[bytes],
                     ids: list[int]) -> list[bool]:
        payloads = []
        for key, b in zip(keys, ids):
            parts = g.parts(b)
            h = xxhash.xxh3_64(seed=xxhash.xxh3_64_intdigest(key))
            for p in parts:
                h.update(p)
            parts.append(self._trailer(group, h.intdigest(), g.block_bytes))
            payloads.append(b"".join(parts))
        try:
            return [bool(x) for x in self.store.batch_put(keys, payloads)]
        except Exception:  # noqa: BLE001 - a store failure must not reach the engine
            log.exception("store batch_put failed; %d blocks dropped", len(keys))
            self._stats.store_errors += 1
            return [False] * len(keys)

    def _save_staged(self, group: str, g: GroupLayout, keys: list[bytes],
                     ids: list[int]) -> list[bool]:
        ready = self._ensure_staging()
        if ready is None:
            return [False] * len(ids)
        staging, hb = ready
        slot = _slot_bytes(g.block_bytes)
        per_call = self._staging_bytes // slot
        size = g.block_bytes + TRAILER_BYTES
        mv = memoryview(staging.numpy())
        out: list[bool] = []
        for lo in range(0, len(ids), per_call):
            chunk_keys, chunk_ids = keys[lo : lo + per_call], ids[lo : lo + per_call]
            n = len(chunk_ids)
            rows = staging[: n * slot].view(n, slot)
            g.gather(chunk_ids, rows, self.copy_mode)
            offsets = [i * slot for i in range(n)]
            for key, off in zip(chunk_keys, offsets):
                digest = xxhash.xxh3_64_intdigest(mv[off : off + g.block_bytes],
                                                  xxhash.xxh3_64_intdigest(key))
                mv[off + g.block_bytes : off + size] = self._trailer(group, digest, g.block_bytes)
            try:
                ok = self.store.batch_put_from(chunk_keys, hb, offsets, [size] * n)
                ok = [bool(x) for x in ok]
            except Exception:  # noqa: BLE001
                log.exception("store batch_put_from failed; %d blocks dropped", n)
                self._stats.store_errors += 1
                ok = [False] * n
            out.extend(ok)
        return out

    # ---------------------------------------------------------------- load
    def load(self, blocks: Sequence[BlockRef]) -> int:
        """Load the given blocks into the cache (one store batch per run of one group).

        Returns:
            the number of leading blocks that were read, verified and copied into their block
            ids; blocks from the first failure on are not written (later runs are not even
            read, and count as failed). 0 when the store is down.

        Raises:
            ValueError: not a BlockRef, unknown group, bad block id (out of range or the null
                block 0) or hash; nothing is loaded then.
        """
        runs = self._runs(blocks)
        loaded = 0
        with self._lock:
            for group, g, keys, ids in runs:
                if self.mode == "direct":
                    n_ok = self._load_direct(group, g, keys, ids)
                else:
                    n_ok = self._load_staged(group, g, keys, ids)
                self._stats.loaded += n_ok
                self._stats.loaded_bytes += n_ok * g.block_bytes
                loaded += n_ok
                if n_ok < len(ids):
                    break
            self._stats.load_failed += len(blocks) - loaded
        return loaded

    def _load_direct(self, group: str, g: GroupLayout, keys: list[bytes], ids: list[int]) -> int:
        try:
            payloads = self.store.batch_get(keys)
        except Exception:  # noqa: BLE001
            log.exception("store batch_get failed; %d blocks not loaded", len(keys))
            self._stats.store_errors += 1
            self._stats.load_misses += len(keys)
            return 0
        size = g.block_bytes + TRAILER_BYTES
        good: list[memoryview] = []
        prefix = True
        for key, payload in zip(keys, payloads):
            if payload is None:
                self._stats.load_misses += 1
                prefix = False
                continue
            view = memoryview(payload).cast("B")
            if view.nbytes != size or not self._valid(group, key, view, g.block_bytes):
                self._stats.corrupt += 1
                prefix = False
                continue
            if prefix:
                good.append(view)
        for b, view in zip(ids, good):
            g.write_payload(b, view)
        return len(good)

    def _load_staged(self, group: str, g: GroupLayout, keys: list[bytes], ids: list[int]) -> int:
        ready = self._ensure_staging()
        if ready is None:
            self._stats.load_misses += len(ids)
            return 0
        staging, hb = ready
        slot = _slot_bytes(g.block_bytes)
        per_call = self._staging_bytes // slot
        size = g.block_bytes + TRAILER_BYTES
        mv = memoryview(staging.numpy())
        loaded = 0
        for lo in range(0, len(ids), per_call):
            chunk_keys, chunk_ids = keys[lo : lo + per_call], ids[lo : lo + per_call]
            n = len(chunk_ids)
            offsets = [i * slot for i in range(n)]
            try:
                got = self.store.batch_get_into(chunk_keys, hb, offsets, [size] * n)
            except Exception:  # noqa: BLE001
                log.exception("store batch_get_into failed; %d blocks not loaded", n)
                self._stats.store_errors += 1
                got = [MISS] * n
            n_good = 0
            prefix = True
            for key, off, result in zip(chunk_keys, offsets, got):
                if result != size:
                    prefix = False
                    continue
                if not self._valid(group, key, mv[off : off + size], g.block_bytes):
                    self._stats.corrupt += 1
                    prefix = False
                    continue
                if prefix:
                    n_good += 1
            wrong_size = sum(1 for r in got if r == WRONG_SIZE)
            self._stats.corrupt += wrong_size
            self._stats.load_misses += sum(1 for r in got if r != size) - wrong_size
            if n_good:
                rows = staging[: n_good * slot].view(n_good, slot)
                g.scatter(chunk_ids[:n_good], rows, self.copy_mode)
            loaded += n_good
            if n_good < n:
                break
        return loaded

    # -------------------------------------------------------------- lookup
    def lookup(self, group: str, block_hashes: Sequence[bytes]) -> int:
        """How many leading blocks of ``group`` the store reports present (a hint: a present
        block may still miss on load). 0 when the store is down."""
        self._group(group)
        keys = [self._key(group, _check_hash(h)) for h in block_hashes]
        if not keys:
            return 0
        try:
            present = self.store.batch_exists(keys)
        except Exception:  # noqa: BLE001
            log.exception("store batch_exists failed")
            with self._lock:
                self._stats.store_errors += 1
            return 0
        n = 0
        for p in present:
            if not p:
                break
            n += 1
        return n


def _slot_bytes(block_bytes: int) -> int:
    """Staging row size of a block: payload + trailer, rounded up to 64 bytes."""
    return -(-(block_bytes + TRAILER_BYTES) // _ALIGN) * _ALIGN


def _check_hash(block_hash: object) -> bytes:
    if not isinstance(block_hash, (bytes, bytearray)) or not block_hash:
        raise ValueError(f"block hash must be non-empty bytes, got {type(block_hash).__name__}")
    return bytes(block_hash)

