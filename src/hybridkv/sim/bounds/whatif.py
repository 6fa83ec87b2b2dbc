"""What a run's workload would do with more cache or a pinned prefix, from its block keys.

Computed beside the offline optimum (:class:`~hybridkv.sim.bounds.optimum_job.OptimumJob` runs
:data:`WHAT_IF` on the same served requests' chained key-block hashes, in the same process or
forked child): block-level passes only, no second simulation, all but the last count made
while the simulation runs:

* the block-level LRU model (:func:`~hybridkv.sim.bounds.optimal.lru_block_hit_rate`, one request at a
  time, no timing; :meth:`~hybridkv.sim.bounds.bound_inputs.BoundInputs.lru`) at the pool's capacity and at twice it, and the Belady optimum at twice it.
  The LRU model's change from 1x to 2x estimates what doubling the cache gives the online run
  (the engine differs from the model by timing and per-group retention, which a larger cache
  does not change much); it is an estimate, and is labelled so where it is printed;
* the workload's most shared prompt prefix (:func:`shared_prefix`) and how many of the
  requests that start with it did not hit all of it online (the one count that needs the
  online run): what ``--prefix-retention`` could save.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from hybridkv.sim.bounds.bound_inputs import BoundInputs
from hybridkv.sim.bounds.optimal import OnlineHits
from hybridkv.sim.bounds.optimum_job import Extra, timed

__all__ = ["WHAT_IF", "WhatIf", "shared_prefix"]

MIN_SHARE = 0.1
"""A prefix counts as shared when at least this share of the requests (and two) start with it."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Block-level answers for one served workload (counts in key blocks).

    Attributes:
        capacity_blocks: the pool's capacity in key blocks (the optimum's).
        lru_blocks: prompt blocks the block-level LRU model hits at that capacity.
        lru_blocks_2x: the same at twice the capacity.
        optimum_blocks_2x: the Belady optimum at twice the capacity.
        prefix_blocks: length of the most shared prompt prefix (0: none is shared).
        prefix_requests: requests that start with it.
        prefix_missed: of those, the ones admitted after the first had finished whose
            full-attention groups no longer held the whole prefix (what pinning it saves).
    """

    capacity_blocks: int
    lru_blocks: int
    lru_blocks_2x: int
    optimum_blocks_2x: int
    prefix_blocks: int = 0
    prefix_requests: int = 0
    prefix_missed: int = 0


def shared_prefix(keys: Sequence[Sequence[bytes]], limits: Sequence[int]) -> tuple[int, list[int]]:
    """The most shared prompt prefix: ``(length in blocks, the requests that start with it)``.

    Requests are grouped by their first prompt block; in the largest group (at least
    :data:`MIN_SHARE` of the requests, and two) the prefix grows one block at a time while at
    least half of the group still agrees on the next block. ``(0, [])`` when nothing is shared.
    """
    firsts = Counter(ks[0] for ks, lim in zip(keys, limits) if lim > 0)
    if not firsts:
        return 0, []
    first, count = firsts.most_common(1)[0]
    if count < max(2, MIN_SHARE * len(keys)):
        return 0, []
    members = [r for r, (ks, lim) in enumerate(zip(keys, limits)) if lim > 0 and ks[0] == first]
    floor = len(members) / 2
    length = 1
    while True:
        nxt = Counter(keys[r][length] for r in members if limits[r] > length)
        if not nxt:
            break
        key, agree = nxt.most_common(1)[0]
        if agree < floor:
            break
        members = [r for r in members if limits[r] > length and keys[r][length] == key]
        length += 1
    return length, members


def _before(inputs: BoundInputs, capacity: int, seconds: dict) -> tuple:
    """Everything of the :class:`WhatIf` at ``capacity`` key blocks that needs no online run."""
    lru = timed(seconds, "lru", lambda: inputs.lru(capacity))
    lru2 = timed(seconds, "lru_2x", lambda: inputs.lru(2 * capacity))
    opt2 = timed(seconds, "optimum_2x", lambda: inputs.belady(2 * capacity))
    length, members = timed(seconds, "shared_prefix",
                            lambda: shared_prefix(inputs.keys, inputs.limits))
    return capacity, lru, lru2, opt2, length, members


def _after(before: tuple, online: OnlineHits) -> WhatIf:
    """The :class:`WhatIf`: ``before``'s counts and the shared prefix's online misses."""
    capacity, lru, lru2, opt2, length, members = before
    missed = 0
    if members:
        first_done = online.finished_t[members[0]]
        att = online.attention_blocks or online.hit_blocks
        missed = sum(1 for r in members[1:]      # gone from the cache after it had been computed
                     if max(online.hit_blocks[r], att[r]) < length and online.admitted_t[r] >= first_done)
    return WhatIf(capacity, lru, lru2, opt2, length, len(members), missed)


#: The :class:`WhatIf` of a served workload, as the optimum job's extra.
WHAT_IF = Extra(_before, _after)
