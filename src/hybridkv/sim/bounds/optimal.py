"""Block-level cache simulations on chained block-key sequences: LRU and the Belady optimum.

The model (the harness behind the table of ``sim/traffic/data/README.md``, the first hit-rate regression):

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

The simulator's bound (:class:`~hybridkv.sim.bounds.optimum_job.OptimumJob`,
:func:`~hybridkv.sim.bounds.bound_inputs.optimal_hit_blocks`) is Belady on a served workload's plain
chained key-block hashes, at the pool's capacity in key blocks (:func:`optimum_capacity_blocks`);
:func:`gap_report` then says why the online run hit fewer blocks than an unlimited cache. On a
served workload the same models run on integer ids (:mod:`hybridkv.sim.bounds.stream_caches`), with
the same answers.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Container, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from hybridkv.core.rules import make_rule
from hybridkv.core.validation import check_int

__all__ = [
    "BlockCacheResult",
    "GapInputs",
    "GapReport",
    "OnlineHits",
    "belady_block_hit_rate",
    "capacity_blocks_for_tokens",
    "gap_from",
    "gap_inputs",
    "gap_report",
    "infinite_block_hit_rate",
    "lru_block_hit_rate",
    "next_read_indices",
    "next_use_indices",
    "optimum_capacity_blocks",
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
    hit_limits: Sequence[int] | None = None,
) -> BlockCacheResult:
    """Simulate an LRU block cache over ``requests``.

    Args:
        requests: per request, its chained block keys (any hashable values).
        capacity_blocks: cache capacity in blocks (>= 0).
        evict_tail_first: touch a request's blocks deepest first so that, among them, the tail
            is evicted first (vLLM's free order). ``False`` touches them in prefix order.
        hit_limits: per request, at most this many leading blocks count (and are referenced),
            as in :func:`belady_block_hit_rate`.

    Returns:
        The hits and references; the input is not modified.
    """
    _check_capacity(capacity_blocks)
    cache: OrderedDict[Hashable, None] = OrderedDict()
    move_to_end = cache.move_to_end
    popitem = cache.popitem
    hits_per_request: list[int] = []
    hits = refs = 0
    for i, keys in enumerate(requests):
        limit = len(keys) if hit_limits is None else min(hit_limits[i], len(keys))
        h = _leading_hits(keys[:limit] if limit < len(keys) else keys, cache)
        hits_per_request.append(h)
        hits += h
        refs += limit
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


def next_read_indices(requests: Sequence[Sequence[Hashable]], limits: Sequence[int]) -> list[list[float]]:
    """For every (request i, position p): the next request after i that *counts* that key,
    i.e. holds it among its first ``limits[j]`` keys (``inf``: none)."""
    last_read: dict[Hashable, int] = {}
    out: list[list[float]] = [[] for _ in requests]
    for i in range(len(requests) - 1, -1, -1):
        keys = requests[i]
        out[i] = [last_read.get(k, _NEVER) for k in keys]
        for k in keys[:limits[i]]:
            last_read[k] = i
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


# ---- the bound of a simulated workload ---------------------------------------------------------


def optimum_capacity_blocks(kv_config, num_blocks: int, key_block: int) -> int:
    """Pool capacity in key blocks for the offline bound.

    Caching ``key_block`` tokens of a prefix takes ``key_block / block_size`` blocks in every
    full-attention-type group (all of them must hold the prefix for a hit), so the bound gets
    ``(num_blocks - 1) // sum_g(key_block / block_size_g)`` key blocks. Window groups are left
    out (they may keep as little as one window per hit end), which keeps it an upper bound.
    """
    units = sum(max(1, key_block // g.spec.block_size) for g in kv_config.groups
                if make_rule(g.spec).downward_closed)
    return (num_blocks - 1) // max(1, units)


@dataclass(frozen=True, slots=True)
class OnlineHits:
    """Per served request (in served order): what the online run measured, for :class:`GapReport`.

    ``hit_blocks[r]``: leading key blocks hit at first admission; ``admitted_t[r]`` /
    ``finished_t[r]``: the clock then and when it finished (sequential mode: its index);
    ``attention_blocks[r]``: the leading key blocks the full-attention groups alone held
    then (>= ``hit_blocks[r]``; more when a sliding-window group kept no window there or a
    recurrent-state group had no checkpoint there), or None when every group is full
    attention; ``instance[r]``: the instance a cluster routed it to (None: one instance).
    """

    hit_blocks: list[int]
    admitted_t: list[float]
    finished_t: list[float]
    attention_blocks: list[int] | None = None
    instance: list[int] | None = None


@dataclass(frozen=True, slots=True)
class GapReport:
    """Why the online run hits fewer blocks than an unlimited cache, measured per request.

    For each request, the blocks an unlimited cache serving requests one at a time would hit
    (``ceiling_blocks`` in total) minus the blocks the online run hit are charged to one cause,
    read at the first block the online run missed:

    * ``in_flight_blocks``: the request that first produced that block had not finished when
      this one was admitted (the engine's concurrency: a follow-up arrived too early);
    * ``retained_blocks``: the full-attention groups still held the block but another group
      could not serve a hit that long (a sliding window not kept there, no recurrent-state
      checkpoint there): where the retention interval puts hit ends, not the cache size;
    * ``routed_blocks`` (a cluster): the block had been computed on another instance;
    * ``evicted_blocks``: the producing request had finished on this instance, and the block
      was no longer (or never) in the full-attention groups.

    A request's loss is split at ``attention_blocks`` (:class:`OnlineHits`): the blocks up to
    it are ``retained_blocks`` (``in_flight_blocks`` when the first missed block was still being
    computed); the rest are charged by the first block past it. A request whose loss has two
    causes is counted under both.
    ``optimum_blocks`` is the Belady bound at the pool's size; ``ceiling_blocks -
    optimum_blocks`` is what the cache size costs any policy.
    """

    ceiling_blocks: int
    optimum_blocks: int
    online_blocks: int
    in_flight_blocks: int
    evicted_blocks: int
    in_flight_requests: int
    evicted_requests: int
    retained_blocks: int = 0
    retained_requests: int = 0
    routed_blocks: int = 0
    routed_requests: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class GapInputs:
    """What the gap report reads of a workload, online results aside: per request its
    ``ceiling`` (the leading blocks within its hit limit that an unlimited cache serving
    requests one at a time holds) and, for each of those blocks ``p``, the request that first
    computed it, ``producer[offsets[r] + p]``."""

    ceiling: list[int]
    offsets: list[int]
    producer: np.ndarray


def gap_inputs(keys: Sequence[Sequence[Hashable]], limits: Sequence[int]) -> GapInputs:
    """The :class:`GapInputs` of ``keys`` (per request, its chained keys) and hit ``limits``,
    key by key (:meth:`~hybridkv.sim.bounds.bound_inputs.BoundInputs.gap_inputs` reads the same from
    a key stream)."""
    seen: set[Hashable] = set()
    ceiling: list[int] = []
    for ks, lim in zip(keys, limits):
        ceiling.append(_leading_hits(ks[:lim], seen))
        seen.update(ks)
    del seen
    first: dict[Hashable, int] = {}
    for j, ks in enumerate(keys):
        for k in ks:
            first.setdefault(k, j)
    producer = [first[k] for ks, c in zip(keys, ceiling) for k in ks[:c]]
    offsets = [0]
    for c in ceiling:
        offsets.append(offsets[-1] + c)
    return GapInputs(ceiling, offsets, np.array(producer, dtype=np.int64))


def gap_report(keys: Sequence[Sequence[Hashable]], limits: Sequence[int], optimum_blocks: int,
               online: OnlineHits) -> GapReport:
    """Attribute the online run's missed blocks (see :class:`GapReport`)."""
    return gap_from(gap_inputs(keys, limits), optimum_blocks, online)


def gap_from(inputs: GapInputs, optimum_blocks: int, online: OnlineHits) -> GapReport:
    """:func:`gap_report` from a workload's :class:`GapInputs`."""
    ceiling, offsets = inputs.ceiling, inputs.offsets
    producer = inputs.producer
    att = online.attention_blocks
    where = online.instance

    def cause(r: int, at: int) -> str:
        j = int(producer[offsets[r] + at])
        if online.finished_t[j] > online.admitted_t[r]:
            return "flight"
        if where is not None and where[j] != where[r]:
            return "routed"
        return "evicted"
    # Each request's loss [h, c) is split at a = the full-attention groups' own hit: [h, a) is
    # "retained" (another group could not serve it) unless the block at h was still being
    # computed (timing); [a, c) is charged by the first block past a.
    counts = {k: [0, 0] for k in ("flight", "routed", "evicted", "retained")}
    for r, (c, h) in enumerate(zip(ceiling, online.hit_blocks)):
        if h >= c:
            continue
        a = h if att is None else max(h, min(att[r], c))
        charged: dict[str, int] = {}
        if a > h:
            kind = "flight" if cause(r, h) == "flight" else "retained"
            charged[kind] = a - h
        if a < c:
            kind = cause(r, a)
            charged[kind] = charged.get(kind, 0) + c - a
        for kind, n in charged.items():
            counts[kind][0] += n
            counts[kind][1] += 1
    return GapReport(sum(ceiling), optimum_blocks, sum(online.hit_blocks), counts["flight"][0],
                     counts["evicted"][0], counts["flight"][1], counts["evicted"][1],
                     counts["retained"][0], counts["retained"][1], counts["routed"][0],
                     counts["routed"][1])
