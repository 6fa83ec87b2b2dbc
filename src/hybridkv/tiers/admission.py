"""Which blocks a tier admits: a frequency (seen-N-times) filter in front of the writes.

A write policy decides *when* a block would be written to the tiers (write-through: when the
GPU caches it; on evict: when the GPU evicts it). :class:`FrequencyAdmission` lets the write
happen only at the block's ``n``-th such *sighting*: a block the GPU computed (or evicted) once
and never needed again is never written, a block the GPU had to compute again after losing it
is (KVBM's frequency admission request, ai-dynamo/dynamo#10062; the door-keeper of TinyLFU).
``n = 1`` admits every block (no filter).

The counts are bounded: at most ``max_tracked`` blocks are counted, the least recently seen
forgotten first (a forgotten block starts again at zero).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["FrequencyAdmission"]


class FrequencyAdmission:
    """Admit a block at its ``n``-th sighting (module docstring).

    Args:
        n: sightings before a block is admitted (>= 1; 1: every block).
        max_tracked: blocks whose count is kept (>= 1).

    Raises:
        ValueError: ``n`` or ``max_tracked`` not an integer >= 1.
    """

    __slots__ = ("n", "max_tracked", "counts", "refused")

    def __init__(self, n: int = 1, max_tracked: int = 1 << 20) -> None:
        for name, v in (("n", n), ("max_tracked", max_tracked)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"FrequencyAdmission {name} must be an integer >= 1, got {v!r}")
        self.n = n
        self.max_tracked = max_tracked
        self.counts: OrderedDict[Hashable, int] = OrderedDict()
        self.refused = 0

    def see(self, key: Hashable) -> bool:
        """Count one sighting of ``key``; whether it is admitted now (count >= ``n``)."""
        if self.n == 1:
            return True
        counts = self.counts
        c = counts.pop(key, 0) + 1
        counts[key] = c
        if len(counts) > self.max_tracked:
            counts.popitem(last=False)
        if c >= self.n:
            return True
        self.refused += 1
        return False
