"""Hit points: eviction on hybrid models ranks chains, and windows go with the chain they end.

On a hybrid model a cached prefix is servable at a *hit point*: a prefix length ``e`` at which
the full-attention chain ``[0, e)`` is cached **and** every other group holds its span ending at
``e`` (a sliding window's last ``W`` tokens, a chunk's tokens, a draft group's blocks). A window
block is worth something only while the full-attention blocks before its hit point are cached;
a policy that ranks every block alone evicts a window block and throws away the value of every
full-attention block before it, or keeps a window whose chain is gone.

:class:`HitPointLayer` sits in front of any policy (the hint layer included) on a config with a
group that is not downward closed. The *key group* is the first downward-closed group (full
attention or MLA); every other group's block is a *companion* of the key-group block that ends
the first hit point it serves, its *anchor*: the last key-group block that hit point needs (the
one covering ``[e - bs, e)``, or in EAGLE drop mode the proof block after it), with ``e`` the
first promised end (a multiple of the config's alignment) the companion serves (the
coordinator tells the layer when it releases the block:
:meth:`~hybridkv.core.policy_pool.PolicyBlockPool.anchor`). Every later hit point extends that
one's chain, so the companion is useless once its anchor is gone. Then:

* the inner policy sees, ranks and evicts key-group blocks only (its order is over chains, as on
  a dense model);
* a free companion whose anchor is cached waits beside the policy; when the policy evicts the
  anchor, the companions it anchors are *dead* (no hit can read them) and are evicted before
  the policy's next victim;
* a companion freed without a cached anchor is dead at once;
* when the policy has nothing left, live companions go, least recently freed first (nothing
  makes the cache refuse work).

The layer is exact about the last key block of a hit point, not about the prefix before it: if
the policy evicts a key block in the middle of a chain (most policies evict a chain tail first),
the hit points after it stay counted live until their own anchors go. LRU without hints and
vLLM's compat mode never see this layer (vLLM's own order is the reference); state groups
(recurrent layers) keep LRU, which evicts sibling checkpoints together already.

Cost: a dictionary operation or two per companion block freed, anchored or evicted; the inner
policy's own cost on the key group's blocks only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Iterator, Sequence, cast

from hybridkv.core.eviction.base import EvictionPolicy, PolicyPool

if TYPE_CHECKING:
    from hybridkv.core.eviction.hint_layer import HintLayer
    from hybridkv.core.hints import HintStats
    from hybridkv.core.retention_config import RetentionMark

#: The key group's share of freed cached blocks (told to a hint layer inside, whose sampled
#: shadow caches see only the key group) is measured over about this many capacities of blocks
#: freed (the counts halve then), and told every ``1 / SHARE_UPDATES`` of a capacity.
SHARE_CAPACITIES = 2
SHARE_UPDATES = 16

_ABSENT = object()


class HitPointLayer(EvictionPolicy):
    """Companions of key-group blocks in front of ``inner`` (see the module docstring).

    Args:
        inner: the policy that ranks the key group's blocks.
        key_group: the group whose blocks anchor hit points (the first downward-closed one).
    """

    name = "hit-points"
    __slots__ = ("inner", "key_group", "anchor_of", "comps_of", "held", "dead", "_freed",
                 "_freed_key", "_share_every", "_since", "_cap", "_counts")

    def __init__(self, inner: EvictionPolicy, key_group: int) -> None:
        super().__init__()
        if not isinstance(inner, EvictionPolicy):
            raise ValueError(f"inner must be an EvictionPolicy, got {inner!r}")
        if not (isinstance(key_group, int) and not isinstance(key_group, bool) and key_group >= 0):
            raise ValueError(f"key_group must be a group index >= 0, got {key_group!r}")
        self.inner = inner
        self.key_group = key_group
        self.anchor_of: dict[int, int] = {}           # companion -> its anchor (a cached key block)
        # anchor -> the companions it anchors, in the order they were anchored
        self.comps_of: dict[int, dict[int, None]] = {}
        self.held: OrderedDict[int, None] = OrderedDict()   # free companions, anchor cached
        self.dead: OrderedDict[int, None] = OrderedDict()   # free companions, no anchor
        self._freed = 0.0                             # cached blocks freed (decayed)
        self._freed_key = 0.0                         # of them, the key group's
        self._share_every = 1
        self._since = 0
        self._cap = 1
        self._counts = [0, 0, 0]                      # companions killed, dead evicted, live evicted

    def attach(self, pool: PolicyPool) -> None:
        if self.pool is not None and self.pool is not pool:
            raise ValueError(f"eviction policy {self.name!r} is already attached to another pool")
        groups = len(pool.index)
        if self.key_group >= groups:
            raise ValueError(f"key_group {self.key_group} is not a group of a pool of "
                             f"{groups} groups (valid: 0..{groups - 1})")
        super().attach(pool)
        self.inner.attach(pool)
        self._cap = max(1, pool.num_blocks - 1)
        self._share_every = max(1, self._cap // SHARE_UPDATES)

    @property
    def uses_retention(self) -> bool:     # type: ignore[override]  # per instance: the inner's
        """The inner policy's (it ranks the key group; companions follow their anchors)."""
        return self.inner.uses_retention

    @property
    def counts(self) -> tuple[int, int, int]:
        """(companions killed with their anchor, dead companions evicted, live companions
        evicted because nothing else was free)."""
        counts = self._counts
        return counts[0], counts[1], counts[2]

    # ---- what the coordinator tells -----------------------------------------------------------
    def anchor(self, comps: Sequence[int], anchors: Sequence[int]) -> None:
        """Companion ``comps[i]`` (held, cached, about to be released) ends the hit point whose
        last key-group block is ``anchors[i]`` (0: none cached). A companion anchored again
        keeps the latest anchor."""
        anchor_of, comps_of = self.anchor_of, self.comps_of
        for c, a in zip(comps, anchors):
            old = anchor_of.pop(c, None)
            if old is not None and old != a:
                s = comps_of.get(old)
                if s is not None:
                    s.pop(c, None)
                    if not s:
                        del comps_of[old]
            if a:
                anchor_of[c] = a
                s = comps_of.get(a)
                if s is None:
                    comps_of[a] = {c: None}
                else:
                    s[c] = None

    def _keys(self, blocks: Sequence[int], positions: Sequence[int]) -> tuple[list[int], list[int]]:
        bg, key = self.pool.block_group, self.key_group
        pairs = [(b, j) for b, j in zip(blocks, positions) if bg[b] == key]
        return [b for b, _ in pairs], [j for _, j in pairs]

    def retain(self, blocks: Sequence[int], positions: Sequence[int],
               marks: Sequence[RetentionMark]) -> None:
        """Retention marks order the key group; companions follow their anchors."""
        kb, kp = self._keys(blocks, positions)
        if kb:
            self.inner.retain(kb, kp, marks)

    def hint(self, blocks: Sequence[int], positions: Sequence[int], marks: Sequence[RetentionMark],
             owner: object,
             track: object = None) -> None:
        """Hints speak for the key group's blocks (a demoted or pinned anchor takes its hit
        point's companions with it)."""
        kb, kp = self._keys(blocks, positions)
        if kb:
            cast("HintLayer", self.inner).hint(kb, kp, marks, owner, track)  # hints: a hint layer

    # ---- container protocol --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.inner) + len(self.held) + len(self.dead)

    def __contains__(self, b: int) -> bool:
        return b in self.held or b in self.dead or b in self.inner

    def __iter__(self) -> Iterator[int]:
        yield from self.dead
        yield from self.held
        yield from self.inner

    # ---- the seam ------------------------------------------------------------------------------
    def on_free(self, blocks: Sequence[int]) -> None:
        bg, key = self.pool.block_group, self.key_group
        anchor_of, held, dead = self.anchor_of, self.held, self.dead
        keys: list[int] = []
        for b in blocks:
            if bg[b] == key:
                keys.append(b)
            elif b in anchor_of:
                held[b] = None
            else:
                dead[b] = None
        if keys:
            self.inner.on_free(keys)
        self._freed += len(blocks)
        self._freed_key += len(keys)
        self._since += len(blocks)
        if self._since >= self._share_every:
            self._since = 0
            scale = getattr(self.inner, "scale_capacity", None)
            if scale is not None and self._freed_key:
                scale(self._freed_key / self._freed)
            if self._freed >= SHARE_CAPACITIES * self._cap:
                self._freed *= 0.5
                self._freed_key *= 0.5

    def on_hit(self, b: int, held: bool) -> None:
        if self.pool.block_group[b] == self.key_group:
            self.inner.on_hit(b, held)
        elif held:
            if self.held.pop(b, _ABSENT) is _ABSENT:
                del self.dead[b]

    def _kill(self, a: int) -> None:
        """Key block ``a`` loses its content: the companions it anchors are dead, the latest
        anchored first (a release anchors a table front to back and frees it tail first, so
        that is their free order)."""
        comps = self.comps_of.pop(a, None)
        if comps:
            anchor_of, held, dead = self.anchor_of, self.held, self.dead
            for c in reversed(comps):
                del anchor_of[c]
                if held.pop(c, _ABSENT) is not _ABSENT:
                    dead[c] = None
                self._counts[0] += 1

    def _unlink(self, c: int) -> None:
        a = self.anchor_of.pop(c, None)
        if a is not None:
            s = self.comps_of[a]
            del s[c]
            if not s:
                del self.comps_of[a]

    def pop(self, n: int) -> list[int]:
        out: list[int] = []
        inner, held, dead, counts = self.inner, self.held, self.dead, self._counts
        while len(out) < n:
            if dead:
                out.append(dead.popitem(last=False)[0])
                counts[1] += 1
            elif len(inner):
                v = inner.pop(1)[0]
                out.append(v)
                self._kill(v)
            else:                               # only live companions are free: oldest first
                c = held.popitem(last=False)[0]
                self._unlink(c)
                out.append(c)
                counts[2] += 1
        return out

    def forget(self, blocks: Sequence[int]) -> None:
        anchor_of, comps_of = self.anchor_of, self.comps_of
        for b in blocks:
            if b in comps_of:
                self._kill(b)
            if b in anchor_of:
                self._unlink(b)
        self.inner.forget(blocks)

    def stats(self) -> HintStats:
        """The inner policy's statistics (a hint layer's :class:`HintStats`)."""
        return cast("HintLayer", self.inner).stats()

    def check(self) -> None:
        self.inner.check()
        held, dead, bg, key = self.held, self.dead, self.pool.block_group, self.key_group
        both = set(held) & set(dead)
        if both:
            raise AssertionError(f"hit points: blocks {sorted(both)[:5]} are both live and dead")
        inner = set(self.inner)
        for b in (*held, *dead):
            if b in inner:
                raise AssertionError(f"hit points: companion {b} is also held by the inner policy")
            if bg[b] == key:
                raise AssertionError(f"hit points: key-group block {b} is held as a companion")
        for b in held:
            if b not in self.anchor_of:
                raise AssertionError(f"hit points: live companion {b} has no anchor")
        for b in dead:
            if b in self.anchor_of:
                raise AssertionError(f"hit points: dead companion {b} still has an anchor")
        for a, comps in self.comps_of.items():
            if not comps:
                raise AssertionError(f"hit points: anchor {a} anchors nothing")
            for c in comps:
                if self.anchor_of.get(c) != a:
                    raise AssertionError(f"hit points: companion {c} is not linked back to anchor {a}")


__all__ = ["HitPointLayer", "SHARE_CAPACITIES", "SHARE_UPDATES"]
