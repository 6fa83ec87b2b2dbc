"""Learned value by age: hit density per chain class (after EVA, Beckmann & Sanchez, HPCA 2017,
and LHD, Beckmann et al., NSDI 2018), learned online.

Assumes traffic whose reuse *timing* is regular enough to learn: a conversation comes back after
a think time, so a block that was just freed is unlikely to be read in the next few requests,
one of a middle age is the likeliest, and one older than most think times is unlikely again.
LRU keeps exactly the wrong ones under such a "dead time" (the newest). This policy learns, from
what it sees, how many reuses a block of a given *age* (clock time since it was last freed) and
*class* still has ahead per unit of space-time it will hold, and evicts the lowest.

Clock: the number of blocks freed to the policy so far (one unit = one block of new cache
demand). Ages are counted in buckets of ``W = max(1, capacity // WIDTH_DIV)`` clock units,
``AGES`` of them (older blocks share the last bucket): the horizon is ``AGES / WIDTH_DIV`` = 8
times the cache.

Class of a block: set when it is freed, for the whole batch freed together (a request's chain,
tail first): the reuse count of the deepest block of the batch that was ever reused (a hit, or
its content recomputed while remembered as a ghost), bucketed 0 / 1 / 2 / 3-7 / 8+. A
conversation's next turn reuses its previous turn's last block once, so its chain, new tail
included, lands in class 1; a first turn only reuses the shared system prompt (reused by
everyone: class 8+). Classes are labels the statistics tell apart; nothing here hard-codes which
one is valuable.

Learning (survival statistics, uncensored up to the horizon): per class and age bucket, ``E``
counts the blocks that entered that age still waiting for their next reuse (held, or evicted
and remembered as a *ghost*: hash, class, free time, reuse count) and ``H`` the reuses at that
age (a hit on a free cached block, or a ghost's content computed and freed again). The reuse
probability of a bucket is ``H / E``; from it, for a block of age ``a``, the expected reuses
until its next one and the buckets of space it holds until then follow by the usual backward
recursion (the open-ended last bucket keeps its probability for ever), and the value is their
ratio: reuses per unit of space-time. A class with fewer than ``MIN_EVENTS`` entries at an age
uses the counts pooled over all classes there; counts halve once per horizon, so the curves
follow drifting traffic.

**Ties fall back to LRU**: equal values (and missing statistics) are broken oldest bucket first,
so before it has learned anything it evicts in LRU order by bucket. It is *not* guaranteed to
match LRU's hit rate once it has learned (see BENCHMARKS.md, "Eviction policies").

Order and cost: every (class, bucket) is a FIFO in free order, so a chain freed in one batch
leaves tail first. The queues (at most ``CLASSES x (AGES + 1)``) are ranked by value once per
clock bucket and victims come from the best-ranked non-empty queue through a cursor, so each
operation is O(1) amortized. A prefix re-freed later by another request sits in a younger
bucket than the tails it was freed with before; if younger buckets are worth less, that prefix
can leave before those tails (a soft order, like S3-FIFO's ghost re-admission).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Sequence

from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy, PolicyPool

#: Age buckets (the last one holds every older block).
AGES = 32
#: Bucket width: the cache's capacity in blocks over this (the horizon is ``AGES / WIDTH_DIV``
#: times the cache).
WIDTH_DIV = 4
#: Entries (blocks that reached an age) a class needs there before its own rate is used.
MIN_EVENTS = 128
#: Chain classes: bucket of the deepest reused block's reuse count (0, 1, 2, 3-7, 8+).
CLASSES = 5
_CLASS_OF_HITS = (0, 1, 2, 3, 3, 3, 3, 3)
#: Ghost entries kept at most (each is a hash and three ints; also at most one horizon's worth).
MAX_GHOSTS = 1 << 21
_OLD = -1   # epoch key of the queue holding blocks older than the last bucket


def chain_class(hits: int) -> int:
    """Class of a batch whose deepest reused block was reused ``hits`` times."""
    return _CLASS_OF_HITS[hits] if hits < len(_CLASS_OF_HITS) else CLASSES - 1


@EVICTION_POLICIES.register("eva")
class EVAPolicy(EvictionPolicy):
    """See the module docstring. ``ages``, ``width`` and ``min_events`` override the bucket
    count, the bucket width and the events a curve needs (tests use small ones); the width
    defaults to the pool's capacity over ``WIDTH_DIV``, read at :meth:`attach`."""

    name = "eva"
    __slots__ = ("ages", "width", "clock", "epoch", "queues", "where", "hits", "ghost",
                 "hit_n", "exp_n", "ghost_groups", "value", "ranking", "rank_of", "cursor",
                 "_next_decay", "_width_arg", "_dirty", "min_events")

    def __init__(self, ages: int = AGES, width: int | None = None,
                 min_events: float = MIN_EVENTS) -> None:
        super().__init__()
        if not isinstance(ages, int) or ages < 2:
            raise ValueError(f"ages must be an integer >= 2, got {ages!r}")
        if width is not None and (not isinstance(width, int) or width < 1):
            raise ValueError(f"width must be a positive integer or None, got {width!r}")
        if not min_events > 0:
            raise ValueError(f"min_events must be > 0, got {min_events!r}")
        self.ages = ages
        self.min_events = min_events
        self._width_arg = width
        self.width = width or 1
        self.clock = 0                    # blocks freed so far
        self.epoch = 0                    # clock // width
        # (class, epoch or _OLD) -> blocks in free order
        self.queues: dict[tuple[int, int], OrderedDict[int, None]] = {}
        self.where: dict[int, tuple[int, int]] = {}      # held block -> its queue key
        self.hits: dict[int, int] = {}                   # block -> hits since its content
        # evicted hash -> (class, epoch, reuses); and how many ghosts each (class, epoch) has
        self.ghost: OrderedDict[object, tuple[int, int, int]] = OrderedDict()
        self.ghost_groups: dict[tuple[int, int], int] = {}
        self.hit_n = [[0.0] * ages for _ in range(CLASSES)]   # reuses per class and age bucket
        self.exp_n = [[0.0] * ages for _ in range(CLASSES)]   # blocks that entered that age
        self.value = [[0.0] * ages for _ in range(CLASSES)]
        self.ranking: list[tuple[int, int]] = []
        self.rank_of: dict[tuple[int, int], int] = {}
        self.cursor = 0
        self._next_decay = 0
        self._dirty = True

    def attach(self, pool: PolicyPool) -> None:
        super().attach(pool)
        if self._width_arg is None:
            self.width = max(1, (pool.num_blocks - 1) // WIDTH_DIV)
        self._next_decay = self.width * self.ages

    # ---- container protocol -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.where)

    def __contains__(self, b: int) -> bool:
        return b in self.where

    def __iter__(self) -> Iterator[int]:
        return iter(self.where)

    # ---- events -----------------------------------------------------------------------------
    def _age(self, e: int) -> int:
        return self.ages - 1 if e == _OLD else min(self.ages - 1, self.epoch - e)

    def on_free(self, blocks: Sequence[int]) -> None:
        if not blocks:
            return
        hits = self.hits
        ghost, bh = self.ghost, self.pool.block_hash
        if ghost:
            for b in blocks:
                g = ghost.pop(bh[b], None)
                if g is not None:                  # evicted content computed again: a reuse
                    hits[b] = g[2] + 1
                    if self._unghost(g):
                        self.hit_n[g[0]][self.epoch - g[1]] += 1
        c = self._batch_class(blocks)
        key = (c, self.epoch)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = OrderedDict()
        r = self.rank_of.get(key)
        if r is None:                              # not ranked (new, or empty when ranked)
            self._dirty = True
        elif r < self.cursor:
            self.cursor = r
        where = self.where
        for b in blocks:
            q[b] = None
            where[b] = key
        self.exp_n[c][0] += len(blocks)
        self.clock += len(blocks)
        if self.clock // self.width != self.epoch:
            self._advance()

    def _batch_class(self, blocks: Sequence[int]) -> int:
        """The class of a batch freed together: its deepest reused block's reuse count."""
        hits = self.hits
        deepest = 0
        for b in blocks:                           # tail first: the first reused one is the deepest
            deepest = hits.get(b, 0)
            if deepest:
                break
        return chain_class(deepest)

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            key = self.where.pop(b)
            del self.queues[key][b]
            self.hit_n[key[0]][self._age(key[1])] += 1
        self.hits[b] = self.hits.get(b, 0) + 1

    def forget(self, blocks: Sequence[int]) -> None:
        hits = self.hits
        for b in blocks:
            hits.pop(b, None)

    # ---- eviction ---------------------------------------------------------------------------
    def pop(self, n: int) -> list[int]:
        if self._dirty:
            self._rank()
        out: list[int] = []
        queues, ranking, where = self.queues, self.ranking, self.where
        i = self.cursor
        while len(out) < n:
            key = ranking[i]
            q = queues[key]
            if not q:
                i += 1
                continue
            b, _ = q.popitem(last=False)
            del where[b]
            self._remember(b, key)
            out.append(b)
        self.cursor = i
        self._trim_ghosts()
        return out

    def discard(self, b: int) -> None:
        """Block ``b`` (held) is evicted by someone else's choice: drop it, remember its ghost."""
        key = self.where.pop(b)
        del self.queues[key][b]
        self._remember(b, key)
        self._trim_ghosts()

    def _remember(self, b: int, key: tuple[int, int]) -> None:
        """Record evicted block ``b`` (from queue ``key``) as a ghost of its content."""
        h = self.pool.block_hash[b]
        if h is not None:
            gk = (key[0], key[1] if key[1] != _OLD else self.epoch - self.ages + 1)
            self.ghost[h] = (gk[0], gk[1], self.hits.get(b, 0))
            self.ghost_groups[gk] = self.ghost_groups.get(gk, 0) + 1

    def _trim_ghosts(self) -> None:
        ghost, cap = self.ghost, self._ghost_cap()
        while len(ghost) > cap:
            self._unghost(ghost.popitem(last=False)[1])

    def _ghost_cap(self) -> int:
        return min(MAX_GHOSTS, max(64, self.ages * self.width))

    def _unghost(self, g: tuple[int, int, int]) -> bool:
        """Take ghost ``g`` out of its group; False if the group already left the horizon."""
        gk = (g[0], g[1])
        left = self.ghost_groups.get(gk)
        if left is None:
            return False
        if left > 1:
            self.ghost_groups[gk] = left - 1
        else:
            del self.ghost_groups[gk]
        return True

    def _advance(self) -> None:
        """The clock entered a new bucket: every pending block (held or ghost) enters the next
        age; age the queues, drop ghosts past the horizon, decay, re-value, re-rank."""
        new = self.clock // self.width
        A = self.ages
        exp_n, queues, groups = self.exp_n, self.queues, self.ghost_groups
        for step in range(max(self.epoch + 1, new - A), new + 1):
            for (c, e), q in queues.items():
                if q:
                    exp_n[c][A - 1 if e == _OLD else min(A - 1, step - e)] += len(q)
            for gk in list(groups):
                age = step - gk[1]
                if age >= A:
                    del groups[gk]                 # not reused within the horizon
                else:
                    exp_n[gk[0]][age] += groups[gk]
        self.epoch = new
        oldest = new - A + 1                       # epochs at or below this are in the last bucket
        for key in [k for k in queues if k[1] != _OLD and k[1] <= oldest]:
            q = queues.pop(key)
            okey = (key[0], _OLD)
            old = queues.setdefault(okey, OrderedDict())
            where = self.where
            for b in q:
                old[b] = None
                where[b] = okey
        for key in [k for k, q in queues.items() if not q]:
            del queues[key]
        if self.clock >= self._next_decay:
            self._next_decay = self.clock + self.width * A
            for rows in (self.hit_n, self.exp_n):
                for row in rows:
                    for a in range(A):
                        row[a] *= 0.5
        self._values()
        self._dirty = True

    def _values(self) -> None:
        """Recompute ``value[class][age]`` from the decayed counts (see the module docstring)."""
        A, m = self.ages, self.min_events
        pooled_h = [sum(row[a] for row in self.hit_n) for a in range(A)]
        pooled_e = [sum(row[a] for row in self.exp_n) for a in range(A)]
        for c in range(CLASSES):
            hazard = []
            for a in range(A):
                h, e = self.hit_n[c][a], self.exp_n[c][a]
                if e < m:
                    h, e = pooled_h[a], pooled_e[a]
                hazard.append(min(1.0, h / e) if e >= m else None)
            self.value[c] = self._density(hazard)

    @staticmethod
    def _density(hazard: list[float | None]) -> list[float]:
        """Per age bucket ``a``: reuses ahead of a block of age ``a`` (until its next reuse) per
        bucket of space it holds until then, from the per-bucket reuse probabilities (None:
        unknown, counted as 0; the open-ended last bucket keeps its probability for ever)."""
        A = len(hazard)
        if all(h is None for h in hazard):
            return [0.0] * A
        out = [0.0] * A
        h = hazard[-1] or 0.0
        reuse, space = (1.0, 1.0 / h) if h > 0 else (0.0, float(A))
        out[-1] = reuse / space
        for a in range(A - 2, -1, -1):
            h = hazard[a] or 0.0
            reuse = h + (1 - h) * reuse
            space = 1.0 + (1 - h) * space
            out[a] = reuse / space
        return out

    def _rank(self) -> None:
        """Order the non-empty queues by value, oldest bucket first among equals."""
        value = self.value
        keys = [k for k, q in self.queues.items() if q]
        keys.sort(key=lambda k: (value[k[0]][self._age(k[1])], -self._age(k[1]), k[0]))
        self.ranking = keys
        self.rank_of = {k: i for i, k in enumerate(keys)}
        self.cursor = 0
        self._dirty = False

    def check(self) -> None:
        count = 0
        for key, q in self.queues.items():
            for b in q:
                if self.where.get(b) != key:
                    raise AssertionError(f"eva: block {b} in queue {key} but recorded in {self.where.get(b)}")
                count += 1
        if count != len(self.where):
            raise AssertionError(f"eva: {len(self.where)} held blocks but {count} queued")
        if len(self.ghost) > self._ghost_cap():
            raise AssertionError("eva: ghost table over its capacity")
