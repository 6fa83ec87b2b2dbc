"""Lookup: the longest prefix every group serves, locally and with an external tier.

**Lookup** is a fixed point: every group answers "the largest aligned hit <= t that my rule
can serve", starting at t = num_tokens - 1 and feeding each answer to the next group, until a
full pass leaves t unchanged. Each answer is <= its input and the true common hit is <= every
answer, so the loop ends at the largest hit all groups serve. Full attention is
downward-closed and answers once; identical sibling groups (same spec) are probed together
(a block counts as cached only if every sibling has it).

A waiting request is looked up every step, so a lookup is memoized per request while no index
change touched one of its hashes. The external fixed point is the same loop where a block
counts as cached if the local hit holds it or the tier has it; ``commit_external`` caches what
was loaded.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from hybridkv.core.blockref import TableRef
from hybridkv.core.coordinator.base import CoordinatorBase, _Fields, _report_runs, _Unit
from hybridkv.core.coordinator.records import CacheHit, ExternalHit
from hybridkv.core.pool import NULL_BLOCK
from hybridkv.core.request import Request

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

if not cython.compiled:     # compiled: the native index (lookup.pxd cimports it)
    from hybridkv.core.hash_index import HashIndex


# Hashes a leading-run probe prefetches at a time (HashIndex.prefetch): a run's misses
# overlap, and a short hit wastes at most this many prefetches per index.
_PROBE_RUN = 32


@cython.locals(idx=HashIndex, k=cython.Py_ssize_t, j=cython.Py_ssize_t, run=list)
def _leading_cached(hashes: list[bytes], indexes: Sequence[HashIndex]) -> int:
    """How many of ``hashes``, from the first on, every one of ``indexes`` holds (prefetched
    :data:`_PROBE_RUN` at a time)."""
    k = 0
    for j in range(0, len(hashes), _PROBE_RUN):
        run = hashes[j:j + _PROBE_RUN]
        for idx in indexes:
            idx.prefetch(run)
        for h in run:
            for idx in indexes:
                if h not in idx:
                    return k
            k += 1
    return k


@cython.cfunc
@cython.locals(idx=HashIndex, out=list)
def _held(hashes: list[bytes], indexes: list[HashIndex]) -> list[bool]:
    """Per hash, whether every one of ``indexes`` holds it (an index is probed only while the
    ones before it held the hash; every hash prefetched first)."""
    for idx in indexes:
        idx.prefetch(hashes)
    out = []
    for h in hashes:
        for idx in indexes:
            if h not in idx:
                out.append(False)
                break
        else:
            out.append(True)
    return out


@cython.cfunc
@cython.locals(ids=list, k=cython.Py_ssize_t, dup=dict)
def _first_of_duplicates(ids: list[Any]) -> None:
    """Replace each dict of block ids in ``ids`` (a hash the index holds for several blocks:
    concurrent requests computed the same content) by its first block."""
    for k in range(len(ids)):
        v = ids[k]
        if type(v) is dict:
            dup = v
            for b in dup:
                ids[k] = b
                break


@cython.cfunc
@cython.locals(idx=HashIndex, out=list, run=list, k=cython.Py_ssize_t)
def _leading_values(hashes: list[bytes], idx: HashIndex) -> list[Any]:
    """What ``idx`` holds for each of ``hashes``, from the first on, up to the first it lacks
    (a block id, or a dict of them; one probe per hash, the ids read on the way; the hashes
    prefetched :data:`_PROBE_RUN` at a time)."""
    out: list[Any] = []
    for k in range(0, len(hashes), _PROBE_RUN):
        run = hashes[k:k + _PROBE_RUN]
        idx.prefetch(run)
        for h in run:
            v = idx.get(h)
            if v is None:
                return out
            out.append(v)
    return out


class Lookup(CoordinatorBase):
    """The coordinator's lookup seam: local and external fixed point, the per-request memo."""

    @cython.locals(self=_Fields)
    def find_longest_hit(self, request: Request, max_tokens: int) -> CacheHit:
        """The longest prefix of at most ``max_tokens`` tokens every group can serve.

        Each unit's "is block j cached" answers are computed up front for every hashed
        block up to ``max_tokens``, in C (:func:`_held`, :func:`_leading_values`): an index
        membership test per block is far cheaper than the Python-level probes the rules'
        scans would otherwise make (a small-pool waiting request is looked up every step).
        Block ids are read from the index only for the blocks of the final hit.
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
            hit: CacheHit = memo[4]
            if hit.epoch != self.epoch:
                hit = CacheHit(hit.num_tokens, hit.block_ids, hit.shared_prefix_boundary,
                               hit.request_id, self.epoch, hit.group_tokens)
            return hit
        hit = self._find_longest_hit(request, max_tokens)
        if len(self._lookups) >= 4096:
            self._lookups.clear()
        self._lookups[request.request_id] = [request, version, n_fine, max_tokens, hit, None]
        return hit

    @cython.locals(self=_Fields)
    def _memo_valid(self, memo: list[Any], hashes: list[bytes], version: int) -> bool:
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

    @cython.locals(self=_Fields)
    def _find_longest_hit(self, request: Request, max_tokens: int) -> CacheHit:
        hashes = request.block_hashes
        n_fine = len(hashes)
        index = self.pool.index
        probes: list[Callable[[int], object]] = []
        # per group, the index values of a one-group downward-closed unit's leading run
        leading: list[list[Any] | None] = [None] * len(self.block_sizes)
        for unit in self.units:
            scale = unit.scale
            # blocks past max_tokens (plus a proof block) can never be part of the hit
            hs = hashes[scale - 1:(max_tokens // unit.rule.block_size + 1) * scale:scale]
            if unit.rule.downward_closed:
                # its hit needs every block before it: the flags up to the first miss decide
                # (the rest read as misses), so the probing stops there
                if len(unit.groups) == 1:
                    values = _leading_values(hs, index[unit.groups[0]])
                    leading[unit.groups[0]] = values
                    k = len(values)
                else:
                    k = _leading_cached(hs, [index[g] for g in unit.groups])
                flags = [True] * k + [False] * (len(hs) - k)
            else:                  # every block is probed: all prefetched first
                flags = _held(hs, [index[g] for g in unit.groups])
            probes.append(flags.__getitem__)
        t, longest = self._fixed_point(probes, n_fine, max_tokens)
        t = max(t, 0)
        rid = request.request_id
        own = self._own_hits(probes, n_fine, max_tokens, t, longest)
        if t == 0:
            return CacheHit(0, tuple(() for _ in self.config.groups), max(longest, 0), rid,
                            self.epoch, own)
        block_ids: list[tuple[int, ...]] = [()] * len(self.config.groups)
        for unit in self.units:
            e = t // unit.rule.block_size
            lo = unit.rule.lo(e)
            scale = unit.scale
            hs = hashes[(lo + 1) * scale - 1:e * scale:scale]
            for g in unit.groups:
                run = leading[g]
                # block ids, or dicts of them (a leading run read already: e <= its length,
                # lo == 0, as the unit answered at most its run)
                ids: list[Any] = run[:e] if run is not None else \
                    list(map(index[g].__getitem__, hs))
                _first_of_duplicates(ids)
                block_ids[g] = (NULL_BLOCK,) * lo + tuple(ids)
        boundary = longest if longest > t else 0
        return CacheHit(t, tuple(block_ids), boundary, rid, self.epoch, own)

    @cython.locals(self=_Fields)
    def _e_caps(self, n_fine: int, max_tokens: int) -> list[int]:
        """Largest block boundary e per unit whose proof block (if any) has a hash."""
        e_cap = [n_fine // unit.scale - unit.rule.proof for unit in self.units]
        if self.compat and len(self.config.groups) == 1:
            # vLLM's single-group coordinator gives drop mode no margin: the proof block
            # must lie below max_tokens too (a hit one block shorter than the hybrid one).
            unit = self.units[0]
            e_cap[0] = min(e_cap[0], max_tokens // unit.rule.block_size - unit.rule.proof)
        return e_cap

    @cython.locals(self=_Fields)
    def _own_hits(self, probes: list[Callable[[int], object]], n_fine: int, max_tokens: int,
                  t: int, first: int) -> tuple[int, ...]:
        """Per group, the largest aligned hit <= max_tokens its unit's rule alone serves
        (:attr:`CacheHit.group_tokens`); ``t`` is the common hit (a single unit's own),
        ``first`` the first unit's own (the fixed point's first answer, -1: none asked)."""
        groups = self.config.groups
        a = self.alignment
        t0 = max_tokens // a * a
        if len(self.units) == 1 or t >= t0:      # one unit, or every unit serves the whole cap
            return (t,) * len(groups)
        e_cap = self._e_caps(n_fine, max_tokens)
        own = [0] * len(groups)
        for u, unit in enumerate(self.units):
            if u == 0:
                for g in unit.groups:
                    own[g] = max(first, 0)
                continue
            bs = unit.rule.block_size
            e_max = min(t0 // bs, e_cap[u])
            hit = unit.rule.longest_hit(probes[u], e_max, unit.step) * bs if e_max > 0 else 0
            for g in unit.groups:
                own[g] = hit
        return tuple(own)

    @cython.locals(self=_Fields)
    def _fixed_point(self, probes: list[Callable[[int], object]], n_fine: int,
                     max_tokens: int) -> tuple[int, int]:
        """The largest aligned t <= max_tokens every unit serves, and the first unit's answer."""
        e_cap = self._e_caps(n_fine, max_tokens)
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

    @cython.locals(self=_Fields)
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

    @cython.locals(self=_Fields)
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
