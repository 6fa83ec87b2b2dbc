"""Release: blocks a request gives back, when they leave a window and when it is freed.

A released block stays cached if it has a hash (the pool queues it as evictable); a request
with a retention config first hands the eviction policy its marks for the blocks it releases
(:mod:`hybridkv.core.retention_config`), and in a pool that takes hints every request hands
the hint layer its hint's marks (none without a hint) and its owner (the hint's session, else
the request: :mod:`hybridkv.core.hints`). A request's table is freed tail first, group by
group, so a chain's tail is evicted before its prefix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence, cast

from hybridkv.core.coordinator.base import CoordinatorBase, _Fields, _ReqBlocks
from hybridkv.core.hints import hint_marks
from hybridkv.core.pool import NULL_BLOCK
from hybridkv.core.request import Request
from hybridkv.core.retention import hit_point_class
from hybridkv.core.retention_config import block_marks

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

if TYPE_CHECKING:
    from hybridkv.core.policy_pool import PolicyBlockPool


class Release(CoordinatorBase):
    """The coordinator's release seam: window release, free, retention marks."""

    @cython.locals(self=_Fields, state=_ReqBlocks)
    def _release(self, request: Request, state: _ReqBlocks, computed: int,
                 released: Sequence[tuple[int, ...]]) -> None:
        """A running request's first commit phase: cache pending ends (up to ``computed``
        tokens), then free the blocks that left the window (``released[g]``: group g's table
        positions, back to front; :meth:`Allocation._released`) and null their table entries."""
        n = len(request.token_ids)
        if computed < n:
            n = computed
        if n >= state.quiet_until:                  # (cache's own first test, saving the call)
            self.cache(request, n)
        pool = self.pool
        for g, positions in enumerate(released):
            if positions:
                table = state.tables[g]
                # released positions run back to front without a gap (_released)
                lo = positions[-1]
                hi = positions[0] + 1
                freed = table[lo:hi]
                freed.reverse()
                if request.retention is not None or self.hinted:
                    self._retain(request, g, table, positions)
                if self.anchor_key is not None and g != self.anchor_key:
                    self._anchor(request, state, g, positions)
                table[lo:hi] = [NULL_BLOCK] * (hi - lo)
                pool.free(freed)

    @cython.locals(self=_Fields, state=_ReqBlocks)
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
        key = self.anchor_key
        if key is not None:          # first: the retention marks and hints then see the hit points
            for g, table in enumerate(state.tables):
                if g != key:
                    self._anchor(request, state, g, range(len(table)))
        if request.retention is not None or self.hinted:
            for g, table in enumerate(state.tables):
                self._retain(request, g, table, range(len(table)), final=True)
        for table in state.tables:
            self.pool.free(reversed(table))

    @cython.locals(self=_Fields)
    def _anchor(self, request: Request, state: _ReqBlocks, g: int, positions: Iterable[int]) -> None:
        """Tell the pool's hit-point layer, for group ``g``'s blocks at ``positions`` (about
        to be released), the place in the key table of the key-group block that ends the first
        hit point each one serves: the key block covering ``[e - bs_key, e)`` (in EAGLE drop
        mode the one after it, the key group's proof block), ``e`` the first multiple of the
        alignment at or after the block's last token, or, for an EAGLE drop-mode group's block
        that starts at such a multiple, that start (it is that hit point's proof block); -1
        where the key table holds none. A later hit point extends the first one's chain, so
        the block is useless once that anchor is gone. Each hit point's class
        (:func:`~hybridkv.core.retention.hit_point_class`) goes with it. A downward-closed
        group's blocks are followers (their place is their own)."""
        key = cast(int, self.anchor_key)              # called only with an anchor key
        a = self.alignment
        bs, bs_key = self.block_sizes[g], self.block_sizes[key]
        proof = self.proof[g]
        last = self.proof[key] - 1            # drop mode: the key group's proof block is last
        table, key_table = state.tables[g], state.tables[key]
        n_key = len(key_table)
        prompt = request.num_prompt_tokens
        comps: list[int] = []
        places: list[int] = []
        classes: list[int] = []
        for j in positions:
            b = table[j]
            if b:
                e = j * bs
                if not (proof and e and e % a == 0):
                    e = -(-(j + 1) * bs // a) * a
                k = e // bs_key + last
                comps.append(b)
                places.append(k if k < n_key else -1)
                classes.append(hit_point_class(e, prompt, a))
        if comps:
            cast("PolicyBlockPool", self.pool).anchor(   # a hit-point layer's pool
                comps, places, key_table, self.rules[g].downward_closed, classes)

    @cython.locals(self=_Fields)
    def _retain(self, request: Request, g: int, table: list[int], positions: Iterable[int],
                final: bool = False) -> None:
        """Give the request's retention marks to group ``g``'s blocks at ``positions`` (about
        to be released), and in a pool that takes hints its hint's marks and owner (and, for
        a session's request freed whole, ``final``, the key its releases are tracked by); see
        :mod:`hybridkv.core.retention_config` and :mod:`hybridkv.core.hints`."""
        pool = cast("PolicyBlockPool", self.pool)  # retention and hints run on a policy's pool
        if request.retention is not None:
            marks = block_marks(request.retention, self.block_sizes[g], request.num_prompt_tokens,
                                request.num_tokens)
            pool.retain(table, positions, marks)
        if self.hinted:
            hint = request.hint
            track = None
            if hint is None or hint.session is None:
                owner: object = ("request", request.request_id)
            else:
                owner = ("session", hint.session)
                if final:
                    track = (hint.session, g)
            marks = () if hint is None or hint.empty else hint_marks(
                hint, self.block_sizes[g], request.num_prompt_tokens, request.num_tokens)
            pool.hint(table, positions, marks, owner, track)
