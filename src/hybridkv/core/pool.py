"""The block pool: ref counts, the free queue, and the hash -> block index.

Blocks are plain integer ids ``0 .. num_blocks-1``; their state lives in parallel lists
(``ref_cnt``, ``block_hash``, ``block_group``), so the hot path allocates no objects.
Block 0 is the *null block*: it pads block tables below a sliding window and is never
allocated, freed, hashed or counted.

**The pool costs what it has used, not what it could hold.** Ids are handed out for the first
time in increasing order, so the ids at or above the *fresh mark* ``next_fresh`` have never
been used: their state is implicit (ref 0, no hash, group 0, free). The per-block lists cover
ids ``0 .. capacity-1`` only, where ``next_fresh <= capacity <= max(2 * next_fresh, 64)``
(they double when a fresh id beyond them is handed out; slots past the fresh mark hold the
fresh state). A pool of 10^11 blocks therefore builds in microseconds and holds only what it
has touched.

Free queue (an intrusive doubly linked list: the links are indexed by block id, two lists in
the pure build, two C arrays in the compiled one)::

    head -> [unhashed, freed last ... first] [never used, by id] [hashed, LRU ... MRU] <- tail
             ^ allocation pops here (reused first)                ^ cached blocks appended here

The never-used region is the implicit run ``next_fresh .. num_blocks-1``; one *gap* node stands
for it in the linked list, between the other two regions (which are linked explicitly). Once
every id has been used the gap leaves the list and the queue is a plain linked list again.

* ``allocate`` pops from the head: the unhashed region first, then fresh ids in id order,
  then the hashed region. A popped block that still has a hash loses it now (*lazy
  eviction*): until then a freed cached block can be revived by a hit.
* ``touch`` (a cache hit) takes a free block out of the queue in O(1).
* ``free`` prepends blocks that reach ref 0 without a hash and appends hashed ones, each batch
  in the caller's order (callers free a request's blocks tail first, so a chain's tail is
  evicted before its prefix).

This order is vLLM 0.33's (``tests/core/test_vllm_compat.py`` pins block ids and queue orders).
Every method accepts any id in ``1 .. num_blocks-1``; one that names a fresh id other than
through ``allocate`` (a touch or insert by id) first makes the fresh ids up to it explicit, at
the end of the unhashed region, which is where they already were in the queue order.

Index: per group, ``hash -> block id``; when the same content was computed twice (concurrent
requests) the value becomes a dict of block ids, so block tables stay append-only. Each group's
index is a :class:`~hybridkv.core.hash_index.HashIndex`: a dict in the pure-Python build, a
native table with the same mapping API in the compiled one, whose ``prefetch`` lets the cache
misses of a run of inserts or an eviction batch overlap. Likewise the free queue
(:mod:`hybridkv.core.free_queue`): links in two lists, in two C arrays when compiled.

Two subclasses change one region each, in their own modules, so LRU's path here stays untouched:
:class:`~hybridkv.core.policy_pool.PolicyBlockPool` hands the cached free blocks to an eviction
policy, :class:`~hybridkv.core.extent_pool.ExtentBlockPool` hands out multi-block extents
(recurrent states).

Invariants (checked by :meth:`BlockPool.check`, in O(ids used + index)):
    len(ref_cnt) == len(block_hash) == len(block_group) == capacity >= next_fresh
    ids in [next_fresh, capacity): ref 0, no hash, group 0, not linked
    ref_cnt[b] == 0  <=>  b is in the free queue          (for every b != 0)
    block_hash[b] is not None  <=>  b is in index[block_group[b]][block_hash[b]]
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

from hybridkv.core.free_queue import GAP, HEAD, TAIL

if not cython.compiled:     # compiled: the native table and queue (pool.pxd cimports them), the same API
    from hybridkv.core.free_queue import FreeBlockQueue
    from hybridkv.core.hash_index import HashIndex

NULL_BLOCK = 0


# Index changes BlockPool records for the lookup memo before restarting the record.
_MAX_CHANGES = 1 << 14


class _FreedTooOften(AssertionError):
    """A block freed more often than it was referenced (BlockPool.free's error); carries the
    blocks its batch released before it, which ``free`` still takes in."""

    def __init__(self, b: int, scratch: list[int], cached: list[int]) -> None:
        super().__init__(f"block {b} freed more often than it was referenced")
        self.scratch = scratch
        self.cached = cached



@cython.cfunc
def _add_duplicate(idx: HashIndex, h: bytes, v: Any, b: int) -> None:
    """Block ``b`` holds ``h`` too (concurrent requests computed the same content): the index
    entry ``v`` (a block id, or a dict of them) becomes or gains it."""
    if isinstance(v, int):
        idx[h] = {v: None, b: None}
    else:
        v[b] = None

class BlockPool:
    """All blocks of all groups, with ref counts, the free queue and the cache index.

    Memory and setup time are proportional to the ids ever used, not to ``num_blocks``
    (see the module docstring); ``ref_cnt``, ``block_hash`` and ``block_group`` cover ids
    ``0 .. capacity-1`` and ids beyond them are free, unhashed and unreferenced.

    Args:
        num_blocks: pool size including the null block 0 (>= 2).
        num_groups: number of KV-cache groups (one index namespace each).
        on_evict: called as ``on_evict(group, hash)`` when a cached hash is dropped because
            its block is reused (used for BlockRemoved events); None for no callback.
    """

    __slots__ = ("num_blocks", "ref_cnt", "block_hash", "block_group", "queue", "index",
                 "on_evict", "num_evictions", "index_version", "_changes", "_changes_base",
                 "free_version")

    def __init__(self, num_blocks: int, num_groups: int,
                 on_evict: Callable[[int, bytes], None] | None = None) -> None:
        self.num_blocks = num_blocks
        self.queue = FreeBlockQueue(num_blocks)
        self.ref_cnt = [0]                        # ids 0 .. next_fresh-1 (the null block only)
        self.block_hash: list[bytes | None] = [None]
        self.block_group = [0]
        self.index: list[HashIndex] = [HashIndex() for _ in range(num_groups)]
        self.on_evict = on_evict
        self.num_evictions = 0
        # bumped by every change of the index (insert, drop, reset): a lookup made at the
        # same version finds the same blocks
        self.index_version = 0
        # the hash of every insert and drop since version _changes_base, in order
        # (index_version == _changes_base + len(_changes); see index_changes_since)
        self._changes: list[bytes] = []
        self._changes_base = 0
        # bumped whenever a cached block may have entered or left the free queue (touch,
        # free, eviction): a count of free cached blocks made at the same version still holds
        self.free_version = 0

    # ---- capacity ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.queue.num_free

    @property
    def next_fresh(self) -> int:
        """The lowest id never handed out; ids from here on hold no state."""
        return self.queue.next_fresh

    @property
    def usage(self) -> float:
        """Fraction of usable blocks (all but the null block) that are referenced."""
        return 1.0 - self.queue.num_free / (self.num_blocks - 1)

    def _sync(self) -> None:
        """Extend the per-block lists to the queue's capacity (new ids: ref 0, no hash)."""
        grow = self.queue.capacity - len(self.ref_cnt)
        if grow > 0:
            self.ref_cnt.extend([0] * grow)
            self.block_hash.extend([None] * grow)
            self.block_group.extend([0] * grow)

    def _materialize(self, b: int) -> None:
        """Give block ``b`` (a fresh id, still free) explicit state."""
        if not 0 < b < self.num_blocks:
            raise ValueError(f"block id {b} out of range [1, {self.num_blocks})")
        self.queue.materialize(b + 1)
        self._sync()

    # ---- index ------------------------------------------------------------------------------
    def index_changes_since(self, version: int) -> list[bytes] | None:
        """The hashes inserted into or dropped from the index (any group) since
        ``index_version`` was ``version``, oldest first; None when no longer known (a reset,
        or the record was trimmed). A lookup whose hashes are all absent from the list would
        find the same blocks now as at ``version``."""
        k = version - self._changes_base
        if k < 0:
            return None
        return self._changes[k:]

    def _restart_changes(self) -> None:
        """Forget the recorded index changes (bounds the record's memory)."""
        self._changes.clear()
        self._changes_base = self.index_version

    def cached_block(self, group: int, h: bytes) -> int | None:
        """A block holding hash ``h`` in ``group`` (the first one if duplicated), else None."""
        v = self.index[group].get(h)
        if v is None or isinstance(v, int):
            return v
        return next(iter(v))

    def insert(self, group: int, h: bytes, b: int) -> None:
        """Register block ``b`` (which must have no hash) as holding ``h`` in ``group``."""
        if b >= self.queue.next_fresh:
            self._materialize(b)
        idx = self.index[group]
        v = idx.get(h)
        if v is None:
            idx[h] = b
        else:
            _add_duplicate(idx, h, v, b)
        self._hashed(group, [h], [b])

    @cython.locals(idx=HashIndex, hs=list, bs=list, n=cython.Py_ssize_t, k=cython.Py_ssize_t)
    def insert_run(self, group: int, hashes: list[bytes], blocks: list[int]) -> None:
        """``insert(group, h, b)`` for each pair of ``hashes`` and ``blocks`` (as ``zip`` pairs
        them), in order.

        The blocks must be distinct and unhashed (allocated, usually; a fresh id becomes explicit
        first, as in :meth:`insert`). Each pair costs one index operation (two for a hash the
        index holds already, or one repeated within the run: the entry becomes a dict of ids,
        as in :meth:`insert`) and the per-block lists and the change record are updated in
        bulk; in a subclass that overrides :meth:`insert`, pair by pair.
        """
        n = len(blocks)
        if not n:
            return
        if type(self).insert is BlockPool.insert and max(blocks) < self.queue.next_fresh \
                and type(hashes) is list and type(blocks) is list and len(hashes) == n:
            idx = self.index[group]
            hs, bs = hashes, blocks
            if n > 1:                           # the run's misses overlap (a no-op in Python)
                idx.prefetch(hs)
            for k in range(n):
                b = bs[k]
                h = hs[k]
                v = idx.setdefault(h, b)
                if v is not b:                  # there already (b is unhashed, so no entry
                    _add_duplicate(idx, h, v, b)    # names it): a duplicate
            self._hashed(group, hashes, blocks)
            return
        insert = self.insert
        for h, b in zip(hashes, blocks):
            insert(group, h, b)

    @cython.locals(bh=list, bg=list, changes=list, n=cython.Py_ssize_t, i=cython.Py_ssize_t,
                   bi=cython.Py_ssize_t)
    def _hashed(self, group: int, hashes: list[bytes], blocks: list[int]) -> None:
        """Record that ``blocks`` hold ``hashes`` in ``group``, once the index has them: the
        per-block lists, the change record (restarted first when the run would pass
        :data:`_MAX_CHANGES`) and the index version (:meth:`insert`, :meth:`insert_run`)."""
        n = len(blocks)
        bh, bg = self.block_hash, self.block_group
        for i in range(n):
            bi = blocks[i]
            bh[bi] = hashes[i]
            bg[bi] = group
        changes = self._changes
        if len(changes) + n > _MAX_CHANGES:
            self._restart_changes()
        changes.extend(hashes)
        self.index_version += n

    def drop_hash(self, b: int) -> None:
        """Forget block ``b``'s hash (its content stays; the index no longer finds it)."""
        bh = self.block_hash
        if b < len(bh) and bh[b] is not None:      # a fresh id has no hash
            self._forget([b])

    def _drop(self, b: int, h: bytes) -> None:
        """Forget block ``b``'s hash ``h`` (:meth:`_forget` of one block)."""
        self._forget([b])

    @cython.locals(changes=list, bh=list, bg=list, index=list, idx=HashIndex, bi=cython.Py_ssize_t,
                   one=cython.bint)
    def _forget(self, blocks: list[int]) -> None:
        """Forget the hash of each of ``blocks`` (distinct, each holding a hash), in order: the
        one rule for dropping a hash (:meth:`drop_hash`, eviction). Per block: its index entry
        goes (the other blocks of a duplicated hash keep theirs), the change is recorded, then
        ``on_evict(group, hash)`` is called, so a callback sees every earlier block of the batch
        dropped and no later one. The change record restarts first when the batch would pass
        :data:`_MAX_CHANGES`."""
        n = len(blocks)
        changes = self._changes
        if len(changes) + n > _MAX_CHANGES:
            self._restart_changes()
        bh, bg, index = self.block_hash, self.block_group, self.index
        on_evict = self.on_evict
        one = len(index) == 1                      # one group: no need to read block_group
        g = 0
        idx = index[0]
        if one and n > 1:                          # the batch's misses overlap
            idx.prefetch([bh[b] for b in blocks])
        for b in blocks:
            bi = b
            h: bytes = bh[bi]  # type: ignore[assignment]  # each of blocks holds a hash
            if not one:
                g = bg[bi]
                idx = index[g]
            v = idx.pop(h)
            if type(v) is dict:                     # duplicated content: the others stay
                del v[b]
                idx[h] = next(iter(v)) if len(v) == 1 else v
            bh[bi] = None
            changes.append(h)
            if on_evict is not None:
                self.index_version += 1
                n -= 1
                on_evict(g, h)
        self.index_version += n

    # ---- ref counting -----------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` free blocks from the head, evicting their hashes; each gets ref 1."""
        blocks = self.queue.popleft_n(n)
        ref, bh = self.ref_cnt, self.block_hash
        if self.queue.capacity != len(ref):
            self._sync()
        if n > 8:
            lo = min(blocks)
            if max(blocks) - lo == n - 1 and not any(bh[lo:lo + n]):
                # n distinct ids spanning n values: exactly lo .. lo+n-1 (fresh ids, usually),
                # none cached: nothing to evict, every ref becomes 1 in one slice assignment
                ref[lo:lo + n] = [1] * n
                return blocks
        evicted = self._claim(blocks)
        if evicted:
            self.free_version += 1
            self.num_evictions += evicted
        return blocks

    @cython.locals(ref=list, bh=list, stale=list, bi=cython.Py_ssize_t)
    def _claim(self, blocks: list[int]) -> int:
        """Give each of ``blocks`` (just taken from the free blocks) ref 1 and evict the hash
        it still holds (lazy eviction, :meth:`_forget`, in order); returns how many were
        evicted."""
        ref, bh = self.ref_cnt, self.block_hash
        stale = []
        for b in blocks:
            bi = b
            ref[bi] = 1
            if bh[bi] is not None:
                stale.append(b)
        if not stale:
            return 0
        self._forget(stale)
        return len(stale)

    @cython.locals(ref=list, q=FreeBlockQueue, bi=cython.Py_ssize_t, fresh=cython.Py_ssize_t,
                   removed=cython.Py_ssize_t)
    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on each non-null block, pulling free ones out of the queue."""
        ref = self.ref_cnt
        q = self.queue
        fresh = q.next_fresh
        removed = 0
        try:
            for b in blocks:
                if b:
                    bi = b
                    if bi >= fresh:               # a fresh id: give it explicit state first
                        self._materialize(b)
                        fresh = q.next_fresh
                    r = ref[bi]
                    if r == 0:                    # FreeBlockQueue.remove, counted below
                        q._unlink(bi)
                        removed += 1
                    ref[bi] = r + 1
        finally:
            q.num_free -= removed
            if removed:
                self.free_version += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop a reference on each non-null block, in the given order (see module doc).

        A block with no reference left (a double free, or an id never handed out) raises
        AssertionError naming it; the blocks before it in ``blocks`` are freed as asked, it
        and the ones after it are left as they were, so no block is lost."""
        try:
            scratch, cached = self._release(blocks)
        except _FreedTooOften as e:
            self._enqueue(e.scratch, e.cached)
            raise
        self._enqueue(scratch, cached)

    def _enqueue(self, scratch: list[int], cached: list[int]) -> None:
        """Take in the blocks a :meth:`free` released: scratch at the queue's head, cached at
        its tail (LRU), each batch in the given order."""
        self.queue.prepend_n(scratch)
        if cached:
            self.queue.append_n(cached)
            self.free_version += 1

    @cython.locals(ref=list, bh=list, scratch=list, cached=list, bi=cython.Py_ssize_t)
    def _release(self, blocks: Iterable[int]) -> tuple[list[int], list[int]]:
        """Drop a reference on each non-null block; return the blocks that became free, split
        into scratch (no hash) and cached, each in the given order. Raises
        :class:`_FreedTooOften` for a block freed more often than it was referenced, carrying
        the blocks released before it (that block keeps ref 0; the rest of ``blocks`` is not
        touched)."""
        ref, bh = self.ref_cnt, self.block_hash
        scratch: list[int] = []
        cached: list[int] = []
        b = 0
        try:
            for b in blocks:
                if b:
                    bi = b
                    r = ref[bi] - 1
                    ref[bi] = r
                    if r == 0:
                        if bh[bi] is None:
                            scratch.append(b)
                        else:
                            cached.append(b)
                    elif r < 0:
                        ref[bi] = 0
                        raise _FreedTooOften(b, scratch, cached)
        except IndexError:                         # a fresh id: never referenced
            raise _FreedTooOften(b, scratch, cached) from None
        return scratch, cached

    def reset_hashes(self) -> None:
        """Drop every hash (no events, no eviction count). Callers check nothing is in use."""
        self.index_version += 1
        self._restart_changes()
        for idx in self.index:
            idx.clear()
        bh = self.block_hash
        bh[:] = [None] * len(bh)

    # ---- integrity --------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if a pool invariant is broken (O(ids used + index))."""
        q = self.queue
        n = q.next_fresh
        if not 1 <= n <= self.num_blocks or q.num_blocks != self.num_blocks:
            raise AssertionError(f"fresh mark {n} outside [1, {self.num_blocks}]")
        cap = q.capacity
        if not n <= cap <= min(self.num_blocks, max(2 * n, 64)):
            raise AssertionError(f"capacity {cap} outside [{n}, max(2 x fresh mark {n}, 64)]")
        for name in ("ref_cnt", "block_hash", "block_group"):
            if len(getattr(self, name)) != cap:
                raise AssertionError(f"{name} holds {len(getattr(self, name))} ids, capacity is {cap}")
        nxt, prv = q._next, q._prev           # (the compiled queue's: list snapshots)
        if len(nxt) != cap + 3 or len(prv) != cap + 3:
            raise AssertionError(f"free queue links hold {len(nxt) - 3} ids, capacity is {cap}")
        for b in range(n, cap):
            if self.ref_cnt[b] or self.block_hash[b] is not None or self.block_group[b]:
                raise AssertionError(f"fresh block {b} (fresh mark {n}) has state")
        in_queue = [False] * n
        count = 0
        prev = HEAD
        b = nxt[HEAD]
        seen_gap = False
        while b != TAIL:
            if b == GAP:
                if seen_gap:
                    raise AssertionError("free queue holds the gap node twice")
                seen_gap = True
            elif not 0 < b < n:
                raise AssertionError(f"free queue holds invalid block id {b} (explicit ids < {n})")
            elif in_queue[b]:
                raise AssertionError(f"block {b} is in the free queue twice")
            else:
                in_queue[b] = True
                count += 1
            if prv[b] != prev:
                raise AssertionError(f"free queue back-link of block {b} is broken")
            prev = b
            b = nxt[b]
        if seen_gap != (n < self.num_blocks):
            raise AssertionError(f"free queue {'holds' if seen_gap else 'lost'} its gap node with "
                                 f"{self.num_blocks - n} fresh ids")
        if prv[TAIL] != prev:
            raise AssertionError("free queue tail link is broken")
        if count + self.num_blocks - n != q.num_free:
            raise AssertionError(f"free queue holds {count} + {self.num_blocks - n} fresh blocks "
                                 f"but counts {q.num_free}")
        self._check_held(in_queue)
        if self.ref_cnt[NULL_BLOCK] != 0 or self.block_hash[NULL_BLOCK] is not None:
            raise AssertionError("the null block was referenced or hashed")
        for b in range(1, n):
            if (self.ref_cnt[b] == 0) != in_queue[b]:
                raise AssertionError(
                    f"block {b}: ref_cnt {self.ref_cnt[b]} but in free queue = {in_queue[b]}")
            if self.ref_cnt[b] < 0:
                raise AssertionError(f"block {b} has negative ref_cnt {self.ref_cnt[b]}")
        indexed = 0
        for g, idx in enumerate(self.index):
            for h, v in idx.items():
                ids = [v] if isinstance(v, int) else list(v)
                if not ids:
                    raise AssertionError(f"group {g}: empty duplicate set for a hash")
                for b in ids:
                    indexed += 1
                    if not 0 < b < n:
                        raise AssertionError(f"group {g}: the index names block {b}, which has no state")
                    if self.block_hash[b] != h or self.block_group[b] != g:
                        raise AssertionError(f"index entry for block {b} disagrees with the block")
        hashed = sum(1 for h in self.block_hash if h is not None)
        if hashed != indexed:
            raise AssertionError(f"{hashed} blocks have a hash but the index holds {indexed}")

    def _check_held(self, in_queue: list[bool]) -> None:
        """Mark the free blocks held outside the queue (none here; see PolicyBlockPool)."""
