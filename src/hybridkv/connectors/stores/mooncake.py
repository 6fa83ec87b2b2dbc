"""A :class:`KVStore` on Mooncake Store (``mooncake.store.MooncakeDistributedStore``) over TCP.

This process is a *pure client* by default (it contributes no RAM, ``global_segment_bytes=0``):
objects live in separate storage nodes (for tests, :mod:`hybridkv.testing.mooncake_cluster`
starts them), so they survive this
process. Metadata goes through the master with ``P2PHANDSHAKE`` (no etcd, no HTTP metadata).

Keys: ``key_prefix + key.hex()`` (Mooncake keys are strings).

Health state machine (never raises on the serving path)::

    HEALTHY --(RPC failure code <= -900, or an exception from the client)--> UNHEALTHY
        (the call that finds the failure pays for it: ~0 s when the master's port is closed,
        ~4 s for a get/put to a dead master, up to ``rpc_timeout_ms`` for a hung master)
    UNHEALTHY: every call answers misses / drops at once (stats.unavailable), no RPC timeouts;
               after a back-off (doubling, capped) the next call starts a background reconnect:
               probe the master's TCP port, then either verify the existing client (it reconnects
               to a restarted master by itself) or run setup() in a thread with a timeout.
    reconnect succeeded --> HEALTHY (buffers re-registered on a new client)

Result codes seen from Mooncake 0.3.13 (per key):

    >= 0  success (gets: bytes read)     -200  no space (put dropped; the pool was full)
    -600  destination smaller than the object (a size mismatch on get_into)
    -704  object not found (a plain miss)  -705  already exists (a successful put)
    -800  transfer failed (e.g. the storage node holding it died)
    <= -900  RPC failure / master unreachable (marks the store unhealthy)

A full pool is also handled by Mooncake silently: at its high watermark it evicts old objects and
the put still succeeds, so every read must be ready to miss. A storage node that dies takes its
objects with it: reads of them fail (-800, counted as errors, store stays healthy) until the
master drops its segment (``client_ttl``), after which they are plain misses.

Restarting the master loses its index (all objects become misses); storage nodes remount their
segments and this client reconnects by itself, so the store recovers without a new setup.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from .base import MISS, WRONG_SIZE, HostBuffer, KVStore, Payload
from .mooncake_config import MooncakeStoreConfig, probe_tcp

__all__ = ["MooncakeStore"]

log = logging.getLogger(__name__)


_OK_EXISTS = -705
_NOT_FOUND = -704
_NO_SPACE = -200
_BUFFER_TOO_SMALL = -600
_RPC_FAILURE_MAX = -900  # codes <= this mean the master could not be reached


class MooncakeStore(KVStore):
    """Mooncake Store tier; see the module docstring for the failure handling.

    Construction connects once (fast failure when the master is down: the store then starts
    unhealthy and reconnects in the background after the back-off). Only configuration errors
    and a missing ``mooncake`` package raise.
    """

    zero_copy = True

    def __init__(self, config: MooncakeStoreConfig, *, connect: bool = True) -> None:
        """Raises:
            ImportError: the ``mooncake`` package is not installed.
        """
        from mooncake.store import MooncakeDistributedStore  # noqa: F401  (fail fast if missing)

        super().__init__()
        self.config = config
        self._client: Any = None
        self._healthy = False
        self._state_lock = threading.Lock()
        self._backoff = config.retry_backoff_s
        self._retry_at = 0.0
        self._reconnecting: threading.Thread | None = None
        self._staging: Any = None  # numpy uint8 array, registered once a client exists
        self._staging_lock = threading.Lock()
        self._failed_checks = 0
        self._largest_payload = 1 << 20  # sizes get_batch chunks; grows with what is seen
        #: Number of Mooncake clients set up so far (1 after a successful first connect).
        self.clients_created = 0
        if connect:
            self.setup()

    # ----------------------------------------------------------------- health
    @property
    def healthy(self) -> bool:
        """True while calls go to Mooncake; False while failures are being waited out."""
        return self._healthy and not self._closed

    def setup(self) -> bool:
        """Connect now (blocking at most ``probe_timeout_s + setup_timeout_s``); return success.

        With a client already set up this only checks that the master answers again.
        """
        if self._closed:
            return False
        ok = self._connect()
        with self._state_lock:
            if ok:
                self._healthy = True
                self._backoff = self.config.retry_backoff_s
            else:
                self._mark_unhealthy_locked()
        return ok

    def _connect(self) -> bool:
        host, port = self.config.master_host_port
        if not probe_tcp(host, port, self.config.probe_timeout_s):
            log.warning("Mooncake master %s unreachable", self.config.master_address)
            return False
        if self._client is not None:
            # The client reconnects to a restarted master by itself; check that it does, and
            # replace it after a few failed checks while the master is reachable.
            try:
                codes = self._client.batch_is_exist([self.config.key_prefix + "__probe__"])
                if codes and codes[0] >= 0:
                    self._failed_checks = 0
                    return True
            except Exception:  # noqa: BLE001 - any client failure means "not yet"
                pass
            self._failed_checks += 1
            if self._failed_checks < 3:
                return False
            old, self._client = self._client, None
            try:
                old.close()
            except Exception:  # noqa: BLE001
                pass
        self._failed_checks = 0
        client = self._setup_client()
        if client is None:
            return False
        if self._closed:  # closed while we were connecting
            client.close()
            return False
        self._client = client
        self.clients_created += 1
        return True

    def _setup_client(self) -> Any:
        """A new, set-up MooncakeDistributedStore with our buffers registered, or None."""
        from mooncake.store import MooncakeDistributedStore

        cfg = self.config
        if cfg.rpc_timeout_ms is not None:
            os.environ["MC_RPC_TIMEOUT_MS"] = str(cfg.rpc_timeout_ms)
        client = MooncakeDistributedStore()
        box: dict[str, Any] = {}
        abandoned = threading.Event()

        def run() -> None:
            try:
                box["rc"] = client.setup(
                    cfg.local_hostname, cfg.metadata_server, cfg.global_segment_bytes,
                    cfg.local_buffer_bytes, cfg.protocol, "", cfg.master_address,
                )
            except Exception as exc:  # noqa: BLE001 - reported below
                box["exc"] = exc
            if abandoned.is_set():  # finished after we gave up: release it
                try:
                    client.close()
                except Exception:  # noqa: BLE001
                    pass

        thread = threading.Thread(target=run, name="mooncake-setup", daemon=True)
        thread.start()
        thread.join(cfg.setup_timeout_s)
        if thread.is_alive():
            abandoned.set()
            log.warning("Mooncake setup timed out after %.1f s", cfg.setup_timeout_s)
            return None
        if box.get("rc") != 0:
            log.warning("Mooncake setup failed: %s", box.get("exc", f"rc={box.get('rc')}"))
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
            return None
        try:
            for hb in self._buffers:
                self._register_with(client, hb)
            if cfg.staging_bytes:
                self._ensure_staging()
                self._register_with(client, HostBuffer.of(self._staging))
        except RuntimeError as exc:
            log.warning("Mooncake buffer registration failed: %s", exc)
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
            return None
        return client

    def _ensure_staging(self) -> None:
        if self._staging is None:
            import numpy as np

            self._staging = np.empty(self.config.staging_bytes, dtype=np.uint8)

    @staticmethod
    def _register_with(client: Any, hb: HostBuffer) -> None:
        rc = client.register_buffer(hb.ptr, hb.nbytes)
        if rc != 0:
            raise RuntimeError(f"register_buffer({hb.nbytes} B) returned {rc}")

    def _mark_unhealthy_locked(self) -> None:
        if self._healthy:
            log.warning("Mooncake store marked unhealthy; retrying in %.1f s", self._backoff)
        self._healthy = False
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.config.max_backoff_s)

    def _mark_unhealthy(self) -> None:
        with self._state_lock:
            self._mark_unhealthy_locked()

    def _acquire(self) -> Any:
        """The client if healthy; otherwise None (maybe starting a background reconnect)."""
        if self._healthy and not self._closed:
            return self._client
        if self._closed:
            return None
        with self._state_lock:
            busy = self._reconnecting is not None and self._reconnecting.is_alive()
            if not busy and time.monotonic() >= self._retry_at:
                self._reconnecting = threading.Thread(
                    target=self.setup, name="mooncake-reconnect", daemon=True
                )
                self._reconnecting.start()
        return None

    def wait_healthy(self, timeout_s: float) -> bool:
        """Drive reconnect attempts until healthy or ``timeout_s`` passes (tests, startup)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._acquire() is not None:
                return True
            time.sleep(0.05)
        return self.healthy

    def _note_codes(self, codes: Sequence[int]) -> None:
        if any(c <= _RPC_FAILURE_MAX for c in codes):
            self._mark_unhealthy()

    def _key(self, key: bytes) -> str:
        return self.config.key_prefix + bytes(key).hex()

    # ----------------------------------------------------------- copying API
    def batch_exists(self, keys: Sequence[bytes]) -> list[bool]:
        client = self._acquire()
        if client is None:
            self._count(unavailable=len(keys))
            return [False] * len(keys)
        if not keys:
            return []
        try:
            codes = client.batch_is_exist([self._key(k) for k in keys])
        except Exception:  # noqa: BLE001 - never raise while serving
            log.exception("Mooncake batch_is_exist failed")
            self._mark_unhealthy()
            self._count(errors=len(keys))
            return [False] * len(keys)
        self._note_codes(codes)
        self._count(errors=sum(1 for c in codes if c < 0))
        return [c == 1 for c in codes]

    def batch_put(self, keys: Sequence[bytes], payloads: Sequence[Payload]) -> list[bool]:
        self._check_lengths(keys, payloads, "payloads")
        views = [memoryview(p).cast("B") for p in payloads]
        if any(v.nbytes == 0 for v in views):
            raise ValueError("payloads must not be empty")
        results: list[bool] = [False] * len(keys)
        client = self._acquire()
        if client is None:
            self._count(drops=len(keys), unavailable=len(keys))
            return results
        import numpy as np

        with self._staging_lock:
            staging = self._staging
            cap = 0 if staging is None else staging.nbytes
            i = 0
            while i < len(keys):
                if not self._healthy:  # an earlier chunk found the master gone: stop sending
                    rest = len(keys) - i
                    self._count(drops=rest, unavailable=rest)
                    break
                if views[i].nbytes > cap:  # too large to stage: one by one through the copy path
                    results[i] = self._put_one(client, keys[i], views[i])
                    i += 1
                    continue
                batch: list[int] = []
                offsets: list[int] = []
                used = 0
                while i < len(keys) and used + views[i].nbytes <= cap:
                    n = views[i].nbytes
                    staging[used : used + n] = np.frombuffer(views[i], dtype=np.uint8)
                    batch.append(i)
                    offsets.append(used)
                    used += n
                    i += 1
                ok = self._put_ptrs(
                    client, [keys[j] for j in batch],
                    [int(staging.ctypes.data) + o for o in offsets],
                    [views[j].nbytes for j in batch],
                )
                for j, good in zip(batch, ok):
                    results[j] = good
        return results

    def _put_one(self, client: Any, key: bytes, view: memoryview) -> bool:
        try:
            rc = client.put(self._key(key), view)
        except Exception:  # noqa: BLE001
            log.exception("Mooncake put failed")
            rc = _RPC_FAILURE_MAX
        return self._tally_puts([rc], [view.nbytes])[0]

    def _put_ptrs(
        self, client: Any, keys: Sequence[bytes], ptrs: list[int], sizes: list[int]
    ) -> list[bool]:
        try:
            codes = client.batch_put_from([self._key(k) for k in keys], ptrs, sizes)
        except Exception:  # noqa: BLE001
            log.exception("Mooncake batch_put_from failed")
            codes = [_RPC_FAILURE_MAX] * len(keys)
        return self._tally_puts(codes, sizes)

    def _tally_puts(self, codes: Sequence[int], sizes: Sequence[int]) -> list[bool]:
        ok = [c >= 0 or c == _OK_EXISTS for c in codes]
        if sizes:
            self._largest_payload = max(self._largest_payload, max(sizes))
        self._note_codes(codes)
        self._count(
            puts=sum(ok),
            put_bytes=sum(s for s, good in zip(sizes, ok) if good),
            drops=len(ok) - sum(ok),
            errors=sum(1 for c, good in zip(codes, ok) if not good and c != _NO_SPACE),
        )
        return ok

    def batch_get(
        self, keys: Sequence[bytes], expected_sizes: Sequence[int] | None = None
    ) -> list[bytes | None]:
        """Read payloads as bytes.

        With ``expected_sizes`` (the connector's case) the data moves through the registered
        staging buffer with ``batch_get_into`` (exact per-key codes, size check by Mooncake).
        Without, ``get_batch`` is used in chunks that fit Mooncake's local buffer (sized from the
        largest payload seen); it cannot tell a failure from a miss, so those count as misses.
        """
        if expected_sizes is not None:
            self._check_lengths(keys, expected_sizes, "expected_sizes")
        client = self._acquire()
        if client is None:
            self._count(gets=len(keys), misses=len(keys), unavailable=len(keys))
            return [None] * len(keys)
        if not keys:
            return []
        staging = self._staging
        if (expected_sizes is not None and staging is not None
                and max(expected_sizes) <= staging.nbytes):
            return self._get_via_staging(client, keys, list(expected_sizes))
        out: list[bytes | None] = []
        chunk = max(1, (self.config.local_buffer_bytes // 2) // self._largest_payload)
        for lo in range(0, len(keys), chunk):
            if not self._healthy:
                rest = len(keys) - lo
                self._count(gets=rest, misses=rest, unavailable=rest)
                out.extend([None] * rest)
                break
            sizes = None if expected_sizes is None else expected_sizes[lo : lo + chunk]
            out.extend(self._get_copying(client, keys[lo : lo + chunk], sizes))
        return out

    def _get_copying(
        self, client: Any, keys: Sequence[bytes], expected_sizes: Sequence[int] | None
    ) -> list[bytes | None]:
        try:
            values = client.get_batch([self._key(k) for k in keys])
        except Exception:  # noqa: BLE001
            log.exception("Mooncake get_batch failed")
            values = None
        if values is None or (not any(values) and not probe_tcp(
                *self.config.master_host_port, self.config.probe_timeout_s)):
            # get_batch reports failures as b"" too; an unreachable master explains them.
            self._mark_unhealthy()
            self._count(gets=len(keys), misses=len(keys), errors=len(keys))
            return [None] * len(keys)
        out: list[bytes | None] = []
        mismatches = 0
        for i, value in enumerate(values):
            if not value:  # b"" = missing (or failed: the copying API does not say which)
                out.append(None)
            elif expected_sizes is not None and len(value) != expected_sizes[i]:
                mismatches += 1
                out.append(None)
            else:
                out.append(bytes(value))
                self._largest_payload = max(self._largest_payload, len(value))
        hits = sum(v is not None for v in out)
        self._count(
            gets=len(keys), hits=hits, misses=len(keys) - hits, size_mismatches=mismatches,
            get_bytes=sum(len(v) for v in out if v is not None),
        )
        return out

    def _get_via_staging(
        self, client: Any, keys: Sequence[bytes], sizes: list[int]
    ) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)
        with self._staging_lock:
            staging = self._staging
            base = int(staging.ctypes.data)
            i = 0
            while i < len(keys):
                if not self._healthy:
                    rest = len(keys) - i
                    self._count(gets=rest, misses=rest, unavailable=rest)
                    break
                batch: list[int] = []
                offsets: list[int] = []
                used = 0
                while i < len(keys) and used + sizes[i] <= staging.nbytes:
                    batch.append(i)
                    offsets.append(used)
                    used += sizes[i]
                    i += 1
                got = self._read_ptrs(
                    client, [keys[j] for j in batch], [base + o for o in offsets],
                    [sizes[j] for j in batch],
                )
                for j, off, result in zip(batch, offsets, got):
                    if result == sizes[j]:
                        out[j] = staging[off : off + sizes[j]].tobytes()
        return out

    def _read_ptrs(
        self, client: Any, keys: Sequence[bytes], ptrs: list[int], sizes: Sequence[int]
    ) -> list[int]:
        """One ``batch_get_into``; classify and count each key: its size for a hit, else
        :data:`WRONG_SIZE` (stored with another size) or :data:`MISS`."""
        try:
            codes = client.batch_get_into([self._key(k) for k in keys], ptrs, list(sizes))
        except Exception:  # noqa: BLE001
            log.exception("Mooncake batch_get_into failed")
            codes = [_RPC_FAILURE_MAX] * len(keys)
        self._note_codes(codes)
        out = [size if code == size
               else WRONG_SIZE if code >= 0 or code == _BUFFER_TOO_SMALL
               else MISS for code, size in zip(codes, sizes)]
        hits = sum(1 for r, size in zip(out, sizes) if r == size)
        errors = sum(1 for c, r in zip(codes, out)
                     if r == MISS and c not in (_BUFFER_TOO_SMALL, _NOT_FOUND))
        self._count(
            gets=len(keys), hits=hits, misses=len(keys) - hits,
            size_mismatches=sum(1 for r in out if r == WRONG_SIZE), errors=errors,
            get_bytes=sum(s for s, r in zip(sizes, out) if r == s),
        )
        return out

    def remove(self, keys: Sequence[bytes]) -> int:
        client = self._acquire()
        if client is None or not keys:
            return 0
        try:
            codes = client.batch_remove([self._key(k) for k in keys], True)
        except Exception:  # noqa: BLE001
            log.exception("Mooncake batch_remove failed")
            self._mark_unhealthy()
            return 0
        self._note_codes(codes)
        removed = sum(1 for c in codes if c == 0)
        self._count(removes=removed)
        return removed

    # --------------------------------------------------------- zero-copy API
    def _register_native(self, buffer: HostBuffer) -> None:
        """Register with the current client; a later client re-registers every buffer.

        Raises:
            RuntimeError: Mooncake refused the registration (bad pointer / size).
        """
        client = self._client
        if client is not None:
            self._register_with(client, buffer)

    def batch_put_from(
        self,
        keys: Sequence[bytes],
        buffer: HostBuffer | Any,
        offsets: Sequence[int],
        sizes: Sequence[int],
    ) -> list[bool]:
        _, ptrs = self._resolve_regions(keys, buffer, offsets, sizes)
        client = self._acquire()
        if client is None:
            self._count(drops=len(keys), unavailable=len(keys))
            return [False] * len(keys)
        if not keys:
            return []
        return self._put_ptrs(client, keys, ptrs, list(sizes))

    def batch_get_into(
        self,
        keys: Sequence[bytes],
        buffer: HostBuffer | Any,
        offsets: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]:
        _, ptrs = self._resolve_regions(keys, buffer, offsets, sizes)
        client = self._acquire()
        if client is None:
            self._count(gets=len(keys), misses=len(keys), unavailable=len(keys))
            return [MISS] * len(keys)
        if not keys:
            return []
        return self._read_ptrs(client, keys, ptrs, sizes)

    # -------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Close the Mooncake client (its own segment, if any, leaves the pool). Idempotent."""
        if self._closed:
            return
        super().close()
        self._healthy = False
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                log.exception("Mooncake close failed")
