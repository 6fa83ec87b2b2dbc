"""The hazard-rate reference of :mod:`hybridkv.sim.bounds.hazard` on a
:class:`~hybridkv.sim.bounds.key_stream.KeyStream`: the same numbers, from whole arrays.

:func:`hazard_classes` is :func:`~hybridkv.sim.bounds.hazard.hazard_uses` (each reference's class and
its key's previous class), :func:`stream_hazard_table` is
:func:`~hybridkv.sim.bounds.hazard.hazard_table` (events and exposure counted with ``bincount`` and one
matrix product over a histogram of durations), :func:`stream_hazard_bound` is
:func:`~hybridkv.sim.bounds.hazard.hazard_bound` (the cells still age request by request; each
request's credits are one array expression, and the sums are taken in the same order, so the
floats are equal, not close). ``tests/sim/test_key_stream.py`` holds them to the per-key code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybridkv.sim.bounds.hazard import (SHARED_CLASS, SHARED_USES, TURN_CLASSES, HazardBound, age_cells,
                                 age_edges)
from hybridkv.sim.bounds.key_stream import KeyStream

__all__ = ["HazardClasses", "hazard_classes", "stream_hazard_bound", "stream_hazard_table"]


@dataclass(frozen=True, slots=True, eq=False)
class HazardClasses:
    """Per reference: the class its request gives the key now (``new_c``) and the class of the
    key's previous use (``prev_c``, -1: first use)."""

    new_c: np.ndarray
    prev_c: np.ndarray


def hazard_classes(stream: KeyStream) -> HazardClasses:
    """The classes of :func:`~hybridkv.sim.bounds.hazard.hazard_uses`: a request's turn class is the
    largest earlier use count below :data:`SHARED_USES` among its keys (capped), a key used
    that often is shared."""
    n = stream.num_requests
    u = stream.uses_before
    lengths = np.diff(stream.starts)
    turn = np.zeros(n, dtype=np.int64)
    some = lengths > 0
    if some.any():
        turn[some] = np.maximum.reduceat(np.where(u < SHARED_USES, u, 0), stream.starts[:-1][some])
    c_req = np.minimum(TURN_CLASSES - 1, turn)
    new_c = np.where(u + 1 >= SHARED_USES, SHARED_CLASS, c_req[stream.req])
    prev = stream.prev_ref
    prev_c = np.where(prev >= 0, new_c[np.maximum(prev, 0)], -1)
    return HazardClasses(new_c, prev_c)


def stream_hazard_table(stream: KeyStream, classes: HazardClasses) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~hybridkv.sim.bounds.hazard.hazard_table` of the stream (its limits are the hit limits)."""
    n = stream.num_requests
    edges = age_edges(n)
    nb = len(edges)
    ncls = TURN_CLASSES + 1
    bucket = np.searchsorted(edges, np.arange(n + 1), side="right") - 1
    p = stream.prev_req
    seen = p >= 0
    d = stream.req[seen] - p[seen]
    c = classes.prev_c[seen]
    counted = (stream.depth < stream.limits[stream.req])[seen]
    events = np.bincount(c[counted] * nb + bucket[d[counted]], minlength=ncls * nb)
    events = events.reshape(ncls, nb).astype(float)
    # durations: every reuse, and each key's open episode to the end (exposure only)
    last = stream.next_req >= n
    open_d = (n - 1) - stream.req[last]
    open_c = classes.new_c[last]
    keep = open_d > 0
    hist = np.bincount(np.concatenate([c * (n + 1) + d, open_c[keep] * (n + 1) + open_d[keep]]),
                       minlength=ncls * (n + 1)).reshape(ncls, n + 1)
    hi = np.append(edges[1:], np.iinfo(np.int64).max)
    ages = np.arange(n + 1, dtype=np.int64)[:, None]              # ages 1..d exposed
    weight = np.clip(np.minimum(hi[None, :] - 1, ages) - edges[None, :] + 1, 0, None)
    exposure = (hist @ weight).astype(float)
    h = np.divide(events, exposure, out=np.zeros_like(events), where=exposure > 0)
    return h, edges


def stream_hazard_bound(stream: KeyStream, capacity_blocks: int, classes: HazardClasses,
                        table: tuple[np.ndarray, np.ndarray]) -> HazardBound:
    """:func:`~hybridkv.sim.bounds.hazard.hazard_bound` of the stream at ``capacity_blocks``."""
    n = stream.num_requests
    h, edges = table
    ncls, nb = h.shape
    order = np.argsort(-h, axis=None, kind="stable")              # cells, best first
    rank = np.empty(ncls * nb, dtype=np.int64)
    rank[order] = np.arange(ncls * nb)
    live = h.reshape(-1)[order] > 0
    cnt = np.zeros((ncls, n + 1), dtype=np.int64)                 # keys by (class, last use)
    cells = np.zeros((ncls, nb), dtype=np.int64)                  # keys by (class, bucket)
    flat_cnt = cnt.reshape(-1)
    flat_cells = cells.reshape(-1)
    lo = edges[1:]
    bucket = np.searchsorted(edges, np.arange(n + 1), side="right") - 1
    starts = stream.starts.tolist()
    limits = stream.limits.tolist()
    prev_req, prev_c, new_c = stream.prev_req, classes.prev_c, classes.new_c
    relaxed_q: list[np.ndarray] = []
    leading_q: list[np.ndarray] = []
    refs = 0
    for t in range(n):
        if t:                                                     # every key ages by one
            age_cells(cells, cnt, t, lo)
        a, b = starts[t], starts[t + 1]
        lim = limits[t]
        refs += lim
        p = prev_req[a:b]
        pc = prev_c[a:b]
        if lim:
            flat = cells.reshape(-1)[order]
            cum = np.cumsum(flat)
            m = int(np.searchsorted(cum, capacity_blocks, side="right"))   # first cell not whole
            frac = 0.0
            if m < len(flat) and live[m] and flat[m]:
                frac = (capacity_blocks - (cum[m - 1] if m else 0)) / flat[m]
            pl = p[:lim]
            valid = pl >= 0
            r = rank[pc[:lim][valid] * nb + bucket[t - pl[valid]]]
            q = np.where((r < m) & live[np.minimum(r, len(live) - 1)], 1.0,
                         np.where(r == m, frac, 0.0))
            relaxed_q.append(q)
            first_new = np.flatnonzero(~valid)
            run = q[:first_new[0]] if len(first_new) else q   # before the first new key
            if len(run):
                leading_q.append(np.multiply.accumulate(run))
        old = p >= 0
        if old.any():
            np.subtract.at(flat_cnt, pc[old] * (n + 1) + p[old], 1)
            np.subtract.at(flat_cells, pc[old] * nb + bucket[t - p[old]], 1)
        if b > a:
            cnt[:, t] += np.bincount(new_c[a:b], minlength=ncls)
    relaxed = _sequential_sum(relaxed_q)
    leading = _sequential_sum(leading_q)
    return HazardBound(capacity_blocks, relaxed, leading, refs)


def _sequential_sum(parts: list[np.ndarray]) -> float:
    """The left-to-right float sum from 0.0 (``add.accumulate`` adds in order; ``sum`` and
    ``np.sum`` may not)."""
    if not parts:
        return 0.0
    values = np.concatenate(parts)
    return float(np.add.accumulate(values)[-1]) if len(values) else 0.0
