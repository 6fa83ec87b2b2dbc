"""Start a small Mooncake Store cluster (master + storage nodes) as local subprocesses.

Test infrastructure (tests, examples, benchmarks; never imported by production modules)::

    with loopback_netns(), MooncakeCluster(storage_bytes=[256 << 20]) as cluster:
        store = MooncakeStore(MooncakeStoreConfig(master_address=cluster.master_address))

Processes::

    mooncake_master   -rpc_address=127.0.0.1 -rpc_port=P  -metrics_host=127.0.0.1 -metrics_port=M
                      (no HTTP metadata server; clients use P2PHANDSHAKE)
    mooncake_client   one per storage node: holds `storage_bytes[i]` of RAM as a global segment
                      and mounts it at the master (-protocol=tcp -metadata_server=P2PHANDSHAKE)

The binaries are the ELF files shipped inside the ``mooncake`` Python package
(``mooncake-transfer-engine-non-cuda``). Every address is 127.0.0.1, but Mooncake's transfer
ports still listen on all interfaces: run the cluster inside :func:`hybridkv.testing.netns.loopback_netns`
unless the machine's other interfaces are trusted.

Readiness is observed through the master's Prometheus endpoint
(``master_total_capacity_bytes`` reaches the sum of the running nodes' segments). Storage nodes
remount their segments on their own when the master restarts; objects stored before the restart
are lost (the master keeps its index in memory).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hybridkv.connectors.stores.mooncake_config import probe_tcp
from hybridkv.core.validation import check_int

__all__ = ["MasterOptions", "MooncakeCluster", "find_mooncake_binary", "free_port"]

_HOST = "127.0.0.1"

# Every process a cluster started and has not reaped yet; killed if the interpreter exits first
# (the processes run in their own session, so they would otherwise outlive a crashed test run).
_LIVE: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
    _LIVE.clear()


def find_mooncake_binary(name: str) -> Path:
    """Path of a Mooncake executable (``mooncake_master``, ``mooncake_client``).

    Looks inside the installed ``mooncake`` package first, then on ``PATH``.

    Raises:
        FileNotFoundError: not installed (``pip install hybridkv[mooncake]``).
    """
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"{name} not found in the mooncake package or on PATH; install "
        "mooncake-transfer-engine-non-cuda (pip install 'hybridkv[mooncake]')"
    )


def free_port(host: str = _HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class MasterOptions:
    """How the cluster's ``mooncake_master`` runs.

    ``client_ttl_s``: seconds the master keeps a silent client (and its segment) alive (>= 1);
    ``eviction_high_watermark``: its ``-eviction_high_watermark_ratio`` if given (in (0, 1]);
    ``extra_args``: more ``-flag=value`` arguments; ``rpc_port``: its RPC port (0 picks a free
    one at first start; else 1..65535).
    """

    client_ttl_s: int = 10
    eviction_high_watermark: float | None = None
    extra_args: tuple[str, ...] = ()
    rpc_port: int = 0

    def __post_init__(self) -> None:
        check_int("client_ttl_s", self.client_ttl_s, 1)
        w = self.eviction_high_watermark
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w <= 1):
            raise ValueError(f"eviction_high_watermark must be None or in (0, 1], got {w!r}")
        check_int("rpc_port", self.rpc_port, 0)
        if self.rpc_port > 65535:
            raise ValueError(f"rpc_port must be 0 (pick a free one) or in [1, 65535], got {self.rpc_port}")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))


class MooncakeCluster:
    """A master and N storage nodes run as subprocesses on 127.0.0.1 ports picked at start.

    Every method that starts something waits until it is ready or raises ``RuntimeError`` with the
    tail of the process log. ``stop`` is idempotent and also runs on ``__exit__``.
    """

    def __init__(
        self,
        storage_bytes: Sequence[int] = (256 << 20,),
        master: MasterOptions | None = None,
        *,
        log_dir: str | Path | None = None,
        ready_timeout_s: float = 20.0,
    ) -> None:
        """Args:
            storage_bytes: one entry per storage node: the RAM it contributes, in bytes.
            master: how the master runs (:class:`MasterOptions`; None: its defaults).
            log_dir: where process logs go; a temporary directory (removed on stop) if None.
            ready_timeout_s: how long to wait for a process to become ready.

        Raises:
            ValueError: a storage size is not positive.
            FileNotFoundError: the Mooncake binaries are not installed.
        """
        if any(int(b) <= 0 for b in storage_bytes):
            raise ValueError(f"storage sizes must be positive, got {list(storage_bytes)}")
        master = MasterOptions() if master is None else master
        self.storage_bytes = [int(b) for b in storage_bytes]
        self.client_ttl_s = master.client_ttl_s
        self.eviction_high_watermark = master.eviction_high_watermark
        self.ready_timeout_s = ready_timeout_s
        self.extra_master_args = list(master.extra_args)
        self._master_bin = find_mooncake_binary("mooncake_master")
        self._client_bin = find_mooncake_binary("mooncake_client")
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir is not None else Path(
            tempfile.mkdtemp(prefix="hybridkv-mooncake-")
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.rpc_port = master.rpc_port
        self.metrics_port = 0
        self._master: subprocess.Popen[bytes] | None = None
        self._nodes: list[subprocess.Popen[bytes] | None] = [None] * len(self.storage_bytes)
        self._node_ports = [0] * len(self.storage_bytes)
        self._starts = 0

    # ------------------------------------------------------------- addresses
    @property
    def master_address(self) -> str:
        """``host:port`` of the master's RPC service (what clients connect to)."""
        return f"{_HOST}:{self.rpc_port}"

    @property
    def metrics_url(self) -> str:
        """The master's Prometheus endpoint."""
        return f"http://{_HOST}:{self.metrics_port}/metrics"

    @property
    def master_running(self) -> bool:
        return self._master is not None and self._master.poll() is None

    def node_running(self, index: int) -> bool:
        node = self._nodes[index]
        return node is not None and node.poll() is None

    # ------------------------------------------------------------- lifecycle
    def start(self) -> MooncakeCluster:
        """Start the master and every storage node; return self once all are ready."""
        try:
            self.start_master()
            for i in range(len(self.storage_bytes)):
                self.start_node(i, wait=False)
            self.wait_capacity(self.expected_capacity())
        except BaseException:
            self.stop()
            raise
        return self

    def start_master(self, wait: bool = True) -> None:
        """Start the master (on the same ports as before if it ran already)."""
        if self.master_running:
            return
        if not self.rpc_port:
            self.rpc_port = free_port()
        if not self.metrics_port:
            self.metrics_port = free_port()
        args = [
            str(self._master_bin),
            f"-rpc_address={_HOST}",
            f"-rpc_port={self.rpc_port}",
            f"-metrics_host={_HOST}",
            f"-metrics_port={self.metrics_port}",
            f"-client_ttl={self.client_ttl_s}",
            "-enable_http_metadata_server=false",
        ]
        if self.eviction_high_watermark is not None:
            args.append(f"-eviction_high_watermark_ratio={self.eviction_high_watermark}")
        args += self.extra_master_args
        self._master = self._spawn(args, "master")
        if wait:
            self._wait(lambda: probe_tcp(_HOST, self.rpc_port, 0.5) and self._metrics_ok(),
                       self._master, "master")

    def start_node(self, index: int, wait: bool = True) -> None:
        """Start storage node ``index`` (a fresh process: its previous objects are gone)."""
        if self.node_running(index):
            return
        if not self._node_ports[index]:
            self._node_ports[index] = free_port()
        args = [
            str(self._client_bin),
            f"-host={_HOST}",
            f"-port={self._node_ports[index]}",
            f"-global_segment_size={self.storage_bytes[index]}",
            f"-master_server_address={self.master_address}",
            "-metadata_server=P2PHANDSHAKE",
            "-protocol=tcp",
        ]
        self._nodes[index] = self._spawn(args, f"node{index}")
        if wait:
            self.wait_capacity(self.expected_capacity())

    def stop_master(self, kill: bool = False) -> None:
        """Stop the master (SIGTERM, or SIGKILL with ``kill=True``); nodes keep running."""
        self._master = self._terminate(self._master, kill)

    def kill_master(self) -> None:
        """SIGKILL the master, as a crash would."""
        self.stop_master(kill=True)

    def pause_master(self) -> None:
        """SIGSTOP the master: it keeps its sockets but answers nothing (a hung master)."""
        if self.master_running:
            assert self._master is not None
            self._master.send_signal(signal.SIGSTOP)

    def resume_master(self) -> None:
        """SIGCONT a paused master."""
        if self.master_running:
            assert self._master is not None
            self._master.send_signal(signal.SIGCONT)

    def restart_master(self, wait: bool = True) -> None:
        """Stop the master if running, start it again on the same port and, with ``wait``, wait
        until the running storage nodes have remounted their segments."""
        self.stop_master()
        self.start_master(wait=True)
        if wait:
            self.wait_capacity(self.expected_capacity())

    def stop_node(self, index: int, kill: bool = False) -> None:
        """Stop storage node ``index``; the objects it held are lost."""
        self._nodes[index] = self._terminate(self._nodes[index], kill)

    def stop(self) -> None:
        """Stop every process (nodes first) and remove the temporary log directory.

        The cluster can be started again (same ports); its objects are gone.
        """
        for i in range(len(self._nodes)):
            self.stop_node(i)
        self.stop_master()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> MooncakeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------- metrics
    def metrics(self) -> dict[str, float]:
        """The master's unlabelled Prometheus gauges and counters (empty dict if unreachable)."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=1.0) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, _, value = line.partition(" ")
                with contextlib.suppress(ValueError):
                    out[name] = float(value)
        return out

    def expected_capacity(self) -> int:
        """Sum of the segments of the storage nodes that are running."""
        return sum(b for i, b in enumerate(self.storage_bytes) if self.node_running(i))

    def wait_capacity(self, nbytes: int, timeout_s: float | None = None) -> None:
        """Wait until the master reports exactly ``nbytes`` of mounted capacity."""
        self._wait(
            lambda: self.metrics().get("master_total_capacity_bytes") == nbytes,
            self._master, f"master capacity {nbytes} B", timeout_s,
        )

    # ---------------------------------------------------------------- helpers
    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        self._starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.{self._starts}.log", "wb")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        _LIVE.add(proc)
        return proc

    @staticmethod
    def _terminate(
        proc: subprocess.Popen[bytes] | None, kill: bool
    ) -> None:
        if proc is None:
            return None
        _LIVE.discard(proc)
        if proc.poll() is not None:
            return None
        proc.send_signal(signal.SIGCONT)  # in case it was paused
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        return None

    def _wait(
        self,
        ready: Callable[[], bool],
        proc: subprocess.Popen[bytes] | None,
        what: str,
        timeout_s: float | None = None,
    ) -> None:
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        while time.monotonic() < deadline:
            if ready():
                return
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"Mooncake {what} not ready; logs:\n{self._log_tail()}")

    def _metrics_ok(self) -> bool:
        return "master_total_capacity_bytes" in self.metrics()

    def _log_tail(self, lines: int = 15) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)
