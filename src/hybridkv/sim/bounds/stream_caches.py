"""The block-level Belady and LRU models of :mod:`hybridkv.sim.bounds.optimal` on a
:class:`~hybridkv.sim.bounds.key_stream.KeyStream`: the same decisions, on integer ids and arrays.

:func:`belady_hits` makes exactly the choices of
:func:`~hybridkv.sim.bounds.optimal.belady_block_hit_rate` (the same heap entries, popped in the same
order); :func:`lru_hits` those of :func:`~hybridkv.sim.bounds.optimal.lru_block_hit_rate` with the tail
evicted first (a request's keys touched deepest first, the least recently touched evicted at
its end). Each is one walk over the requests; per request only array operations and, for
Belady, a heap push per inserted reference. ``tests/sim/test_key_stream.py`` holds them to
the per-key models.
"""

from __future__ import annotations

import heapq

import numpy as np

from hybridkv.sim.bounds.key_stream import KeyStream

__all__ = ["belady_hits", "lru_hits"]

#: Belady's heap entries must stay below this to be int64 (else the per-key model answers).
ENTRY_LIMIT = 1 << 63


def belady_hits(stream: KeyStream, capacity: int, limits: np.ndarray | None = None,
                next_req: np.ndarray | None = None) -> int | None:
    """Leading hits of the Belady cache with bypass at ``capacity`` keys, counted within
    ``limits`` (default the stream's) with next uses ``next_req`` (default the stream's: the
    next reference of any request; :func:`~hybridkv.sim.bounds.optimal.next_read_indices`'s
    counted references give the hybrid bound). None when a heap entry could reach
    :data:`ENTRY_LIMIT` (then the per-key model answers)."""
    n = stream.num_requests
    lim = (stream.limits if limits is None else limits).tolist()
    nxt = stream.next_req if next_req is None else next_req
    total = len(stream.ids)
    depth_span = int(np.diff(stream.starts).max(initial=0)) + 1
    seq_span = total + 1
    if ((n + 1) * depth_span + depth_span) * seq_span >= ENTRY_LIMIT:
        return None
    never = nxt >= n
    kept = ~never
    seq = np.cumsum(kept) - 1                            # the per-key model's reference counter
    depth = stream.depth
    entry = ((n - nxt) * depth_span + depth_span - 1 - depth) * seq_span + seq
    ids = stream.ids
    seq_key = ids[kept].tolist()                         # seq -> key
    where = np.full(stream.num_keys, -1, dtype=np.int64)  # key -> seq of its live entry (-1: not cached)
    entries = entry.tolist()
    kept_l = kept.tolist()
    starts = stream.starts.tolist()
    heap: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    size = hits = 0
    for i in range(n):
        a, b = starts[i], starts[i + 1]
        if lim[i]:
            gone = np.flatnonzero(where[ids[a:a + lim[i]]] < 0)
            hits += int(gone[0]) if len(gone) else lim[i]
        seg = ids[a:b]
        dead = seg[never[a:b]]                          # never used again: bypassed
        if len(dead):
            size -= int(np.count_nonzero(where[dead] >= 0))
            where[dead] = -1
        live = kept[a:b]
        keys = seg[live]
        if len(keys):
            size += int(np.count_nonzero(where[keys] < 0))
            where[keys] = seq[a:b][live]
            for e, k in zip(entries[a:b], kept_l[a:b]):
                if k:
                    push(heap, e)
        if size > capacity:
            w = where
            while size > capacity:
                s = pop(heap) % seq_span
                key = seq_key[s]
                if w[key] == s:
                    w[key] = -1
                    size -= 1
        if len(heap) > 4 * (size + 64):                 # drop stale entries
            heap = [e for e in heap if where[seq_key[e % seq_span]] == e % seq_span]
            heapq.heapify(heap)
    return hits


def lru_hits(stream: KeyStream, capacity: int) -> int:
    """Leading hits (within the stream's limits) of the LRU cache at ``capacity`` keys, a
    request's keys touched deepest first (:func:`~hybridkv.sim.bounds.optimal.lru_block_hit_rate`
    with ``evict_tail_first``).

    Every touch gets the next clock value; a key is cached while ``touched[key]`` holds the
    clock of its last touch. The touches, in clock order, form the eviction queue: at a
    request's end the oldest touches that are still some cached key's last one are evicted
    until ``capacity`` keys are left."""
    n = stream.num_requests
    ids = stream.ids
    lim = stream.limits.tolist()
    starts = stream.starts.tolist()
    total = len(ids)
    queue_key = np.empty(total, dtype=np.int64)          # touch clock -> key
    touched = np.full(stream.num_keys, -1, dtype=np.int64)   # key -> clock of its last touch, -1: not cached
    clock = head = size = hits = 0
    for i in range(n):
        a, b = starts[i], starts[i + 1]
        seg = ids[a:b]
        if lim[i]:
            gone = np.flatnonzero(touched[seg[:lim[i]]] < 0)
            hits += int(gone[0]) if len(gone) else lim[i]
        m = b - a
        if not m:
            continue
        size += int(np.count_nonzero(touched[seg] < 0))
        rev = seg[::-1]
        queue_key[clock:clock + m] = rev
        touched[rev] = np.arange(clock, clock + m, dtype=np.int64)
        clock += m
        need = size - capacity
        while need > 0:                                  # evict the `need` oldest live touches
            span = max(2 * need, 1024)
            hi = min(clock, head + span)
            qk = queue_key[head:hi]
            live = touched[qk] == np.arange(head, hi, dtype=np.int64)
            count = np.cumsum(live)
            if count[-1] >= need:
                stop = int(np.searchsorted(count, need))     # the need-th live touch
                touched[qk[:stop + 1][live[:stop + 1]]] = -1
                head += stop + 1
                size -= need
                need = 0
            else:
                touched[qk[live]] = -1
                size -= int(count[-1])
                need -= int(count[-1])
                head = hi
    return hits
