"""The facade a scheduler uses: lookup, allocate, free, reset, stats, events, integrity.

Typical use (one request)::

    hit = kv.lookup(req)                          # side-effect free
    new = kv.allocate(req, req.num_tokens - hit.num_tokens, hit)   # None: does not fit
    req.num_computed_tokens = req.num_tokens      # after the forward pass
    req.append_tokens([next_token])
    kv.allocate(req, 1)                           # each decode step
    kv.free(req)                                  # finished or preempted

Block layout of one group's table as a request runs (``bs`` = 4, 2 lookahead slots)::

    | computed (hit + earlier steps) | scheduled now | lookahead | (unallocated)
    [b1  b2 ][ b3 ][ b4       ][b5..  ]
      cached when full and promised   never cached: draft slots
"""

from __future__ import annotations

import time
from typing import Callable, cast

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.coordinator import (CacheHit, CoordinatorModes, ExternalHit, KVCacheCoordinator,
                                       StateBlocks)
from hybridkv.core.coordinator.allocate import _PLAN
from hybridkv.core.events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEvent,
                                  PrefixCacheStats, untag_extra_keys)
from hybridkv.core.hashing import BlockHasher
from hybridkv.core.eviction import HitPointLayer, key_group, make_policy, resolve_policy
from hybridkv.core.extent_pool import ExtentBlockPool
from hybridkv.core.hints import Hint, HintStats
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import NULL_BLOCK, BlockPool
from hybridkv.core.request import Request
from hybridkv.core.request_fit import blocks_for_request, check_fits, check_lookahead
from hybridkv.core.retention import Retention, validate_retention_interval
from hybridkv.core.retention_config import RetentionConfig
from hybridkv.core.rules import make_rule
from hybridkv.core.specs import KVCacheConfig
from hybridkv.core.spec_decode import SpecDecode


class _ManagerFields:
    """The manager's fields a running request's step reads: in the compiled core an extension
    type (``manager.pxd``), so :meth:`KVCacheManager.allocate`'s fast path reads them as C
    struct members. They stay public attributes, set by :class:`KVCacheManager`."""


class KVCacheManager(_ManagerFields):
    """Prefix-caching KV block manager for hybrid models.

    Args:
        config: groups and pool size.
        options: what the manager does with them (:class:`~hybridkv.core.cache_options.
            CacheOptions`: speculative decoding, retention, hashing, limits, events, compat
            mode, eviction policy, hints); the defaults when None.
        clock: seconds, non-decreasing, for retention TTLs (default ``time.monotonic``; the
            simulator passes its virtual time). Read by the ``priority`` policy and hint pins.

    Invariants (:meth:`check_integrity`): every block is free xor referenced; ref counts equal
    the references in request tables; the free queue and the hash index agree with the blocks;
    every cached block a request holds carries that request's hash for its position.
    """

    def __init__(self, config: KVCacheConfig, options: CacheOptions | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        if not isinstance(config, KVCacheConfig):
            raise ValueError(f"config must be a KVCacheConfig, got {type(config).__name__}")
        if options is None:
            options = CacheOptions()
        elif not isinstance(options, CacheOptions):
            raise ValueError(f"options must be a CacheOptions or None, got {type(options).__name__}")
        self.options = options
        spec_decode, retention_interval = options.spec_decode, options.retention_interval
        max_model_len, vllm_compat, hints = options.max_model_len, options.vllm_compat, options.hints
        enable_caching, enable_events = options.enable_caching, options.enable_events
        has_local = any(not make_rule(g.spec).downward_closed for g in config.groups)
        validate_retention_interval(retention_interval, config.alignment, has_local)
        config.check_state_fits()
        self.config = config
        self.spec_decode = spec_decode
        self.retention_interval = retention_interval
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.vllm_compat = vllm_compat
        self.enable_events = enable_events
        self.lookahead_slots = spec_decode.lookahead_slots if spec_decode else 0
        if spec_decode is not None:
            check_lookahead(config, spec_decode, max_model_len)
        drop_mode = bool(spec_decode and spec_decode.drops_last_block)
        self.hasher = BlockHasher(config.hash_block_size, options.hash_algo, options.hash_seed,
                                  spec_decode.hash_lookahead_tokens if spec_decode else 0)
        self._events: list[KVEvent] = []
        rules = [make_rule(g.spec) for g in config.groups]
        self.eviction_policy = resolve_policy(options.eviction_policy, vllm_compat,
                                              hybrid=key_group(rules) is not None)
        if clock is not None and not callable(clock):
            raise ValueError(f"clock must be None or a callable returning seconds, got {clock!r}")
        if config.has_state and hints:
            raise ValueError("hints=True does not support state groups (recurrent layers) yet; "
                             "use hints=False with a StateSpec group")
        policy = make_policy(self.eviction_policy, rules,
                             clock or time.monotonic, hints=hints)
        self.hints = hints
        self.uses_retention = policy is not None and policy.uses_retention
        on_evict = self._on_evict if enable_events else None
        if config.has_state and policy is not None:
            raise ValueError(
                f"eviction_policy {self.eviction_policy!r} does not support state groups "
                "(recurrent layers) yet; valid with a StateSpec group: 'lru'")
        self.pool = (ExtentBlockPool(config.num_blocks, len(config.groups), on_evict=on_evict)
                     if config.has_state else   # recurrent state: extents (docs/state-groups.md)
                     BlockPool(config.num_blocks, len(config.groups), on_evict=on_evict)
                     if policy is None else
                     PolicyBlockPool(config.num_blocks, len(config.groups), policy, on_evict=on_evict))
        self.coordinator = KVCacheCoordinator(
            config, self.pool, Retention(retention_interval, config.alignment), CoordinatorModes(
                drop_mode=drop_mode, vllm_compat=bool(vllm_compat), caching=bool(enable_caching),
                max_model_len=max_model_len, max_in_flight_tokens=options.max_in_flight_tokens))
        if max_model_len is not None:
            check_fits(config, max_model_len, retention_interval=retention_interval,
                       vllm_compat=vllm_compat, hold=self.coordinator.hold)
        self.coordinator.hinted = bool(hints)
        self.coordinator.hasher = self.hasher
        self.coordinator.anchor_key = policy.key_group if isinstance(policy, HitPointLayer) else None
        if isinstance(self.pool, ExtentBlockPool) and not vllm_compat:
            # sibling state groups serve hits only together: evict their checkpoints together
            states = set(self.coordinator.state_groups)
            self.pool.siblings = {g: tuple(x for x in u.groups if x != g)
                                  for u in self.coordinator.units if len(u.groups) > 1
                                  for g in u.groups if g in states}
        if enable_events:   # blocks loaded from an external tier are stored blocks too
            self.coordinator.on_stored = self._on_stored
            self.coordinator.on_adopted = self._record_stored
        self._stats = PrefixCacheStats()
        self._group_query_blocks = [0] * len(config.groups)
        self._group_hit_blocks = [0] * len(config.groups)
        self._requests: dict[object, Request] = {}
        self._block_sizes = tuple(g.spec.block_size for g in config.groups)
        self._cached_listeners: list[Callable[[int, list[bytes], list[int]], None]] = []
        self._evicted_listeners: list[Callable[[int, bytes], None]] = []

    #: blocks one request needs at most (:func:`hybridkv.core.request_fit.blocks_for_request`)
    blocks_for_request = staticmethod(blocks_for_request)

    # ---- queries ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return self.pool.usage

    @cython.locals(self=_ManagerFields)
    def _sync_hashes(self, request: Request) -> None:
        if request.hasher is None:
            request.hasher = self.hasher
        elif request.hasher is not self.hasher:
            raise ValueError(
                f"request {request.request_id!r} was hashed by another manager's hasher; "
                "create a new Request for each manager"
            )
        if self.enable_caching:
            self.hasher.update(request)

    @cython.locals(self=_ManagerFields)
    def lookup(self, request: Request) -> CacheHit:
        """The longest cached prefix of ``request`` every group can serve. Changes nothing.

        The hit is at most ``num_tokens - 1`` (the last token is recomputed for its logits)
        and a multiple of the alignment (LCM of block sizes).
        """
        if not isinstance(request, Request):
            raise ValueError(f"lookup needs a Request, got {type(request).__name__}")
        self._sync_hashes(request)
        if not self.enable_caching or request.skip_prefix_cache:
            return CacheHit(0, tuple(() for _ in self.config.groups), 0, request.request_id,
                            self.coordinator.epoch)
        max_tokens = request.num_tokens - 1
        if self.max_model_len is not None:
            max_tokens = min(max_tokens, self.max_model_len - 1)
        return self.coordinator.find_longest_hit(request, max_tokens)

    def lookup_external(self, request: Request, hit: CacheHit,
                        contains: Callable[[int, bytes], bool]) -> ExternalHit | None:
        """How far an external tier extends ``hit`` (this request's local lookup). Changes nothing.

        ``contains(group_index, block_hash)`` says whether the tier holds that block. The
        extension obeys the same per-type hit rules, alignment and ``num_tokens - 1`` cap as
        :meth:`lookup`; None when the tier adds no tokens. Then: ``allocate(request, 0, hit,
        external=ext)``, load ``ext.loads`` into the allocated blocks, ``commit_external``.
        """
        if not isinstance(hit, CacheHit):
            raise ValueError(f"lookup_external needs the request's CacheHit, got {hit!r}")
        self._sync_hashes(request)
        if not self.enable_caching or request.skip_prefix_cache:
            return None
        max_tokens = request.num_tokens - 1
        if self.max_model_len is not None:
            max_tokens = min(max_tokens, self.max_model_len - 1)
        return self.coordinator.find_external_hit(request, max_tokens, hit, contains)

    def commit_external(self, request: Request, external: ExternalHit, ok: bool) -> int:
        """Finish an external load: ``ok`` caches the loaded blocks and sets
        ``num_computed_tokens`` to ``external.num_tokens``; a failed load changes nothing (the
        tokens are recomputed from the local hit). Returns ``num_computed_tokens``."""
        if not self.coordinator.holds(request):
            raise ValueError(f"request {request.request_id!r} holds no blocks; allocate it first")
        if request.num_computed_tokens != external.local_tokens:
            raise ValueError(
                f"request {request.request_id!r} has {request.num_computed_tokens} computed tokens; "
                f"the external load was planned from {external.local_tokens}")
        self.coordinator.commit_external(request, external, ok)
        return request.num_computed_tokens

    @cython.locals(self=_ManagerFields)
    def allocate(self, request: Request, num_new_tokens: int, hit: CacheHit | None = None,
                 num_lookahead_tokens: int | None = None,
                 external: ExternalHit | None = None,
                 full_sequence_must_fit: bool = False) -> list[list[int]] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request``.

        Args:
            request: the request; ``request.num_computed_tokens`` tokens already have KV.
            num_new_tokens: tokens computed in this step (after the hit for a new request).
            hit: a new request's lookup result, adopted as computed tokens (its blocks are
                taken). Only for the first allocation of a request.
            num_lookahead_tokens: slots past the new tokens for draft tokens; defaults to the
                spec-decode's (k, or k+1 for DFlash). Never cached.
            external: an :meth:`lookup_external` result for this (new) request: blocks up to
                its end are reserved for loading; see :meth:`commit_external`.
            full_sequence_must_fit: admission reservation (vLLM's
                ``scheduler_reserve_full_isl``). In compat mode vLLM 0.33's count exactly:
                per group ``cdiv(min(request.num_tokens, max_model_len), bs)`` blocks (window
                groups capped at ``cdiv(min(W - 1 + max_in_flight_tokens, max_model_len), bs)
                + 1``), minus the hit or out-of-window blocks, whichever is more, plus the
                evictable hit blocks, must not exceed the free blocks. Default mode: succeed only if, after this step's blocks, the pool could still give
                the request's whole sequence (``request.num_tokens`` + lookahead, capped at
                max_model_len) its peak footprint in every group (sliding/chunked groups:
                their window or chunk, see ``HitRule.max_blocks``). Only this step's blocks
                are allocated.

        Returns:
            The newly allocated block ids per group, or None if the pool cannot supply them;
            on None nothing changed. Full blocks of promised hit ends up to
            ``min(computed + num_new_tokens, request.num_tokens)`` are cached.

        Raises:
            ValueError: bad counts (among them a step that would take the request past
                ``max_model_len``: computed + hit + ``num_new_tokens``; lookahead slots are
                capped there instead); ``hit`` looked up for another request, stale, or given
                to a request that already holds blocks; a different Request object holds this
                id. Nothing changes.
        """
        if not isinstance(request, Request):
            raise ValueError(f"allocate needs a Request, got {type(request).__name__}")
        if hit is None and external is None and not full_sequence_must_fit \
                and type(num_new_tokens) is int and num_new_tokens >= 0:
            # A running request's step (most decode steps need no block, cache nothing and
            # slide no window: the coordinator answers those from thresholds it keeps per
            # request; the rest it applies without a plan record). _PLAN: validate and plan.
            if num_lookahead_tokens is None:
                lookahead = self.lookahead_slots
            elif type(num_lookahead_tokens) is int and num_lookahead_tokens >= 0:
                lookahead = num_lookahead_tokens
            else:
                lookahead = -1              # not an integer >= 0: the checks below refuse it
            if lookahead >= 0:
                blocks = self.coordinator.step(request, num_new_tokens, lookahead)
                if blocks is not _PLAN:
                    return blocks
        if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) or num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be a non-negative integer, got {num_new_tokens!r}")
        known = self.coordinator.holds(request)     # raises for another object with this id
        if known and hit is not None and hit.num_tokens:
            raise ValueError(
                f"request {request.request_id!r} already holds blocks; a hit can only be adopted "
                "by its first allocate"
            )
        if hit is not None:
            if not isinstance(hit, CacheHit) or len(hit.block_ids) != len(self.config.groups):
                raise ValueError(f"hit must be a CacheHit from this manager's lookup, got {hit!r}")
            if hit.request_id is not None and hit.request_id != request.request_id:
                raise ValueError(
                    f"the hit was looked up for request {hit.request_id!r}, not "
                    f"{request.request_id!r}; call lookup(request) for the request you allocate")
            if hit.num_tokens + request.num_computed_tokens > request.num_tokens:
                raise ValueError(
                    f"hit of {hit.num_tokens} tokens exceeds request {request.request_id!r}'s "
                    f"{request.num_tokens} tokens"
                )
            for g, (ids, bs) in enumerate(zip(hit.block_ids, self._block_sizes)):
                if len(ids) * bs != hit.num_tokens:
                    raise ValueError(f"hit blocks of group {g} do not cover {hit.num_tokens} tokens")
        if external is not None:
            if known or not isinstance(external, ExternalHit) or hit is None \
                    or external.local_tokens != hit.num_tokens:
                raise ValueError(
                    f"external must be lookup_external's result for new request "
                    f"{request.request_id!r} and its hit, got {external!r}")
        if self.max_model_len is not None:
            hit_tokens = hit.num_tokens if hit is not None else 0
            end = request.num_computed_tokens + hit_tokens + num_new_tokens
            if end > self.max_model_len:
                raise ValueError(
                    f"request {request.request_id!r} would hold {end} tokens "
                    f"(num_computed_tokens {request.num_computed_tokens} + hit {hit_tokens} + "
                    f"num_new_tokens {num_new_tokens}), past max_model_len={self.max_model_len}")
        if not known and request.retention is not None:
            self._check_retention(request)
        if not known and request.hint is not None:
            self._check_hint(request)
        if num_new_tokens == 0 and not known and not (hit and hit.num_tokens) and external is None:
            raise ValueError(
                f"allocate for new request {request.request_id!r} needs num_new_tokens > 0 or a hit"
            )
        lookahead = self.lookahead_slots if num_lookahead_tokens is None else num_lookahead_tokens
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
            raise ValueError(f"num_lookahead_tokens must be a non-negative integer, got {lookahead!r}")
        if request.hasher is self.hasher:             # _sync_hashes, the usual case inlined
            if self.enable_caching:
                self.hasher.update(request)
        else:
            self._sync_hashes(request)
        if not full_sequence_must_fit:
            reserve = 0
        elif self.vllm_compat:
            reserve = request.num_tokens            # vLLM counts the sequence without lookahead
        else:
            reserve = request.num_tokens + lookahead
        blocks = self.coordinator.allocate(request, num_new_tokens, hit, lookahead, external, reserve)
        if blocks is not None and not known:
            self._requests[request.request_id] = request
            self._record(request, hit)
        return blocks

    @cython.locals(self=_ManagerFields)
    def quiet_steps(self, requests: list[Request], num_new_tokens: list[int]) -> list[bool]:
        """For each ``i``: would ``allocate(requests[i], num_new_tokens[i])`` take the fast path
        (no new block, nothing to cache, no block leaving a window: it returns empty lists and
        changes nothing)? One call for a batch of decode steps; pure. Each answer depends on
        its own request only, so other requests' allocations between this call and the step
        do not change it. False for a request this manager does not hold (or a different
        Request object with a held id) and for a step past max_model_len."""
        if type(requests) is not list:
            requests = list(requests)
        if type(num_new_tokens) is not list:
            num_new_tokens = list(num_new_tokens)
        return self.coordinator.steps_quiet(requests, num_new_tokens, self.lookahead_slots)

    def _check_retention(self, request: Request) -> None:
        """ValueError unless this manager's policy can honour ``request.retention``."""
        if not self.uses_retention:
            raise ValueError(
                f"request {request.request_id!r} carries a retention config, which "
                f"eviction_policy={self.eviction_policy!r} ignores; use eviction_policy='priority' "
                "(the only policy that reads retention configs) or drop the config")
        if not isinstance(request.retention, RetentionConfig):
            raise ValueError(f"request {request.request_id!r}: retention must be a RetentionConfig "
                             f"or None, got {request.retention!r}")
        request.retention.check_prompt(request.num_prompt_tokens, f"request {request.request_id!r}")

    def _check_hint(self, request: Request) -> None:
        """ValueError unless this manager takes hints and ``request.hint``'s pin fits the pool."""
        hint = request.hint
        if not self.hints:
            raise ValueError(
                f"request {request.request_id!r} carries a hint, which this manager ignores; "
                "create it with CacheOptions(hints=True) or drop the hint")
        if not isinstance(hint, Hint):
            raise ValueError(f"request {request.request_id!r}: hint must be a Hint or None, got {hint!r}")
        hint.check_prompt(request.num_prompt_tokens, f"request {request.request_id!r}")
        if hint.pin_tokens is not None:
            need = self.blocks_for_request(self.config, hint.pin_tokens,
                                           retention_interval=self.retention_interval)
            if need > self.config.num_blocks - 1:
                raise ValueError(
                    f"request {request.request_id!r}: hint pin_tokens={hint.pin_tokens} needs {need} "
                    f"blocks, more than the cache holds ({self.config.num_blocks - 1}); pin fewer tokens")

    def hint_stats(self) -> HintStats | None:
        """What the hint layer did (:class:`~hybridkv.core.hints.HintStats`); None without hints."""
        if not self.hints:
            return None
        stats: HintStats = cast(PolicyBlockPool, self.pool).policy.stats()   # hints: a policy pool
        return stats

    @cython.locals(self=_ManagerFields)
    def _record(self, request: Request, hit: CacheHit | None) -> None:
        if not self.enable_caching or request.skip_prefix_cache:
            return
        s = self._stats
        hit_tokens = hit.num_tokens if hit is not None else 0
        if request.num_preemptions:
            s.preempted_requests += 1
            s.preempted_queries += request.num_tokens
            s.preempted_hits += hit_tokens
        else:
            s.requests += 1
            s.queries += request.num_tokens
            s.hits += hit_tokens
            # per group: the blocks a hit could cover (the last token is always recomputed)
            # and the blocks of the group's own hit
            own = hit.group_tokens if hit is not None and hit.group_tokens else None
            n = request.num_tokens - 1
            qb, hb = self._group_query_blocks, self._group_hit_blocks
            for g, bs in enumerate(self._block_sizes):
                qb[g] += n // bs
                hb[g] += (own[g] if own is not None else hit_tokens) // bs

    @cython.locals(self=_ManagerFields)
    def free(self, request: Request) -> None:
        """Release the request's blocks (cached ones stay cached, LRU).

        Raises:
            ValueError: the request holds no blocks here (never allocated, or already freed),
                naming its id; in ``vllm_compat`` mode that is a no-op, as in vLLM (whose
                scheduler frees aborted requests that were never allocated).
        """
        if request.request_id not in self._requests and not self.vllm_compat:
            raise ValueError(f"free({request.request_id!r}): the request holds no blocks (never "
                             "allocated, or already freed)")
        self._sync_hashes(request)
        self.coordinator.free(request)
        self._requests.pop(request.request_id, None)

    def block_ids(self, request: Request | object) -> tuple[list[int], ...]:
        """The request's block table per group (0 = null block, outside the window)."""
        rid = request.request_id if isinstance(request, Request) else request
        state = self.coordinator.reqs.get(rid)
        if state is None:
            raise KeyError(f"request {rid!r} holds no blocks")
        return tuple(list(t) for t in state.tables)

    # ---- state groups (recurrent layers) -------------------------------------------------------
    def state_blocks(self, request: Request) -> list[StateBlocks]:
        """What the engine reads and writes, per state group, for ``request``'s current step.

        Call it after :meth:`allocate` (empty list when the config has no state group).
        For each state group a :class:`~hybridkv.core.coordinator.StateBlocks`:

        * ``live``: the block ids (an extent: head first, ``config.extent_blocks(group)``
          long) holding the request's live state, i.e. the state after
          ``num_computed_tokens`` tokens. The engine reads and updates it every step.
        * ``restore_from`` / ``restore_position``: non-empty only while the request has not
          advanced past its cache hit: the checkpoint extent to copy into ``live`` before
          the first step (the state after ``restore_position`` = the hit's tokens). The
          checkpoint itself is immutable and shared.
        * ``exports``: the positions ``t`` in ``(num_computed_tokens, num_computed_tokens +
          scheduled]`` where this step must leave a checkpoint: after computing the first
          ``t`` tokens, copy the live state into ``blocks``. They are already hashed (like
          KV blocks, at allocation), so the engine must write them in this step. Only
          accepted (non-draft) positions are ever asked for.

        Each layer of a state group stores its state in its own layer slot of the extent's
        pages, as one flat byte buffer (``cat(pages)[:spec.page_size_bytes]``: conv state,
        then recurrent state).
        """
        self._sync_hashes(request)
        return self.coordinator.state_blocks(request)

    def export_positions(self, request: Request, num_new_tokens: int,
                         hit: CacheHit | None = None) -> list[int]:
        """The checkpoint positions an :meth:`allocate` of ``num_new_tokens`` more tokens
        (adopting ``hit``, for a waiting request) would ask for; pure. A scheduler ends a
        prefill chunk at the first one, so the live state is there when the step ends."""
        self._sync_hashes(request)
        return self.coordinator.export_positions(request, num_new_tokens, hit)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash. Returns False (and changes nothing) while blocks are in use."""
        if self.coordinator.reqs or self.pool.num_free != self.pool.num_blocks - 1:
            return False
        self.pool.reset_hashes()
        self.coordinator.epoch += 1                 # hits and plans made before are stale
        if self.enable_events:
            self._events.append(AllBlocksCleared())
        return True

    def stats(self) -> PrefixCacheStats:
        """Cumulative prefix-cache counters (a copy)."""
        s = self._stats
        return PrefixCacheStats(s.requests, s.queries, s.hits, s.preempted_requests,
                                s.preempted_queries, s.preempted_hits, self.pool.num_evictions,
                                tuple(self._group_query_blocks), tuple(self._group_hit_blocks))

    def take_events(self) -> list[KVEvent]:
        """Drain the recorded KV events (empty unless ``enable_events``)."""
        out, self._events = self._events, []
        return out

    # ---- events -------------------------------------------------------------------------------
    def _on_evict(self, group: int, h: bytes) -> None:
        if self.enable_events:
            self._events.append(BlockRemoved([h], "GPU", group))
        if self._evicted_listeners and h not in self.pool.index[group]:
            for listener in self._evicted_listeners:
                listener(group, h)

    def holds_cached(self, group: int, block_hash: bytes) -> bool:
        """Whether some block of the pool is cached under ``block_hash`` for ``group`` (in use
        or free). Changes nothing."""
        return block_hash in self.pool.index[group]

    def add_evicted_listener(self, listener: Callable[[int, bytes], None]) -> None:
        """Call ``listener(group, hash)`` when the pool stops holding any block cached under
        ``hash`` for ``group`` (its last copy's block is reused): the content leaves the GPU
        tier. The block's bytes are still intact during the call (the step that reuses the
        block has not run yet), so an offload-on-evict tier copies them then. Only blocks the
        write path cached are ever evicted, so a sliding group offers only blocks inside a
        promised window."""
        self._evicted_listeners.append(listener)
        self.pool.on_evict = self._on_evict

    def add_cached_listener(self, listener: Callable[[int, list[bytes], list[int]], None]) -> None:
        """Call ``listener(group, hashes, block_ids)`` for every run of blocks the write path
        caches (the same write mask as the prefix cache; blocks adopted by
        :meth:`commit_external` are not reported here, they came from the tier, but they do
        produce ``BlockStored`` events). A KV connector saves exactly these."""
        self._cached_listeners.append(listener)
        self.coordinator.on_stored = self._on_stored

    def _on_stored(self, group: int, request: Request, first: int, blocks: list[int]) -> None:
        """A run the write path cached: tell the cached listeners (saves), record the event."""
        if self._cached_listeners:
            scale = self.config.groups[group].spec.block_size // self.config.hash_block_size
            hashes = request.block_hashes
            run = [hashes[(j + 1) * scale - 1] for j in range(first, first + len(blocks))]
            for listener in self._cached_listeners:
                listener(group, run, list(blocks))
        if self.enable_events:
            self._record_stored(group, request, first, blocks)

    def _record_stored(self, group: int, request: Request, first: int, blocks: list[int]) -> None:
        """Record one ``BlockStored`` event for the cached run ``blocks`` (positions from
        ``first``): computed here (:meth:`_on_stored`) or loaded from a tier (commit_external)."""
        bs = self.config.groups[group].spec.block_size
        scale = bs // self.config.hash_block_size
        hashes = request.block_hashes
        n = len(blocks)
        la = self.hasher.lookahead
        toks = request.token_ids
        start, end = first * bs, (first + n) * bs
        extra = None
        lookahead = None
        if request.has_extra_keys:
            extra = [untag_extra_keys(request.extra_keys(j * bs, (j + 1) * bs + la))
                     for j in range(first, first + n)]
        if la:
            lookahead = [list(toks[(j + 1) * bs:(j + 1) * bs + la]) for j in range(first, first + n)]
        self._events.append(BlockStored(
            block_hashes=[hashes[(j + 1) * scale - 1] for j in range(first, first + n)],
            parent_block_hash=hashes[first * scale - 1] if first else None,
            token_ids=list(toks[start:end]), block_size=bs,
            lora_name=request.lora.name if request.lora else None, medium="GPU",
            group_idx=group, extra_keys=extra, lookahead_token_ids=lookahead))

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(blocks used + tables))."""
        pool = self.pool
        pool.check()
        refs = [0] * len(pool.ref_cnt)        # ids beyond were never handed out
        hbs = self.config.hash_block_size
        for rid, state in self.coordinator.reqs.items():
            req = self._requests.get(rid)
            for g, table in enumerate(state.tables):
                scale = self.config.groups[g].spec.block_size // hbs
                for j, b in enumerate(table):
                    if b == NULL_BLOCK:
                        continue
                    if not 0 < b < len(refs):
                        raise AssertionError(f"request {rid!r} group {g} holds block {b}, which the "
                                             "pool never handed out")
                    refs[b] += 1
                    h = pool.block_hash[b]
                    if h is None or req is None:
                        continue
                    if pool.block_group[b] != g:
                        raise AssertionError(f"request {rid!r} group {g} holds block {b} cached for "
                                             f"group {pool.block_group[b]}")
                    k = (j + 1) * scale - 1
                    if k >= len(req.block_hashes) or req.block_hashes[k] != h:
                        raise AssertionError(
                            f"request {rid!r} group {g} position {j}: block {b} is cached under a "
                            "hash that is not the request's hash for that position")
        if self.coordinator.state_groups:
            self.coordinator.state_refs(refs)
        for b in range(1, len(refs)):
            if refs[b] != pool.ref_cnt[b]:
                raise AssertionError(f"block {b}: ref_cnt {pool.ref_cnt[b]} but {refs[b]} table references")
