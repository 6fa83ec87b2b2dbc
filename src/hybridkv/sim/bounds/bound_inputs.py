"""A served workload's bound keys, computed once, and every block-level bound read from them.

:func:`bound_inputs` hashes the served requests' blocks (plain chained key-block hashes, no
lookahead, no salt, independent of the simulated manager) and makes their
:class:`~hybridkv.sim.bounds.key_stream.KeyStream`, one pass for every bound: Belady at any capacity
(and with the hybrid bound's counted limits), the block-level LRU model, the unlimited cache,
the gap report's inputs and the hazard-rate reference. Each takes the stream's array path
(:mod:`hybridkv.sim.bounds.stream_caches`, :mod:`hybridkv.sim.bounds.hazard_stream`) and, for a workload
without a stream (a request that repeats a key), the per-key model of
:mod:`hybridkv.sim.bounds.optimal` / :mod:`hybridkv.sim.bounds.hazard`; both give the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from hybridkv.core.hashing import BlockHasher
from hybridkv.core.request import Request
from hybridkv.sim.bounds.hazard import HazardBound, hazard_bound, hazard_table, hazard_uses
from hybridkv.sim.bounds.hazard_stream import hazard_classes, stream_hazard_bound, stream_hazard_table
from hybridkv.sim.bounds.key_stream import key_stream, next_counted, unlimited_hits
from hybridkv.sim.bounds.optimal import (GapInputs, belady_block_hit_rate, gap_inputs,
                                  infinite_block_hit_rate, lru_block_hit_rate, next_read_indices,
                                  next_use_indices)
from hybridkv.sim.bounds.stream_caches import belady_hits, lru_hits
from hybridkv.sim.traffic.workitems import ServedItem, WorkItem

__all__ = ["BoundInputs", "bound_inputs", "optimal_hit_blocks", "reuse_ceiling_tokens"]


def _compute_bound_keys(items: Iterable[WorkItem | ServedItem],
                        block_size: int) -> tuple[list[list[bytes]], list[int]]:
    """Per request: its plain chained key-block hashes and hit limit.

    The keys are the blocks the request leaves computed: its tokens but the last sampled one
    (prompt + served output, whose last token's KV is never written), so every full prompt
    block when the outputs are the simulator's pseudo tokens (unique, never shared). A request
    may hit its prompt's first ``(prompt_len - 1) // block_size`` blocks (the last token is
    always recomputed)."""
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


class BoundInputs:
    """One workload's bound keys (``keys``, ``limits``: per request its chained key-block
    hashes and hit limit), their ``stream`` (None when a request repeats a key) and, made on
    first use and kept, the per-key models' next uses, the hazard reference's capacity-free
    parts and the gap report's inputs. Methods answer one bound each."""

    __slots__ = ("keys", "limits", "stream", "_next_uses", "_hazard", "_gap")

    def __init__(self, keys: list[list[bytes]], limits: list[int]) -> None:
        self.keys = keys
        self.limits = limits
        self.stream = key_stream(keys, limits)
        self._next_uses: list | None = None
        self._hazard: tuple | None = None
        self._gap: GapInputs | None = None

    def next_uses(self) -> list[list[float]]:
        """:func:`~hybridkv.sim.bounds.optimal.next_use_indices` of the keys (made once)."""
        if self._next_uses is None:
            self._next_uses = next_use_indices(self.keys)
        return self._next_uses

    def belady(self, capacity: int, limits: Sequence[int] | None = None,
               counted_next_use: bool = False) -> int:
        """Leading hits of Belady with bypass at ``capacity`` key blocks, counted within
        ``limits`` (default the workload's). ``counted_next_use``: a key's next use is its next
        reference within ``limits`` (the hybrid bound), not its next reference."""
        st = self.stream
        if st is not None:
            lim = None if limits is None else np.minimum(np.asarray(limits, dtype=np.int64),
                                                         st.limits)
            nxt = next_counted(st, lim) if counted_next_use and lim is not None else None
            got = belady_hits(st, capacity, lim, nxt)
            if got is not None:
                return got
        lim = self.limits if limits is None else limits
        if counted_next_use and limits is not None:
            uses = next_read_indices(self.keys, lim)
        else:
            uses = self.next_uses()
        return belady_block_hit_rate(self.keys, capacity, lim, next_uses=uses).block_hits

    def lru(self, capacity: int) -> int:
        """Leading hits of the block-level LRU model (tail evicted first) at ``capacity``."""
        if self.stream is not None:
            return lru_hits(self.stream, capacity)
        return lru_block_hit_rate(self.keys, capacity, hit_limits=self.limits).block_hits

    def unlimited(self) -> list[int]:
        """Per request, the leading keys (its whole chain, no limit) an unlimited cache holds."""
        if self.stream is not None:
            return unlimited_hits(self.stream).tolist()
        return list(infinite_block_hit_rate(self.keys).request_hits)

    def gap_inputs(self) -> GapInputs:
        """The gap report's :class:`~hybridkv.sim.bounds.optimal.GapInputs` (made once)."""
        if self._gap is None:
            st = self.stream
            if st is None:
                self._gap = gap_inputs(self.keys, self.limits)
            else:
                ceiling = unlimited_hits(st, st.limits)
                producer = st.first_req[st.depth < ceiling[st.req]]
                offsets = np.zeros(len(ceiling) + 1, dtype=np.int64)
                np.cumsum(ceiling, out=offsets[1:])
                self._gap = GapInputs(ceiling.tolist(), offsets.tolist(), producer)
        return self._gap

    def hazard(self, capacity: int) -> HazardBound:
        """The hazard-rate reference (:mod:`hybridkv.sim.bounds.hazard`) at ``capacity``."""
        st = self.stream
        if self._hazard is None:
            if st is not None:
                classes = hazard_classes(st)
                self._hazard = (classes, stream_hazard_table(st, classes))
            else:
                uses = hazard_uses(self.keys)
                self._hazard = (uses, hazard_table(self.keys, self.limits, uses))
        parts, table = self._hazard
        if st is not None:
            return stream_hazard_bound(st, capacity, parts, table)
        return hazard_bound(self.keys, self.limits, capacity, table, parts)


def bound_inputs(items: Iterable[WorkItem | ServedItem], block_size: int) -> BoundInputs:
    """The :class:`BoundInputs` of ``items`` at ``block_size``.

    They do not depend on the capacity: the last workload's are kept (by identity of the
    ``items`` list and the block size), so a sweep worker computes them once for all its
    capacities. :func:`~hybridkv.sim.traffic.workitems.served_workload` keeps its last answer the same
    way, so the per-run served list is the same object across runs over one workload.
    """
    global _OPTIMUM_KEYS
    memo = _OPTIMUM_KEYS
    if memo is not None and memo[0] is items and memo[1] == block_size:
        return memo[2]
    _OPTIMUM_KEYS = None                     # free the previous workload's keys first
    inputs = BoundInputs(*_compute_bound_keys(items, block_size))
    if isinstance(items, list):
        _OPTIMUM_KEYS = (items, block_size, inputs)
    return inputs


_OPTIMUM_KEYS: tuple | None = None   # (items, block_size, BoundInputs) of the last call


def _bound_keys(items: Iterable[WorkItem | ServedItem],
                block_size: int) -> tuple[list[list[bytes]], list[int], list]:
    """Keys, hit limits and Belady next uses of ``items`` (:func:`bound_inputs`)."""
    inputs = bound_inputs(items, block_size)
    return inputs.keys, inputs.limits, inputs.next_uses()


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
    return bound_inputs(items, block_size).belady(capacity_blocks)


def reuse_ceiling_tokens(items: Sequence[WorkItem | ServedItem], block_size: int) -> list[int]:
    """Per request, the most prompt tokens any cache could serve it from: the leading key
    blocks an unlimited cache holds when it arrives (every block earlier requests left
    computed), within its hit limit, times ``block_size``. No online run hits more
    (``online <= optimum <= unlimited cache``)."""
    keys, limits = _compute_bound_keys(items, block_size)
    hits = infinite_block_hit_rate(keys).request_hits
    return [min(h, lim) * block_size for h, lim in zip(hits, limits)]
