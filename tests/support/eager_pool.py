"""The eager block pool, kept as the oracle of the lazy one in ``hybridkv.core.pool``.

This is the pool as it was before it became lazy: every block's state (ref count, hash,
group, free-queue links) exists from construction, so memory and setup time are
O(num_blocks). ``tests/core/test_pool.py`` drives both with the same random operations
and compares block ids, free-queue orders and state; ``benchmarks/bench_manager.py`` times
the manager with either pool.

Its original description follows.

The block pool: ref counts, the free queue, and the hash -> block index.

Blocks are plain integer ids ``0 .. num_blocks-1``; their state lives in parallel arrays
(``ref_cnt``, ``block_hash``, ``block_group``), so the hot path allocates no objects.
Block 0 is the *null block*: it pads block tables below a sliding window and is never
allocated, freed, hashed or counted.

Free queue (an intrusive doubly linked list: the links are two arrays indexed by block id)::

    head -> [unhashed, freed last ... first] [never used, by id] [hashed, LRU ... MRU] <- tail
             ^ allocation pops here (reused first)                ^ cached blocks appended here

* ``allocate`` pops from the head. A popped block that still has a hash loses it now
  (*lazy eviction*): until then a freed cached block can be revived by a hit.
* ``touch`` (a cache hit) takes a free block out of the queue in O(1).
* ``free`` prepends blocks that reach ref 0 without a hash and appends hashed ones, each batch
  in the caller's order (callers free a request's blocks tail first, so a chain's tail is
  evicted before its prefix).

Index: per group, ``hash -> block id``; when the same content was computed twice (concurrent
requests) the value becomes a dict of block ids, so block tables stay append-only.

Invariants (checked by :meth:`BlockPool.check`):
    ref_cnt[b] == 0  <=>  b is in the free queue          (for every b != 0)
    block_hash[b] is not None  <=>  b is in index[block_group[b]][block_hash[b]]
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from hybridkv.core.pool import BlockPool as _LazyPool

#: The index type of the build under test (a dict subclass, or the compiled native table).
_INDEX = type(_LazyPool(2, 1).index[0])

NULL_BLOCK = 0


class FreeBlockQueue:
    """Doubly linked list of block ids with O(1) popleft/append/prepend/remove per block.

    Two sentinels (ids ``n`` and ``n+1``) make every operation branch-free.
    """

    __slots__ = ("_prev", "_next", "_head", "_tail", "num_free")

    def __init__(self, num_blocks: int, initial: Iterable[int]) -> None:
        self._head = num_blocks
        self._tail = num_blocks + 1
        self._prev = [0] * (num_blocks + 2)
        self._next = [0] * (num_blocks + 2)
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        self.num_free = 0
        self.append_n(list(initial))

    def __len__(self) -> int:
        return self.num_free

    def __iter__(self) -> Iterator[int]:
        nxt = self._next
        b = nxt[self._head]
        while b != self._tail:
            yield b
            b = nxt[b]

    def popleft_n(self, n: int) -> list[int]:
        """Remove and return the first ``n`` blocks (``n <= num_free``)."""
        if n > self.num_free:
            raise ValueError(f"cannot pop {n} blocks, only {self.num_free} are free")
        nxt = self._next
        out = []
        b = nxt[self._head]
        for _ in range(n):
            out.append(b)
            b = nxt[b]
        nxt[self._head] = b
        self._prev[b] = self._head
        self.num_free -= n
        return out

    def _link_run(self, blocks: list[int], before: int, after: int) -> None:
        prev, nxt = self._prev, self._next
        p = before
        for b in blocks:
            nxt[p] = b
            prev[b] = p
            p = b
        nxt[p] = after
        prev[after] = p
        self.num_free += len(blocks)

    def append_n(self, blocks: list[int]) -> None:
        """Insert ``blocks`` at the tail, in order (the last one becomes the tail)."""
        if blocks:
            self._link_run(blocks, self._prev[self._tail], self._tail)

    def prepend_n(self, blocks: list[int]) -> None:
        """Insert ``blocks`` at the head, in order (``blocks[0]`` becomes the head)."""
        if blocks:
            self._link_run(blocks, self._head, self._next[self._head])

    def remove(self, b: int) -> None:
        """Unlink block ``b`` (which must be in the queue)."""
        p = self._prev[b]
        n = self._next[b]
        self._next[p] = n
        self._prev[n] = p
        self.num_free -= 1


class BlockPool:
    """All blocks of all groups, with ref counts, the free queue and the cache index.

    Args:
        num_blocks: pool size including the null block 0 (>= 2).
        num_groups: number of KV-cache groups (one index namespace each).
        on_evict: called as ``on_evict(group, hash)`` when a cached hash is dropped because
            its block is reused (used for BlockRemoved events); None for no callback.
    """

    __slots__ = ("num_blocks", "ref_cnt", "block_hash", "block_group", "queue", "index",
                 "on_evict", "num_evictions", "index_version")

    def __init__(self, num_blocks: int, num_groups: int,
                 on_evict: Callable[[int, bytes], None] | None = None) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.block_group = [0] * num_blocks
        self.queue = FreeBlockQueue(num_blocks, range(1, num_blocks))
        # the build's index type (a dict, or the compiled build's native table): the
        # coordinator's compiled lookup reads it as that type
        self.index: list[dict[bytes, int | dict[int, None]]] = [_INDEX() for _ in range(num_groups)]
        self.on_evict = on_evict
        self.num_evictions = 0
        self.index_version = 0   # bumped on every index change (the lookup memo reads it)

    # ---- capacity ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of usable blocks (all but the null block) that are referenced."""
        return 1.0 - self.queue.num_free / (self.num_blocks - 1)

    # ---- index ------------------------------------------------------------------------------
    def cached_block(self, group: int, h: bytes) -> int | None:
        """A block holding hash ``h`` in ``group`` (the first one if duplicated), else None."""
        v = self.index[group].get(h)
        if v is None or v.__class__ is int:
            return v
        return next(iter(v))

    def insert(self, group: int, h: bytes, b: int) -> None:
        """Register block ``b`` (which must have no hash) as holding ``h`` in ``group``."""
        idx = self.index[group]
        v = idx.get(h)
        if v is None:
            idx[h] = b
        elif v.__class__ is int:
            idx[h] = {v: None, b: None}
        else:
            v[b] = None
        self.block_hash[b] = h
        self.index_version += 1
        self.block_group[b] = group

    def insert_run(self, group: int, hashes: list[bytes], blocks: list[int]) -> None:
        """``insert(group, h, b)`` for each pair, in order."""
        for h, b in zip(hashes, blocks):
            self.insert(group, h, b)

    def drop_hash(self, b: int) -> None:
        """Forget block ``b``'s hash (its content stays; the index no longer finds it)."""
        h = self.block_hash[b]
        if h is None:
            return
        g = self.block_group[b]
        idx = self.index[g]
        v = idx[h]
        if v.__class__ is int:
            del idx[h]
        else:
            del v[b]
            if len(v) == 1:
                idx[h] = next(iter(v))
        self.block_hash[b] = None
        self.index_version += 1
        if self.on_evict is not None:
            self.on_evict(g, h)

    # ---- ref counting -----------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` free blocks from the head, evicting their hashes; each gets ref 1."""
        blocks = self.queue.popleft_n(n)
        ref, bh = self.ref_cnt, self.block_hash
        evicted = 0
        for b in blocks:
            ref[b] = 1
            if bh[b] is not None:
                self.drop_hash(b)
                evicted += 1
        self.num_evictions += evicted
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on each non-null block, pulling free ones out of the queue."""
        ref = self.ref_cnt
        remove = self.queue.remove
        for b in blocks:
            if b:
                if ref[b] == 0:
                    remove(b)
                ref[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop a reference on each non-null block, in the given order (see module doc)."""
        ref, bh = self.ref_cnt, self.block_hash
        scratch: list[int] = []
        cached: list[int] = []
        for b in blocks:
            if b:
                r = ref[b] - 1
                ref[b] = r
                if r == 0:
                    (scratch if bh[b] is None else cached).append(b)
                elif r < 0:
                    ref[b] = 0
                    raise AssertionError(f"block {b} freed more often than it was referenced")
        self.queue.prepend_n(scratch)
        self.queue.append_n(cached)

    def reset_hashes(self) -> None:
        """Drop every hash (no events, no eviction count). Callers check nothing is in use."""
        self.index_version += 1
        for idx in self.index:
            idx.clear()
        bh = self.block_hash
        for b in range(self.num_blocks):
            bh[b] = None

    # ---- integrity --------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if a pool invariant is broken (O(num_blocks))."""
        n = self.num_blocks
        in_queue = [False] * n
        count = 0
        q = self.queue
        prev = q._head
        for b in q:
            if not 0 < b < n:
                raise AssertionError(f"free queue holds invalid block id {b}")
            if in_queue[b]:
                raise AssertionError(f"block {b} is in the free queue twice")
            if q._prev[b] != prev:
                raise AssertionError(f"free queue back-link of block {b} is broken")
            in_queue[b] = True
            prev = b
            count += 1
        if q._prev[q._tail] != prev:
            raise AssertionError("free queue tail link is broken")
        if count != q.num_free:
            raise AssertionError(f"free queue holds {count} blocks but counts {q.num_free}")
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
                ids = [v] if v.__class__ is int else list(v)
                if not ids:
                    raise AssertionError(f"group {g}: empty duplicate set for a hash")
                for b in ids:
                    indexed += 1
                    if self.block_hash[b] != h or self.block_group[b] != g:
                        raise AssertionError(f"index entry for block {b} disagrees with the block")
        hashed = sum(1 for h in self.block_hash if h is not None)
        if hashed != indexed:
            raise AssertionError(f"{hashed} blocks have a hash but the index holds {indexed}")
