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

The simulator's bound (:class:`OptimumJob`, :func:`optimal_hit_blocks`) is Belady on a served
workload's plain chained key-block hashes, at the pool's capacity in key blocks
(:func:`optimum_capacity_blocks`); :func:`gap_report` then says why the online run hit fewer
blocks than an unlimited cache.
"""

from __future__ import annotations

import heapq
import math
import multiprocessing as mp
from collections import OrderedDict
from collections.abc import Callable, Container, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from hybridkv.core.hashing import BlockHasher
from hybridkv.core.request import Request
from hybridkv.core.rules import make_rule
from hybridkv.core.validation import check_int
from hybridkv.sim.failures import ChildProcessDied, describe_exit
from hybridkv.sim.bounds.hazard import HazardBound, hazard_bound, hazard_table, hazard_uses
from hybridkv.sim.traffic.workitems import ServedItem, WorkItem

__all__ = [
    "BlockCacheResult",
    "GapReport",
    "OnlineHits",
    "OptimumJob",
    "belady_block_hit_rate",
    "capacity_blocks_for_tokens",
    "gap_report",
    "infinite_block_hit_rate",
    "lru_block_hit_rate",
    "next_use_indices",
    "optimal_hit_blocks",
    "optimum_capacity_blocks",
]

_NEVER = math.inf  # next-use index of a block that is not referenced again
PARALLEL_OPTIMUM_TOKENS = 20_000_000  # above this many prompt tokens, compute the bound in a child


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


def reuse_ceiling_tokens(items: Sequence[WorkItem | ServedItem], block_size: int) -> list[int]:
    """Per request, the most prompt tokens any cache could serve it from: the leading key
    blocks an unlimited cache holds when it arrives (every block earlier requests left
    computed), within its hit limit, times ``block_size``. No online run hits more
    (``online <= optimum <= unlimited cache``)."""
    keys, limits = _compute_bound_keys(items, block_size)
    hits = infinite_block_hit_rate(keys).request_hits
    return [min(h, lim) * block_size for h, lim in zip(hits, limits)]


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


def _compute_bound_keys(items: Iterable[WorkItem | ServedItem],
                        block_size: int) -> tuple[list[list[bytes]], list[int]]:
    """Per request: its plain chained key-block hashes and hit limit.

    The keys are the blocks the request leaves computed: its tokens but the last sampled one
    (prompt + served output, whose last token's KV is never written), so every full prompt
    block when the outputs are the simulator's pseudo tokens (unique, never shared)."""
    hasher = BlockHasher(block_size)
    keys: list[list[bytes]] = []
    limits: list[int] = []
    for entry in items:
        it, max_out = (entry.item, entry.max_tokens) if isinstance(entry, ServedItem) else (entry, None)
        out = it.output_ids
        if out is not None and max_out is not None:
            out = out[:max_out]
        known = out is not None and len(out) > 0
        tokens = np.concatenate([it.prompt(), out]) if known else it.prompt()
        req = Request(it.request_id, tokens)
        hasher.update(req)
        del req.block_hashes[((len(tokens) - 1) if known else len(tokens)) // block_size:]
        keys.append(req.block_hashes)
        limits.append((it.prompt_len - 1) // block_size)
    return keys, limits


def _bound_keys(items: Iterable[WorkItem | ServedItem],
                block_size: int) -> tuple[list[list[bytes]], list[int], list]:
    """Keys, hit limits and Belady next uses of ``items``.

    They do not depend on the capacity: the last workload's are kept (by identity of the
    ``items`` list and the block size), so a sweep worker computes them once for all its
    capacities. :func:`served_workload` keeps its last answer the same way, so the per-run
    served list is the same object across runs over one workload.
    """
    global _OPTIMUM_KEYS
    memo = _OPTIMUM_KEYS
    if memo is not None and memo[0] is items and memo[1] == block_size:
        return memo[2], memo[3], memo[4]
    _OPTIMUM_KEYS = None                     # free the previous workload's keys first
    keys, limits = _compute_bound_keys(items, block_size)
    uses = next_use_indices(keys)
    if isinstance(items, list):
        _OPTIMUM_KEYS = (items, block_size, keys, limits, uses)
    return keys, limits, uses


_OPTIMUM_KEYS: tuple | None = None   # (items, block_size, keys, limits, next uses) of the last call


def optimal_hit_blocks(items: Iterable[WorkItem | ServedItem], block_size: int,
                       capacity_blocks: int) -> int:
    """Prompt blocks the offline optimum (Belady with bypass) hits, one request at a time.

    Keys are plain chained block hashes (no lookahead, no salt), computed independently of
    the simulated manager. A request may hit its prompt's first ``(prompt_len - 1) //
    block_size`` blocks (the last token is always recomputed, online and here); after it,
    its blocks are inserted, including those of its output when the workload knows the
    output tokens (the next turn of a chat repeats them), cut to the ``max_tokens`` the
    online run generated for a :class:`ServedItem`.
    """
    keys, limits, uses = _bound_keys(items, block_size)
    return belady_block_hit_rate(keys, capacity_blocks, limits, next_uses=uses).block_hits


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


def gap_report(keys: list[list[bytes]], limits: list[int], optimum_blocks: int,
               online: OnlineHits) -> GapReport:
    """Attribute the online run's missed blocks (see :class:`GapReport`)."""
    seen: set[bytes] = set()
    ceiling: list[int] = []
    for ks, lim in zip(keys, limits):
        h = 0
        for k in ks[:lim]:
            if k not in seen:
                break
            h += 1
        ceiling.append(h)
        seen.update(ks)
    del seen
    att = online.attention_blocks
    # Each request's loss [h, c) is split at a = the full-attention groups' own hit: [h, a) is
    # "retained" (another group could not serve it) unless the block at h was still being
    # computed (timing); [a, c) is charged by the first block past a.
    split: list[tuple[int, int]] = []      # (where the loss starts, where the charged part starts)
    for r, (c, h) in enumerate(zip(ceiling, online.hit_blocks)):
        split.append((h, h if att is None else max(h, min(att[r], c))))
    firsts = {keys[r][at] for r, (c, (h, a)) in enumerate(zip(ceiling, split))
              for at in {h, a} if at < c}
    producer: dict[bytes, int] = {}
    for j, ks in enumerate(keys):
        if len(producer) == len(firsts):
            break
        for k in ks:
            if k in firsts and k not in producer:
                producer[k] = j
    where = online.instance

    def cause(r: int, at: int) -> str:
        j = producer[keys[r][at]]
        if online.finished_t[j] > online.admitted_t[r]:
            return "flight"
        if where is not None and where[j] != where[r]:
            return "routed"
        return "evicted"
    counts = {k: [0, 0] for k in ("flight", "routed", "evicted", "retained")}
    for r, (c, (h, a)) in enumerate(zip(ceiling, split)):
        if h >= c:
            continue
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


def _bound_and_gap(items: list[ServedItem], block_size: int, capacity: int,
                   get_online: Callable[[], OnlineHits], extra: Extra | None = None,
                   side: Callable[[], object] | None = None) -> tuple:
    """The Belady bound, the non-anticipative (hazard-rate) reference (:mod:`hybridkv.sim.bounds.hazard`)
    and ``side()`` (work that needs no online result), then (once the online run is done) the
    gap attribution and ``extra(keys, limits, next_uses, capacity, online)``."""
    global _HAZARD_PARTS
    keys, limits, uses = _bound_keys(items, block_size)
    opt = belady_block_hit_rate(keys, capacity, limits, next_uses=uses).block_hits
    parts = _HAZARD_PARTS
    if parts is None or parts[0] is not keys:
        _HAZARD_PARTS = None
        hz_uses = hazard_uses(keys)
        parts = (keys, hz_uses, hazard_table(keys, limits, hz_uses))
        _HAZARD_PARTS = parts
    hazard = hazard_bound(keys, limits, capacity, parts[2], parts[1])
    beside = side() if side is not None else None
    online = get_online()
    more = extra(keys, limits, uses, capacity, online) if extra is not None else None
    return opt, gap_report(keys, limits, opt, online), more, hazard, beside


#: A computation on a served workload's keys beside the bound (``hybridkv.sim.bounds.whatif``).
Extra = Callable[[list, list, list, int, OnlineHits], object]

_HAZARD_PARTS: tuple | None = None   # (keys, uses, table) of the last workload's hazard reference


class OptimumJob:
    """The offline bound, the non-anticipative reference and the gap report of one run over a
    served workload.

    Large workloads (more than :data:`PARALLEL_OPTIMUM_TOKENS` prompt tokens, with ``parallel``
    and where ``fork`` exists) compute it in a forked child from the start, while the
    simulation runs on this core: the bound needs no simulation state, and the child waits for
    the online run's :class:`OnlineHits` only for the gap report. Others compute it inline in
    :meth:`result`. ``extra`` (see :data:`Extra`) runs after the gap report, in the same place;
    its answer is the third item of :meth:`result`. ``side()`` runs in the same place before
    the online run is needed (in the child: while the simulation runs); its answer is
    :attr:`side_result` once :meth:`result` returned.
    """

    def __init__(self, served: list[ServedItem], block_size: int, capacity: int,
                 parallel: bool = True, extra: Extra | None = None,
                 side: Callable[[], object] | None = None) -> None:
        self.served = served
        self.block_size = block_size
        self.capacity = capacity
        self.extra = extra
        self.side = side
        self.side_result: object = None
        self._child = self._conn = None
        if parallel and sum(s.item.prompt_len for s in served) > PARALLEL_OPTIMUM_TOKENS \
                and "fork" in mp.get_all_start_methods():
            ctx = mp.get_context("fork")
            self._conn, child_conn = ctx.Pipe()
            self._child = ctx.Process(target=_optimum_child, daemon=True,
                                      args=(served, block_size, capacity, child_conn, extra, side))
            self._child.start()
            child_conn.close()

    def result(self, online: OnlineHits) -> tuple[int, GapReport, object, HazardBound]:
        """The bound in key blocks, the gap report, ``extra``'s answer and the non-anticipative
        reference (:mod:`hybridkv.sim.bounds.hazard`), given the finished online run's hits.

        Raises:
            ChildProcessDied: the forked child died before it answered (``SIGKILL`` from the
                kernel's out-of-memory killer, typically); the message names its pid and signal.
        """
        if self._child is None:
            *got, self.side_result = _bound_and_gap(self.served, self.block_size, self.capacity,
                                                    lambda: online, self.extra, self.side)
            return tuple(got)
        try:
            self._conn.send(online)
            got = self._conn.recv()
        except (OSError, EOFError):     # the child died before it answered (killed, OOM)
            self._child.join(timeout=5)
            self.cancel()
            raise ChildProcessDied(f"the offline optimum's child process (pid {self._child.pid}) "
                                   f"{describe_exit(self._child.exitcode)} before it answered",
                                   child="optimum") from None
        self._child.join()
        if isinstance(got, BaseException):
            raise got
        *got, self.side_result = got
        return tuple(got)

    def cancel(self) -> None:
        """Stop the child, if any, and wait for it (the run failed or was interrupted)."""
        if self._child is not None:
            self._child.kill()
            self._child.join(timeout=5)
            self._conn.close()


def _optimum_child(items: list[ServedItem], block_size: int, capacity: int, conn,
                   extra: Extra | None, side: Callable[[], object] | None = None) -> None:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent handles Ctrl-C and stops us
    try:
        conn.send(_bound_and_gap(items, block_size, capacity, conn.recv, extra, side))
    except BaseException as exc:  # report, never hang the parent
        conn.send(exc)
    finally:
        conn.close()
