"""How to reach a Mooncake Store (:class:`MooncakeStoreConfig`) and whether its master answers
(:func:`probe_tcp`); the client is :mod:`hybridkv.connectors.stores.mooncake`."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from hybridkv.core.validation import check_int

__all__ = ["MooncakeStoreConfig", "probe_tcp"]


def probe_tcp(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout_s`` (then closed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class MooncakeStoreConfig:
    """How to reach a Mooncake Store.

    Attributes:
        master_address: ``host:port`` of ``mooncake_master``'s RPC service.
        local_hostname: the address this client's transfer engine advertises.
        protocol: transfer protocol (``"tcp"``; ``"rdma"`` needs devices).
        metadata_server: ``"P2PHANDSHAKE"`` (no etcd / HTTP metadata server).
        global_segment_bytes: RAM this process contributes to the pool (0 = pure client; objects
            placed in it die with this process).
        local_buffer_bytes: Mooncake's client-side staging buffer for the copying calls.
        staging_bytes: this wrapper's registered staging buffer for ``batch_put`` (payloads are
            copied into it and sent with one zero-copy batch; larger payloads go one by one).
        key_prefix: namespace prepended to every key.
        setup_timeout_s: longest wait for ``setup()`` (it blocks ~90 s on an unreachable master).
        probe_timeout_s: TCP connect timeout of the master probe.
        retry_backoff_s, max_backoff_s: first and largest delay before reconnecting.
        rpc_timeout_ms: bound on one master RPC (Mooncake's ``MC_RPC_TIMEOUT_MS``; its default
            is 30 s, which a hung master costs the first call). It is an environment variable
            read at client setup, so it is process-wide: the latest value set applies to every
            client set up afterwards. ``None`` leaves the environment alone.
    """

    master_address: str
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    metadata_server: str = "P2PHANDSHAKE"
    global_segment_bytes: int = 0
    local_buffer_bytes: int = 64 << 20
    staging_bytes: int = 32 << 20
    key_prefix: str = "hkv/"
    setup_timeout_s: float = 10.0
    probe_timeout_s: float = 1.0
    retry_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    rpc_timeout_ms: int | None = 5000

    def __post_init__(self) -> None:
        host, sep, port = self.master_address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"master_address must be 'host:port', got {self.master_address!r}")
        for name in ("global_segment_bytes", "local_buffer_bytes", "staging_bytes"):
            check_int(name, getattr(self, name), 0)
        for name in ("setup_timeout_s", "probe_timeout_s", "retry_backoff_s", "max_backoff_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        check_int("rpc_timeout_ms", self.rpc_timeout_ms, 1, optional=True)

    @property
    def master_host_port(self) -> tuple[str, int]:
        host, _, port = self.master_address.rpartition(":")
        return host, int(port)
