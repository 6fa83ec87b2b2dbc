"""Allocation: a pure plan, then a commit; the admission reservation; the decode fast path.

**Allocation** is a pure plan and a commit. :meth:`Allocation.plan` counts, per group, the new
blocks for the scheduled tokens and lookahead slots, the free (evictable) hit blocks a touch
takes out of the free queue, and the blocks that sliding out of the window releases; the
:class:`~hybridkv.core.coordinator.records.AllocationPlan` says whether that fits.
:meth:`Allocation.commit` applies a plan that fits; nothing is mutated before it. An admission
check that reserves more than it allocates (vLLM's full-sequence reservation) is a plan for a
larger token count; compat mode counts it as vLLM 0.33 does (:meth:`_vllm_admission_blocks`).

**A running request's step** is one call, :meth:`Allocation.step`: from three thresholds kept
per request it answers whether the step needs no new block, caches nothing and releases
nothing (the decode fast path: then nothing happens); any other such step is applied directly
(:meth:`Allocation._step`: what the commit of its plan does, without the plan's records).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Sequence, cast

from hybridkv.core.coordinator.base import CoordinatorBase, _Fields, _ReqBlocks
from hybridkv.core.coordinator.records import (_UNCHANGED, AllocationPlan, CacheHit, ExternalHit,
                                               GroupPlan, _make)
from hybridkv.core.pool import NULL_BLOCK
from hybridkv.core.request import Request
from hybridkv.core.rules import HitRule

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi


class _Plan(Enum):
    """:meth:`Allocation.step`'s answer for a step it does not take: validate, plan and
    commit it (one member, so a type checker narrows ``is not _PLAN``)."""

    PLAN = "plan"


_PLAN = _Plan.PLAN


@cython.cfunc
@cython.locals(state=_ReqBlocks, computed=cython.Py_ssize_t, num_new_tokens=cython.Py_ssize_t,
               lookahead=cython.Py_ssize_t, len_cap=cython.double, end=cython.Py_ssize_t,
               slots=cython.double)
def _is_quiet(state: _ReqBlocks, computed: int, num_new_tokens: int, lookahead: int,
              len_cap: float) -> bool:
    """The decode fast path's test (:meth:`Allocation.step_is_quiet`): the step's slots fit
    the tables, no block leaves a window, no promised end is reached; False past
    ``len_cap`` (max_model_len). Compiled, its counts are C integers: a count past one
    raises OverflowError, which its callers read as "not quiet" (as the source answers)."""
    end = computed + num_new_tokens
    slots: float = end + lookahead if lookahead else end      # (only compared)
    if slots > len_cap:
        if end > len_cap:
            return False                        # past max_model_len: the slow path refuses it
        slots = len_cap
    return slots <= state.slots and computed < state.slide_until and end < state.quiet_until


@cython.cfunc
@cython.locals(reqs=dict, req=Request, state=_ReqBlocks)
def _quiet(reqs: dict[object, _ReqBlocks], request: object, num_new_tokens: int, lookahead: int,
           len_cap: float) -> bool:
    """:meth:`Allocation.step_is_quiet` for the requests ``reqs`` holds: False for anything but
    a held request's own Request object (another object with its id, or not a Request), else
    :func:`_is_quiet`, a count past a C integer (compiled) answering False."""
    if not isinstance(request, Request):
        return False
    req = request
    state = reqs.get(req.request_id)
    if state is None or state.owner is not req:
        return False
    try:
        return _is_quiet(state, req.num_computed_tokens, num_new_tokens, lookahead, len_cap)
    except OverflowError:               # compiled: a count past a C integer is not quiet
        return False


@cython.cfunc
@cython.locals(tables=list, block_sizes=list, g=cython.Py_ssize_t, fit=cython.Py_ssize_t,
               have=cython.Py_ssize_t)
def _table_slots(tables: list[list[int]], block_sizes: list[int]) -> int:
    """The tokens every table has room for: the least ``len(table) * block size`` (the fast
    path's ``slots`` threshold)."""
    fit = len(tables[0]) * block_sizes[0]
    for g in range(1, len(tables)):
        have = len(tables[g]) * block_sizes[g]
        if have < fit:
            fit = have
    return fit


@cython.cfunc
def _empty_lists(n: int) -> list[list[int]]:
    """``n`` fresh empty lists (a step's result when it needs no new block)."""
    if n == 1:
        return [[]]
    if n == 2:
        return [[], []]
    return [[] for _ in range(n)]


class Allocation(CoordinatorBase):
    """The coordinator's allocation seam: plan, commit, admission reservation, fast path."""

    @cython.locals(self=_Fields)
    def step_is_quiet(self, request: Request, num_new_tokens: int, lookahead: int) -> bool:
        """True iff allocating ``num_new_tokens`` more tokens (+ ``lookahead`` slots) for this
        request would change nothing: no new block, nothing to cache, no block leaving a window.

        The decode fast path's test: three comparisons against thresholds the last commit and
        cache pass left (``slots``, ``quiet_until``, ``slide_until``; :func:`_is_quiet`). False
        for an unknown request, a different Request object with a known id, or tokens past
        max_model_len (the slow path then raises).
        """
        return _quiet(self.reqs, request, num_new_tokens, lookahead, self.len_cap)

    @cython.locals(self=_Fields, requests=list, nums=list, out=list, reqs=dict,
                   i=cython.Py_ssize_t)
    def steps_quiet(self, requests: list[Request], nums: list[int], lookahead: int) -> list[bool]:
        """:meth:`step_is_quiet` of ``requests[i]`` with ``nums[i]`` new tokens, for each ``i``
        (the lists pair up as ``zip`` pairs them), in one call."""
        reqs = self.reqs
        len_cap = self.len_cap
        out = []
        for i in range(min(len(requests), len(nums))):
            out.append(_quiet(reqs, requests[i], nums[i], lookahead, len_cap))
        return out

    @cython.locals(self=_Fields, req=Request, reqs=dict, state=_ReqBlocks)
    def step(self, request: Request, num_new_tokens: int,
             lookahead: int) -> list[list[int]] | None | _Plan:
        """A running request's step (no hit, no external load, no reservation), the manager's
        one call per decode step: empty lists for a quiet step (:meth:`step_is_quiet`), else,
        once :attr:`hasher` (the manager's) has appended the request's new hashes, the step
        applied directly (:meth:`_step`). ``_PLAN`` when the request is not this
        coordinator's running request, its step passes max_model_len, the request was hashed
        by another hasher, or the config has a state group: then the caller validates,
        hashes, and plans and commits (:meth:`allocate`)."""
        if not isinstance(request, Request):
            return _PLAN                    # (the caller refuses it)
        req = request
        reqs = self.reqs
        state = reqs.get(req.request_id)
        if state is None or state.owner is not req:
            return _PLAN
        computed = req.num_computed_tokens
        try:
            if _is_quiet(state, computed, num_new_tokens, lookahead, self.len_cap):
                return _empty_lists(len(state.tables))
        except OverflowError:               # compiled: a count past a C integer is not quiet
            pass
        hasher = self.hasher
        if self.state_groups or computed + num_new_tokens > self.len_cap \
                or hasher is None or req.hasher is not hasher:
            return _PLAN
        if self.caching:
            hasher.update(request)
        return self._step(request, state, num_new_tokens, lookahead)

    @cython.locals(self=_Fields)
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

    @cython.locals(self=_Fields)
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
            slots = cast(int, self.len_cap)               # finite here: max_model_len
        ref = self.pool.ref_cnt
        groups: list[GroupPlan] = []
        needed = freed_total = 0
        if state is None:                                 # new_request
            if hit is not None and hit.num_tokens and hit.epoch != self.epoch:
                self._verify_hit(request, hit)
            counts = self._evictable_counts(request, hit)
            for g, bs in enumerate(self.block_sizes):
                ids: Sequence[int] = hit.block_ids[g] if hit is not None else ()
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

    @cython.locals(self=_Fields)
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
        n = num_tokens if num_tokens < self.len_cap else cast(int, self.max_model_len)
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

    @cython.locals(self=_Fields)
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

    @cython.locals(self=_Fields, ref=list, n=cython.Py_ssize_t, bi=cython.Py_ssize_t)
    def _num_evictable(self, ids: tuple[int, ...]) -> int:
        """The non-null blocks of ``ids`` nobody references (in the free queue: a touch
        takes them out). A table never holds a block twice."""
        ref = self.pool.ref_cnt
        n = 0
        for b in ids:
            if b != NULL_BLOCK:
                bi = b
                if ref[bi] == 0:
                    n += 1
        return n

    @cython.locals(self=_Fields)
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

    @cython.locals(self=_Fields, state=_ReqBlocks)
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
            self._release(request, state, computed, [gp.released for gp in plan.groups])
        new_blocks: list[list[int]] = []
        is_state_group = self.is_state_group
        for g, gp in enumerate(plan.groups):
            if gp.new_blocks and not is_state_group[g]:
                got = pool.allocate(gp.new_blocks)
                state.tables[g].extend(got)
                new_blocks.append(got)
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
        state.slots = _table_slots(state.tables, self.block_sizes)
        if self.state_groups and self.caching:
            # the next checkpoint needs an extent: no quiet step may reach it
            nxt = self._next_export(request, state, n)
            if nxt - 1 < state.slots:
                state.slots = nxt - 1
        if not plan.new_request:
            state.slide_until = self._slide_until(computed)
        return new_blocks

    @cython.locals(self=_Fields)
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

    @cython.locals(self=_Fields, state=_ReqBlocks, tables=list, block_sizes=list,
                   new_counts=list, released=list, new_blocks=list, needed=cython.Py_ssize_t,
                   freed=cython.Py_ssize_t, new=cython.Py_ssize_t, g=cython.Py_ssize_t)
    def _step(self, request: Request, state: _ReqBlocks, num_new_tokens: int,
              lookahead: int) -> list[list[int]] | None:
        """A running request's step (no hit, no external load, no reservation, no state
        group; ``state`` is its bookkeeping) applied directly: exactly what
        ``commit(plan(...))`` does, without building the plan's records. Returns the new
        block ids per group, or None when they do not fit (as :meth:`allocate`).

        The common steps are short: a step inside the table that releases nothing only
        caches (a block just filled), one that needs a block pops it; only a step at which a
        block may leave a window looks at the tables' released positions.
        """
        computed = request.num_computed_tokens
        slots = computed + num_new_tokens + lookahead
        if slots > self.len_cap:
            slots = cast(int, self.len_cap)               # finite here: max_model_len
        tables = state.tables
        block_sizes = self.block_sizes
        new_counts = []
        needed = 0
        if slots > state.slots:                           # some table is too short
            for g in range(len(tables)):
                new = -(-slots // block_sizes[g]) - len(tables[g])
                if new > 0:
                    needed += new
                else:
                    new = 0
                new_counts.append(new)
        released = []
        freed = 0
        if computed >= state.slide_until:                 # a block may leave a window
            ref = self.pool.ref_cnt
            for table, rule in zip(tables, self.rules):
                rel = () if rule.downward_closed else self._released(table, rule, computed)
                if rel:
                    freed += list(map(ref.__getitem__, map(table.__getitem__, rel))).count(1)
                released.append(rel)
        pool = self.pool
        if needed > pool.num_free + freed:                # does not fit: nothing changes
            if self.compat and any(released):
                # vLLM runs remove_skipped_blocks before its capacity check: a failed
                # allocation still frees the blocks that left the window (docs/parity.md D2)
                self.epoch += 1
                self._release(request, state, computed, released)
                state.slide_until = 0
            return None
        self.epoch += 1
        if released:
            self._release(request, state, computed, released)
        else:
            n = len(request.token_ids)
            if computed < n:
                n = computed
            if n >= state.quiet_until:                    # (the pending ends _release caches)
                self.cache(request, n)
        new_blocks = []
        if needed:
            for g in range(len(tables)):
                new = new_counts[g]
                if new:
                    got = pool.allocate(new)
                    tables[g].extend(got)
                    new_blocks.append(got)
                else:
                    new_blocks.append([])
        else:
            new_blocks = _empty_lists(len(tables))
        n = len(request.token_ids)
        if computed + num_new_tokens < n:
            n = computed + num_new_tokens
        if n >= state.quiet_until:                        # (cache's own first test)
            self.cache(request, n)
        if needed:
            state.slots = _table_slots(tables, block_sizes)
        if needed or released:          # (a cache-only step keeps the tables, so the threshold)
            state.slide_until = self._slide_until(computed)
        return new_blocks

    @cython.locals(self=_Fields)
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
        if hit is None and external is None and not reserve_tokens and not self.state_groups:
            state = self.reqs.get(request.request_id)
            if state is not None and state.owner is request:
                return self._step(request, state, num_new_tokens, lookahead)
        plan = self.plan(request, num_new_tokens, hit, lookahead, external, reserve_tokens)
        if plan.num_needed + plan.num_reserved > plan.num_available:          # not plan.fits
            if self.compat and not plan.new_request and any(gp.released for gp in plan.groups):
                # vLLM runs remove_skipped_blocks before its capacity check: a failed
                # allocation still frees the blocks that left the window (docs/parity.md D2)
                self.epoch += 1
                self._release(request, self.reqs[request.request_id], plan.num_computed,
                              [gp.released for gp in plan.groups])
                self.reqs[request.request_id].slide_until = 0
            return None
        return self.commit(request, plan)
