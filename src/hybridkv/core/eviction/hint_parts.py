"""The hint layer's two data structures (:mod:`hybridkv.core.eviction.hint_layer`): the pins it
holds, by expiry (:class:`PinSet`), and a sampled shadow cache that counts what a way of
ranking would hit (:class:`Shadow`)."""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from typing import Generic, Hashable, Iterator, TypeVar

__all__ = ["sample_key", "HARD", "PREDICTED", "SOFT", "PinSet", "Shadow"]

INF = math.inf
#: A pin's kind (the second item of a pin record; a bool ``predicted`` reads as 0 or 1).
HARD, PREDICTED, SOFT = 0, 1, 2

_K = TypeVar("_K", bound=Hashable)


def sample_key(h: object) -> int:
    """A deterministic small integer of a block hash (bytes: its last byte): what the hint
    layer's shadows and the hit-point layer's class sample are drawn by."""
    return h[-1] if isinstance(h, (bytes, bytearray)) else hash(h) & 0xFF


class PinSet(Generic[_K]):
    """Pinned items (blocks, or a shadow's keys) with an expiry each. They lapse in expiry
    order; when the cache must break pins, soft ones go first (earliest expiry first), then
    *predicted* ones (a resume time: the expiry stands for the next use), latest expiry first
    (the farthest next use, as Belady would), then hard TTL pins, earliest expiry first (the one
    closest to lapsing anyway)."""

    __slots__ = ("items", "lapse", "order", "_seq")

    def __init__(self) -> None:
        self.items: dict[_K, tuple[float, int]] = {}       # item -> (expiry, seq)
        self.lapse: list[tuple[float, int, _K]] = []
        self.order: list[tuple[tuple[int, float], int, _K]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, x: object) -> bool:
        return x in self.items

    def __iter__(self) -> Iterator[_K]:
        return iter(self.items)

    def add(self, x: _K, expiry: float, kind: int) -> None:
        """Pin ``x`` until ``expiry``; ``kind``: ``HARD`` (False), ``PREDICTED`` (True) or
        ``SOFT``."""
        self._seq += 1
        s = self._seq
        self.items[x] = (expiry, s)
        heapq.heappush(self.lapse, (expiry, s, x))
        key = (-1, expiry) if kind == SOFT else (0, -expiry) if kind else (1, expiry)
        heapq.heappush(self.order, (key, s, x))

    def discard(self, x: _K) -> bool:
        if self.items.pop(x, None) is None:
            return False
        if len(self.lapse) > 2 * len(self.items) + 64:
            live = self._live
            self.lapse = [e for e in self.lapse if live(e)]
            self.order = [e for e in self.order if live(e)]
            heapq.heapify(self.lapse)
            heapq.heapify(self.order)
        return True

    def _live(self, entry: tuple[object, int, _K]) -> bool:
        got = self.items.get(entry[2])
        return got is not None and got[1] == entry[1]

    def next_expiry(self) -> float:
        """The earliest expiry of a live pin (``inf``: none)."""
        lapse = self.lapse
        while lapse and not self._live(lapse[0]):
            heapq.heappop(lapse)
        return lapse[0][0] if lapse else INF

    def pop_lapsed(self, now: float) -> list[_K]:
        """Remove and return the items whose pin ran out by ``now``, in expiry order."""
        out: list[_K] = []
        lapse = self.lapse
        while lapse and lapse[0][0] <= now:
            entry = heapq.heappop(lapse)
            if self._live(entry):
                del self.items[entry[2]]
                out.append(entry[2])
        return out

    def pop_break(self) -> _K:
        """Remove and return the pin to break first (the set is not empty)."""
        order = self.order
        while True:
            entry = heapq.heappop(order)
            if self._live(entry):
                del self.items[entry[2]]
                return entry[2]

    def check(self) -> None:
        for heap in (self.lapse, self.order):
            live = sum(1 for e in heap if self._live(e))
            if live != len(self.items):
                raise AssertionError(f"hint layer: {len(self.items)} pinned items but {live} live heap entries")


class Shadow:
    """A key-only cache of ``cap`` keys that demotes (``dead``) and/or pins (``pin``) as told,
    LRU otherwise; :meth:`serve` counts the keys of a batch it holds, then takes them in."""

    __slots__ = ("cap", "dead", "pin", "lru", "demoted", "pinned", "hits", "ins", "reused",
                 "ghost", "ghost_cap")

    def __init__(self, cap: int, dead: bool, pin: bool, ghosts: int = 0) -> None:
        self.cap = cap
        self.ghost: OrderedDict[object, int] = OrderedDict()   # evicted key -> its kind
        self.ghost_cap = ghosts * cap
        self.dead = dead
        self.pin = pin
        self.lru: OrderedDict[object, int] = OrderedDict()          # key -> its kind
        self.demoted: OrderedDict[object, int] = OrderedDict()
        self.pinned: PinSet[object] = PinSet()
        self.hits = 0.0
        self.ins = [0.0, 0.0, 0.0]    # keys taken in, and those of them hit, by kind (rest,
        self.reused = [0.0, 0.0, 0.0]  # hinted dead, pinned)

    def __len__(self) -> int:
        return len(self.lru) + len(self.demoted) + len(self.pinned)

    def demote(self, k: object) -> None:
        """Key ``k``, if held in the LRU part, is dead now (a demoting shadow moves it first)."""
        if self.dead:
            kind = self.lru.pop(k, None)
            if kind is not None:
                self.demoted[k] = kind

    def serve(self, batch: list[tuple[object, int, bool, float, int]], now: float) -> None:
        """``batch``: (key, kind, hinted dead, pin expiry or 0, predicted pin) per freed block,
        tail first; kind (what the hint test counts) 2: pinned, 1: hinted dead, 0: neither, -1:
        not a release's representative block (not counted in ``ins``)."""
        lru, demoted, pinned, ins, reused = self.lru, self.demoted, self.pinned, self.ins, self.reused
        for k, dead, is_dead, expiry, predicted in batch:
            was = lru.pop(k, None)
            if was is None:
                was = demoted.pop(k, None)
            if was is not None:
                self.hits += 1
                if was >= 0:
                    reused[was] += 1
            elif self.ghost_cap:
                was = self.ghost.pop(k, None)
                if was is not None and was >= 0:
                    reused[was] += 1
            elif pinned.discard(k):
                self.hits += 1
            if dead >= 0:
                ins[dead] += 1
            if self.pin and expiry > now:
                pinned.add(k, expiry, predicted)
            elif self.dead and is_dead:
                demoted[k] = dead
            else:
                lru[k] = dead
        for k in pinned.pop_lapsed(now):              # a lapsed pin goes first, as the layer's
            demoted[k] = -1
        over = len(self) - self.cap
        ghost = self.ghost if self.ghost_cap else None
        while over > 0 and demoted:
            k, kind = demoted.popitem(last=False)
            if ghost is not None:
                ghost[k] = kind
            over -= 1
        while over > 0 and lru:
            k, kind = lru.popitem(last=False)
            if ghost is not None:
                ghost[k] = kind
            over -= 1
        if ghost is not None:
            while len(ghost) > self.ghost_cap:
                ghost.popitem(last=False)
        while over > 0 and pinned:
            pinned.pop_break()
            over -= 1
