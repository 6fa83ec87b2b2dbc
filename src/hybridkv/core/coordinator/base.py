"""The coordinator's state: per-group facts derived once from the config, and per-request
bookkeeping (tables, how far the write path has gone, the fast path's thresholds).

:class:`CoordinatorBase` builds that state; each seam of the coordinator is a subclass that
adds one job's methods (``lookup.py``, ``allocate.py``, ``write.py``, ``release.py``,
``states.py``) and :class:`~hybridkv.core.coordinator.KVCacheCoordinator` joins them. The seams
share nothing but this state and call each other only through ``self``:

* allocation calls the write path (``cache``, ``_boundaries``, ``_mask_ends``), the release
  (``_release``) and the state groups (``_plan_states``, ``_commit_states``, ``_next_export``);
* the release calls the write path (``cache``) and the state groups (``_free_states``);
* the state groups call the write path (``_boundaries``) and allocation (``_num_evictable``,
  ``_vllm_admission_blocks``).

:class:`SeamCalls` declares those methods, so a type checker follows each call to its seam
(the base derives from it for the checker only; at run time it is a plain class).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from hybridkv.core.pool import NULL_BLOCK, BlockPool
from hybridkv.core.request import Request
from hybridkv.core.retention import Retention
from hybridkv.core.rules import HitRule, make_rule, rule_class
from hybridkv.core.specs import KVCacheConfig

if TYPE_CHECKING:
    from hybridkv.core.coordinator.records import AllocationPlan, CacheHit, GroupPlan
    from hybridkv.core.hashing import BlockHasher


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
        self.slots: float = 0
        self.slide_until: float = 0
        # state groups only (None otherwise): live extents, held checkpoints, restore/exports
        self.states: dict[int, _StateBlocks] | None = None




class SeamCalls(Protocol):
    """The methods one seam of the coordinator calls on another through ``self``, by the
    seam that defines them (the type checker checks each definition against these)."""

    # write.py (WritePath)
    def cache(self, request: Request, num_tokens: int, final: bool = False) -> None: ...
    def _boundaries(self, request: Request, hit: CacheHit | None) -> tuple[int, ...]: ...
    def _final_end(self, request: Request, num_tokens: int) -> int: ...
    def _mask_ends(self, request: Request, hit: CacheHit | None) -> list[tuple[int, ...]]: ...

    # release.py (Release)
    def _release(self, request: Request, state: _ReqBlocks, computed: int,
                 released: Sequence[tuple[int, ...]]) -> None: ...

    # allocate.py (Allocation)
    def _num_evictable(self, ids: tuple[int, ...]) -> int: ...
    def _vllm_admission_blocks(self, state: _ReqBlocks | None, hit: CacheHit | None,
                               num_tokens: int, num_computed: int,
                               touched: list[int] | None = None) -> int: ...

    # states.py (StateGroups)
    def _next_export(self, request: Request, state: _ReqBlocks, after: int) -> float: ...
    def _plan_states(self, request: Request, state: _ReqBlocks | None, hit: CacheHit | None,
                     computed: int, num_new: int, slots: int, groups: list[GroupPlan],
                     needed: int, freed_total: int, reserved: int,
                     reserve_tokens: int) -> tuple[int, int, int]: ...
    def _commit_states(self, request: Request, state: _ReqBlocks,
                       plan: AllocationPlan) -> dict[int, list[int]]: ...
    def _free_states(self, request: Request, state: _ReqBlocks) -> bool: ...


if TYPE_CHECKING:
    _Seams = SeamCalls
else:
    _Seams = object


@dataclass(frozen=True)
class CoordinatorModes:
    """How the coordinator runs, derived by the manager from its options.

    ``drop_mode``: EAGLE drop mode (draft groups need the block after a hit);
    ``vllm_compat``: reproduce vLLM 0.33 (full groups always cache every block; no
    below-boundary or final-length promises); ``caching``: prefix caching enabled;
    ``max_model_len``: cap on tokens per request (None: none); ``max_in_flight_tokens``:
    tokens scheduled but not yet computed at most (vLLM's ``max_in_flight_tokens``), which
    caps a window group's admission reservation in compat mode (None: only max_model_len
    caps it). Both caps: None or a positive integer.
    """

    drop_mode: bool = False
    vllm_compat: bool = False
    caching: bool = True
    max_model_len: int | None = None
    max_in_flight_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("drop_mode", "vllm_compat", "caching"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"CoordinatorModes: {name} must be True or False, got {getattr(self, name)!r}")
        for name in ("max_model_len", "max_in_flight_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"CoordinatorModes: {name} must be None or a positive integer, got {value!r}")


class _Fields:
    """The fields a running request's step reads: in the compiled core an extension type
    (``base.pxd``) that :class:`KVCacheCoordinator` derives from, so compiled seam methods
    that declare ``self`` of this type read them as C struct members (a generic attribute
    lookup costs ~160 instructions). Every field stays a public attribute. Set by
    :class:`CoordinatorBase`."""


class CoordinatorBase(_Fields, _Seams):
    """The state every seam of the coordinator reads: the config's per-group facts and the
    per-request bookkeeping (see :class:`~hybridkv.core.coordinator.KVCacheCoordinator`).

    Args:
        config: the KV-cache config.
        pool: the shared block pool.
        retention: the promised-end policy.
        modes: drop mode, compat mode, caching and the token caps (:class:`CoordinatorModes`).

    Attributes set by the owner after construction (None: no callback):
        on_stored: ``(group, request, first_block, blocks)`` for each run the write path
            caches (KV events and the connector's saves).
        on_adopted: the same for each run that ``commit_external`` caches (loaded from a
            tier, not computed here): KV events only, never saves.
        hinted: the pool runs the hint layer, so every release reports its owner and hint
            (False: only retention configs are passed on).
        hasher: the manager's :class:`~hybridkv.core.hashing.BlockHasher`, which a running
            request's step (``step``) runs before it caches (None: such steps are planned).
        anchor_key: the key group of the pool's hit-point layer
            (:mod:`hybridkv.core.eviction.hit_points`): every release of another group's blocks
            first tells the pool the key-group block that ends each one's hit point (None: no
            such layer).
    """

    def __init__(self, config: KVCacheConfig, pool: BlockPool, retention: Retention,
                 modes: CoordinatorModes) -> None:
        drop_mode, vllm_compat, caching = modes.drop_mode, modes.vllm_compat, modes.caching
        max_model_len, max_in_flight_tokens = modes.max_model_len, modes.max_in_flight_tokens
        self.config = config
        self.max_in_flight_tokens = max_in_flight_tokens
        self.pool = pool
        self.retention = retention
        self.drop_mode = drop_mode
        self.compat = vllm_compat
        self.caching = caching
        self.max_model_len = max_model_len
        self.len_cap = max_model_len if max_model_len is not None else math.inf
        self.on_stored: Callable[[int, Request, int, list[int]], None] | None = None
        self.on_adopted: Callable[[int, Request, int, list[int]], None] | None = None
        self.hinted = False
        self.hasher: BlockHasher | None = None
        self.anchor_key: int | None = None
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
            # The final length is promised at free (less the proof block, rounded down to the
            # alignment): keep one alignment unit more of each window (past the proof blocks'
            # hold) so that end's run is still in the table.
            self.hold += config.alignment
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
        # The write path's per-group facts, one tuple per group (cache() reads them once per
        # group): (block size, scale, proof) for its limits; (group, rule, block size,
        # masked, the dense step or 0 when retention decides the ends, delay, aligned limit).
        self._limit_facts = [(r.block_size, sc, r.proof) for r, sc in zip(self.rules, self.scales)]
        self._write_facts = [
            (g, r, r.block_size, self.masked[g], self.dense_step[g] if self.dense[g] else 0,
             self.cache_delay[g], self.aligned_limit[g]) for g, r in enumerate(self.rules)]
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
        self._lookups: dict[object, list[Any]] = {}
        # request id -> (hit block ids, pool free_version, counts) (see _evictable_counts)
        self._evictable: dict[object, tuple[tuple[tuple[int, ...], ...], int | None, list[int]]] = {}
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
