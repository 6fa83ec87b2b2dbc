"""Hit density by conversation turn and age: :class:`~hybridkv.core.eviction.eva.EVAPolicy`'s
learned value-by-age curves, with the chain classes a prefix cache can count per *turn*.

Assumes multi-turn traffic in which (1) a conversation comes back after a think time (the
age curves of ``eva``: a just-freed block is unlikely to be read in the next few requests, a
middle-aged one likelier, an old one unlikely again) and (2) the longer a conversation has
gone on, the likelier it comes back (Mooncake conversation trace: after turn 1 / 2 / 3 / 4 /
5+ it returns with probability 0.31 / 0.42 / 0.51 / 0.59 / 0.71, ``eviction_bounds.py``).

Class of a batch (a request's chain, freed together): ``min(4, r)``, where ``r`` is the
largest reuse count (hits, and recomputations of remembered ghosts) below ``SHARED_REUSES``
among the batch's blocks. A prompt grows by one turn each time its conversation comes back
and every turn re-reads the whole earlier prompt, so along a chain the reuse counts fall by
one per turn: content shared by many requests (a system prompt) is reused ``SHARED_REUSES``
times or more and ignored, a conversation's first private block has been reused once per
earlier turn, so ``r`` is the number of earlier turns (capped at ``SHARED_REUSES - 1``).
``eva`` instead classes a batch by its *deepest* reused block, which is 1 for every returning
conversation (its previous turn's tail was read once), so it cannot tell turn 2 from turn 9.

Learning, ordering and cost are ``eva``'s (see :mod:`hybridkv.core.eviction.eva`): per class
and age bucket, reuse probabilities from survival counts (ghosts included), value = expected
reuses per unit of space-time, the lowest-valued (class, age) FIFO goes first, oldest first
among equals; O(1) amortized per operation. Only the classes and the horizon (``AGES``) differ.
What it gains and where it is worse than LRU: BENCHMARKS.md, "Eviction policies".
"""

from __future__ import annotations

from typing import Sequence

from hybridkv.core.eviction.base import EVICTION_POLICIES
from hybridkv.core.eviction.eva import CLASSES, MIN_EVENTS, EVAPolicy

#: Age buckets: twice ``eva``'s, so the horizon (ages and ghosts) is 16 capacities of freed
#: blocks. Mooncake conversation, fraction of the optimum at 1M / 3M tokens with 32 / 64 / 96 /
#: 128 buckets: 0.344 / 0.363 / 0.383 / 0.388 and 0.414 / 0.460 / 0.446 / 0.444.
AGES = 64
#: Reuses at or above which a block is shared content, not one conversation's history.
SHARED_REUSES = 8


@EVICTION_POLICIES.register("eva-turns")
class TurnEVAPolicy(EVAPolicy):
    """``eva`` with per-turn chain classes (see the module docstring)."""

    name = "eva-turns"
    __slots__ = ()

    def __init__(self, ages: int = AGES, width: int | None = None,
                 min_events: float = MIN_EVENTS) -> None:
        super().__init__(ages, width, min_events)

    def _batch_class(self, blocks: Sequence[int]) -> int:
        hits = self.hits
        turns = 0
        for b in blocks:
            r = hits.get(b, 0)
            if turns < r < SHARED_REUSES:
                turns = r
        return min(CLASSES - 1, turns)
