"""Hit points: on a hybrid model the unit of eviction is a servable prefix, not a block.

On a hybrid model a cached prefix is servable at a *hit point*: a prefix length ``e`` at which
the full-attention chain ``[0, e)`` is cached **and** every other group holds its span ending at
``e`` (a sliding window's last ``W`` tokens, a chunk's tokens, a state checkpoint). A window
block is worth something only while the chain before it is cached, and a chain block only while
some hit point at or after it is: a policy that ranks every block alone evicts a window block
and throws away the value of the whole chain before it, or keeps a chain no hit can end on.

:class:`HitPointLayer` sits in front of any policy (the hint layer included) on a config with a
group that is not downward closed. The *key group* is the first downward-closed group (full
attention or MLA); the other downward-closed groups (a drafter's full-attention layers) are
*followers*: their block at a place lives and dies with the key block there. Every other group's
block is a *companion* of the key block that ends the first hit point it serves, its *anchor*
(the coordinator says which when it releases the block:
:meth:`~hybridkv.core.policy_pool.PolicyBlockPool.anchor`, with the key table that is the hit
point's chain). A hit point is *live* from the release that anchors a companion there until
it is evicted.

The key blocks form a tree (a block's parent is the one before it in every table that holds
it). A key block is *needed* while a live hit point is at it or after it: ``need[b]`` counts
its own live hit point and its needed children, so a chain becomes unneeded tail first the
moment the last hit point after it dies. The cached free blocks fall in five regions, evicted
in this order:

1. **dead**: blocks no hit can read (an unneeded key block, its followers and the companions
   anchored there), in the order they died;
2. **idle**: anchors of hit points of a *cold class* that served no hit yet. A hit point's
   class is where it ends against the prompt of the request that stored it
   (:func:`~hybridkv.core.retention.hit_point_class`: past the prompt, as a chat turn's final
   length; at the prompt's resend end; one alignment unit below it; further below, as a
   junction or an interval point). Which classes serve hits depends on the traffic (a chat
   whose next turn carries the answer hits the final length, a trace whose next turn diverges
   inside the prompt's last block hits one unit below), so the layer measures it: a sample of
   the hit points (``1 / (SAMPLE_MASK + 1)`` by their anchor's hash) is ranked as every hit
   point of a warm class is, and a class whose sampled hit points serve a hit less than
   ``COLD_RATIO`` times as often as the best class's is cold;
3. **the policy's**: anchors of every other live hit point, in the inner policy's order; the
   inner policy sees, ranks and evicts these *units* only (and hears of their hits). Evicting
   a unit kills its hit point: every key block no other live hit point needs dies, back to
   the nearest needed one, with its followers and the companions anchored there (a companion
   anchored at a block a later hit point still needs stays: a window can serve several);
4. **held**: companions and followers anchored at needed key blocks;
5. **covered**: needed key blocks that anchor no live hit point.

An inner policy that tests hints (the hint layer) also hears, as
:meth:`~hybridkv.core.eviction.hint_layer.HintLayer.returned`, the key
blocks released again at the place of a hit point that died (by their hash: a request wanted
it back and computed it again), so its shadow caches count the pool's misses too.

Regions 4 and 5 are reached only when nothing else is free (nothing makes the cache refuse
work); such a victim is counted. LRU without hints and vLLM's compat mode never see this layer
(vLLM's own order is the reference); state groups (recurrent layers) keep LRU, which evicts
sibling checkpoints together already.

Cost: a few dictionary operations per block freed, anchored or evicted; a hit point's birth
and death walk the chain only as far as its need changes (amortised O(1) per key block).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence, cast

from hybridkv.core.eviction.base import EvictionPolicy, PolicyPool
from hybridkv.core.eviction.hint_parts import sample_key
from hybridkv.core.retention import HIT_POINT_CLASSES as CLASSES

if TYPE_CHECKING:
    from hybridkv.core.eviction.hint_layer import HintLayer
    from hybridkv.core.hints import HintStats
    from hybridkv.core.retention_config import RetentionMark

#: An inner policy that scales its capacity (the hint layer's shadow caches) is told, every
#: ``1 / SHARE_UPDATES`` of a capacity of blocks freed, the hit points' share of the blocks they
#: hold now (live hit points over the key blocks, followers and companions they need): the
#: pool holds about that share of its blocks in hit points.
SHARE_UPDATES = 16

#: A sample of the hit points (anchor hashes whose last byte & SAMPLE_MASK is 0) is never
#: idle, and measures its class: served hits per hit point born.
SAMPLE_MASK = 7
#: A class is cold while its sampled hit points serve a hit less than this share as often as
#: the best class's ...
COLD_RATIO = 0.25
#: ... once it and the best class have this many sampled births.
MIN_SAMPLES = 32
#: The counts halve every this many sampled births (the traffic's habits may change).
DECAY_SAMPLES = 1024

_ABSENT = object()
_SAMPLED = 8                    # flag on a class: the hit point is in the sample




def _add_member(sets: dict[int, dict[int, None]], a: int, x: int) -> None:
    """Block ``x`` goes with key block ``a`` (``sets[a]``, in insertion order)."""
    s = sets.get(a)
    if s is None:
        sets[a] = {x: None}
    else:
        s[x] = None


class HitPointLayer(EvictionPolicy):
    """Hit points in front of ``inner`` (see the module docstring).

    Args:
        inner: the policy that ranks the live hit points (by their anchors).
        key_group: the group whose blocks anchor hit points (the first downward-closed one).
        followers: the other downward-closed groups (their block goes with the key block
            at its place).
    """

    name = "hit-points"
    __slots__ = ("inner", "key_group", "followers", "anchor_of", "comps_of", "node_of", "fols_of",
                 "need", "parent", "gen", "live", "cls_of", "served", "born_n", "served_n", "cold", "_births",
                 "dead", "idle", "held", "covered", "gone", "_returned", "_share_every", "_since", "_counts")

    def __init__(self, inner: EvictionPolicy, key_group: int, followers: Iterable[int] = ()) -> None:
        super().__init__()
        if not isinstance(inner, EvictionPolicy):
            raise ValueError(f"inner must be an EvictionPolicy, got {inner!r}")
        if not (isinstance(key_group, int) and not isinstance(key_group, bool) and key_group >= 0):
            raise ValueError(f"key_group must be a group index >= 0, got {key_group!r}")
        followers = frozenset(followers)
        bad = [g for g in followers
               if not isinstance(g, int) or isinstance(g, bool) or g < 0 or g == key_group]
        if bad:
            raise ValueError(f"followers must be group indices >= 0 other than the key group "
                             f"{key_group}, got {sorted(map(repr, bad))}")
        self.inner = inner
        self.key_group = key_group
        self.followers = followers
        self.anchor_of: dict[int, int] = {}           # companion -> the anchor of its hit point
        self.comps_of: dict[int, dict[int, None]] = {}  # anchor -> its companions (needed key block)
        self.live: set[int] = set()                   # anchors of live hit points
        self.node_of: dict[int, int] = {}             # follower -> the key block at its place
        self.fols_of: dict[int, dict[int, None]] = {}   # key block -> its followers
        self.need: dict[int, int] = {}                # needed key block -> own hit point + needed children
        self.parent: dict[int, tuple[int, int]] = {}  # needed key block -> (parent, parent's generation)
        self.gen: dict[int, int] = {}                 # key block -> times it lost a needed content
        self.cls_of: dict[int, int] = {}              # anchor -> its class (| _SAMPLED)
        self.served: set[int] = set()                 # anchors whose hit point served a hit
        self.born_n = [0.0] * CLASSES                 # sampled hit points born, per class (decayed)
        self.served_n = [0.0] * CLASSES               # of them, served a hit
        self.cold = [False] * CLASSES
        self._births = 0
        self.dead: OrderedDict[int, None] = OrderedDict()
        self.idle: OrderedDict[int, None] = OrderedDict()
        self.held: OrderedDict[int, None] = OrderedDict()
        self.covered: OrderedDict[int, None] = OrderedDict()
        self.gone: dict[object, None] = {}           # hashes of anchors whose hit point died
        # told of them when they come back
        self._returned: Callable[[list[int]], None] | None = getattr(inner, "returned", None)
        self._share_every = 1
        self._since = 0
        self._counts = [0, 0, 0]                      # companions killed, dead evicted, live evicted

    def attach(self, pool: PolicyPool) -> None:
        if self.pool is not None and self.pool is not pool:
            raise ValueError(f"eviction policy {self.name!r} is already attached to another pool")
        groups = len(pool.index)
        for g in (self.key_group, *sorted(self.followers)):
            if g >= groups:
                raise ValueError(f"group {g} of the hit-point layer is not a group of a pool of "
                                 f"{groups} groups (valid: 0..{groups - 1})")
        super().attach(pool)
        self.inner.attach(pool)
        self._share_every = max(1, (pool.num_blocks - 1) // SHARE_UPDATES)

    @property
    def uses_retention(self) -> bool:     # type: ignore[override]  # per instance: the inner's
        """The inner policy's (it ranks the hit points)."""
        return self.inner.uses_retention

    @property
    def counts(self) -> tuple[int, int, int]:
        """(companions killed with their hit point, dead blocks evicted, needed blocks evicted
        because nothing else was free)."""
        counts = self._counts
        return counts[0], counts[1], counts[2]

    # ---- what the coordinator tells -----------------------------------------------------------
    def anchor(self, comps: Sequence[int], positions: Sequence[int], table: Sequence[int],
               follow: bool = False, classes: Sequence[int] = ()) -> None:
        """Blocks ``comps`` (held, cached, about to be released) of one group go with key
        block ``table[positions[i]]`` (-1: none cached), whose chain is ``table[:positions[i] + 1]``:
        a companion ends the hit point anchored there (a companion anchored again keeps the
        latest anchor; ``classes[i]``, :func:`~hybridkv.core.retention.hit_point_class`, is
        the class of a hit point it is the first companion of; none given: class 0), a
        follower (``follow``) sits at that key block's place."""
        if follow:
            node_of, fols_of = self.node_of, self.fols_of
            for f, k in zip(comps, positions):
                self._unfollow(f)
                if k >= 0:
                    a = table[k]
                    node_of[f] = a
                    _add_member(fols_of, a, f)
            return
        anchor_of, comps_of, live = self.anchor_of, self.comps_of, self.live
        for i, (c, k) in enumerate(zip(comps, positions)):
            a = table[k] if k >= 0 else 0
            old = anchor_of.get(c)
            if old is not None and old != a:
                self._unlink(c)
            if a:
                if old != a:
                    anchor_of[c] = a
                    _add_member(comps_of, a, c)
                if a not in live:               # (again, for one whose hit point was evicted)
                    live.add(a)
                    self._born(table, k, classes[i] if classes else 0)

    def _units(self, blocks: Sequence[int], positions: Sequence[int]) -> tuple[list[int], list[int]]:
        live = self.live
        pairs = [(b, j) for b, j in zip(blocks, positions) if b in live]
        return [b for b, _ in pairs], [j for _, j in pairs]

    def retain(self, blocks: Sequence[int], positions: Sequence[int],
               marks: Sequence[RetentionMark]) -> None:
        """Retention marks order the hit points (by their anchors, told after the
        coordinator's anchors); the rest follows."""
        kb, kp = self._units(blocks, positions)
        if kb:
            self.inner.retain(kb, kp, marks)

    def hint(self, blocks: Sequence[int], positions: Sequence[int], marks: Sequence[RetentionMark],
             owner: object,
             track: object = None) -> None:
        """Hints speak for the hit points (a demoted or pinned anchor takes its hit point, and
        the chain only it needs, with it)."""
        kb, kp = self._units(blocks, positions)
        if kb:
            cast("HintLayer", self.inner).hint(kb, kp, marks, owner, track)  # hints: a hint layer

    # ---- the tree of needed key blocks ---------------------------------------------------------
    def _own(self, a: int) -> int:
        return 1 if a in self.live else 0

    def _born(self, table: Sequence[int], k: int, cls: int) -> None:
        """A hit point of class ``cls`` is born at ``table[k]``: it and every unneeded block
        before it are needed now."""
        need, parent, gen = self.need, self.parent, self.gen
        a = b = table[k]
        if not 0 <= cls < CLASSES:
            raise ValueError(f"hit-point class must be in 0..{CLASSES - 1}, got {cls!r}")
        h = self.pool.block_hash[a]
        if h is not None and not sample_key(h) & SAMPLE_MASK:
            cls |= _SAMPLED
            self.born_n[cls & 3] += 1
            self._births += 1
            if self._births >= DECAY_SAMPLES:
                self._births = 0
                self.born_n = [x * 0.5 for x in self.born_n]
                self.served_n = [x * 0.5 for x in self.served_n]
            self._judge()
        self.cls_of[a] = cls
        n = need.get(b, 0)
        need[b] = n + 1
        while not n and k > 0:
            p = table[k - 1]
            parent[b] = (p, gen.get(p, 0))
            np_ = need.get(p, 0)
            need[p] = np_ + 1
            if np_:
                break
            if self.dead.pop(p, _ABSENT) is not _ABSENT:   # a free dead block is needed again
                self.covered[p] = None
            b = p
            k -= 1
        # a free block that becomes an anchor (only a block some table still holds becomes
        # one, so this is rare) moves to the units
        if self.dead.pop(a, _ABSENT) is not _ABSENT or self.covered.pop(a, _ABSENT) is not _ABSENT:
            self._place(a)

    def _place(self, a: int) -> None:
        """Free anchor ``a`` of a live hit point goes to the idle region or the policy's."""
        if self._cold(a):
            self.idle[a] = None
        else:
            self.inner.on_free([a])

    def _cold(self, a: int) -> bool:
        """Whether live hit point ``a`` is idle: of a cold class, not sampled, never served."""
        c = self.cls_of[a]
        return c < _SAMPLED and self.cold[c] and a not in self.served

    def _judge(self) -> None:
        """Which classes are cold now (see the module docstring)."""
        born, served = self.born_n, self.served_n
        rates = [served[c] / born[c] if born[c] >= MIN_SAMPLES else None for c in range(CLASSES)]
        best = max((r for r in rates if r is not None), default=0.0)
        self.cold = [r is not None and best > 0 and r < COLD_RATIO * best for r in rates]

    def _unneed(self, b: int) -> None:
        """Key block ``b`` loses one need; a block needed no more dies (its followers with
        it), and so on towards the root. A parent left with its own hit point only is a leaf
        again: if it was idle, the inner policy ranks it."""
        need, parent, gen = self.need, self.parent, self.gen
        while True:
            n = need[b] - 1
            if n:
                need[b] = n
                return
            del need[b]
            self._drop_followers(b)
            self._drop_companions(b)
            if self.covered.pop(b, _ABSENT) is not _ABSENT:
                self.dead[b] = None
            up = parent.pop(b, None)
            if up is None or gen.get(up[0], 0) != up[1] or up[0] not in need:
                return
            b = up[0]

    def _drop_followers(self, b: int) -> None:
        fols = self.fols_of.pop(b, None)
        if fols:
            node_of, held, dead = self.node_of, self.held, self.dead
            for f in fols:
                del node_of[f]
                if held.pop(f, _ABSENT) is not _ABSENT:
                    dead[f] = None

    def _drop_companions(self, b: int) -> None:
        """Key block ``b`` is needed no more: the companions anchored there are dead (a later
        hit point that read them needs ``b`` too)."""
        comps = self.comps_of.pop(b, None)
        if comps:
            anchor_of, held, dead = self.anchor_of, self.held, self.dead
            for c in reversed(comps):    # a release frees a table tail first: their free order
                del anchor_of[c]
                if held.pop(c, _ABSENT) is not _ABSENT:
                    dead[c] = None
                self._counts[0] += 1

    def _death(self, a: int) -> None:
        """The hit point at ``a`` dies: ``a`` loses its own need (its companions die with the
        block, once no later hit point needs it either: a window block can serve several).
        The caller has taken ``a`` out of the idle and the policy's regions."""
        self.live.remove(a)
        h = self.pool.block_hash[a]
        if h is not None and self._returned is not None:
            gone = self.gone
            gone[h] = None
            if len(gone) > self.pool.num_blocks:
                del gone[next(iter(gone))]
        self.cls_of.pop(a)
        self.served.discard(a)
        self._unneed(a)

    def _kill(self, a: int) -> None:
        """The hit point at ``a`` dies other than by the inner policy's choice."""
        free = False
        if self.idle.pop(a, _ABSENT) is not _ABSENT:
            free = True
        elif a in self.inner:
            self.inner.on_hit(a, True)
            free = True
        self._death(a)
        if free:
            if a in self.need:
                self.covered[a] = None
            else:
                self.dead[a] = None

    def _unlink(self, c: int) -> None:
        a = self.anchor_of.pop(c)
        s = self.comps_of[a]
        del s[c]
        if not s:                        # its last companion: the hit point dies
            del self.comps_of[a]
            if a in self.live:
                self._kill(a)

    def _unfollow(self, f: int) -> None:
        a = self.node_of.pop(f, None)
        if a is not None:
            s = self.fols_of[a]
            del s[f]
            if not s:
                del self.fols_of[a]

    # ---- container protocol --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.inner) + len(self.dead) + len(self.idle) + len(self.held) + len(self.covered)

    def __contains__(self, b: int) -> bool:
        return b in self.dead or b in self.idle or b in self.held or b in self.covered or b in self.inner

    def __iter__(self) -> Iterator[int]:
        yield from self.dead
        yield from self.idle
        yield from self.inner
        yield from self.held
        yield from self.covered

    # ---- the seam ------------------------------------------------------------------------------
    def on_free(self, blocks: Sequence[int]) -> None:
        bg, key, followers = self.pool.block_group, self.key_group, self.followers
        need, live = self.need, self.live
        held, dead = self.held, self.dead
        units: list[int] = []
        back: list[int] = []
        gone, bh = self.gone, self.pool.block_hash
        for b in blocks:
            g = bg[b]
            if g == key:
                if gone and b not in live and gone.pop(bh[b], _ABSENT) is None:
                    back.append(b)
                if b in live:
                    if self._cold(b):
                        self.idle[b] = None
                    else:
                        units.append(b)
                elif b in need:
                    self.covered[b] = None
                else:
                    dead[b] = None
            elif g in followers:
                a = self.node_of.get(b)
                if a is not None and a in need:
                    held[b] = None
                else:
                    self._unfollow(b)
                    dead[b] = None
            elif b in self.anchor_of:
                held[b] = None
            else:
                dead[b] = None
        if units:
            self.inner.on_free(units)
        if back and self._returned is not None:
            self._returned(back)
        self._since += len(blocks)
        if self._since >= self._share_every:
            self._since = 0
            scale = getattr(self.inner, "scale_capacity", None)
            if scale is not None and live:
                scale(len(live) / (len(need) + len(self.node_of) + len(self.anchor_of)))

    def on_hit(self, b: int, held: bool) -> None:
        g = self.pool.block_group[b]
        if g == self.key_group:
            if b in self.live:
                if not held:
                    self.inner.on_hit(b, False)
                elif self.idle.pop(b, _ABSENT) is _ABSENT:
                    self.inner.on_hit(b, True)
            elif held and self.covered.pop(b, _ABSENT) is _ABSENT:
                del self.dead[b]
            return
        if held and self.held.pop(b, _ABSENT) is _ABSENT:
            del self.dead[b]
        if g not in self.followers:
            a = self.anchor_of.get(b)
            if a is not None and a in self.live and a not in self.served:    # a hit ends there
                self.served.add(a)
                c = self.cls_of[a]
                if c >= _SAMPLED:
                    self.served_n[c & 3] += 1
                    self._judge()

    def pop(self, n: int) -> list[int]:
        out: list[int] = []
        inner, dead, idle, counts = self.inner, self.dead, self.idle, self._counts
        while len(out) < n:
            if dead:
                out.append(dead.popitem(last=False)[0])
                counts[1] += 1
                continue
            if idle:
                a = idle.popitem(last=False)[0]
            elif len(inner):
                a = inner.pop(1)[0]
            elif self.held:                 # only needed blocks are free: oldest first
                c = self.held.popitem(last=False)[0]
                if c in self.anchor_of:
                    self._unlink(c)
                else:
                    self._unfollow(c)
                out.append(c)
                counts[2] += 1
                continue
            else:
                b = self.covered.popitem(last=False)[0]
                self._lose(b)
                out.append(b)
                counts[2] += 1
                continue
            self._death(a)
            if a in self.need:              # a longer hit point still needs the block
                self.covered[a] = None
            else:
                out.append(a)
        return out

    def _lose(self, b: int) -> None:
        """Needed key block ``b`` (no hit point of its own) is evicted: the hit points after it
        are unservable until their own anchors go (their parent links to ``b`` are stale)."""
        del self.need[b]
        self.gen[b] = self.gen.get(b, 0) + 1
        self._drop_followers(b)
        self._drop_companions(b)
        up = self.parent.pop(b, None)
        if up is not None and self.gen.get(up[0], 0) == up[1] and up[0] in self.need:
            self._unneed(up[0])

    def forget(self, blocks: Sequence[int]) -> None:
        anchor_of, node_of = self.anchor_of, self.node_of
        for b in blocks:
            if b in anchor_of:
                self._unlink(b)
            if b in node_of:
                self._unfollow(b)
        self.inner.forget(blocks)

    def stats(self) -> HintStats:
        """The inner policy's statistics (a hint layer's :class:`HintStats`)."""
        return cast("HintLayer", self.inner).stats()

    def check(self) -> None:
        self.inner.check()
        bg, key, followers = self.pool.block_group, self.key_group, self.followers
        regions = {"dead": self.dead, "idle": self.idle, "held": self.held, "covered": self.covered}
        seen: dict[int, str] = {b: "the policy" for b in self.inner}
        for name, region in regions.items():
            for b in region:
                if b in seen:
                    raise AssertionError(f"hit points: block {b} is in {seen[b]} and {name}")
                seen[b] = name
        need, comps_of, live = self.need, self.comps_of, self.live
        for b in self.inner:
            if b not in live:
                raise AssertionError(f"hit points: the policy ranks block {b}, which anchors no hit point")
        for b in self.idle:
            if b not in live:
                raise AssertionError(f"hit points: idle block {b} anchors no hit point")
        for b in self.covered:
            if bg[b] != key or b in live or b not in need:
                raise AssertionError(f"hit points: covered block {b} is not a needed key block")
        for b in self.held:
            if bg[b] == key:
                raise AssertionError(f"hit points: key block {b} is held as a companion")
            kept = (need.get(self.node_of.get(b, 0), 0) > 0 if bg[b] in followers
                    else b in self.anchor_of)
            if not kept:
                raise AssertionError(f"hit points: held block {b} is anchored at no needed block")
        for b in self.dead:
            if (bg[b] == key and b in need) or b in self.anchor_of:
                raise AssertionError(f"hit points: dead block {b} is still needed")
        if set(self.cls_of) != live or not self.served <= live or not live <= set(comps_of):
            raise AssertionError("hit points: a live hit point without companions, or classes or "
                                 "served marks of dead ones kept")
        for a, comps in comps_of.items():
            if not comps or a not in need:
                raise AssertionError(f"hit points: block {a} anchors no companion or is not needed")
            for c in comps:
                if self.anchor_of.get(c) != a:
                    raise AssertionError(f"hit points: companion {c} is not linked back to anchor {a}")
        if len(self.anchor_of) != sum(len(s) for s in comps_of.values()):
            raise AssertionError("hit points: a companion is linked to no hit point")
        for a, fols in self.fols_of.items():
            for f in fols:
                if self.node_of.get(f) != a:
                    raise AssertionError(f"hit points: follower {f} is not linked back to {a}")
        children: dict[int, int] = {}
        for b, (p, g) in self.parent.items():
            if b not in need:
                raise AssertionError(f"hit points: unneeded block {b} keeps a parent link")
            if self.gen.get(p, 0) == g and p in need:
                children[p] = children.get(p, 0) + 1
        for b, n in need.items():
            want = self._own(b) + children.get(b, 0)
            if n != want:
                raise AssertionError(f"hit points: block {b} counts need {n}, its hit point and "
                                     f"needed children make {want}")


__all__ = ["COLD_RATIO", "DECAY_SAMPLES", "HitPointLayer", "MIN_SAMPLES", "SAMPLE_MASK",
           "SHARE_UPDATES"]
