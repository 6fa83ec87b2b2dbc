"""State groups (recurrent layers; docs/state-groups.md): live extents, checkpoints, exports.

A state group's table is sparse: entry j holds the checkpoint after (j + 1) * a tokens (an
extent head) or the null block. Each request also holds one live extent per state group,
outside the table. Checkpoints are written ("exported") at the promised ends the write path
will cache, so the extents are allocated exactly for the ends ``cache()`` hashes. The plan and
the commit call :meth:`StateGroups._plan_states` / :meth:`StateGroups._commit_states` only
when the config has a state group, so other configs never run this code.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

from hybridkv.core.coordinator.base import CoordinatorBase, _ReqBlocks, _StateBlocks
from hybridkv.core.coordinator.records import (AllocationPlan, CacheHit, GroupPlan, StateBlocks,
                                               StateExport, _make)
from hybridkv.core.pool import NULL_BLOCK
from hybridkv.core.request import Request
from hybridkv.core.retention import multiples_between

if TYPE_CHECKING:
    from hybridkv.core.extent_pool import ExtentBlockPool



class StateGroups(CoordinatorBase):
    """The coordinator's state-group seam: extents, checkpoints, exports."""

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
                t: float = (x // self.dense_step[g] + 1) * self.dense_step[g]
            else:
                t = self.retention.next_end(x, state.boundaries)
            if t < nxt:
                nxt = t
        return nxt

    def _plan_states(self, request: Request, state: _ReqBlocks | None, hit: CacheHit | None,
                     computed: int, num_new: int, slots: int, groups: list[GroupPlan],
                     needed: int, freed_total: int, reserved: int,
                     reserve_tokens: int) -> tuple[int, int, int]:
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
            if state is None:                                     # new_request
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
        pool = cast("ExtentBlockPool", self.pool)      # a config with state groups: extents
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
                st.live = pool.allocate_extent(k)
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
                head = pool.allocate_extent(k)
                table[t // a - 1] = head
                st.held.append(t // a - 1)
                st.exports.append((t, head))
                heads.append(head)
        return out

    def _free_states(self, request: Request, state: _ReqBlocks) -> bool:
        """At free: the live state becomes the final-length checkpoint when it sits exactly
        on the final end (:meth:`_final_end`; default mode; no copy, the extent is re-tagged),
        else it is freed. Returns whether every state group holds a checkpoint at that end, i.e.
        whether promising that end to the other groups serves a hit (else their runs for it
        would be cached for nothing)."""
        computed = min(request.num_computed_tokens, request.num_tokens)
        end = self._final_end(request, computed)
        retag = self.caching and not self.compat and computed > 0 and computed == end
        servable = end > 0
        live = []
        # (called for a request with state groups only)
        for g, st in cast("dict[int, _StateBlocks]", state.states).items():
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
        extent = cast("ExtentBlockPool", self.pool).extent
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
