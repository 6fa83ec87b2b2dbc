"""Block-level cache simulations on chained block-key sequences: LRU and the Belady optimum.

The model (the harness of the reference note §8.3, used as the first hit-rate regression):

* A workload is a sequence of requests; each request is the sequence of its *chained* block
  keys (block ``p`` of a request identifies the content of tokens ``[p*B, (p+1)*B)`` together
  with everything before it, so equal keys imply equal prefixes).
* A request's *hit* is the number of its leading blocks found in the cache, counted before the
  request changes the cache. The hit rate is total hits / total block references.
* After a request is served, all its blocks are inserted; the cache then holds at most
  ``capacity_blocks`` blocks. There is no timing and no concurrency.

Policies:

* **LRU**: after a request every one of its blocks is touched (most recently used) and the
  least recently used blocks are evicted. The current request's blocks are therefore evicted
  only when nothing older is left. With ``evict_tail_first=True`` (vLLM's order: blocks of a
  finished request are freed tail first) a request's deeper blocks are older than its shallower
  ones.
* **Belady** (offline optimum): after a request the cache keeps the ``capacity_blocks`` blocks
  of (cache ∪ request) whose next use is soonest; blocks never used again go first. A block
  may bypass the cache. Ties are broken deeper block first. Because a chained block is never
  used later than its ancestor, this keeps the cached set prefix-closed, so every cached block
  of a request is a leading hit, and the policy is optimal for this unit-size, no-timing
  objective (the classic exchange argument for offline caching with bypass).

Both simulations are O(total block references · log) and run in a few seconds on the full
Mooncake conversation trace (288,500 references).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Container, Hashable, Sequence
from dataclasses import dataclass

from hybridkv.core.validation import check_int

__all__ = [
    "BlockCacheResult",
    "belady_block_hit_rate",
    "capacity_blocks_for_tokens",
    "infinite_block_hit_rate",
    "lru_block_hit_rate",
    "next_use_indices",
]

_NEVER = math.inf  # next-use index of a block that is not referenced again


@dataclass(frozen=True, slots=True)
class BlockCacheResult:
    """Outcome of one block-level cache simulation.

    Attributes:
        policy: ``"lru"``, ``"belady"`` or ``"infinite"``.
        capacity_blocks: cache capacity in blocks (``None`` for an unlimited cache).
        block_hits: leading cached blocks summed over all requests.
        block_refs: blocks referenced, summed over all requests.
        request_hits: per request, its leading cached blocks (same order as the input).
    """

    policy: str
    capacity_blocks: int | None
    block_hits: int
    block_refs: int
    request_hits: tuple[int, ...]

    @property
    def hit_rate(self) -> float:
        """``block_hits / block_refs`` (0.0 for a workload without blocks)."""
        return self.block_hits / self.block_refs if self.block_refs else 0.0


def capacity_blocks_for_tokens(capacity_tokens: int, block_tokens: int = 512) -> int:
    """Whole blocks that fit in ``capacity_tokens`` tokens (``capacity_tokens // block_tokens``)."""
    if capacity_tokens < 0 or block_tokens <= 0:
        raise ValueError(
            f"need capacity_tokens >= 0 and block_tokens > 0, got {capacity_tokens}, {block_tokens}"
        )
    return capacity_tokens // block_tokens


def _check_capacity(capacity_blocks: int) -> None:
    check_int("capacity_blocks", capacity_blocks, 0)


def _leading_hits(keys: Sequence[Hashable], cache: Container[Hashable]) -> int:
    """Number of leading ``keys`` present in ``cache``."""
    hits = 0
    for key in keys:
        if key not in cache:
            break
        hits += 1
    return hits


def lru_block_hit_rate(
    requests: Sequence[Sequence[Hashable]],
    capacity_blocks: int,
    *,
    evict_tail_first: bool = True,
) -> BlockCacheResult:
    """Simulate an LRU block cache over ``requests``.

    Args:
        requests: per request, its chained block keys (any hashable values).
        capacity_blocks: cache capacity in blocks (>= 0).
        evict_tail_first: touch a request's blocks deepest first so that, among them, the tail
            is evicted first (vLLM's free order). ``False`` touches them in prefix order.

    Returns:
        The hits and references; the input is not modified.
    """
    _check_capacity(capacity_blocks)
    cache: OrderedDict[Hashable, None] = OrderedDict()
    move_to_end = cache.move_to_end
    popitem = cache.popitem
    hits_per_request: list[int] = []
    hits = refs = 0
    for keys in requests:
        h = _leading_hits(keys, cache)
        hits_per_request.append(h)
        hits += h
        refs += len(keys)
        order = reversed(keys) if evict_tail_first else keys
        for key in order:
            if key in cache:
                move_to_end(key)
            else:
                cache[key] = None
        # Blocks of other requests are all older than the ones just touched, so popping the
        # LRU end evicts them first: the current request is protected while anything else is left.
        while len(cache) > capacity_blocks:
            popitem(last=False)
    return BlockCacheResult("lru", capacity_blocks, hits, refs, tuple(hits_per_request))


def next_use_indices(requests: Sequence[Sequence[Hashable]]) -> list[list[float]]:
    """For every (request i, position p): index of the next request after i using that key."""
    last_seen: dict[Hashable, int] = {}
    out: list[list[float]] = [[] for _ in requests]
    for i in range(len(requests) - 1, -1, -1):
        keys = requests[i]
        out[i] = [last_seen.get(k, _NEVER) for k in keys]
        for k in keys:
            last_seen[k] = i
    return out


def belady_block_hit_rate(
    requests: Sequence[Sequence[Hashable]], capacity_blocks: int,
    hit_limits: Sequence[int] | None = None,
    next_uses: Sequence[Sequence[float]] | None = None,
    footprints: Sequence[int] | None = None,
) -> BlockCacheResult:
    """Simulate the offline-optimal (Belady, with bypass) block cache over ``requests``.

    After request ``i`` the cache holds the ``capacity_blocks`` blocks of cache ∪ request ``i``
    whose next use is soonest (ties: shallower block kept, i.e. deeper evicted first; blocks
    never used again are evicted first). For chained keys the cached set stays prefix-closed
    and the result is the optimum of the model in the module docstring. Arbitrary hashable
    keys are accepted; a key's *depth* is its position in the request that last used it.

    Args:
        requests: per request, its chained block keys (all of them are inserted after it).
        capacity_blocks: cache capacity in blocks (>= 0).
        hit_limits: per request, at most this many leading blocks count (and are referenced),
            e.g. the prompt's blocks when ``requests`` also holds the output's blocks.
        next_uses: :func:`next_use_indices` of ``requests`` when the caller already has them (they
            do not depend on the capacity, so a sweep computes them once).
        footprints: per request, the blocks it occupies while it runs (prompt and output); its
            misses need ``footprint - hits`` blocks of their own, so before the request's blocks
            are inserted the cache is cut to ``capacity - (footprint - hits)`` (never below
            the hits). A real pool has this constraint; plain Belady ignores it. The cut also
            keeps the soonest-used blocks, so the result is the optimum under the constraint
            (Belady's exchange argument holds for any capacity that changes over time) and a
            tighter upper bound on every policy of the pool, online or not.

    Returns:
        The hits and references; the input is not modified.
    """
    _check_capacity(capacity_blocks)
    n_req = len(requests)
    if next_uses is None:
        next_uses = next_use_indices(requests)
    # Heap entries are single ints (fast to compare), smallest = evicted first:
    #     ((n_req - next_use) * depth_span + (depth_span - 1 - depth)) * seq_span + seq
    # i.e. latest next use first (never used again = n_req), then deepest first. ``seq`` names
    # the reference; an entry is live iff it is its key's latest reference (lazy invalidation).
    depth_span = max((len(k) for k in requests), default=0) + 1
    seq_span = sum(len(k) for k in requests) + 1
    cache: dict[Hashable, int] = {}   # cached key -> seq of its latest reference
    seq_key: list[Hashable] = []       # seq -> key
    heap: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    seq = 0
    hits_per_request: list[int] = []
    hits = refs = 0
    for i, keys in enumerate(requests):
        limit = len(keys) if hit_limits is None else min(hit_limits[i], len(keys))
        h = _leading_hits(keys[:limit] if limit < len(keys) else keys, cache)
        hits_per_request.append(h)
        hits += h
        refs += limit
        if footprints is not None:
            # the misses' own blocks: what is cached beyond the hits must make room first (the
            # hits' entries have the soonest next use, i, so they are popped last)
            target = max(h, capacity_blocks - (footprints[i] - h))
            while len(cache) > target:
                s = pop(heap) % seq_span
                key = seq_key[s]
                if cache.get(key) == s:
                    del cache[key]
        for depth, (key, nu) in enumerate(zip(keys, next_uses[i])):
            if nu == _NEVER:   # never used again: it would be evicted first and never hit, so
                cache.pop(key, None)   # bypassing it now changes no other block's fate
                continue
            nu_i = int(nu)
            cache[key] = seq
            seq_key.append(key)
            push(heap, ((n_req - nu_i) * depth_span + depth_span - 1 - depth) * seq_span + seq)
            seq += 1
        while len(cache) > capacity_blocks:
            s = pop(heap) % seq_span
            key = seq_key[s]
            if cache.get(key) == s:
                del cache[key]
        if len(heap) > 4 * (len(cache) + 64):  # drop stale entries so the heap stays small
            heap = [e for e in heap if cache.get(seq_key[e % seq_span]) == e % seq_span]
            heapq.heapify(heap)
    return BlockCacheResult("belady", capacity_blocks, hits, refs, tuple(hits_per_request))


def infinite_block_hit_rate(requests: Sequence[Sequence[Hashable]]) -> BlockCacheResult:
    """Hit rate of an unlimited cache (every block ever inserted stays): the reuse ceiling."""
    seen: set[Hashable] = set()
    hits_per_request: list[int] = []
    hits = refs = 0
    for keys in requests:
        h = _leading_hits(keys, seen)
        hits_per_request.append(h)
        hits += h
        refs += len(keys)
        seen.update(keys)
    return BlockCacheResult("infinite", None, hits, refs, tuple(hits_per_request))
