"""Glue between a manager and a publisher: one batch per engine step, as vLLM's scheduler does."""

from __future__ import annotations

import time
from typing import Callable, Protocol

from hybridkv.core.manager import KVCacheManager
from hybridkv.events.wire import EventBatch, WireMapper


class BatchSink(Protocol):
    def publish(self, batch: EventBatch) -> None: ...


class KVEventStream:
    """After each step, :meth:`flush` drains the manager's events and publishes them as one
    :class:`EventBatch` (nothing is published for a step without events).

    Args:
        kv: a manager built with ``enable_events=True``.
        sink: where batches go (a :class:`~hybridkv.events.publisher.ZmqEventPublisher`, or any
            object with ``publish(batch)``).
        clock: the batch timestamp source (wall time by default; the simulator passes its clock).
    """

    __slots__ = ("kv", "sink", "mapper", "clock", "batches", "events")

    def __init__(self, kv: KVCacheManager, sink: BatchSink,
                 clock: Callable[[], float] = time.time) -> None:
        if not kv.enable_events:
            raise ValueError("KVEventStream needs a KVCacheManager built with enable_events=True")
        self.kv = kv
        self.sink = sink
        self.mapper = WireMapper(kv.config)
        self.clock = clock
        self.batches = 0
        self.events = 0

    def flush(self, ts: float | None = None) -> int:
        """Publish the events recorded since the last flush; returns how many there were."""
        events = self.kv.take_events()
        if not events:
            return 0
        self.sink.publish(self.mapper.batch(events, self.clock() if ts is None else ts))
        self.batches += 1
        self.events += len(events)
        return len(events)


class AttachedKVEvents:
    """A stream flushed by an engine's step hook, and the publisher it may own."""

    __slots__ = ("stream", "publisher")

    def __init__(self, stream: KVEventStream, publisher: object | None) -> None:
        self.stream = stream
        self.publisher = publisher  # started here, so shut down by :meth:`close`

    @property
    def published(self) -> int:
        """Batches the owned publisher sent (or the batches handed to a foreign sink)."""
        return getattr(self.publisher, "published", self.stream.batches)

    def close(self) -> None:
        self.stream.flush()
        if self.publisher is not None:
            self.publisher.shutdown()  # type: ignore[attr-defined]
            self.publisher = None


def attach_kv_events(kv: KVCacheManager, step_hooks: list, kv_events: object) -> AttachedKVEvents:
    """Publish ``kv``'s events after every step: ``kv_events`` is a ``KVEventsConfig`` or an
    endpoint string (a :class:`ZmqEventPublisher` is started) or an object with ``publish``."""
    from hybridkv.events.publisher import KVEventsConfig, ZmqEventPublisher
    owned = None
    if isinstance(kv_events, str):
        kv_events = KVEventsConfig(endpoint=kv_events)
    if isinstance(kv_events, KVEventsConfig):
        owned = sink = ZmqEventPublisher(kv_events)
    elif callable(getattr(kv_events, "publish", None)):
        sink = kv_events  # type: ignore[assignment]
    else:
        raise ValueError(f"kv_events must be a KVEventsConfig, an endpoint string or an object "
                         f"with publish(batch), got {kv_events!r}")
    stream = KVEventStream(kv, sink)  # type: ignore[arg-type]
    step_hooks.append(lambda: stream.flush())
    return AttachedKVEvents(stream, owned)
