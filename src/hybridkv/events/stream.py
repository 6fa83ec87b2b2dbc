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
