"""The pool of every non-LRU eviction policy: :class:`PolicyBlockPool`.

LRU, the default, is :class:`~hybridkv.core.pool.BlockPool`'s own free queue and never runs
this code. Here the free queue keeps only the scratch and never-used regions; cached free
blocks go to an eviction policy (:mod:`hybridkv.core.eviction.base` states its contract), which
this module calls but never imports.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from hybridkv.core.pool import BlockPool


class PolicyBlockPool(BlockPool):
    """A :class:`BlockPool` whose cached free blocks are ordered by an eviction policy.

    Scratch blocks (no hash) and never-used ids stay in the free queue and are reused first,
    exactly as in :class:`BlockPool`; a block that reaches ref 0 *with* a hash goes to
    ``policy`` instead of the queue's tail, and ``allocate`` asks the policy for victims once
    the queue is empty (see :mod:`hybridkv.core.eviction.base` for the contract). A free block
    is in exactly one of the two. ``BlockPool`` itself (LRU) is left untouched, so LRU pays
    nothing for the seam. ``policy`` is a :class:`hybridkv.core.eviction.base.EvictionPolicy`
    (not imported here: the policies read the pool, the pool only calls them).
    """

    __slots__ = ("policy",)

    def __init__(self, num_blocks: int, num_groups: int, policy: Any,
                 on_evict: Callable[[int, bytes], None] | None = None) -> None:
        super().__init__(num_blocks, num_groups, on_evict)
        self.policy = policy
        policy.attach(self)

    @property
    def num_free(self) -> int:
        return self.queue.num_free + len(self.policy)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def allocate(self, n: int) -> list[int]:
        q, pol = self.queue, self.policy
        if n > q.num_free + len(pol):
            raise ValueError(f"cannot pop {n} blocks, only {q.num_free + len(pol)} are free")
        k = min(n, q.num_free)
        blocks = q.popleft_n(k) if k else []
        if n > k:
            blocks += pol.pop(n - k)
        if q.capacity != len(self.ref_cnt):
            self._sync()
        evicted = self._claim(blocks)
        pol.forget(blocks)
        self.free_version += 1
        self.num_evictions += evicted
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        self.free_version += 1
        ref, bh, pol = self.ref_cnt, self.block_hash, self.policy
        remove = self.queue.remove
        used = len(ref)
        for b in blocks:
            if b:
                if b >= used:
                    self._materialize(b)
                    used = len(ref)
                if ref[b] == 0:
                    if b in pol:
                        pol.on_hit(b, True)
                    else:
                        remove(b)
                elif bh[b] is not None:
                    pol.on_hit(b, False)
                ref[b] += 1

    def _enqueue(self, scratch: list[int], cached: list[int]) -> None:
        """As :meth:`BlockPool._enqueue`, but cached blocks go to the eviction policy."""
        self.queue.prepend_n(scratch)
        if cached:
            self.policy.on_free(cached)
            self.free_version += 1

    def reset_hashes(self) -> None:
        """As :meth:`BlockPool.reset_hashes`; the policy's blocks, hash-less now, leave it for
        the queue's tail in the policy's order (where LRU's hashed region was: the same
        layout as :class:`BlockPool`), so a policy never holds a block without a hash."""
        super().reset_hashes()
        pol = self.policy
        if len(pol):
            blocks = pol.pop(len(pol))
            pol.forget(blocks)
            self.queue.append_n(blocks)

    def retain(self, table: list[int], positions: Iterable[int], marks: Any) -> None:
        """Pass a request's retention ``marks`` for the blocks at ``positions`` of one group's
        ``table`` to the policy (before they are freed); null and hash-less blocks are skipped
        (they are never cached). See :mod:`hybridkv.core.retention_config`."""
        bh = self.block_hash
        pos = [j for j in positions if table[j] and bh[table[j]] is not None]
        if pos:
            self.policy.retain([table[j] for j in pos], pos, marks)

    def hint(self, table: list[int], positions: Iterable[int], marks: Any, owner: object,
             track: object = None) -> None:
        """Pass a release's hint ``marks`` (empty without a hint), its ``owner`` and ``track``
        (a session's whole release: the key its releases are compared by) for the blocks at
        ``positions`` of one group's ``table`` to the policy's hint layer (before they are
        freed); null and hash-less blocks are skipped. See :mod:`hybridkv.core.hints`."""
        bh = self.block_hash
        pos = [j for j in positions if table[j] and bh[table[j]] is not None]
        if pos:                  # (a release that cached nothing says nothing of its session)
            self.policy.hint([table[j] for j in pos], pos, marks, owner, track)

    def anchor(self, comps: list[int], places: list[int], key_table: list[int],
               follow: bool = False, classes: list[int] | None = None) -> None:
        """Blocks ``comps`` of one group (held, about to be released) go with the key-group
        block ``key_table[places[i]]`` (-1: none): a companion ends the hit point anchored
        there (of class ``classes[i]``: :func:`~hybridkv.core.retention.hit_point_class`;
        None: 0), a follower (``follow``: a downward-closed group) sits at its place; passed to
        the policy's hit-point layer (:mod:`hybridkv.core.eviction.hit_points`). Hash-less
        blocks are skipped; a hash-less key block anchors nothing."""
        bh = self.block_hash
        cls = classes if classes is not None else [0] * len(comps)
        kept = [(c, k if k >= 0 and bh[key_table[k]] is not None else -1, x)
                for c, k, x in zip(comps, places, cls) if c and bh[c] is not None]
        if kept:
            self.policy.anchor([c for c, _, _ in kept], [k for _, k, _ in kept], key_table, follow,
                               [x for _, _, x in kept])

    def _check_held(self, in_queue: list[bool]) -> None:
        n = len(in_queue)
        count = 0
        for b in self.policy:
            count += 1
            if not 0 < b < n:
                raise AssertionError(f"eviction policy holds invalid block id {b} (explicit ids < {n})")
            if in_queue[b]:
                raise AssertionError(f"block {b} is held by the eviction policy and the free queue")
            in_queue[b] = True
        if count != len(self.policy):
            raise AssertionError(f"eviction policy iterates {count} blocks but counts {len(self.policy)}")
        self.policy.check()
