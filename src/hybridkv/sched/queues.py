"""Scheduling policies: one waiting-queue type per policy, behind one small interface.

A policy decides two orders, and only those:

* which waiting request is admitted next (:meth:`WaitingQueue.peek` / :meth:`WaitingQueue.pop`);
* which running request is preempted first when the pool is full (:meth:`WaitingQueue.victim`).

=========  ======================================  ==========================================
policy     admission order                          preemption victim
=========  ======================================  ==========================================
fcfs       arrival order; a preempted request       the last running request
           goes back to the front
priority   lowest ``priority``, then earliest        the highest ``priority`` (then latest
           ``arrival_time``, then submission order   arrival, latest submission)
=========  ======================================  ==========================================

The scheduler stamps each request with a submission number (``EngineRequest._seq``) before
pushing it, which makes every priority key unique. Iterating a queue yields its requests in
admission order without changing it; ``len`` is the number waiting.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator, Sequence

from hybridkv.sched.request import EngineRequest

__all__ = ["FCFSQueue", "POLICIES", "PriorityQueue", "WaitingQueue", "make_waiting_queue"]


class WaitingQueue(ABC):
    """The waiting requests of a scheduler, in the order its policy admits them."""

    policy: str = ""

    @abstractmethod
    def push(self, req: EngineRequest) -> None:
        """Queue a new request."""

    @abstractmethod
    def push_preempted(self, req: EngineRequest) -> None:
        """Queue a request that was just preempted (it resumes by recompute)."""

    @abstractmethod
    def peek(self) -> EngineRequest | None:
        """The request to admit next, or None when empty; the queue is unchanged."""

    @abstractmethod
    def pop(self) -> EngineRequest:
        """Remove and return the request :meth:`peek` names. Raises IndexError when empty."""

    @abstractmethod
    def remove(self, req: EngineRequest) -> None:
        """Remove ``req`` (an abort). Raises ValueError if it is not queued."""

    @abstractmethod
    def __iter__(self) -> Iterator[EngineRequest]:
        """The waiting requests in admission order."""

    @abstractmethod
    def __len__(self) -> int: ...

    def __bool__(self) -> bool:
        return len(self) > 0

    def __contains__(self, req: object) -> bool:
        return any(r is req for r in self)

    @abstractmethod
    def victim(self, running: Sequence[EngineRequest]) -> EngineRequest:
        """The request of ``running`` (non-empty, in running order) to preempt first.
        (Implementations may be static methods; an abstract static method does not compile.)"""


class FCFSQueue(WaitingQueue):
    """First come, first served; preempted requests resume first."""

    policy = "fcfs"

    def __init__(self) -> None:
        self._q: deque[EngineRequest] = deque()

    def push(self, req: EngineRequest) -> None:
        self._q.append(req)

    def push_preempted(self, req: EngineRequest) -> None:
        self._q.appendleft(req)

    def peek(self) -> EngineRequest | None:
        return self._q[0] if self._q else None

    def pop(self) -> EngineRequest:
        return self._q.popleft()

    def remove(self, req: EngineRequest) -> None:
        self._q.remove(req)

    def __iter__(self) -> Iterator[EngineRequest]:
        return iter(list(self._q))

    def __len__(self) -> int:
        return len(self._q)

    @staticmethod
    def victim(running: Sequence[EngineRequest]) -> EngineRequest:
        return running[-1]


def _key(req: EngineRequest) -> tuple[int, float, int]:
    return req.priority, req.arrival_time, req._seq


class PriorityQueue(WaitingQueue):
    """Lowest ``priority`` first (ties: earlier arrival, then earlier submission), a binary heap.

    A preempted request goes back by its key like any other (its priority does not change).
    """

    policy = "priority"

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, EngineRequest]] = []

    def push(self, req: EngineRequest) -> None:
        heapq.heappush(self._heap, (*_key(req), req))

    push_preempted = push

    def peek(self) -> EngineRequest | None:
        return self._heap[0][3] if self._heap else None

    def pop(self) -> EngineRequest:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: EngineRequest) -> None:
        n = len(self._heap)
        self._heap = [e for e in self._heap if e[3] is not req]
        if len(self._heap) == n:
            raise ValueError(f"request {req.request_id!r} is not waiting")
        heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[EngineRequest]:
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))

    def __len__(self) -> int:
        return len(self._heap)

    @staticmethod
    def victim(running: Sequence[EngineRequest]) -> EngineRequest:
        return max(running, key=_key)


_QUEUES: dict[str, type[WaitingQueue]] = {q.policy: q for q in (FCFSQueue, PriorityQueue)}
POLICIES = tuple(_QUEUES)


def make_waiting_queue(policy: str) -> WaitingQueue:
    """The empty waiting queue of ``policy`` (one of :data:`POLICIES`)."""
    try:
        return _QUEUES[policy]()
    except KeyError:
        raise ValueError(f"unknown scheduling policy {policy!r}; valid: {', '.join(POLICIES)}") from None
