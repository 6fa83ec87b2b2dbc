"""One pass over a served workload's chained key blocks: what every bound reads of each reference.

The bounds (:mod:`hybridkv.sim.bounds.optimal`, :mod:`hybridkv.sim.bounds.hazard`, :mod:`hybridkv.sim.bounds.whatif`)
all walk the same sequence of block references (request after request, each request's keys in
order). :func:`key_stream` replaces each key by a dense integer id and sorts the references by
key once (a stable sort, so a key's references stay in workload order); every per-reference
neighbour the bounds need then comes out of that order as whole arrays: the request of the
key's previous and next reference, how many references of the key came before, the request
that first produced it. The unlimited cache (:func:`unlimited_hits`) is one more array pass.

A request that names one key twice has no such stream (:func:`key_stream` returns None) and
the bounds fall back to their per-key models; chained keys never repeat within a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

__all__ = ["KeyStream", "key_stream", "leading_true", "next_counted", "unlimited_hits"]


@dataclass(frozen=True, slots=True, eq=False)
class KeyStream:
    """The references of ``n`` requests, request after request (arrays of one entry per
    reference unless named per request).

    Attributes:
        ids: the key's dense id (``0 .. num_keys - 1``).
        starts: per request and one more, where its references start (``n + 1`` entries).
        limits: per request, the leading references a hit may count (``<=`` its length).
        req: the request of the reference.
        prev_ref: the key's previous reference (-1: first use).
        prev_req: the request of the key's previous reference (-1: first use).
        next_req: the request of the key's next reference (``n``: never used again).
        uses_before: references of the key before this one.
        first_req: the request of the key's first reference (the one that produced it).
        num_keys: distinct keys.
    """

    ids: np.ndarray
    starts: np.ndarray
    limits: np.ndarray
    req: np.ndarray
    prev_ref: np.ndarray
    prev_req: np.ndarray
    next_req: np.ndarray
    uses_before: np.ndarray
    first_req: np.ndarray
    num_keys: int

    @property
    def num_requests(self) -> int:
        return len(self.starts) - 1

    @property
    def depth(self) -> np.ndarray:
        """Each reference's position in its request."""
        return np.arange(len(self.ids), dtype=np.int64) - self.starts[self.req]


def _sort_keys(keys: Sequence[Sequence[bytes]], total: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, new)``: a stable order of the references by key and, along it, where a new key
    starts. Keys of one length, a multiple of 8 bytes (every block hash), are sorted as
    integers by their first 8 bytes and checked equal in full within a run (a run holding two
    keys is sorted by all their bytes); other keys are numbered in a dict first."""
    lengths = set(map(len, chain.from_iterable(keys)))
    width = next(iter(lengths)) if len(lengths) == 1 else 0
    if width and width % 8 == 0:
        words = np.frombuffer(b"".join(chain.from_iterable(keys)), dtype="<u8").reshape(total, width // 8)
        order = np.argsort(words[:, 0], kind="stable")
        s = words[order]
        same = s[1:] == s[:-1]
        if not np.array_equal(same[:, 0], same.all(axis=1)):    # two keys share the first word
            order = np.lexsort(words.T[::-1])
            s = words[order]
            same = s[1:] == s[:-1]
        new = np.ones(total, dtype=bool)
        new[1:] = ~same.all(axis=1)
        return order, new
    numbers: dict = {}
    number = numbers.setdefault
    ids = np.fromiter((number(k, len(numbers)) for k in chain.from_iterable(keys)),
                      dtype=np.int64, count=total)
    order = np.argsort(ids, kind="stable")
    new = np.ones(total, dtype=bool)
    new[1:] = ids[order][1:] != ids[order][:-1]
    return order, new


def key_stream(keys: Sequence[Sequence[bytes]], limits: Sequence[int]) -> KeyStream | None:
    """The :class:`KeyStream` of ``keys`` (per request, its chained keys) with hit ``limits``
    (per request; cut to ``[0, the request's length]``), or None when a request names a key
    twice."""
    n = len(keys)
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=n)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    total = int(starts[-1])
    lim = np.clip(np.fromiter((int(x) for x in limits), dtype=np.int64, count=n), 0, lengths)
    req = np.repeat(np.arange(n, dtype=np.int64), lengths)
    if total == 0:
        empty = np.zeros(0, dtype=np.int64)
        return KeyStream(empty, starts, lim, req, empty, empty, empty, empty, empty, 0)
    order, new = _sort_keys(keys, total)
    group = np.cumsum(new) - 1                         # the key's id, along the order
    run_start = np.flatnonzero(new)                    # where each key's run starts
    rs = req[order]
    if np.any(~new[1:] & (rs[1:] == rs[:-1])):       # a request names a key twice
        return None
    prev_o = np.full(total, -1, dtype=np.int64)
    prev_o[1:] = np.where(new[1:], -1, order[:-1])
    prev_s = np.full(total, -1, dtype=np.int64)
    prev_s[1:] = np.where(new[1:], -1, rs[:-1])
    next_s = np.full(total, n, dtype=np.int64)
    next_s[:-1] = np.where(new[1:], n, rs[1:])
    ids = np.empty(total, dtype=np.int64)
    prev_ref = np.empty(total, dtype=np.int64)
    prev_req = np.empty(total, dtype=np.int64)
    next_req = np.empty(total, dtype=np.int64)
    uses_before = np.empty(total, dtype=np.int64)
    first_req = np.empty(total, dtype=np.int64)
    ids[order] = group
    prev_ref[order] = prev_o
    prev_req[order] = prev_s
    next_req[order] = next_s
    uses_before[order] = np.arange(total, dtype=np.int64) - run_start[group]
    first_req[order] = rs[run_start][group]
    return KeyStream(ids, starts, lim, req, prev_ref, prev_req, next_req, uses_before, first_req,
                     len(run_start))


def leading_true(flags: np.ndarray, starts: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """Per request ``r``: how many of its first ``limits[r]`` references (``starts[r]`` on)
    have ``flags`` set before the first that has not."""
    n = len(starts) - 1
    pos = np.arange(len(flags), dtype=np.int64)
    miss = np.where(flags, np.iinfo(np.int64).max, pos)
    # the first unset flag of each request: a running minimum from the end, read at its start
    first = np.minimum.accumulate(miss[::-1])[::-1] if len(miss) else miss
    at = np.append(first, np.iinfo(np.int64).max)[starts[:-1]]
    return np.minimum(np.maximum(at - starts[:-1], 0), limits) if n else np.zeros(0, np.int64)


def unlimited_hits(stream: KeyStream, limits: np.ndarray | None = None) -> np.ndarray:
    """Per request, the leading keys (at most ``limits[r]``, default its whole length) an
    unlimited cache holds: keys some earlier request used."""
    lim = np.diff(stream.starts) if limits is None else limits
    return leading_true(stream.prev_req >= 0, stream.starts, lim)


def next_counted(stream: KeyStream, limits: np.ndarray) -> np.ndarray:
    """Per reference: the request of the key's next reference that is *counted* (its position
    below ``limits`` of its request; :func:`~hybridkv.sim.bounds.optimal.next_read_indices`), or
    ``n`` when none is."""
    n = stream.num_requests
    total = len(stream.ids)
    if not total:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(stream.ids, kind="stable")
    ids_s = stream.ids[order]
    rs = stream.req[order]
    counted = (stream.depth < limits[stream.req])[order]
    pos = np.where(counted, np.arange(total, dtype=np.int64), total)
    after = np.full(total, total, dtype=np.int64)       # the first counted position after each
    after[:-1] = np.minimum.accumulate(pos[::-1])[::-1][1:]
    at = np.minimum(after, total - 1)
    same = (after < total) & (ids_s[at] == ids_s)
    out = np.empty(total, dtype=np.int64)
    out[order] = np.where(same, rs[at], n)
    return out
