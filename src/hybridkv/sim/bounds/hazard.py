"""A non-anticipative reference: the hazard-rate bound, adapted to prefix caching.

Belady's optimum knows the future; no online policy can. Panigrahy, Nain, Neglia and Towsley
("A New Upper Bound on Cache Hit Probability for Non-anticipative Caching Policies", IFIP
Performance 2021; ACM TOMPECS 2022, doi:10.1145/3547332) bound every policy that does *not*
know the future: at each request, keep the objects with the highest *hazard rate* (the
probability that an object is requested next, given what has been observed of it) per unit of
size, up to the capacity, and count a hit when the requested object is among them. Because the
set is chosen afresh at every request (objects come back into the cache for free), it is at
least as good as any policy that must admit and evict; when the objects' request processes are
conditionally independent given the observed history and the hazard functions are the true
ones, it maximises the expected hits of every non-anticipative policy. Their simulations find
it tighter than Belady for renewal, Markov-modulated and shot-noise traffic.

**Adapted here.** Objects are cached blocks (one unit each). What a pool can observe of a block
is its *age* (requests since it was last used) and a *class*, the one ``eva-turns`` counts: the
turn class of the request that last used it (the largest reuse count below
:data:`~hybridkv.core.eviction.turns.SHARED_REUSES` among that request's blocks, capped at 4,
i.e. the conversation's turn) or *shared* for a block used that often. The hazard ``h[class,
age bucket]`` is fitted on the whole workload (events over exposure, per class and geometric
age bucket): the curves an online learner could at best converge to, in-sample. Then, before
each request, the blocks seen so far are ranked by ``h`` and the top ``capacity`` are "cached"
(within the marginal (class, bucket) cell a block is cached with the cell's fill fraction), and
the request is credited with its first ``limit`` blocks that are cached (a hit on block ``i``
needs blocks ``0..i``: the *relaxed* count credits cached blocks past a missing one too, which
keeps it an upper bound on the leading-hit count of the same cache; the *leading* count stops at
the first miss, in expectation over the marginal cell).

**What it is and is not.** It bounds policies that rank blocks by (class, age) and know the
true curves, under the independence assumption; it is not a bound on policies that use other
information (a prompt's length, the chain's shape, hints), nor is it below Belady in general (it
re-admits blocks for free). On the Mooncake conversation trace, returns of one conversation
are a property of the conversation, not of each block, and a policy sees more than (class,
age): the numbers it gives are a reference for what ranking by age and turn can reach, beside
Belady (the future known) and the unlimited cache (reuse alone).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

#: Turn classes 0..4 (capped) and the shared class.
TURN_CLASSES = 5
SHARED_CLASS = TURN_CLASSES
#: A block used by this many requests or more is shared content (eva-turns' threshold).
SHARED_USES = 8
#: Age buckets per doubling of the age (geometric edges from age 1).
BUCKETS_PER_DOUBLING = 3


@dataclass(frozen=True, slots=True)
class HazardBound:
    """The hazard-rate reference of one workload at one capacity (block counts).

    ``relaxed_hits`` is the bound (cached requested blocks, fractional at the marginal cell);
    ``leading_hits`` the same cache's expected leading hits (a hit needs its whole prefix)."""

    capacity_blocks: int
    relaxed_hits: float
    leading_hits: float
    block_refs: int

    @property
    def hit_rate(self) -> float:
        return self.relaxed_hits / self.block_refs if self.block_refs else 0.0

    @property
    def leading_hit_rate(self) -> float:
        return self.leading_hits / self.block_refs if self.block_refs else 0.0


def age_edges(num_requests: int) -> np.ndarray:
    """Lower edges of the age buckets (ages start at 1), geometric, covering ``num_requests``."""
    edges = [1]
    while edges[-1] <= num_requests:
        nxt = int(math.floor(edges[-1] * 2 ** (1 / BUCKETS_PER_DOUBLING)))
        edges.append(max(edges[-1] + 1, nxt))
    return np.array(edges, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class HazardUses:
    """Per request, per block of its chain: the class and request of the block's previous use
    (-1: first use), and the class the request gives its blocks now."""

    prev_t: list[list[int]]
    prev_c: list[list[int]]
    new_c: list[list[int]]


def hazard_uses(keys: Sequence[Sequence[Hashable]]) -> HazardUses:
    """One pass over the workload: each block's previous use and the classes (observable:
    counts of earlier uses only)."""
    last: dict[Hashable, tuple[int, int]] = {}        # block -> (request, class) of its last use
    count: dict[Hashable, int] = {}                   # block -> requests that used it so far
    prev_t, prev_c, new_c = [], [], []
    for t, ks in enumerate(keys):
        turn = 0
        pt, pc = [], []
        for k in ks:
            u = count.get(k, 0)
            if turn < u < SHARED_USES:
                turn = u
            lt = last.get(k)
            pt.append(-1 if lt is None else lt[0])
            pc.append(-1 if lt is None else lt[1])
        c_req = min(TURN_CLASSES - 1, turn)
        nc = []
        for k in ks:
            u = count.get(k, 0) + 1
            count[k] = u
            c = SHARED_CLASS if u >= SHARED_USES else c_req
            last[k] = (t, c)
            nc.append(c)
        prev_t.append(pt)
        prev_c.append(pc)
        new_c.append(nc)
    return HazardUses(prev_t, prev_c, new_c)


def hazard_table(keys: Sequence[Sequence[Hashable]], limits: Sequence[int],
                 uses: HazardUses | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(h, edges)``: ``h[class, bucket]`` = requests of a block of that class at an age in
    that bucket, over block-requests exposed there (the workload's own, in-sample). A use past
    a request's hit limit ends the episode without an event (it is not a hit opportunity)."""
    n = len(keys)
    uses = uses or hazard_uses(keys)
    edges = age_edges(n)
    nb = len(edges)
    events = np.zeros((TURN_CLASSES + 1, nb))
    durations: list[list[int]] = [[] for _ in range(TURN_CLASSES + 1)]
    bucket = (np.searchsorted(edges, np.arange(n + 1), side="right") - 1).tolist()
    for t, ks in enumerate(keys):
        lim = limits[t]
        for j, (p, c) in enumerate(zip(uses.prev_t[t], uses.prev_c[t])):
            if p >= 0:
                d = t - p
                durations[c].append(d)
                if j < lim:
                    events[c, bucket[d]] += 1
    # open episodes run to the end of the workload (censored)
    last: dict[Hashable, tuple[int, int]] = {}
    for t, ks in enumerate(keys):
        for k, c in zip(ks, uses.new_c[t]):
            last[k] = (t, c)
    for t, c in last.values():
        if n - 1 - t > 0:
            durations[c].append(-(n - 1 - t))         # negative: exposure only, no event there
    exposure = np.zeros((TURN_CLASSES + 1, nb))
    hi = np.append(edges[1:], np.iinfo(np.int64).max)
    for c, ds in enumerate(durations):
        if not ds:
            continue
        d = np.abs(np.array(ds, dtype=np.int64))[:, None]       # ages 1..d exposed
        exposure[c] = np.clip(np.minimum(hi[None, :] - 1, d) - edges[None, :] + 1, 0, None).sum(axis=0)
    h = np.divide(events, exposure, out=np.zeros_like(events), where=exposure > 0)
    return h, edges



def age_cells(cells: np.ndarray, cnt: np.ndarray, t: int, lo: np.ndarray) -> None:
    """Age every counted block by one request, in place: the blocks first seen at request
    ``t - 1`` enter bucket 0 and those whose age reaches a bucket's lower edge ``lo`` move up one
    bucket (``cells``: blocks by (class, bucket); ``cnt``: blocks by (class, request first
    seen)). Shared by the per-key reference and the key-stream version."""
    cells[:, 0] += cnt[:, t - 1]
    src = t - lo
    ok = src >= 0
    if ok.any():
        moved = np.zeros((cells.shape[0], cells.shape[1] - 1), dtype=np.int64)
        moved[:, ok] = cnt[:, src[ok]]
        cells[:, :-1] -= moved
        cells[:, 1:] += moved

def hazard_bound(keys: Sequence[Sequence[Hashable]], limits: Sequence[int], capacity_blocks: int,
                 table: tuple[np.ndarray, np.ndarray] | None = None,
                 uses: HazardUses | None = None) -> HazardBound:
    """The hazard-rate reference of ``keys`` (per request, its chained block keys, all inserted
    after it) at ``capacity_blocks`` (see the module docstring). ``limits``: per request, the
    leading blocks a hit may count. ``table`` / ``uses``: the capacity-free parts, when the
    caller already has them (a sweep)."""
    n = len(keys)
    uses = uses or hazard_uses(keys)
    h, edges = table if table is not None else hazard_table(keys, limits, uses)
    ncls, nb = h.shape
    order = np.argsort(-h, axis=None, kind="stable")              # cells, best first
    rank = np.empty(ncls * nb, dtype=np.int64)
    rank[order] = np.arange(ncls * nb)
    live = h.reshape(-1)[order] > 0
    cnt = np.zeros((ncls, n + 1), dtype=np.int64)                 # blocks by (class, last use)
    cells = np.zeros((ncls, nb), dtype=np.int64)                  # blocks by (class, bucket)
    lo = edges[1:]
    refs = 0
    relaxed = leading = 0.0
    bucket = (np.searchsorted(edges, np.arange(n + 1), side="right") - 1).tolist()
    rank_l = rank.tolist()
    for t, ks in enumerate(keys):
        if t:                                                     # every block ages by one
            age_cells(cells, cnt, t, lo)
        lim = min(limits[t], len(ks))
        refs += lim
        if lim:
            flat = cells.reshape(-1)[order]
            cum = np.cumsum(flat)
            m = int(np.searchsorted(cum, capacity_blocks, side="right"))   # first cell not whole
            frac = 0.0
            if m < len(flat) and live[m] and flat[m]:
                frac = (capacity_blocks - (cum[m - 1] if m else 0)) / flat[m]
            run = 1.0
            for j in range(lim):
                p = uses.prev_t[t][j]
                if p < 0:
                    run = 0.0
                    continue
                r = rank_l[uses.prev_c[t][j] * nb + bucket[t - p]]
                q = 1.0 if r < m and live[r] else frac if r == m else 0.0
                relaxed += q
                run *= q
                leading += run
        for k, p, pc, c in zip(ks, uses.prev_t[t], uses.prev_c[t], uses.new_c[t]):
            if p >= 0:
                cnt[pc, p] -= 1
                cells[pc, bucket[t - p]] -= 1
            cnt[c, t] += 1
    return HazardBound(capacity_blocks, relaxed, leading, refs)


__all__ = ["HazardBound", "HazardUses", "age_cells", "age_edges", "hazard_bound", "hazard_table", "hazard_uses"]
