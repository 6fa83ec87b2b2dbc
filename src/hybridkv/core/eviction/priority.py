"""Priority + time to live per token range (the requests' :class:`RetentionConfig`).

Assumes the caller knows which prefixes matter (a system prompt, a tool schema, a shared
document) and says so per request; traffic without retention configs is ordered exactly like
LRU. The marks and how a block's priority follows from them are defined in
:mod:`hybridkv.core.retention_config`; this module only orders the blocks:

* lower priority is evicted first; within a priority, the block freed earliest (LRU);
* a mark whose TTL runs out drops the block to its next live mark (or the default priority),
  keeping its place in LRU order (its free time), not its expiry time.

Structure (every operation O(1) amortized, an expiry or its level move O(log n)):

* one FIFO per priority level (0..100) of ``(seq, block)`` entries, ``seq`` growing with every
  free, so each FIFO is in free order; a bit mask of the levels that may hold entries finds the
  lowest one in O(1);
* per level, a heap of entries *moved in* by an expiry (they carry their old ``seq``, so they
  merge into the level's LRU order by comparison with the FIFO's head);
* a heap of ``(expiry, seq, block)`` for held blocks whose current level lapses, processed
  lazily when victims are taken (order is only observed there);
* lazy deletion: an entry is live iff its block is held with that ``seq`` at that level; the
  structures are rebuilt when dead entries outnumber live ones.

Tail before prefix: a request frees a chain tail first (lower ``seq``), and by the marking rule
a prefix holds every mark its tail holds, so its level is never lower at any time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy
from hybridkv.core.retention_config import DEFAULT_PRIORITY, MAX_PRIORITY, RetentionMark

if TYPE_CHECKING:
    from hybridkv.core.rules import HitRule

_INF = math.inf


def _merge(marks: list[tuple[int, float]], p: int, e: float) -> None:
    """Add mark ``(p, e)`` to a block's Pareto list (priority descending, expiry ascending):
    drop what it dominates, skip it if it is dominated."""
    for q, f in marks:
        if q >= p and f >= e:
            return
    marks[:] = [(q, f) for q, f in marks if not (q <= p and f <= e)]
    marks.append((p, e))
    marks.sort(reverse=True)


@EVICTION_POLICIES.register("priority")
class PriorityPolicy(EvictionPolicy):
    """Evict the lowest live priority first, LRU within a priority (see the module docstring).

    Args:
        clock: seconds, non-decreasing (the simulator's virtual time; ``time.monotonic`` in
            the engine). Read when a request with a config releases blocks and when victims
            are taken while some mark can expire.
    """

    name = "priority"
    uses_retention = True
    __slots__ = ("clock", "marks", "seq_of", "level_of", "fifo", "moved", "expiry", "mask",
                 "_seq", "_entries")

    @classmethod
    def create(cls, rules: Sequence[HitRule], clock: Callable[[], float]) -> PriorityPolicy:
        """The manager's clock drives the TTLs."""
        return cls(clock)

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        self.clock = clock
        self.marks: dict[int, list[tuple[int, float]]] = {}   # block -> live-able marks
        self.seq_of: dict[int, int] = {}                       # held block -> its free seq
        self.level_of: dict[int, int] = {}                     # held block -> its level
        n = MAX_PRIORITY + 1
        self.fifo: list[deque[tuple[int, int]]] = [deque() for _ in range(n)]
        self.moved: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.expiry: list[tuple[float, int, int]] = []
        self.mask = 0
        self._seq = 0
        self._entries = 0                                      # level entries, live or dead

    def __len__(self) -> int:
        return len(self.seq_of)

    def __contains__(self, b: int) -> bool:
        return b in self.seq_of

    def __iter__(self) -> Iterator[int]:
        return iter(self.seq_of)

    # ---- marks --------------------------------------------------------------------------------
    def retain(self, blocks: Sequence[int], positions: Sequence[int],
               marks: Sequence[RetentionMark]) -> None:
        """A request with a retention config releases ``blocks`` (held, cached) at table
        ``positions`` of one group: each gets the ``marks`` whose ``num_blocks`` exceed its
        position, expiring ``ttl_s`` from now."""
        now = self.clock()
        timed = sorted(((m.num_blocks, m.priority, _INF if m.ttl_s is None else now + m.ttl_s)
                        for m in marks), reverse=True)            # reach descending
        fresh: dict[int, list[tuple[int, float]]] = {}           # count of marks -> their list
        table = self.marks
        for b, j in zip(blocks, positions):
            n = len(timed)
            while n and timed[n - 1][0] <= j:                     # the first n marks reach j
                n -= 1
            if not n:
                continue
            lst = table.get(b)
            if lst is None:                                       # the usual case: build once
                band = fresh.get(n)
                if band is None:
                    band = fresh[n] = []
                    for _, p, e in timed[:n]:
                        _merge(band, p, e)
                table[b] = band.copy()
            else:
                for _, p, e in timed[:n]:
                    _merge(lst, p, e)

    def level(self, b: int, now: float) -> tuple[int, float]:
        """Block ``b``'s priority at ``now`` and when it lapses (``inf``: never); prunes
        expired marks."""
        lst = self.marks.get(b)
        if lst:
            while lst and lst[0][1] <= now:         # expiry ascending: expired ones lead
                del lst[0]
            if lst:
                return lst[0]
            del self.marks[b]
        return DEFAULT_PRIORITY, _INF

    # ---- the seam ----------------------------------------------------------------------------
    def on_free(self, blocks: Sequence[int]) -> None:
        seq_of, level_of, fifo, marks = self.seq_of, self.level_of, self.fifo, self.marks
        s = self._seq
        now = None
        for b in blocks:
            s += 1
            if b in marks:
                if now is None:
                    now = self.clock()
                lv, e = self.level(b, now)
                if e != _INF:
                    heapq.heappush(self.expiry, (e, s, b))
            else:
                lv = DEFAULT_PRIORITY
            seq_of[b] = s
            level_of[b] = lv
            fifo[lv].append((s, b))
            self.mask |= 1 << lv
        self._entries += len(blocks)
        self._seq = s

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            del self.seq_of[b]
            del self.level_of[b]
            if self._entries > 2 * len(self.seq_of) + 64:
                self._rebuild()

    def _expire(self, now: float) -> None:
        """Move every held block whose level lapsed by ``now`` to its next level."""
        exp, seq_of, level_of = self.expiry, self.seq_of, self.level_of
        while exp and exp[0][0] <= now:
            _, s, b = heapq.heappop(exp)
            if seq_of.get(b) != s:
                continue                             # hit (or evicted) since
            lv, e = self.level(b, now)
            if lv != level_of[b]:
                level_of[b] = lv
                heapq.heappush(self.moved[lv], (s, b))
                self.mask |= 1 << lv
                self._entries += 1
            if e != _INF:
                heapq.heappush(exp, (e, s, b))

    def pop(self, n: int) -> list[int]:
        if self.expiry:
            self._expire(self.clock())
        seq_of, level_of, fifo, moved = self.seq_of, self.level_of, self.fifo, self.moved
        out: list[int] = []
        dead = 0
        while len(out) < n:
            mask = self.mask
            lv = (mask & -mask).bit_length() - 1
            f, m = fifo[lv], moved[lv]
            while f:                                 # drop dead entries at the heads
                s, b = f[0]
                if seq_of.get(b) == s and level_of[b] == lv:
                    break
                f.popleft()
                dead += 1
            while m:
                s, b = m[0]
                if seq_of.get(b) == s and level_of[b] == lv:
                    break
                heapq.heappop(m)
                dead += 1
            if not f and not m:
                self.mask = mask ^ (1 << lv)
                continue
            if m and (not f or m[0][0] < f[0][0]):
                _, b = heapq.heappop(m)
            else:
                _, b = f.popleft()
            del seq_of[b]
            del level_of[b]
            out.append(b)
        self._entries -= dead + len(out)
        return out

    def forget(self, blocks: Sequence[int]) -> None:
        marks = self.marks
        if marks:
            for b in blocks:
                marks.pop(b, None)

    def _live(self, entry: tuple[int, int], lv: int) -> bool:
        s, b = entry
        return self.seq_of.get(b) == s and self.level_of[b] == lv

    def _rebuild(self) -> None:
        live = self._live
        for lv in range(MAX_PRIORITY + 1):
            if self.mask >> lv & 1:
                self.fifo[lv] = deque(x for x in self.fifo[lv] if live(x, lv))
                m = [x for x in self.moved[lv] if live(x, lv)]
                heapq.heapify(m)
                self.moved[lv] = m
                if not self.fifo[lv] and not m:
                    self.mask &= ~(1 << lv)
        seq_of = self.seq_of
        self.expiry = [x for x in self.expiry if seq_of.get(x[2]) == x[1]]
        heapq.heapify(self.expiry)
        self._entries = len(seq_of)

    def check(self) -> None:
        live = 0
        count = 0
        for lv in range(MAX_PRIORITY + 1):
            entries = list(self.fifo[lv]) + self.moved[lv]
            if entries and not self.mask >> lv & 1:
                raise AssertionError(f"priority: level {lv} holds entries but its mask bit is clear")
            count += len(entries)
            live += sum(1 for x in entries if self._live(x, lv))
            seqs = [s for s, _ in self.fifo[lv]]
            if seqs != sorted(seqs):
                raise AssertionError(f"priority: level {lv}'s FIFO is not in free order")
        if live != len(self.seq_of):
            raise AssertionError(f"priority: {len(self.seq_of)} held blocks but {live} live entries")
        if count != self._entries:
            raise AssertionError(f"priority: counts {self._entries} entries, holds {count}")
        if self.seq_of.keys() != self.level_of.keys():
            raise AssertionError("priority: seq and level tables disagree")
        for b, lst in self.marks.items():
            if any(p1 <= p2 or e1 >= e2 for (p1, e1), (p2, e2) in zip(lst, lst[1:])):
                raise AssertionError(f"priority: block {b}'s marks are not a Pareto list: {lst}")
