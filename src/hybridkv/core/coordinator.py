"""Cross-group lookup, allocation and caching.

Per request and per group the coordinator keeps a positional block table: entry j holds the
group's tokens ``[j*bs, (j+1)*bs)``, or the null block 0 where the tokens left the window::

    full (bs 16)     [ 7][ 8][ 9][10][11][12]             tokens 0..95
    sliding (bs 32)  [ 0][ 0][21][22]      window W=40 -> blocks 0,1 freed, now null
                      ^^^^^^ below the window: never read again

**Lookup** is a fixed point: every group answers "the largest aligned hit <= t that my rule
can serve", starting at t = num_tokens - 1 and feeding each answer to the next group, until a
full pass leaves t unchanged. Each answer is <= its input and the true common hit is <= every
answer, so the loop ends at the largest hit all groups serve. Full attention is
downward-closed and answers once; identical sibling groups (same spec) are probed together
(a block counts as cached only if every sibling has it).

**Allocation** is a pure plan and a commit. :meth:`KVCacheCoordinator.plan` counts, per
group, the new blocks for the scheduled tokens and lookahead slots, the free (evictable) hit
blocks a touch takes out of the free queue, and the blocks that sliding out of the window
releases; the :class:`AllocationPlan` says whether that fits. :meth:`KVCacheCoordinator.commit`
applies a plan that fits; nothing is mutated before it. An admission check that reserves more
than it allocates (vLLM's full-sequence reservation) is a plan for a larger token count.

**Decode fast path**: :meth:`KVCacheCoordinator.step_is_quiet` answers, from three thresholds
kept per request, whether a step needs no new block, caches nothing and releases nothing; then
the allocation is a no-op and is skipped.

**Caching** walks the promised hit ends (:mod:`hybridkv.core.retention`) and gives each group
the hashes of exactly the runs its rule needs for them (:mod:`hybridkv.core.rules`).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Callable, NamedTuple

from hybridkv.core.blockref import TableRef
from hybridkv.core.hashing import BlockHasher
from hybridkv.core.pool import NULL_BLOCK, BlockPool
from hybridkv.core.request import Request
from hybridkv.core.retention import Retention, multiples_between, replay_boundaries
from hybridkv.core.retention_config import block_marks
from hybridkv.core.rules import HitRule, make_rule, rule_class
from hybridkv.core.specs import KVCacheConfig


@dataclass(frozen=True, slots=True)
class CacheHit:
    """The result of a lookup: reusable tokens and, per group, the blocks that hold them.

    ``block_ids[g]`` has ``num_tokens // block_size_g`` entries; 0 marks a block outside the
    group's window (not needed). ``shared_prefix_boundary`` > 0 when a longer prefix is cached
    in some group but not servable by all: allocating this hit then promises that boundary,
    so the prefix becomes reusable (Marconi-style junction). ``request_id`` names the request
    the hit was looked up for (None for a hand-made hit); only that request can adopt it.
    A hit is a snapshot of the coordinator state ``epoch``: allocate it before other requests
    allocate, or look up again. A hit adopted after the state changed (or hand-made, epoch -1)
    is verified block by block; a block that no longer carries the request's hash for its
    position is refused.
    """

    num_tokens: int
    block_ids: tuple[tuple[int, ...], ...]
    shared_prefix_boundary: int = 0
    request_id: object = None
    epoch: int = -1


@dataclass(frozen=True, slots=True)
class ExternalHit:
    """A prefix an external tier (CPU memory, a KV store) can extend a local hit to.

    ``num_tokens`` (> the local hit) is the end of the combined hit: the same per-type rules
    and alignment as a local hit, with each needed block either held by the local hit or
    present in the tier. ``loads`` lists a :class:`TableRef` for every block to load:
    the blocks past the local hit that the hit rule needs (for a sliding window, only the
    window before ``num_tokens``).
    """

    num_tokens: int
    local_tokens: int
    loads: tuple[TableRef, ...]


def _report_runs(report: Callable[[int, Request, int, list[int]], None], group: int,
                 request: Request, table: list[int], positions: list[int]) -> None:
    """Call ``report(group, request, first, blocks)`` once per run of consecutive ``positions``
    (ascending), with the run's block ids from ``table``."""
    start = 0
    for k in range(1, len(positions) + 1):
        if k == len(positions) or positions[k] != positions[k - 1] + 1:
            report(group, request, positions[start], [table[j] for j in positions[start:k]])
            start = k


class _Unit:
    """Groups looked up together: one spec and one hit rule."""

    __slots__ = ("groups", "rule", "scale", "step")

    def __init__(self, groups: list[int], rule: HitRule, scale: int, step: int) -> None:
        self.groups = groups
        self.rule = rule
        self.scale = scale  # group block size / hash block size
        self.step = step    # alignment / group block size


class GroupPlan(NamedTuple):
    """One group's share of an :class:`AllocationPlan`.

    Attributes:
        new_blocks: blocks the commit pops from the pool for this group's table (a state
            group: new extents, counted by head; each takes the config's extent size in
            block ids, which ``num_needed`` counts).
        touched: free (evictable) blocks of the adopted hit that the commit takes out of the
            free queue.
        released: table positions that left the window, back to front (one run without
            gaps: the entries below it are null already); the commit frees
            them (before it pops new blocks) and nulls the entries.
        freed: how many of the released blocks go back to the free queue (last reference).
    """

    new_blocks: int
    touched: int
    released: tuple[int, ...]
    freed: int


# The plan of a group that neither grows nor releases (shared: plans are immutable).
_UNCHANGED = GroupPlan(0, 0, (), 0)


class AllocationPlan(NamedTuple):
    """What an allocation would do, counted without mutating anything (a NamedTuple: built
    on every slow-path allocation, where a frozen dataclass costs microseconds).

    A plan is valid for the coordinator state it was made against (``epoch``): commit it
    before any other allocation, free or load commit, or plan again.

    Attributes:
        request_id: the request planned for.
        new_request: the request holds no blocks yet (the commit adopts ``hit``).
        hit: the lookup result a new request adopts (None: none).
        num_computed: tokens with KV after adopting the hit.
        num_tokens: ``num_computed`` + the scheduled tokens; the commit caches promised ends
            up to ``min(num_tokens, request.num_tokens)``.
        slots: tokens every group's table covers after the commit (scheduled tokens,
            lookahead slots and an external load's reservation, capped at max_model_len).
        groups: per group, a :class:`GroupPlan`.
        num_needed: blocks the commit takes out of the free queue (new blocks plus touched
            hit blocks, summed over the groups).
        num_available: free blocks when planned plus the blocks the window releases before
            new ones are popped.
        num_reserved: blocks an admission reservation wants kept available beyond the
            commit's (``plan(..., reserve_tokens=)``); never allocated by the commit.
        epoch: the coordinator's state version when planned.
    """

    request_id: object
    new_request: bool
    hit: CacheHit | None
    num_computed: int
    num_tokens: int
    slots: int
    groups: tuple[GroupPlan, ...]
    num_needed: int
    num_available: int
    num_reserved: int
    epoch: int

    @property
    def fits(self) -> bool:
        """The commit's blocks, and any reservation on top, are available."""
        return self.num_needed + self.num_reserved <= self.num_available


# Builds a NamedTuple from a tuple of all its fields in order without the generated
# keyword-handling __new__ (half the cost; plans are built on every slow-path allocation).
_make = tuple.__new__

# Runs at least this long are cached with one BlockPool.insert_run (C-level bulk updates);
# shorter ones block by block, which costs less for a few blocks.
_BULK_RUN = 12


class StateExport(NamedTuple):
    """A checkpoint the engine must write: after computing the first ``position`` tokens,
    copy the live state into ``blocks`` (an extent: head first)."""

    position: int
    blocks: tuple[int, ...]


class StateBlocks(NamedTuple):
    """What the engine needs for one state group of one request (see
    :meth:`hybridkv.core.manager.KVCacheManager.state_blocks`).

    Attributes:
        group: the state group's index.
        live: the extent holding the request's live state (after ``num_computed_tokens``).
        restore_from: the checkpoint extent to copy into ``live`` before the request's first
            step (its cache hit ends at ``restore_position``); () when it has no hit.
        restore_position: the hit's end (0 without a hit).
        exports: the checkpoints the last allocation asked for, ascending positions.
    """

    group: int
    live: tuple[int, ...]
    restore_from: tuple[int, ...]
    restore_position: int
    exports: tuple[StateExport, ...]


class _StateBlocks:
    """One state group's per-request extents (heads)."""

    __slots__ = ("live", "held", "restore", "restore_at", "exports")

    def __init__(self) -> None:
        self.live = NULL_BLOCK                   # head of the live extent
        self.held: list[int] = []                # table positions holding a checkpoint
        self.restore = NULL_BLOCK                # hit checkpoint to copy from (first step)
        self.restore_at = 0
        self.exports: list[tuple[int, int]] = [] # (position, head) asked by the last commit


class _ReqBlocks:
    """Per-request bookkeeping: tables, and how far the write path has gone per group."""

    __slots__ = ("owner", "tables", "cached_hi", "done_t", "boundaries", "mask_ends",
                 "quiet_until", "slots", "slide_until", "states")

    def __init__(self, owner: Request, num_groups: int) -> None:
        self.owner = owner                  # the Request object that holds these blocks
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.cached_hi = [0] * num_groups   # blocks below were decided (cached or scratch)
        self.done_t = [0] * num_groups      # promised ends <= done_t were processed
        self.boundaries: tuple[int, ...] = ()
        # compat block-mask groups: per group, the request's boundary ends in that group's blocks
        self.mask_ends: list[tuple[int, ...]] = []
        # cache() is a no-op below this many tokens: no group has a promised end in
        # (done_t, num_tokens] (a decode step between block boundaries skips the walk)
        self.quiet_until: float = 0
        # allocate() needs no new block while computed + new + lookahead <= slots, and no
        # block leaves a window while num_computed < slide_until (0: not known yet)
        self.slots = 0
        self.slide_until: float = 0
        # state groups only (None otherwise): live extents, held checkpoints, restore/exports
        self.states: dict[int, _StateBlocks] | None = None


class KVCacheCoordinator:
    """Lookup, allocation and caching over all groups of one pool.

    Args:
        config: the KV-cache config.
        pool: the shared block pool.
        hasher: produces the requests' hashes at ``config.hash_block_size``.
        retention: the promised-end policy.
        drop_mode: EAGLE drop mode (draft groups need the block after a hit).
        vllm_compat: reproduce vLLM 0.33 (full groups always cache every block; no
            below-boundary or final-length promises).
        caching: prefix caching enabled.
        on_stored: event callback ``(group, request, first_block, blocks)`` for each cached run.
        max_in_flight_tokens: tokens scheduled but not yet computed at most (vLLM's
            ``max_in_flight_tokens``); caps a window group's admission reservation in compat
            mode (None: only max_model_len caps it).
    """

    def __init__(self, config: KVCacheConfig, pool: BlockPool, hasher: BlockHasher,
                 retention: Retention, drop_mode: bool, vllm_compat: bool, caching: bool,
                 max_model_len: int | None,
                 on_stored: Callable[[int, Request, int, list[int]], None] | None = None,
                 max_in_flight_tokens: int | None = None) -> None:
        self.config = config
        self.max_in_flight_tokens = max_in_flight_tokens
        self.pool = pool
        self.hasher = hasher
        self.retention = retention
        self.drop_mode = drop_mode
        self.compat = vllm_compat
        self.caching = caching
        self.max_model_len = max_model_len
        self.len_cap = max_model_len if max_model_len is not None else math.inf
        self.on_stored = on_stored
        #: ``(group, request, first_block, blocks)`` for each run that :meth:`commit_external`
        #: caches (loaded from a tier, not computed here): KV events only, never saves.
        self.on_adopted: Callable[[int, Request, int, list[int]], None] | None = None
        self.alignment = config.alignment
        hbs = config.hash_block_size
        groups = config.groups
        any_draft = any(g.is_draft for g in groups)
        # Identical sibling groups (same spec) are one lookup unit and share one write mask:
        # if any sibling is a draft group, all of them carry the proof (vLLM #44082).
        by_spec: dict[object, list[int]] = {}
        for i, g in enumerate(groups):
            by_spec.setdefault(g.spec, []).append(i)
        self.proof = [False] * len(groups)
        for ids in by_spec.values():
            draft = drop_mode and (not any_draft or any(groups[i].is_draft for i in ids))
            for i in ids:
                self.proof[i] = draft
        for i, g in enumerate(groups):
            if rule_class(g.spec).sparse:    # recurrent layers are never in a drafter: no proof
                self.proof[i] = False
        self.rules: list[HitRule] = [make_rule(g.spec, self.proof[i]) for i, g in enumerate(groups)]
        self.block_sizes = [g.spec.block_size for g in groups]
        # Tokens local groups keep past their window until proof blocks complete (not in vLLM).
        self.hold = 0 if vllm_compat else max(
            (bs for bs, p in zip(self.block_sizes, self.proof) if p), default=0)
        if not vllm_compat and not retention.dense:
            # The final length is promised at free (rounded down to the alignment): keep one
            # alignment unit more of each window so that end's run is still in the table.
            self.hold = max(self.hold, config.alignment)
        self.scales = [bs // hbs for bs in self.block_sizes]
        # Dense write path: every aligned end. Downward-closed (full) groups ignore retention.
        self.dense = [retention.dense or r.downward_closed for r in self.rules]
        self.releasing = [r for r in self.rules if not r.downward_closed]
        # Compat mode, sparse retention: window groups write vLLM's per-block mask
        # (Retention.next_masked_block) instead of the runs of completed promised ends.
        # (bool(): Cython miscompiles `obj and not x and ...` here; setup.py, MISCOMPILE.)
        self.masked = [bool(vllm_compat) and not retention.dense and r.window is not None
                       for r in self.rules]
        # Compat mode: vLLM's hybrid coordinator caches a group only up to its cacheable
        # prefix (get_num_cacheable_tokens): align(n), or for an EAGLE group
        # min(n, align(n) + block_size); the unitary coordinator caches all n.
        self.hybrid_limit = vllm_compat and len(groups) > 1
        self.aligned_limit = [self.hybrid_limit and not p for p in self.proof]
        # Next-end step of the dense write path: downward-closed groups in compat mode end
        # on any block boundary (their cacheable prefix need not be aligned), else A.
        self.dense_step = [r.block_size if (vllm_compat and r.downward_closed) else config.alignment
                           for r in self.rules]
        # cache(n) can reach a promised end t only once n >= t + delay: the proof block(s)
        # must be computed too (per group in compat mode, for all groups at once otherwise)
        delays = [r.proof * r.block_size for r in self.rules]
        self.cache_delay = delays if vllm_compat else [max(delays)] * len(delays)
        ordered = sorted(by_spec.values(), key=lambda ids: not self.rules[ids[0]].downward_closed)
        self.units = [
            _Unit(ids, self.rules[ids[0]], self.scales[ids[0]], self.alignment // self.block_sizes[ids[0]])
            for ids in ordered
        ]
        self.admission_caps = [r.admission_cap(max_in_flight_tokens, self.len_cap)
                               for r in self.rules]
        # State groups (recurrent layers): block ids per state (the extent size) and the
        # group indices; empty for configs without one, whose paths never look at them.
        self.extent = [config.extent_blocks(g) for g in range(len(groups))]
        self.state_groups = [g for g, r in enumerate(self.rules) if r.sparse]
        self.is_state_group = [g in self.state_groups for g in range(len(groups))]
        self.reqs: dict[object, _ReqBlocks] = {}
        # request id -> [request, index version, hashes, max_tokens, hit, hash set] of its
        # last lookup (see _memo_valid)
        self._lookups: dict[object, list] = {}
        # request id -> (hit block ids, pool free_version, counts) (see _evictable_counts)
        self._evictable: dict[object, tuple] = {}
        # the pool's record of index changes (a pool without one: the memo needs the same
        # index version)
        self._index_changes = getattr(pool, "index_changes_since", None)
        # bumped by every mutation; a plan or hit made before it is stale
        self.epoch = 0

    def holds(self, request: Request) -> bool:
        """Whether ``request`` holds blocks; raises if a different Request object holds its id."""
        state = self.reqs.get(request.request_id)
        if state is not None and state.owner is not request:
            self._state(request)                                  # raises
        return state is not None

    def _state(self, request: Request) -> _ReqBlocks | None:
        """The request's bookkeeping; raises if another Request object holds its id."""
        state = self.reqs.get(request.request_id)
        if state is not None and state.owner is not request:
            raise ValueError(
                f"request id {request.request_id!r} already holds blocks for a different Request "
                "object; free that request first or use a unique id")
        return state

    # ---- lookup -----------------------------------------------------------------------------
    def find_longest_hit(self, request: Request, max_tokens: int) -> CacheHit:
        """The longest prefix of at most ``max_tokens`` tokens every group can serve.

        Each unit's "is block j cached" answers are computed up front for every hashed
        block up to ``max_tokens``, in C (``map`` of the index's ``__contains__``): a dict membership test per
        block is far cheaper than the Python-level probes the rules' scans would otherwise
        make (a small-pool waiting request is looked up every step). Block ids are read
        from the index only for the blocks of the final hit.
        """
        hashes = request.block_hashes
        n_fine = len(hashes)
        pool = self.pool
        version = pool.index_version
        memo = self._lookups.get(request.request_id)
        if memo is not None and memo[0] is request and memo[2] == n_fine \
                and memo[3] == max_tokens and self._memo_valid(memo, hashes, version):
            # none of this request's hashes was cached or evicted since its last lookup (a
            # waiting request is looked up every step): the same hit, valid now
            hit = memo[4]
            if hit.epoch != self.epoch:
                hit = CacheHit(hit.num_tokens, hit.block_ids, hit.shared_prefix_boundary,
                               hit.request_id, self.epoch)
            return hit
        hit = self._find_longest_hit(request, max_tokens)
        if len(self._lookups) >= 4096:
            self._lookups.clear()
        self._lookups[request.request_id] = [request, version, n_fine, max_tokens, hit, None]
        return hit

    def _memo_valid(self, memo: list, hashes: list[bytes], version: int) -> bool:
        """Whether a memoized lookup (``[request, index version, hashes, max_tokens, hit,
        hash set]``) still holds: no index change since touched one of the request's hashes.
        Moves the memo to ``version`` when it holds."""
        if memo[1] == version:
            return True
        changes = self._index_changes(memo[1]) if self._index_changes is not None else None
        if changes is None:
            return False
        mine = memo[5]
        if mine is None:
            mine = memo[5] = set(hashes)
        if not mine.isdisjoint(changes):
            return False
        memo[1] = version
        return True

    def _find_longest_hit(self, request: Request, max_tokens: int) -> CacheHit:
        hashes = request.block_hashes
        n_fine = len(hashes)
        index = self.pool.index
        probes = []
        for unit in self.units:
            scale = unit.scale
            # blocks past max_tokens (plus a proof block) can never be part of the hit
            hs = hashes[scale - 1:(max_tokens // unit.rule.block_size + 1) * scale:scale]
            flags = list(map(index[unit.groups[0]].__contains__, hs))
            for g in unit.groups[1:]:
                flags = list(map(operator.and_, flags, map(index[g].__contains__, hs)))
            probes.append(flags.__getitem__)
        t, longest = self._fixed_point(probes, n_fine, max_tokens)
        t = max(t, 0)
        rid = request.request_id
        if t == 0:
            return CacheHit(0, tuple(() for _ in self.config.groups), max(longest, 0), rid,
                            self.epoch)
        block_ids: list[tuple[int, ...]] = [()] * len(self.config.groups)
        for unit in self.units:
            e = t // unit.rule.block_size
            lo = unit.rule.lo(e)
            scale = unit.scale
            hs = hashes[(lo + 1) * scale - 1:e * scale:scale]
            for g in unit.groups:
                ids = list(map(index[g].__getitem__, hs))
                # a duplicated hash (a dict of block ids): its first block
                for k in compress(range(len(ids)), map(isinstance, ids, repeat(dict))):
                    ids[k] = next(iter(ids[k]))
                block_ids[g] = (NULL_BLOCK,) * lo + tuple(ids)
        boundary = longest if longest > t else 0
        return CacheHit(t, tuple(block_ids), boundary, rid, self.epoch)

    def _fixed_point(self, probes: list[Callable[[int], object]], n_fine: int,
                     max_tokens: int) -> tuple[int, int]:
        """The largest aligned t <= max_tokens every unit serves, and the first unit's answer."""
        # Largest e per unit whose proof block (if any) has a hash.
        e_cap = [n_fine // unit.scale - unit.rule.proof for unit in self.units]
        if self.compat and len(self.config.groups) == 1:
            # vLLM's single-group coordinator gives drop mode no margin: the proof block
            # must lie below max_tokens too (a hit one block shorter than the hybrid one).
            unit = self.units[0]
            e_cap[0] = min(e_cap[0], max_tokens // unit.rule.block_size - unit.rule.proof)
        full_answer: dict[int, int] = {}
        a = self.alignment
        t = max_tokens // a * a
        longest = -1
        while True:
            start = t
            for u, unit in enumerate(self.units):
                if t <= 0:
                    break
                bs = unit.rule.block_size
                e_max = min(t // bs, e_cap[u])
                if unit.rule.downward_closed:
                    # downward-closed: one scan at the first candidate answers every later one
                    if u not in full_answer:
                        full_answer[u] = unit.rule.longest_hit(probes[u], e_max, unit.step) * bs
                    t = min(t // a * a, full_answer[u])
                else:
                    t = unit.rule.longest_hit(probes[u], e_max, unit.step) * bs
                if longest < 0:
                    longest = t
            if t <= 0 or t == start:
                break
        return max(t, 0), longest

    def find_external_hit(self, request: Request, max_tokens: int, local: CacheHit,
                          contains: Callable[[int, bytes], bool]) -> ExternalHit | None:
        """Extend ``local`` with blocks an external tier holds (``contains(group, hash)``).

        The same fixed point as :meth:`find_longest_hit`, where a block counts as cached if
        the local hit holds it or the tier has it in every group of its unit. None if the
        tier adds nothing.
        """
        if self.state_groups:
            return None          # checkpoints are not kept in external tiers (yet)
        hashes = request.block_hashes
        held = local.num_tokens

        def make_probe(unit: _Unit) -> Callable[[int], object]:
            below = held // unit.rule.block_size
            scale = unit.scale
            gids = unit.groups

            def probe(j: int) -> object:
                if j < below:
                    return True
                h = hashes[(j + 1) * scale - 1]
                return all(contains(g, h) for g in gids)
            return probe

        t, _ = self._fixed_point([make_probe(u) for u in self.units], len(hashes), max_tokens)
        if t <= held:
            return None
        loads = []
        for g, rule in enumerate(self.rules):
            bs = rule.block_size
            e = t // bs
            scale = self.scales[g]
            for j in range(max(rule.lo(e), held // bs), e):
                loads.append(TableRef(g, j, hashes[(j + 1) * scale - 1]))
        return ExternalHit(t, held, tuple(loads))

    def commit_external(self, request: Request, ext: ExternalHit, ok: bool) -> None:
        """After the loads of ``ext``: on success cache the loaded blocks under their hashes
        and count the tokens as computed; on failure change nothing (they are recomputed)."""
        state = self._state(request)
        assert state is not None
        state.quiet_until = 0
        self.epoch += 1
        if not ok:
            return
        pool = self.pool
        adopted: dict[int, list[int]] = {}   # group -> positions newly cached
        for g, j, h in ext.loads:
            b = state.tables[g][j]
            if self.caching and pool.block_hash[b] is None:
                pool.insert(g, h, b)
                adopted.setdefault(g, []).append(j)
        if self.on_adopted is not None:
            for g, positions in adopted.items():   # one KV event per run of positions
                _report_runs(self.on_adopted, g, request, state.tables[g], sorted(positions))
        t = ext.num_tokens
        for g, bs in enumerate(self.block_sizes):
            # ends below t are skipped (a window group loaded only t's run); t itself stays
            # open so a proof block (drop mode) is cached once this request computes it
            state.done_t[g] = max(state.done_t[g], t - 1)
            state.cached_hi[g] = max(state.cached_hi[g], t // bs)
        request.num_computed_tokens = t

    # ---- allocation -------------------------------------------------------------------------
    def step_is_quiet(self, request: Request, num_new_tokens: int, lookahead: int) -> bool:
        """True iff allocating ``num_new_tokens`` more tokens (+ ``lookahead`` slots) for this
        request would change nothing: no new block, nothing to cache, no block leaving a window.

        The decode fast path: three comparisons against thresholds the last commit and cache
        pass left (``slots``, ``quiet_until``, ``slide_until``). False for an unknown request,
        a different Request object with a known id, or tokens past max_model_len (the slow
        path then raises).
        """
        state = self.reqs.get(request.request_id)
        if state is None or state.owner is not request:
            return False
        computed = request.num_computed_tokens
        slots = computed + num_new_tokens + lookahead
        if slots > self.len_cap:
            if computed + num_new_tokens > self.len_cap:
                return False                        # past max_model_len: the slow path refuses it
            slots = self.len_cap
        return slots <= state.slots and computed < state.slide_until \
            and computed + num_new_tokens < state.quiet_until

    def _released(self, table: list[int], rule: HitRule, num_computed: int) -> tuple[int, ...]:
        """Table positions that left the window of ``rule`` at ``num_computed`` (back to front)."""
        nskip = rule.skipped_tokens(num_computed, self.hold) // rule.block_size
        if nskip > len(table):
            nskip = len(table)
        if nskip <= 0 or table[nskip - 1] == NULL_BLOCK:          # nothing left the window
            return ()
        j = nskip - 2
        while j >= 0 and table[j] != NULL_BLOCK:
            j -= 1
        return tuple(range(nskip - 1, j, -1))

    def plan(self, request: Request, num_new_tokens: int, hit: CacheHit | None, lookahead: int,
             external: ExternalHit | None = None, reserve_tokens: int = 0) -> AllocationPlan:
        """Count what :meth:`allocate` would do; changes nothing.

        ``reserve_tokens`` (an admission check): the plan fits only if, after the commit, a
        sequence of that many tokens (capped at max_model_len) could still grow to its peak
        footprint, ``rule.max_blocks`` per group; the blocks beyond the commit's are counted
        in :attr:`AllocationPlan.num_reserved` and are not allocated.

        Raises:
            ValueError: a different Request object holds the id, or an adopted hit block no
                longer carries the request's hash for its position (a stale or foreign hit).
        """
        state = self.reqs.get(request.request_id)
        if state is not None and state.owner is not request:
            self._state(request)                                  # raises
        new_request = state is None
        computed = request.num_computed_tokens
        if hit is not None:
            computed += hit.num_tokens
        slots = computed + num_new_tokens
        if external is not None and external.num_tokens > slots:
            slots = external.num_tokens
        slots += lookahead
        if slots > self.len_cap:
            slots = self.len_cap
        ref = self.pool.ref_cnt
        groups = []
        needed = freed_total = 0
        if new_request:
            if hit is not None and hit.num_tokens and hit.epoch != self.epoch:
                self._verify_hit(request, hit)
            counts = self._evictable_counts(request, hit)
            for g, bs in enumerate(self.block_sizes):
                ids = hit.block_ids[g] if hit is not None else ()
                touched = counts[g]
                new = -(-slots // bs) - len(ids)
                if new < 0:
                    new = 0
                needed += new + touched
                groups.append(_make(GroupPlan, (new, touched, (), 0)))
        else:
            for table, bs, rule in zip(state.tables, self.block_sizes, self.rules):
                new = -(-slots // bs) - len(table)
                if new > 0:
                    needed += new
                else:
                    new = 0
                # a downward-closed rule never releases a block
                released = () if rule.downward_closed else self._released(table, rule, computed)
                if released:
                    freed = list(map(ref.__getitem__, map(table.__getitem__, released))).count(1)
                    freed_total += freed
                    groups.append(_make(GroupPlan, (new, 0, released, freed)))
                else:
                    groups.append(_make(GroupPlan, (new, 0, (), 0)) if new else _UNCHANGED)
        reserved = 0
        if reserve_tokens and self.compat:
            # vLLM 0.33's full_sequence_must_fit: its count must fit the free blocks as they
            # are before the window frees (kv_cache_manager.allocate_slots)
            want = self._vllm_admission_blocks(state, hit if new_request else None,
                                               reserve_tokens, computed,
                                               [gp.touched for gp in groups] if new_request else None)
            reserved = want + freed_total - needed
            if reserved < 0:
                reserved = 0
        elif reserve_tokens > slots:
            if self.max_model_len is not None:
                reserve_tokens = min(reserve_tokens, self.max_model_len)
            for g, gp in enumerate(groups):
                ids = hit.block_ids[g] if new_request and hit is not None else \
                    (state.tables[g] if state is not None else ())
                held = len(ids) - ids.count(NULL_BLOCK) - len(gp.released) + gp.new_blocks
                peak = self.rules[g].max_blocks(reserve_tokens, self.hold)
                if peak > held:
                    reserved += peak - held
        if self.state_groups:
            needed, freed_total, reserved = self._plan_states(
                request, state, hit, computed, num_new_tokens, slots, groups, needed,
                freed_total, reserved, reserve_tokens)
        return _make(AllocationPlan, (request.request_id, new_request, hit if new_request else None,
                                      computed, computed + num_new_tokens, slots, tuple(groups),
                                      needed, self.pool.num_free + freed_total, reserved,
                                      self.epoch))

    def _vllm_admission_blocks(self, state: _ReqBlocks | None, hit: CacheHit | None,
                               num_tokens: int, num_computed: int,
                               touched: list[int] | None = None) -> int:
        """vLLM 0.33's admission count (``get_num_blocks_to_allocate(...,
        apply_admission_cap=True)`` summed over groups): per group ``cdiv(n, bs)`` blocks
        (n = num_tokens capped at max_model_len), capped by the rule's
        :meth:`~hybridkv.core.rules.base.HitRule.admission_cap`; a new request subtracts
        its hit blocks or its out-of-window blocks, whichever is more, and adds the hit
        blocks a touch takes out of the free queue (``touched[g]``, when given, is that count
        for all of the hit's blocks); a running request subtracts its table."""
        n = num_tokens if num_tokens < self.len_cap else self.max_model_len
        total = 0
        for g, rule in enumerate(self.rules):
            bs = rule.block_size
            required = -(-n // bs)
            cap = self.admission_caps[g]
            if cap is not None and cap < required:
                required = cap
            if state is not None:
                held = len(state.tables[g])
                if required > held:
                    total += required - held
                continue
            ids = hit.block_ids[g] if hit is not None else ()
            skipped = rule.skipped_tokens(num_computed) // bs
            new = required - (skipped if skipped > len(ids) else len(ids))
            if new > 0:
                total += new
            if touched is not None and (skipped <= 0 or not any(ids[:skipped])):
                total += touched[g]              # the skipped blocks are all null: same count
            else:
                total += self._num_evictable(ids[skipped:])
        return total

    def _evictable_counts(self, request: Request, hit: CacheHit | None) -> list[int]:
        """Per group, :meth:`_num_evictable` of the hit's blocks. Memoized per request while
        the hit is the same (a waiting request's admission is planned again every step) and
        no cached block entered or left the free queue (``BlockPool.free_version``)."""
        if hit is None:
            return [0] * len(self.block_sizes)
        version = getattr(self.pool, "free_version", None)
        memo = self._evictable.get(request.request_id)
        if memo is not None and memo[0] is hit.block_ids and memo[1] == version is not None:
            return memo[2]
        counts = [self._num_evictable(ids) for ids in hit.block_ids]
        if len(self._evictable) >= 4096:
            self._evictable.clear()
        self._evictable[request.request_id] = (hit.block_ids, version, counts)
        return counts

    def _num_evictable(self, ids: tuple[int, ...]) -> int:
        """The non-null blocks of ``ids`` nobody references (in the free queue: a touch
        takes them out). Counted in C; a table never holds a block twice."""
        if not ids:
            return 0
        ref = self.pool.ref_cnt
        n = list(map(ref.__getitem__, ids)).count(0)
        if ref[NULL_BLOCK] == 0:
            n -= ids.count(NULL_BLOCK)
        return n

    def _verify_hit(self, request: Request, hit: CacheHit) -> None:
        """Raise unless every block of ``hit`` still holds the request's tokens."""
        block_hash = self.pool.block_hash
        block_group = self.pool.block_group
        hashes = request.block_hashes
        n_fine = len(hashes)
        for g, ids in enumerate(hit.block_ids):
            scale = self.scales[g]
            for j, b in enumerate(ids):
                if not b:
                    continue
                k = (j + 1) * scale - 1
                if k >= n_fine or block_hash[b] != hashes[k] or block_group[b] != g:
                    raise ValueError(
                        f"the hit's block {b} (group {g}, position {j}) no longer holds "
                        f"request {request.request_id!r}'s tokens: the hit is stale or was "
                        "looked up for another request; look up again")

    def commit(self, request: Request, plan: AllocationPlan) -> list[list[int]]:
        """Apply ``plan`` (made by :meth:`plan` for this request, and fitting).

        Order: adopt the hit (touch every group's blocks, then fill the tables), or for a
        running request cache pending ends and free the blocks that left the window (back to
        front); then pop the new blocks; then cache up to ``min(plan.num_tokens,
        request.num_tokens)`` (lookahead slots are never cached).
        Returns the newly allocated block ids per group.
        """
        if plan.epoch != self.epoch or plan.request_id != request.request_id:
            raise ValueError(f"stale allocation plan for request {request.request_id!r}; plan again")
        if plan.num_needed + plan.num_reserved > plan.num_available:          # not plan.fits
            raise ValueError(
                f"allocation plan for request {request.request_id!r} needs {plan.num_needed} "
                f"blocks (+{plan.num_reserved} reserved) but {plan.num_available} are available")
        pool = self.pool
        self.epoch += 1
        computed = plan.num_computed
        hit = plan.hit
        if plan.new_request:
            self._lookups.pop(request.request_id, None)
            self._evictable.pop(request.request_id, None)
            state = _ReqBlocks(request, len(self.block_sizes))
            self.reqs[request.request_id] = state
            state.boundaries = self._boundaries(request, hit)
            if any(self.masked):
                state.mask_ends = self._mask_ends(request, hit)
            if hit is not None and hit.num_tokens:
                for ids in hit.block_ids:                        # phase 1: touch every hit
                    pool.touch(ids)
                for g, ids in enumerate(hit.block_ids):
                    state.tables[g] = list(ids)
                    state.cached_hi[g] = len(ids)
                    # Compat (vLLM): the hit's proof block was dropped, so this request's
                    # copy of block e is written as soon as it is full: end e stays open.
                    state.done_t[g] = hit.num_tokens - (
                        self.cache_delay[g] if self.compat else 0)
        else:
            state = self.reqs[request.request_id]
            self._release(request, state, plan)
        new_blocks: list[list[int]] = []
        is_state_group = self.is_state_group
        for g, gp in enumerate(plan.groups):
            if gp.new_blocks and not is_state_group[g]:
                ids = pool.allocate(gp.new_blocks)
                state.tables[g].extend(ids)
                new_blocks.append(ids)
            else:
                new_blocks.append([])
        if self.state_groups:
            for g, heads in self._commit_states(request, state, plan).items():
                new_blocks[g] = heads          # a state group's new extents, by head
        n = len(request.token_ids)
        if plan.num_tokens < n:
            n = plan.num_tokens
        if n >= state.quiet_until:                  # (cache's own first test, saving the call)
            self.cache(request, n)
        state.slots = min(map(operator.mul, map(len, state.tables), self.block_sizes))
        if self.state_groups and self.caching:
            # the next checkpoint needs an extent: no quiet step may reach it
            nxt = self._next_export(request, state, n)
            if nxt - 1 < state.slots:
                state.slots = nxt - 1
        if not plan.new_request:
            state.slide_until = self._slide_until(computed)
        return new_blocks

    def _slide_until(self, computed: int) -> float:
        """The fewest computed tokens at which a block leaves some group's window."""
        releasing = self.releasing
        if len(releasing) == 1:
            return releasing[0].next_skip_growth(computed, self.hold)
        until = math.inf
        hold = self.hold
        for r in releasing:
            t = r.next_skip_growth(computed, hold)
            if t < until:
                until = t
        return until

    def _release(self, request: Request, state: _ReqBlocks, plan: AllocationPlan) -> None:
        """A running request's first commit phase: cache pending ends, then free the blocks
        that left the window (back to front) and null their table entries."""
        n = len(request.token_ids)
        if plan.num_computed < n:
            n = plan.num_computed
        if n >= state.quiet_until:                  # (cache's own first test, saving the call)
            self.cache(request, n)
        pool = self.pool
        for g, gp in enumerate(plan.groups):
            released = gp.released
            if released:
                table = state.tables[g]
                # released positions run back to front without a gap (_released)
                lo = released[-1]
                hi = released[0] + 1
                freed = table[lo:hi]
                freed.reverse()
                if request.retention is not None:
                    self._retain(request, g, table, released)
                table[lo:hi] = [NULL_BLOCK] * (hi - lo)
                pool.free(freed)

    def allocate(self, request: Request, num_new_tokens: int, hit: CacheHit | None,
                 lookahead: int, external: ExternalHit | None = None,
                 reserve_tokens: int = 0) -> list[list[int]] | None:
        """Blocks for ``num_new_tokens`` more tokens (+ lookahead slots); None if they don't fit.

        :meth:`plan` then :meth:`commit`. ``external`` (a new request only) also reserves
        blocks up to its end; they are neither computed nor cached until
        :meth:`commit_external`. ``reserve_tokens``: see :meth:`plan`. Returns the newly
        allocated block ids per group. On None nothing changed, except in compat mode, where
        (as in vLLM) the blocks that left the window of a running request are still freed.
        """
        if hit is None and external is None and not reserve_tokens:
            state = self.reqs.get(request.request_id)
            if state is not None and state.owner is request:
                computed = request.num_computed_tokens
                slots = computed + num_new_tokens + lookahead
                if slots > self.len_cap:
                    slots = self.len_cap
                if slots <= state.slots and computed < state.slide_until:
                    # Cache-only step (a block just completed): no block to pop or release,
                    # so the commit reduces to its two cache passes; skip building the plan.
                    self.epoch += 1
                    num_tokens = request.num_tokens
                    self.cache(request, min(computed, num_tokens))
                    self.cache(request, min(computed + num_new_tokens, num_tokens))
                    return [[] for _ in self.block_sizes]
        plan = self.plan(request, num_new_tokens, hit, lookahead, external, reserve_tokens)
        if plan.num_needed + plan.num_reserved > plan.num_available:          # not plan.fits
            if self.compat and not plan.new_request and any(gp.released for gp in plan.groups):
                # vLLM runs remove_skipped_blocks before its capacity check: a failed
                # allocation still frees the blocks that left the window (docs/parity.md D2)
                self.epoch += 1
                self._release(request, self.reqs[request.request_id], plan)
                self.reqs[request.request_id].slide_until = 0
            return None
        return self.commit(request, plan)

    def _boundaries(self, request: Request, hit: CacheHit | None) -> tuple[int, ...]:
        if self.retention.dense:
            return ()
        a = self.alignment
        ends = set(replay_boundaries(request.num_prompt_tokens, a, self.drop_mode,
                                     below_boundary=not self.compat))
        junction = hit.shared_prefix_boundary if hit is not None else 0
        if junction:
            ends.add(junction)
            if (self.drop_mode or not self.compat) and junction > a:
                # drop mode: the proof block after the junction is not shared, so the
                # servable end is one unit lower; default mode: the #57610 unit below.
                ends.add(junction - a)
        return tuple(sorted(ends))

    def _mask_ends(self, request: Request, hit: CacheHit | None) -> list[tuple[int, ...]]:
        """Per group, the boundary ends (in the group's blocks) of vLLM's block mask: its
        replay boundaries (0 kept), the junction, and junction - block_size in EAGLE groups
        only (SingleTypeKVCacheManager.cache_blocks), each aligned down to A."""
        a = self.alignment
        p = request.num_prompt_tokens
        if self.drop_mode:
            base = [max((p - 1) // a * a - a, 0), max(p // a * a - a, 0)]
        else:
            base = [p - 1]
        junction = hit.shared_prefix_boundary if hit is not None else 0
        if junction:
            base.append(junction)
        out = []
        for g, rule in enumerate(self.rules):
            ends = list(base)
            if junction and rule.proof:
                ends.append(junction - rule.block_size)
            bs = rule.block_size
            out.append(tuple(sorted({e // a * a // bs for e in ends if e >= 0})))
        return out

    def _compat_limits(self, num_tokens: int, n_fine: int) -> list[int]:
        """Compat mode, per group: the highest end (tokens) whose run vLLM's coordinator lets
        ``cache_blocks`` write with ``num_tokens`` computed and ``n_fine`` hashes: its
        cacheable blocks (the hybrid coordinator's ``get_num_cacheable_tokens``: align(n), or
        for an EAGLE group min(n, align(n) + block_size); the unitary one: all n) less the
        proof block."""
        limits = []
        if self.hybrid_limit:
            aligned = num_tokens // self.alignment * self.alignment
            for r, scale in zip(self.rules, self.scales):
                bs = r.block_size
                if r.proof and aligned > 0:
                    n = (num_tokens if num_tokens < aligned + bs else aligned + bs) // bs
                else:
                    n = aligned // bs
                m = n_fine // scale
                limits.append(((n if n < m else m) - r.proof) * bs)
        else:
            for r, scale in zip(self.rules, self.scales):
                bs = r.block_size
                n = num_tokens // bs
                m = n_fine // scale
                limits.append(((n if n < m else m) - r.proof) * bs)
        return limits

    # ---- caching ----------------------------------------------------------------------------
    def cache(self, request: Request, num_tokens: int, final: bool = False) -> None:
        """Cache the runs of every promised end reachable with ``num_tokens`` computed tokens.

        ``final`` adds the request's final length as a promised end (default mode, at free).
        """
        if not self.caching:
            return
        state = self.reqs[request.request_id]
        if num_tokens < state.quiet_until and not final:
            return
        hashes = request.block_hashes
        n_fine = len(hashes)
        extra = state.boundaries
        if final and not self.compat:
            extra = extra + (num_tokens // self.alignment * self.alignment,)
        # An end t is cacheable in a group once its run [lo, hi) is computed and hashed.
        if self.compat:
            limits = self._compat_limits(num_tokens, n_fine)
        else:
            limits = [(min(num_tokens // r.block_size, n_fine // self.scales[g]) - r.proof)
                      * r.block_size for g, r in enumerate(self.rules)]
        masked = self.masked
        if not self.compat:
            # an end serves a hit only if every group holds its run: promise it to all at once
            common = min(limits)
            limits = [common] * len(limits)
        # Each group also gives the fewest tokens at which it has work again (its next end,
        # plus its delay); below the smallest, cache() is a no-op (state.quiet_until).
        delay = self.cache_delay
        dense = self.dense
        dense_step = self.dense_step
        aligned = self.aligned_limit
        done_t = state.done_t
        nxt = math.inf
        for g, rule in enumerate(self.rules):
            bs = rule.block_size
            if masked[g]:
                # the next masked block must be full (a lower bound on the tokens)
                t = (self._write_mask(g, request, state, limits[g] // bs + rule.proof, hashes)
                     + 1) * bs
            else:
                t_limit = limits[g]
                done = done_t[g]
                # the next promised end after done; the group has work iff it is <= t_limit
                if dense[g]:
                    step = dense_step[g]
                    t = (done // step + 1) * step
                else:
                    t = self.retention.next_end(done, extra)
                if t <= t_limit:
                    if rule.downward_closed:
                        self._cache_prefix(g, rule, request, state, t_limit, hashes)
                    else:
                        self._cache_ends(g, rule, request, state, t_limit, hashes, extra)
                    done = done_t[g]
                    t = (done // step + 1) * step if dense[g] else \
                        self.retention.next_end(done, extra)
                t += delay[g]
            if aligned[g] and t < math.inf:
                # compat hybrid, no proof: the group caches up to align(n) only
                a = self.alignment
                t = -(-t // a) * a
            if t < nxt:
                nxt = t
        if not final:
            # every group's limit is <= num_tokens, so nothing happens before the next end
            state.quiet_until = nxt

    def _cache_prefix(self, g: int, rule: HitRule, request: Request, state: _ReqBlocks,
                      t_limit: int, hashes: list[bytes]) -> None:
        """A downward-closed (dense) group: cache the run of the last end <= ``t_limit``
        (runs ``[0, e + proof)`` are nested, so it covers every earlier end's run)."""
        step = self.dense_step[g]
        last = t_limit // step * step                  # the last of multiples_between(...)
        if last <= state.done_t[g]:
            return
        state.done_t[g] = last
        j = state.cached_hi[g]
        hi = last // rule.block_size + rule.proof
        if j >= hi:
            return
        state.cached_hi[g] = hi
        table = state.tables[g]
        positions: list[int] = []
        if hi - j == 1:                                # one block (a decode step): no run
            b = table[j]
            pool = self.pool
            if b != NULL_BLOCK and pool.block_hash[b] is None:
                pool.insert(g, hashes[hi * self.scales[g] - 1], b)
                positions.append(j)
        else:
            self._insert_span(g, table, j, hi, hashes, self.scales[g], positions)
        if positions and self.on_stored is not None:
            _report_runs(self.on_stored, g, request, table, positions)

    def _cache_ends(self, g: int, rule: HitRule, request: Request, state: _ReqBlocks,
                    t_limit: int, hashes: list[bytes], extra: tuple[int, ...]) -> None:
        """A local group: cache the runs of the promised ends in ``(done_t, t_limit]``."""
        done = state.done_t[g]
        if self.dense[g]:
            ends = multiples_between(done, t_limit, self.dense_step[g])
        else:
            ends = self.retention.ends_between(done, t_limit, extra)
        if not ends:
            return
        state.done_t[g] = ends[-1]
        table = state.tables[g]
        lo_prev = state.cached_hi[g]
        bs = rule.block_size
        scale = self.scales[g]
        positions: list[int] = []
        for t in ends:
            lo, hi = rule.span(t // bs)
            j = lo if lo > lo_prev else lo_prev
            if j < hi:
                self._insert_span(g, table, j, hi, hashes, scale, positions)
            if hi > lo_prev:
                lo_prev = hi
        state.cached_hi[g] = lo_prev
        if positions and self.on_stored is not None:
            _report_runs(self.on_stored, g, request, table, positions)

    def _insert_span(self, g: int, table: list[int], j: int, hi: int, hashes: list[bytes],
                     scale: int, positions: list[int]) -> None:
        """Cache the blocks of table positions ``[j, hi)`` of group g that are neither null
        nor cached yet, under the request's hashes; append their positions to ``positions``.
        A run with no null and no cached block (the usual case) goes to the pool in one call."""
        pool = self.pool
        block_hash = pool.block_hash
        if hi - j >= _BULK_RUN:
            blocks = table[j:hi]
            if NULL_BLOCK not in blocks and not any(map(block_hash.__getitem__, blocks)):
                hs = hashes[(j + 1) * scale - 1:hi * scale:scale]
                if len(hs) == len(blocks):
                    pool.insert_run(g, hs, blocks)
                    positions.extend(range(j, hi))
                    return
        while j < hi:
            b = table[j]
            if b != NULL_BLOCK and block_hash[b] is None:
                pool.insert(g, hashes[(j + 1) * scale - 1], b)
                positions.append(j)
            j += 1

    def _write_mask(self, g: int, request: Request, state: _ReqBlocks, hi: int,
                    hashes: list) -> float:
        """Compat, sparse retention: cache the masked blocks of ``[cached_hi, hi)`` and mark
        the range decided (vLLM's ``num_cached_block``), masked or not. Returns the next
        masked block at or after the new ``cached_hi`` (``inf`` if none)."""
        j = state.cached_hi[g]
        rule = self.rules[g]
        ends = state.mask_ends[g]
        run = self.retention.next_masked_run
        if hi <= j:
            return run(rule, j, ends)[0]
        table = state.tables[g]
        scale = self.scales[g]
        positions: list[int] = []
        while True:
            i, stop = run(rule, j, ends)
            if i >= hi:
                break
            if stop > hi:
                stop = hi
            self._insert_span(g, table, i, stop, hashes, scale, positions)
            j = stop
        state.cached_hi[g] = hi
        if positions and self.on_stored is not None:
            _report_runs(self.on_stored, g, request, table, positions)
        return i

    # ---- free -------------------------------------------------------------------------------
    def free(self, request: Request) -> None:
        """Release every block of the request: each group's table tail first, group by group."""
        self._lookups.pop(request.request_id, None)
        self._evictable.pop(request.request_id, None)
        state = self._state(request)
        if state is None:
            return
        self.epoch += 1
        final = True
        if state.states is not None:
            final = self._free_states(request, state)
        if self.caching and not self.compat:
            self.cache(request, min(request.num_computed_tokens, request.num_tokens), final=final)
        del self.reqs[request.request_id]
        if request.retention is not None:
            for g, table in enumerate(state.tables):
                self._retain(request, g, table, range(len(table)))
        for table in state.tables:
            self.pool.free(reversed(table))

    def _retain(self, request: Request, g: int, table: list[int], positions) -> None:
        """Give the request's retention marks to group ``g``'s blocks at ``positions`` (about
        to be released); see :mod:`hybridkv.core.retention_config`."""
        marks = block_marks(request.retention, self.block_sizes[g], request.num_prompt_tokens,
                            request.num_tokens)
        self.pool.retain(table, positions, marks)

    # ---- state groups (recurrent layers; docs/state-groups.md) ------------------------------
    # A state group's table is sparse: entry j holds the checkpoint after (j + 1) * a tokens
    # (an extent head) or the null block. Each request also holds one live extent per state
    # group, outside the table. Checkpoints are written ("exported") at the promised ends the
    # write path will cache, so the extents are allocated exactly for the ends cache() hashes.

    def _export_ends(self, request: Request, state: _ReqBlocks | None, hit: CacheHit | None,
                     g: int, computed: int, num_new: int) -> list[int]:
        """Promised ends ``t`` (tokens) in ``(max(done, computed), min(computed + num_new,
        num_tokens)]`` whose checkpoint entry is still empty: the positions where the engine
        must copy the live state into a new checkpoint during this step. Draft tokens are
        never counted (``request.num_tokens`` excludes them): checkpoints are taken at
        accepted positions only."""
        if not self.caching:
            return []
        if state is None:
            done = hit.num_tokens if hit is not None else 0
            extra = self._boundaries(request, hit)
            table: tuple[int, ...] | list[int] = hit.block_ids[g] if hit is not None else ()
        else:
            done = state.done_t[g]
            extra = state.boundaries
            table = state.tables[g]
        after = done if done > computed else computed
        limit = computed + num_new
        if limit > request.num_tokens:
            limit = request.num_tokens
        if limit <= after:
            return []
        if self.dense[g]:
            ends = list(multiples_between(after, limit, self.dense_step[g]))
        else:
            ends = self.retention.ends_between(after, limit, extra)
        a = self.block_sizes[g]
        return [t for t in ends if t // a - 1 >= len(table) or table[t // a - 1] == NULL_BLOCK]

    def _next_export(self, request: Request, state: _ReqBlocks, after: int) -> float:
        """The smallest promised end a state group will need a checkpoint extent for,
        beyond ``after`` tokens (inf: none)."""
        nxt = math.inf
        for g in self.state_groups:
            x = max(state.done_t[g], after)
            if self.dense[g]:
                t = (x // self.dense_step[g] + 1) * self.dense_step[g]
            else:
                t = self.retention.next_end(x, state.boundaries)
            if t < nxt:
                nxt = t
        return nxt

    def _plan_states(self, request: Request, state: _ReqBlocks | None, hit: CacheHit | None,
                     computed: int, num_new: int, slots: int, groups: list, needed: int,
                     freed_total: int, reserved: int, reserve_tokens: int) -> tuple[int, int, int]:
        """Replace the state groups' share of a plan (counted above as if they were paged)
        by their extents: a new request's live extent, one extent per export position, the
        hit checkpoint a touch takes out of the queue, the checkpoints that leave the table.
        Every count is in block ids (entries times the extent size)."""
        ref = self.pool.ref_cnt
        new_request = state is None
        for g in self.state_groups:
            gp = groups[g]
            k = self.extent[g]
            rule = self.rules[g]
            needed -= gp.new_blocks + gp.touched
            freed_total -= gp.freed
            exports = self._export_ends(request, state, hit, g, computed, num_new)
            if new_request:
                ids = hit.block_ids[g] if hit is not None else ()
                touched = self._num_evictable(ids) * k
                released: tuple[int, ...] = ()
                freed = 0
                new = (1 + len(exports)) * k
                entries = len(ids) - ids.count(NULL_BLOCK) + 1 + len(exports)
                generic_held = len(ids) - ids.count(NULL_BLOCK)
            else:
                table = state.tables[g]
                held = state.states[g].held if state.states is not None else []
                nskip = rule.skipped_tokens(computed, self.hold) // rule.block_size
                released = tuple(j for j in reversed(held)
                                 if j < nskip and table[j] != NULL_BLOCK)
                touched = 0
                freed = sum(1 for j in released if ref[table[j]] == 1) * k
                new = len(exports) * k
                entries = len(held) - len(released) + 1 + len(exports)
                generic_held = len(table) - table.count(NULL_BLOCK)
            groups[g] = _make(GroupPlan, (new // k, touched, released, freed))
            needed += new + touched
            freed_total += freed
            if reserve_tokens > slots and not self.compat:
                # swap the paged estimate of the reservation for the extents' one
                peak = rule.max_blocks(reserve_tokens, self.hold)
                generic = peak - (generic_held - len(gp.released) + gp.new_blocks)
                reserved -= generic if generic > 0 else 0
                extra = peak * k - entries * k
                reserved += extra if extra > 0 else 0
        if reserve_tokens and self.compat:
            want = self._vllm_admission_blocks(state, hit if new_request else None,
                                               reserve_tokens, computed)
            reserved = max(0, want + freed_total - needed)
        return needed, freed_total, reserved

    def _commit_states(self, request: Request, state: _ReqBlocks,
                       plan: AllocationPlan) -> dict[int, list[int]]:
        """The state groups' part of a commit, after the released checkpoints were freed:
        a new request's live extent (and the hit checkpoint to restore from), the table
        grown with null entries, one new extent per export position. Returns the new
        extents' heads per state group."""
        pool = self.pool
        out: dict[int, list[int]] = {}
        if state.states is None:
            state.states = {g: _StateBlocks() for g in self.state_groups}
        hit = plan.hit
        for g in self.state_groups:
            st = state.states[g]
            k = self.extent[g]
            a = self.block_sizes[g]
            table = state.tables[g]
            heads = out[g] = []
            if plan.new_request:
                st.live = pool.allocate_extent(k)  # type: ignore[attr-defined]
                heads.append(st.live)
                if hit is not None and hit.num_tokens:
                    e = hit.num_tokens // a
                    st.restore, st.restore_at = table[e - 1], hit.num_tokens
                    st.held = [e - 1]
            else:
                st.restore, st.restore_at = NULL_BLOCK, 0       # restored before this step
                if plan.groups[g].released:
                    st.held = [j for j in st.held if table[j] != NULL_BLOCK]
            need = -(-plan.slots // a)
            if len(table) < need:
                table.extend([NULL_BLOCK] * (need - len(table)))
            st.exports = []
            for t in self._export_ends(request, state, None, g, plan.num_computed,
                                       plan.num_tokens - plan.num_computed):
                head = pool.allocate_extent(k)  # type: ignore[attr-defined]
                table[t // a - 1] = head
                st.held.append(t // a - 1)
                st.exports.append((t, head))
                heads.append(head)
        return out

    def _free_states(self, request: Request, state: _ReqBlocks) -> bool:
        """At free: the live state becomes the final-length checkpoint when it sits exactly
        on an aligned end (default mode; no copy, the extent is re-tagged), else it is freed.
        Returns whether every state group holds a checkpoint at the final aligned length, i.e.
        whether promising that end to the other groups serves a hit (else their runs for it
        would be cached for nothing)."""
        computed = min(request.num_computed_tokens, request.num_tokens)
        end = computed // self.alignment * self.alignment
        retag = self.caching and not self.compat and computed > 0 and computed == end
        servable = end > 0
        live = []
        for g, st in state.states.items():
            table = state.tables[g]
            j = end // self.block_sizes[g] - 1
            if retag and computed > state.done_t[g] and j < len(table) \
                    and table[j] == NULL_BLOCK:
                table[j] = st.live
            else:
                live.append(st.live)
                if j >= len(table) or table[j] == NULL_BLOCK:
                    servable = False
            st.live = NULL_BLOCK
        self.pool.free(live)
        return servable

    def state_blocks(self, request: Request) -> list[StateBlocks]:
        """Per state group, the extents the engine reads and writes for ``request`` now
        (see :meth:`hybridkv.core.manager.KVCacheManager.state_blocks`)."""
        state = self._state(request)
        if state is None:
            raise KeyError(f"request {request.request_id!r} holds no blocks")
        if state.states is None:
            return []
        extent = self.pool.extent  # type: ignore[attr-defined]
        computed = request.num_computed_tokens
        out = []
        for g, st in state.states.items():
            restore = st.restore and computed <= st.restore_at
            out.append(StateBlocks(
                g, extent(st.live), extent(st.restore) if restore else (),
                st.restore_at if restore else 0,
                tuple(StateExport(t, extent(h)) for t, h in st.exports if t > computed)))
        return out

    def export_positions(self, request: Request, num_new_tokens: int,
                         hit: CacheHit | None = None) -> list[int]:
        """The positions an allocation of ``num_new_tokens`` more tokens would ask the engine
        to checkpoint (ascending, deduplicated over state groups); pure."""
        if not self.state_groups:
            return []
        state = self._state(request)
        computed = request.num_computed_tokens + (hit.num_tokens if state is None and hit else 0)
        out: set[int] = set()
        for g in self.state_groups:
            out.update(self._export_ends(request, state, hit, g, computed, num_new_tokens))
        return sorted(out)

    def state_refs(self, refs: list[int]) -> None:
        """Add the live extents' heads and every referenced extent's tails to ``refs``
        (``check_integrity``'s count of references per block id)."""
        for state in self.reqs.values():
            if state.states is not None:
                for st in state.states.values():
                    if st.live:
                        refs[st.live] += 1
        for head, tails in getattr(self.pool, "tails", {}).items():
            if refs[head]:
                for x in tails:
                    refs[x] += 1
