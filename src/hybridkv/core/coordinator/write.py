"""The write path: which blocks get cached under which hashes, as a request computes.

**Caching** walks the promised hit ends (:mod:`hybridkv.core.retention`) and gives each group
the hashes of exactly the runs its rule needs for them (:mod:`hybridkv.core.rules`): a
downward-closed group caches its prefix, a local group the runs of its promised ends. A
request's extra promised ends are its replay boundaries and the shared-prefix junction its hit
found (:meth:`WritePath._boundaries`). Compat mode takes vLLM 0.33's shape where it differs:
per-block masks under sparse retention (:meth:`WritePath._write_mask`) and each group cached
only up to vLLM's cacheable prefix (:meth:`WritePath._compat_limits`).
"""

from __future__ import annotations

import math
from typing import Sequence

from hybridkv.core.coordinator.base import CoordinatorBase, _Fields, _ReqBlocks, _report_runs
from hybridkv.core.coordinator.records import CacheHit
from hybridkv.core.pool import NULL_BLOCK
from hybridkv.core.request import Request
from hybridkv.core.retention import multiples_between, replay_boundaries
from hybridkv.core.rules import HitRule

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi


_INF = math.inf


class WritePath(CoordinatorBase):
    """The coordinator's write path: promised ends, compat masks and limits, caching."""

    @cython.locals(self=_Fields)
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
        if request.checkpoints:
            if not self.compat:
                # the application's marks (Request.checkpoints), rounded down to the alignment
                ends.update(m // a * a for m in request.checkpoints if m >= a)
        return tuple(sorted(ends))

    @cython.locals(self=_Fields)
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

    @cython.locals(self=_Fields)
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

    def _final_end(self, request: Request, num_tokens: int) -> int:
        """The end a request freed after ``num_tokens`` computed tokens promises (default
        mode): the largest aligned end whose run every group can complete, i.e. its proof
        block computed (drop mode) and its last block hashed (lookahead hashing). The next
        chat turn then hits at most one proof block (one alignment unit) short of the final
        length, never more."""
        n_fine = len(request.block_hashes)
        common = min((min(num_tokens // r.block_size, n_fine // self.scales[g]) - r.proof)
                     * r.block_size for g, r in enumerate(self.rules))
        return max(common, 0) // self.alignment * self.alignment

    # ---- caching ----------------------------------------------------------------------------
    @cython.locals(self=_Fields, state=_ReqBlocks)
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
        # An end t is cacheable in a group once its run [lo, hi) is computed and hashed.
        limits: list[int] | None = None
        common = 0
        if self.compat:
            limits = self._compat_limits(num_tokens, n_fine)
        else:
            # an end serves a hit only if every group holds its run: promise it to all at
            # once, up to the smallest group's limit
            first = True
            for bs, scale, proof in self._limit_facts:
                n = num_tokens // bs
                m = n_fine // scale
                lim = ((n if n < m else m) - proof) * bs
                if first or lim < common:
                    common = lim
                    first = False
            if final:
                extra = extra + (self._final_end(request, num_tokens),)
        # Each group also gives the fewest tokens at which it has work again (its next end,
        # plus its delay); below the smallest, cache() is a no-op (state.quiet_until).
        done_t = state.done_t
        nxt = _INF
        for g, rule, bs, masked, step, delay, aligned in self._write_facts:
            if masked:
                # the next masked block must be full (a lower bound on the tokens)
                t = (self._write_mask(g, request, state, limits[g] // bs + rule.proof,  # type: ignore[index]
                                      hashes) + 1) * bs
            else:
                t_limit = common if limits is None else limits[g]
                done = done_t[g]
                # the next promised end after done (step: a dense group's, else the
                # retention's); the group has work iff it is <= t_limit
                t = (done // step + 1) * step if step else self.retention.next_end(done, extra)
                if t <= t_limit:
                    if rule.downward_closed:
                        self._cache_prefix(g, rule, request, state, t_limit, hashes)
                    else:
                        self._cache_ends(g, rule, request, state, t_limit, hashes, extra)
                    done = done_t[g]
                    t = (done // step + 1) * step if step else \
                        self.retention.next_end(done, extra)
                t += delay
            if aligned and t < _INF:
                # compat hybrid, no proof: the group caches up to align(n) only
                a = self.alignment
                t = -(-t // a) * a
            if t < nxt:
                nxt = t
        if not final:
            # every group's limit is <= num_tokens, so nothing happens before the next end
            state.quiet_until = nxt

    @cython.locals(self=_Fields, state=_ReqBlocks)
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

    @cython.locals(self=_Fields, state=_ReqBlocks)
    def _cache_ends(self, g: int, rule: HitRule, request: Request, state: _ReqBlocks,
                    t_limit: int, hashes: list[bytes], extra: tuple[int, ...]) -> None:
        """A local group: cache the runs of the promised ends in ``(done_t, t_limit]``."""
        done = state.done_t[g]
        ends: Sequence[int]
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

    @cython.locals(self=_Fields, table=list, hashes=list, block_hash=list, hs=list, run=list,
                   j=cython.Py_ssize_t, hi=cython.Py_ssize_t, scale=cython.Py_ssize_t,
                   bi=cython.Py_ssize_t)
    def _insert_span(self, g: int, table: list[int], j: int, hi: int, hashes: list[bytes],
                     scale: int, positions: list[int]) -> None:
        """Cache the blocks of table positions ``[j, hi)`` of group g that are neither null
        nor cached yet, under the request's hashes; append their positions to ``positions``.
        One pass picks them, one :meth:`BlockPool.insert_run` caches them (pair by pair, in
        order, as an insert each would)."""
        block_hash = self.pool.block_hash
        hs = []
        run = []
        while j < hi:
            b = table[j]
            if b != NULL_BLOCK:
                bi = b
                if block_hash[bi] is None:
                    hs.append(hashes[(j + 1) * scale - 1])
                    run.append(b)
                    positions.append(j)
            j += 1
        if run:
            self.pool.insert_run(g, hs, run)

    @cython.locals(self=_Fields)
    def _write_mask(self, g: int, request: Request, state: _ReqBlocks, hi: int,
                    hashes: list[bytes]) -> float:
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
            # (i < hi: a finite block index)
            self._insert_span(g, table, i, stop, hashes, scale, positions)  # type: ignore[arg-type]
            j = stop
        state.cached_hi[g] = hi
        if positions and self.on_stored is not None:
            _report_runs(self.on_stored, g, request, table, positions)
        return i
