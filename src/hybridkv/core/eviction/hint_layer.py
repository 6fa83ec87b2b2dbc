"""The hint layer: application hints in front of any eviction policy.

A manager that takes hints (``CacheOptions(hints=True)``) puts this layer between the
pool and its policy (``lru`` becomes the exact-LRU object of :mod:`.lru`). Requests' hints
arrive as retention marks (:mod:`hybridkv.core.hints`: a pin is a mark above the default
priority with a TTL, an ending session a mark below it), and the layer splits the cached free
blocks into three regions, evicted in this order:

1. **demoted**: blocks of an ending session (FIFO in free order, so a chain leaves tail first);
2. **the policy's**: every other block, in the inner policy's own order;
3. **pinned**: blocks with a live pin. A pin whose TTL runs out moves its block to region 1
   (its time is up, as in a TTL prompt cache). Pins never make the cache refuse work: when regions 1 and 2 are
   empty a victim comes from here and is counted (``pins_broken``): first soft pins (the
   least retained: earliest expiry first), then pins that stand for a predicted return (a
   resume time, :data:`~hybridkv.core.hints.RESUME_PRIORITY`), latest first (the farthest next
   use), then hard TTL pins, earliest expiry first.

**Hard and soft pins.** A hard pin (:data:`~hybridkv.core.hints.PIN_PRIORITY`) lasts its TTL
from the release that set it; only another pinning release extends it. A soft pin
(:data:`~hybridkv.core.hints.SOFT_PIN_PRIORITY`, SGLang's ``retention_seconds``) remembers its
retention time for as long as the block keeps its content, and *every* release of the block
(any request that hit it, hinted or not) extends it to that long from now (refresh on hit), so
it decays only after that long without a use; it is broken before any other pin.

**Whose blocks an end demotes.** Every release in a hinted pool tells the layer which *owner*
released each block (the hint's session, else the request itself): a block released by two
owners is *shared* for as long as it keeps its content. An ending session demotes only the
blocks it owns alone, so a system prompt other sessions use is never demoted by one end. The
latest release decides whether a block is demoted (a session that comes back after its "last"
turn un-demotes what it re-reads); pins accumulate (the latest expiry wins), as retention
marks do. **A session moves on**: when a session's request is freed, the blocks its previous
release (of that group) held that this one does not, still its own alone (an answer the next
turn did not re-read, a partial block), are dead to it and demoted like an end's.

**Hints are advice: the layer tests them.** Beside the real cache run three *shadow caches*
(after ``adaptive``'s): key-only LRU caches of the pool's capacity that take every freed batch,
count the blocks of it they still hold (what they would have hit) and take it in; one ignores
hints, one demotes what the hints say is dead, one pins what they pin. The layer honours
demotions while (1) the hints are informative: in the plain shadow (hits and, past its reach,
its remembered evicted keys), releases hinted dead are reused at most ``DEAD_RATIO`` times as
often as the others, judged once ``MIN_EVENTS`` reuses were seen or enough hinted releases
that ``MIN_EXPECTED`` of them would have been reused at the others' rate, and (2) they pay:
the demoting shadow hits more than the plain one by ``MARGIN`` (relative) and ``MIN_LEAD``
blocks; pins while pinned blocks are reused at
least ``PIN_GAIN`` times as often as the others and the pinning shadow leads likewise. A
release is judged by its first block its owner owns alone (the blocks after it share its fate;
shared blocks say nothing about a session, and a tail of output nobody reads is not pinned) and
by its own hint (not by pins earlier releases left on its blocks). The counts halve every ``DECAY_CAPACITIES``
capacities of freed blocks, so a change in the hints' quality is followed. So hints that carry
no information (a coin flip: an LRU cache of the dead-time kind can gain even from those, a
policy that already keeps returning chains loses), and right-but-useless ones (a cache that
keeps everything anyway, where a wrong "last turn" costs a hit and a right one gains nothing),
are ignored; useful ones are followed after a warm-up of about a capacity (from then on the
free blocks hinted dead during it go first too). The shadows see a sample of the blocks (by
hash: about ``SAMPLED`` of a pool's capacity, at that share of the capacity), so their cost is
bounded. BENCHMARKS.md, "Application hints", measures the layer under right, noisy and random
hints.

**Under a hit-point layer** (:mod:`.hit_points`, which tells the layer the hit points' share
of the blocks they need, :meth:`HintLayer.scale_capacity`) the units are hit points, and the
plain shadow models the pool only once fitted: every eighth of its capacity its capacity moves
(by at most ``FIT_STEP``) towards the one at which it hits as often as the pool (a pool hit:
a sampled release of a block hit since its last release; the hit-point layer also serves the
shadows the places of dead hit points a request computed again, :meth:`HintLayer.returned`,
which are the pool's misses). The demoting shadow cannot model a demotion (a dead hit point
frees its whole chain, a shadow key one slot), so demotions are *tried*: while the hints are
informative the layer honours them for ``TRIAL_CAPACITIES`` shadow capacities and goes on
while the pool hits at least ``1 - MARGIN`` of the plain shadow's hits less ``min_lead`` (the
shadow, fitted before the trial, keeps its capacity during it); a failed trial waits
``COOLDOWN_CAPACITIES`` capacities (a demoting shadow's lead restarts one sooner).

**Forced** (``HintLayer(..., force=True)``, ``CacheOptions(hints="force")``): both kinds are
followed from the first release and the shadows do not run (the hints are known to be right,
or the point is what they could give).

Cost: a few dictionary operations per freed block on top of the inner policy's, and the
shadows' on the sampled blocks.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Iterator, Sequence

from hybridkv.core.eviction.base import EvictionPolicy, PolicyPool
from hybridkv.core.eviction.hint_parts import HARD, PREDICTED, SOFT, PinSet, Shadow, sample_key
from hybridkv.core.hints import RESUME_PRIORITY, SOFT_PIN_PRIORITY, HintStats
from hybridkv.core.retention_config import DEFAULT_PRIORITY, RetentionMark

#: A hint kind is honoured while its shadow leads the plain one by this share of its hits ...
MARGIN = 0.05
#: ... and by at least this many (sampled) blocks (of the pool's: a block this layer sees that
#: stands for ``1 / share`` of them, :meth:`HintLayer.scale_capacity`, counts for that many).
MIN_LEAD = 8
#: Demotions are honoured only while, in the shadow that ignores hints, blocks hinted dead are
#: reused at most this share of the others' rate (the hints tell dead from live) ...
DEAD_RATIO = 0.5
#: Pins are honoured only while pinned blocks are reused at least this many times as often ...
PIN_GAIN = 1.5
#: ... both measured on at least this many sampled releases of each kind, with this many reuses
#: among the two kinds compared, or enough hinted releases that, if the hints said nothing
#: (reused as often as the others), ``MIN_EXPECTED`` of them would have been reused.
MIN_SAMPLES = 64
MIN_EVENTS = 32
MIN_EXPECTED = 16
#: The plain shadow remembers this many capacities of evicted keys, so a reuse counts for the
#: informativeness test well past the cache's own reach (conversations return late).
GHOST_CAPACITIES = 16
#: The shadows' hit counts halve every this many capacities of (sampled) blocks freed.
DECAY_CAPACITIES = 8
#: The layer remembers the latest release of at most this many sessions per pool block.
LAST_SESSIONS = 4
#: Under a hit-point layer demotions are tried for this many shadow capacities of sampled
#: blocks freed at a time ...
TRIAL_CAPACITIES = 1
#: ... and after a failed trial not again for this many.
COOLDOWN_CAPACITIES = 8
#: Under a hit-point layer the shadows' capacity is fitted every this share of it ...
FIT_EVERY = 8
#: ... by at most this factor ...
FIT_STEP = 1.25
#: ... and stays at least this share of the one the hit points' share gives.
MIN_FIT = 1.0 / 16
#: About this many blocks of a pool's capacity are sampled (the modulus is a power of two).
SAMPLED = 4096

_SHARED = object()      # owner of a block released by more than one owner
_INF = math.inf
_NO_PIN = (-_INF, False)


class HintLayer(EvictionPolicy):
    """The hint regions over ``inner`` (see the module docstring).

    Args:
        inner: the policy that orders the blocks no hint speaks for.
        clock: seconds, non-decreasing, for the pins' TTLs.
        force: follow every hint, untested (no shadow caches run).
    """

    name = "hint-layer"
    __slots__ = ("inner", "clock", "owner", "dead", "pin_until", "fresh_pin", "reps", "demoted", "pinned",
                 "shadows", "honour", "mask", "freed", "_decay_every", "_counts", "last", "force",
                 "soft_ttl", "min_lead", "share", "fit", "touched", "real", "_fit_since", "win", "cool")

    def __init__(self, inner: EvictionPolicy, clock: Callable[[], float], force: bool = False) -> None:
        super().__init__()
        if not isinstance(inner, EvictionPolicy):
            raise ValueError(f"inner must be an EvictionPolicy, got {inner!r}")
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        if not isinstance(force, bool):
            raise ValueError(f"force must be True or False, got {force!r}")
        self.force = force
        self.inner = inner
        self.clock = clock
        self.owner: dict[int, object] = {}          # block -> owner (or _SHARED) since its content
        self.dead: set[int] = set()                 # blocks an ending session demotes
        # block -> (latest pin expiry, that pin's kind: HARD, PREDICTED or SOFT)
        self.pin_until: dict[int, tuple[float, int]] = {}
        self.soft_ttl: dict[int, float] = {}         # block -> its soft retention time (s)
        self.fresh_pin: set[int] = set()            # blocks whose latest release pinned them
        self.reps: set[int] = set()                 # a release's first block its owner owns
        self.last: dict[object, Sequence[int]] = {}  # (session, group) -> its latest release
        self.demoted: OrderedDict[int, None] = OrderedDict()
        self.pinned: PinSet[int] = PinSet()       # free pinned blocks
        self.shadows: tuple[Shadow, Shadow, Shadow] = (Shadow(1, False, False),
                                                          Shadow(1, True, False), Shadow(1, False, True))
        self.honour = [force, force]                # demotions, pins
        self.mask = 0
        self.freed = 0                              # sampled blocks freed since the last decay
        self.min_lead = float(MIN_LEAD)             # MIN_LEAD in the blocks this layer sees
        self._decay_every = 1
        self.share = 0.0                            # told by scale_capacity (0: not scaled)
        self.fit = 1.0                              # the shadows' capacity over the share's
        self.touched: set[int] = set()              # blocks hit since their last release
        self.real = 0.0                             # sampled releases of blocks hit (decayed)
        self._fit_since = 0
        self.win = [0.0, 0.0, 0.0]                  # a trial's sampled blocks freed, pool hits, plain shadow's
        self.cool = 0.0                             # sampled blocks to free before the next trial
        # releases, demoted, pinned, ignored demotions, ignored pins, pins broken, pins lapsed,
        # soft refreshes
        self._counts = [0] * 8

    # ---- setup ---------------------------------------------------------------------------------
    def attach(self, pool: PolicyPool) -> None:
        super().attach(pool)
        self.inner.attach(pool)
        cap = max(1, pool.num_blocks - 1)
        m = 1
        while m * SAMPLED < cap and m < 256:
            m *= 2
        self.mask = m - 1
        scap = max(1, cap // m)
        self.shadows = (Shadow(scap, False, False, GHOST_CAPACITIES), Shadow(scap, True, False),
                        Shadow(scap, False, True))
        self._decay_every = DECAY_CAPACITIES * scap

    def scale_capacity(self, share: float) -> None:
        """The blocks this layer sees are ``share`` of what the pool holds (a hit-point layer
        outside passes only its hit points' anchors, and tells the share of them among the
        blocks they need): the shadows, which model the pool with the blocks this layer sees,
        keep that share of its capacity (times the fit; unchanged while demotions are
        honoured: see the module docstring), sampled as a pool of that capacity would be (and
        decay after that share of blocks), and the lead they must show is ``MIN_LEAD`` pool
        blocks' worth (at least one block this layer sees)."""
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self.share = share
        if not self.honour[0]:          # (honouring, the plain shadow stays the fitted model)
            self._resize(min(1.0, share * self.fit))
        self.min_lead = max(1.0, MIN_LEAD * share)

    def _resize(self, share: float) -> None:
        cap = max(1, round((self.pool.num_blocks - 1) * share))
        m = 1
        while m * SAMPLED < cap and m < 256:
            m *= 2
        self.mask = m - 1
        scap = max(1, cap // m)
        now = self.clock()
        for shadow in self.shadows:
            if shadow.ghost_cap:
                shadow.ghost_cap = GHOST_CAPACITIES * scap
            shadow.cap = scap
            shadow.serve([], now)                      # (trims a shadow over its new capacity)
        self._decay_every = DECAY_CAPACITIES * scap

    @property
    def uses_retention(self) -> bool:     # type: ignore[override]  # per instance: the inner's
        """The inner policy's: retention configs are its business, hints the layer's."""
        return self.inner.uses_retention

    def retain(self, blocks: Sequence[int], positions: Sequence[int],
               marks: Sequence[RetentionMark]) -> None:
        self.inner.retain(blocks, positions, marks)

    # ---- container protocol --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.demoted) + len(self.pinned) + len(self.inner)

    def __contains__(self, b: int) -> bool:
        return b in self.demoted or b in self.pinned or b in self.inner

    def __iter__(self) -> Iterator[int]:
        yield from self.demoted
        yield from self.pinned
        yield from self.inner

    # ---- hints ---------------------------------------------------------------------------------
    def hint(self, blocks: Sequence[int], positions: Sequence[int], marks: Sequence[RetentionMark],
             owner: object, track: object = None) -> None:
        """``owner`` is about to release ``blocks`` (held, cached; table ``positions`` of one
        group) with these hint ``marks`` (empty for a request without a hint): record the
        owner, demote or un-demote each block, extend its pin. ``track`` (a session's request
        freed whole: its session and group): the blocks the session's previous release of
        that group left behind, still its own alone, are demoted (the session moved on)."""
        own, dead, pin_until, fresh, reps = self.owner, self.dead, self.pin_until, self.fresh_pin, self.reps
        if track is not None:
            self._moved_on(track, blocks, owner, marks)
        rep_found = False
        demote_reach = 0
        pins: list[tuple[int, float, int, float]] = []
        if marks:
            now = None
            for m in marks:
                if m.priority < DEFAULT_PRIORITY:
                    demote_reach = max(demote_reach, m.num_blocks)
                elif m.priority > DEFAULT_PRIORITY:
                    if now is None:
                        now = self.clock()
                    kind = (SOFT if m.priority == SOFT_PIN_PRIORITY else
                            PREDICTED if m.priority == RESUME_PRIORITY else HARD)
                    ttl = _INF if m.ttl_s is None else m.ttl_s
                    pins.append((m.num_blocks, now + ttl, kind, ttl if kind == SOFT else 0.0))
            self._counts[0] += 1
        for b, j in zip(blocks, positions):
            o = own.get(b)
            if o is None:
                own[b] = owner
                private = True
            elif o is _SHARED:
                private = False
            elif o == owner:
                private = True
            else:
                own[b] = _SHARED
                private = False
            if private and not rep_found:
                reps.add(b)
                rep_found = True
            else:
                reps.discard(b)
            if private and j < demote_reach:
                dead.add(b)
            else:
                dead.discard(b)
            pinned_now = False
            for reach, expiry, kind, soft in pins:
                if j < reach:
                    pinned_now = True
                    if expiry > pin_until.get(b, _NO_PIN)[0]:
                        pin_until[b] = (expiry, kind)
                    if soft > self.soft_ttl.get(b, 0.0):
                        self.soft_ttl[b] = soft
            if pinned_now:
                fresh.add(b)
            else:
                fresh.discard(b)

    def _moved_on(self, track: object, blocks: Sequence[int], owner: object,
                  marks: Sequence[RetentionMark]) -> None:
        """The session's previous release (of this group) left blocks this one does not hold
        again: while they keep the content the session alone released, they are dead to it
        (demoted at once when demotions are honoured and the block is free in the policy's
        region). Remembers this release's blocks (for at most ``LAST_SESSIONS`` sessions per
        block of the pool); forgets the session when it ends."""
        last = self.last
        prev = last.pop(track, None)
        if not any(m.priority < DEFAULT_PRIORITY for m in marks):    # an end forgets the session
            last[track] = blocks
            if len(last) > LAST_SESSIONS * self.pool.num_blocks:   # the least recently seen goes
                del last[next(iter(last))]
        if not prev:
            return
        own, dead, inner = self.owner, self.dead, self.inner
        cur = set(blocks)
        honour = self.honour[0]
        bh, mask = self.pool.block_hash, self.mask
        demoting = self.shadows[1]
        for b in prev:
            if b in cur or own.get(b) != owner or b in dead:
                continue
            dead.add(b)
            h = bh[b]
            if h is not None and not sample_key(h) & mask:
                demoting.demote(h)
            if b in self.pinned:
                continue
            if honour and b in inner:
                inner.on_hit(b, True)
                self.demoted[b] = None
                self._counts[1] += 1

    # ---- the seam ------------------------------------------------------------------------------
    def on_free(self, blocks: Sequence[int]) -> None:
        pin_until, dead, honour = self.pin_until, self.dead, self.honour
        bh, mask = self.pool.block_hash, self.mask
        counts = self._counts
        batch: list[int] = []
        sample: list[tuple[object, int, bool, float, int]] = []
        own = self.owner
        soft_ttl = self.soft_ttl
        touched = self.touched
        now = None
        for b in blocks:
            was_hit = False
            if touched:
                was_hit = b in touched
                if was_hit:
                    touched.discard(b)
            if soft_ttl:
                ttl = soft_ttl.get(b)
                if ttl is not None:                    # soft: refreshed by every release
                    if now is None:
                        now = self.clock()
                    cur = pin_until.get(b, _NO_PIN)
                    if now + ttl > cur[0]:
                        pin_until[b] = (now + ttl, SOFT)
                        if b not in self.fresh_pin:
                            counts[7] += 1
            pin = pin_until.get(b)
            if pin is not None:
                if now is None:
                    now = self.clock()
                if pin[0] <= now:
                    del pin_until[b]
                    pin = None
            is_dead = b in dead
            h = bh[b]
            if not sample_key(h) & mask:
                if was_hit:
                    self.real += 1
                    self.win[1] += 1
                # the test judges a release by its first own block (its tail may be output
                # no one reads, which a pin does not cover) and by this release's hint (pins
                # accumulate over releases: a live pin says how active a session is)
                kind = ((2 if b in self.fresh_pin else 1 if is_dead else 0) if b in self.reps
                        else -1)
                sample.append((h, kind, is_dead, 0.0, False) if pin is None
                              else (h, kind, is_dead, pin[0], pin[1]))
            if pin is not None:
                if honour[1]:
                    self.pinned.add(b, pin[0], pin[1])
                    counts[2] += 1
                    continue
                counts[4] += 1
            if is_dead:
                if honour[0]:
                    self.demoted[b] = None
                    counts[1] += 1
                    continue
                counts[3] += 1
            batch.append(b)
        if batch:
            self.inner.on_free(batch)
        if sample:
            self._test(sample, now)

    def returned(self, blocks: Sequence[int]) -> None:
        """A hit-point layer outside saw ``blocks`` (held, cached) released again, each the
        place of a hit point that died before: the request wanted it back. The shadows are
        served them (a shadow that kept the hit point hits it), the policy is not told."""
        if self.force:
            return
        bh, mask = self.pool.block_hash, self.mask
        sample: list[tuple[object, int, bool, float, int]] = [
            (h, -1, False, 0.0, 0) for h in (bh[b] for b in blocks) if not sample_key(h) & mask]
        if sample:
            self._test(sample, None)

    def on_hit(self, b: int, held: bool) -> None:
        if self.share:
            self.touched.add(b)
        if held:
            if b in self.demoted:
                del self.demoted[b]
            elif not self.pinned.discard(b):
                self.inner.on_hit(b, True)
                return
        self.inner.on_hit(b, False)

    def pop(self, n: int) -> list[int]:
        pinned = self.pinned
        if pinned and pinned.next_expiry() <= self.clock():
            self._lapse(self.clock())
        out: list[int] = []
        demoted = self.demoted
        while demoted and len(out) < n:
            out.append(demoted.popitem(last=False)[0])
        k = min(n - len(out), len(self.inner))
        if k:
            out += self.inner.pop(k)
        while len(out) < n:                    # nothing else is free: break a pin
            out.append(pinned.pop_break())
            self._counts[5] += 1
        return out

    def forget(self, blocks: Sequence[int]) -> None:
        own, dead, pin_until, fresh, reps = self.owner, self.dead, self.pin_until, self.fresh_pin, self.reps
        soft_ttl = self.soft_ttl
        if own or pin_until or soft_ttl:
            for b in blocks:
                soft_ttl.pop(b, None)
                own.pop(b, None)
                dead.discard(b)
                pin_until.pop(b, None)
                fresh.discard(b)
                reps.discard(b)
        if self.touched:
            self.touched.difference_update(blocks)
        self.inner.forget(blocks)

    # ---- pins ----------------------------------------------------------------------------------
    def _lapse(self, now: float) -> None:
        """Move every pinned block whose pin ran out by ``now`` to the evict-first region (a
        pin that lapsed is content whose time is up, as in a TTL prompt cache)."""
        demoted = self.demoted
        for b in self.pinned.pop_lapsed(now):
            self.pin_until.pop(b, None)
            self._counts[6] += 1
            demoted[b] = None

    # ---- the test of the hints -----------------------------------------------------------------
    def _test(self, sample: list[tuple[object, int, bool, float, int]], now: float | None) -> None:
        """Serve a freed batch's sampled blocks to the shadows; decay; decide what to honour."""
        if self.force:
            return
        plain, demoting, pinning = self.shadows
        if now is None:
            now = self.clock() if pinning.pinned else 0.0
        before = plain.hits
        for shadow in self.shadows:
            shadow.serve(sample, now)
        self.freed += len(sample)
        if self.share and not self.honour[0]:
            self._fit(len(sample))
        if self.freed >= self._decay_every:
            self.freed = 0
            self.real *= 0.5
            for shadow in self.shadows:
                shadow.hits *= 0.5
                for lst in (shadow.ins, shadow.reused):
                    for i in range(3):
                        lst[i] *= 0.5
        base = plain.hits * (1.0 + MARGIN) + self.min_lead
        ins, reused, least = plain.ins, plain.reused, MIN_SAMPLES
        tells_dead = tells_live = False
        if ins[0] >= least:
            rest = reused[0] / ins[0]
            tells_dead = (ins[1] >= least and reused[1] / ins[1] <= DEAD_RATIO * rest
                          and (reused[0] + reused[1] >= MIN_EVENTS or rest * ins[1] >= MIN_EXPECTED))
            tells_live = (ins[2] >= least and reused[2] / ins[2] >= PIN_GAIN * rest
                          and (reused[0] + reused[2] >= MIN_EVENTS or rest * ins[2] >= MIN_EXPECTED))
        if self.share:
            pays = self._trial(tells_dead, len(sample), plain.hits - before)
        else:
            pays = demoting.hits > base
        honour = [tells_dead and pays, tells_live and pinning.hits > base]
        if honour[0] and not self.honour[0]:
            # demotions are honoured from now on: the free blocks already hinted dead go first
            inner, demoted, dead = self.inner, self.demoted, self.dead
            for b in [b for b in inner if b in dead]:      # (in the policy's order)
                inner.on_hit(b, True)
                demoted[b] = None
        self.honour = honour

    def _trial(self, tells: bool, n: int, plain_hits: float) -> bool:
        """Under a hit-point layer, whether honouring demotions pays. Its demoting shadow
        undercounts what a demotion frees (a dead hit point frees its whole chain, the shadow
        one key), so the layer tries: while the hints tell dead from live, it honours them for
        a trial of ``TRIAL_CAPACITIES`` shadow capacities of sampled blocks freed and keeps
        on while the pool hits more than the plain shadow (fitted to the pool before the
        trial, unchanged during it) by ``MARGIN`` and ``min_lead``; a trial that fails waits
        ``COOLDOWN_CAPACITIES`` capacities (the demoting shadow's lead may start one sooner)."""
        win = self.win
        cap = self.shadows[0].cap
        if not self.honour[0]:
            self.cool -= n
            if not tells or (self.cool > 0 and self.shadows[1].hits <= self.shadows[0].hits * (1.0 + MARGIN) + self.min_lead):
                win[1] = 0.0
                return False
            win[0] = win[1] = win[2] = 0.0       # a trial starts
            return True
        win[0] += n
        win[2] += plain_hits
        if win[0] < TRIAL_CAPACITIES * cap:
            return True
        keep = win[1] >= win[2] * (1.0 - MARGIN) - self.min_lead
        win[0] = win[1] = win[2] = 0.0
        if not keep:
            self.cool = COOLDOWN_CAPACITIES * cap
        return keep

    def _fit(self, n: int) -> None:
        """Every ``1 / FIT_EVERY`` of a shadow's capacity of sampled blocks freed, move the
        shadows' capacity (by at most ``FIT_STEP``) towards the one at which the shadow of
        what the layer does now (honouring demotions or not) hits as often as the pool."""
        self._fit_since += n
        shadow = self.shadows[1] if self.honour[0] else self.shadows[0]
        if self._fit_since * FIT_EVERY < shadow.cap:
            return
        self._fit_since = 0
        r = (self.real + 1.0) / (shadow.hits + 1.0)
        fit = self.fit * min(FIT_STEP, max(1.0 / FIT_STEP, r))
        self.fit = min(1.0 / self.share, max(MIN_FIT, fit))
        self._resize(self.share * self.fit)

    def stats(self) -> HintStats:
        """The layer's counters and its current judgement (:class:`HintStats`)."""
        c = self._counts
        plain, demoting, pinning = self.shadows
        return HintStats(c[0], c[1], c[2], c[3], c[4], c[5], c[6], plain.hits, demoting.hits,
                         pinning.hits, self.honour[0], self.honour[1], self.force, c[7])

    def check(self) -> None:
        self.inner.check()
        regions = (set(self.demoted), set(self.pinned), set(self.inner))
        for i in range(3):
            for j in range(i + 1, 3):
                both = regions[i] & regions[j]
                if both:
                    raise AssertionError(f"hint layer: blocks {sorted(both)[:5]} are in two regions")
        self.pinned.check()
        for shadow in self.shadows:
            if len(shadow) > shadow.cap:
                raise AssertionError(f"hint layer: a shadow holds {len(shadow)} keys, over {shadow.cap}")


__all__ = ["HintLayer"]
