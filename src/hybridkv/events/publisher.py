"""ZMQ publisher of KV event batches, wire-compatible with vLLM 0.33's ``ZmqEventPublisher``.

Sockets and frames (what a vLLM consumer — Dynamo, llm-d, Mooncake Conductor — expects)::

    PUB (an XPUB here)  ->  (topic, seq: 8-byte big-endian, payload)        one frame set per batch
    ROUTER (replay)     <-  (identity, b"", start_seq: 8-byte big-endian)    from a DEALER/REQ
                        ->  (identity, b"", topic, seq, payload)  for every buffered seq >= start
                        ->  (identity, b"", b"", -1 as 8-byte signed big-endian, b"")   end marker

Endpoint rule (vLLM's): an endpoint containing ``*`` or ``::``, and every ``ipc://`` or
``inproc://`` endpoint, is bound; any other is connected to (the subscriber binds). hybridkv
also binds ``tcp://0.0.0.0:PORT`` (connecting to 0.0.0.0 means nothing useful). The replay
endpoint is always bound. Defaults are vLLM's: ``tcp://*:5557``, 10,000 buffered batches for
replay, HWM 100,000, topic ``""``.

Delivery contract:

* ``publish`` never blocks and never raises because of a subscriber: batches go to a queue that
  a background thread drains (``max_queue_size`` batches; beyond it a batch is dropped and
  counted in ``dropped``, and a warning is logged once). A PUB socket drops rather than blocks
  when a subscriber is slow or gone, so a subscriber that disconnects mid-run costs nothing.
* **No loss for a subscriber already listening.** ZMQ's PUB drops messages sent before a
  subscription has reached it (the "slow joiner"). The socket is an XPUB, which reports each
  new subscription; before sending its first batch the thread waits until one subscription has
  arrived or ``subscriber_wait_s`` has passed. So a subscriber that subscribed before the first
  publish gets every batch from seq 0. One that joins later asks the replay socket.
* ``shutdown`` publishes everything queued (up to ``drain_timeout_s``), then closes the sockets
  with ``linger_s`` so frames already queued in ZMQ still reach connected subscribers.
* ``published`` counts batches sent, ``seq`` numbers start at 0 and grow by one per batch.
"""

from __future__ import annotations

import errno
import logging
import queue
import re
import threading
import time
from collections import deque
from dataclasses import dataclass

import zmq

from hybridkv.core.validation import check_int
from hybridkv.events.wire import EventBatch, encode_batch

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
DEFAULT_ENDPOINT = "tcp://*:5557"
_TCP = re.compile(r"^tcp://(?P<host>\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-:]+?):(?P<port>\d+)$")
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """Where and how to publish KV events (vLLM's ``KVEventsConfig`` fields and defaults).

    Attributes:
        endpoint: PUB endpoint; bound or connected by the endpoint rule (module docstring).
        replay_endpoint: ROUTER endpoint for replay requests (bound), or None for no replay.
        buffer_steps: batches kept for replay.
        hwm: the PUB socket's send high-water mark.
        max_queue_size: batches queued for the background thread before new ones are dropped.
        topic: the first frame of every message.
        data_parallel_rank: stamped on batches without one; endpoint ports are offset by it
            (vLLM's rule: ``tcp://h:5557`` -> ``tcp://h:5557+rank``, ``inproc://x`` -> ``x_dpN``).
        subscriber_wait_s: how long the first batch waits for a subscription (see above).
        drain_timeout_s: how long ``shutdown`` may take to publish what is queued.
        linger_s: how long closing the sockets may take to flush queued frames.
    """

    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    data_parallel_rank: int = 0
    subscriber_wait_s: float = 1.0
    drain_timeout_s: float = 10.0
    linger_s: float = 1.0

    def __post_init__(self) -> None:
        check_endpoint(self.endpoint, "endpoint")
        if self.replay_endpoint is not None:
            check_endpoint(self.replay_endpoint, "replay_endpoint")
            if not is_bind_endpoint(self.replay_endpoint):
                raise ValueError(
                    f"replay_endpoint {self.replay_endpoint!r} must be one this process can bind "
                    "(tcp://*:PORT, tcp://0.0.0.0:PORT, ipc://PATH or inproc://NAME)")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            check_int(f"KVEventsConfig.{name}", getattr(self, name), 1)
        check_int("KVEventsConfig.data_parallel_rank", self.data_parallel_rank, 0)
        for name in ("subscriber_wait_s", "drain_timeout_s", "linger_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"KVEventsConfig.{name} must be a number >= 0, got {v!r}")


def check_endpoint(endpoint: object, what: str = "endpoint") -> str:
    """Validate a ZMQ endpoint: ``tcp://HOST:PORT`` (PORT 0-65535, HOST ``*`` to bind all),
    ``ipc://PATH`` or ``inproc://NAME``; raise ValueError naming the bad value otherwise."""
    if not isinstance(endpoint, str):
        raise ValueError(f"KV events {what} must be a string, got {endpoint!r}")
    if endpoint.startswith(("ipc://", "inproc://")):
        if endpoint.split("://", 1)[1]:
            return endpoint
    else:
        m = _TCP.match(endpoint)
        if m and int(m["port"]) <= 65535:
            return endpoint
    raise ValueError(f"malformed KV events {what} {endpoint!r}: expected tcp://HOST:PORT "
                     "(PORT 0-65535; HOST * binds every interface), ipc://PATH or inproc://NAME")


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule (``*``, ``::``, ipc, inproc bind), plus ``0.0.0.0``."""
    return ("*" in endpoint or "::" in endpoint or "//0.0.0.0:" in endpoint
            or endpoint.startswith(("ipc://", "inproc://")))


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """vLLM's data-parallel rule: tcp ports move up by ``rank`` (port 0 stays 0), inproc names
    get ``_dp{rank}``; ipc paths get ``_dp{rank}`` too (vLLM 0.33 rejects ipc with a rank)."""
    if endpoint is None or rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + rank}"
    raise ValueError(f"malformed KV events endpoint {endpoint!r}")


class ZmqEventPublisher:
    """Publishes :class:`EventBatch` es on ZMQ from a background thread (contract above).

    Raises ValueError at construction for a malformed endpoint or one that cannot be bound
    (address in use, permission), naming the endpoint.
    """

    def __init__(self, config: KVEventsConfig | None = None, **overrides) -> None:
        if config is None:
            config = KVEventsConfig(**overrides)
        elif overrides:
            raise TypeError("pass either a KVEventsConfig or keyword options, not both")
        self.config = config
        rank = config.data_parallel_rank
        self.endpoint = offset_endpoint(config.endpoint, rank)
        self.replay_endpoint = offset_endpoint(config.replay_endpoint, rank)
        self._topic = config.topic.encode()
        self._queue: queue.Queue[EventBatch] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._stop = threading.Event()
        self._closed = False
        self.published = 0
        self.dropped = 0
        self.replays_served = 0
        self.subscribed = False
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._replay = None
        try:
            self._pub.setsockopt(zmq.SNDHWM, config.hwm)
            self._attach(self._pub, self.endpoint, is_bind_endpoint(self.endpoint))
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # A full replay plus its end marker must fit in the send queue.
                self._replay.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
                self._attach(self._replay, self.replay_endpoint, True)
        except BaseException:
            self._close_sockets(0)
            self._ctx.term()
            raise
        self._thread = threading.Thread(target=self._run, name="hybridkv-kv-events", daemon=True)
        self._thread.start()

    @staticmethod
    def _attach(sock: zmq.Socket, endpoint: str, bind: bool) -> None:
        try:
            if bind:
                sock.bind(endpoint)
            else:
                sock.connect(endpoint)
        except zmq.ZMQError as exc:
            what = "bind" if bind else "connect to"
            hint = " (address already in use)" if exc.errno == errno.EADDRINUSE else ""
            raise ValueError(f"cannot {what} KV events endpoint {endpoint!r}{hint}: {exc}") from None

    # ---- the engine side ------------------------------------------------------------------------
    def publish(self, batch: EventBatch) -> None:
        """Queue one batch (never blocks). Raises RuntimeError after :meth:`shutdown`."""
        if self._closed:
            raise RuntimeError("KV events publisher is shut down")
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.config.data_parallel_rank
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            if not self.dropped:
                logger.warning("KV events queue full (%d batches): dropping batches",
                               self.config.max_queue_size)
            self.dropped += 1

    def shutdown(self) -> None:
        """Publish what is queued, flush, close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(self.config.drain_timeout_s + self.config.subscriber_wait_s + 1.0)
        if self._thread.is_alive():
            logger.warning("KV events publisher did not drain within %.1f s; %d batches unsent",
                           self.config.drain_timeout_s, self._queue.qsize())
            return  # the daemon thread still owns the sockets; never block the engine on it
        self._ctx.term()

    def __enter__(self) -> "ZmqEventPublisher":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- the background thread ------------------------------------------------------------------
    def _run(self) -> None:
        cfg = self.config
        gate_deadline = time.monotonic() + cfg.subscriber_wait_s
        drain_deadline = None
        poller = zmq.Poller()
        poller.register(self._pub, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            while True:
                gate_open = self.subscribed or time.monotonic() >= gate_deadline
                ready = dict(poller.poll(0 if gate_open else _POLL_S * 1000))
                if self._pub in ready:
                    self._read_subscriptions()
                if self._replay is not None and self._replay in ready:
                    self._serve_replay()
                if not gate_open:
                    continue
                if self._stop.is_set():
                    if drain_deadline is None:
                        drain_deadline = time.monotonic() + cfg.drain_timeout_s
                    elif time.monotonic() > drain_deadline:
                        break
                try:
                    batch = self._queue.get(timeout=_POLL_S)
                except queue.Empty:
                    if self._stop.is_set():
                        break
                    continue
                try:
                    payload = encode_batch(batch)
                    seq = self.published
                    self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                    self._buffer.append((seq, payload))
                    self.published += 1
                except Exception:  # never let one bad batch kill the thread
                    logger.exception("KV events: failed to publish a batch")
        finally:
            self._close_sockets(int(cfg.linger_s * 1000))

    def _read_subscriptions(self) -> None:
        while True:
            try:
                msg = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] == b"\x01":
                self.subscribed = True

    def _serve_replay(self) -> None:
        sock = self._replay
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("KV events: ignoring a malformed replay request of %d frames",
                               len(frames))
                continue
            ident = frames[0]
            start = int.from_bytes(frames[2], "big", signed=True)
            for seq, payload in self._buffer:
                if seq >= start:
                    sock.send_multipart((ident, b"", self._topic, seq.to_bytes(8, "big"), payload))
            sock.send_multipart((ident, b"", b"", END_SEQ, b""))
            self.replays_served += 1

    def _close_sockets(self, linger_ms: int) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=linger_ms)
