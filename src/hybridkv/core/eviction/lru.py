"""Exact LRU as a policy object, for the pools that need one behind the policy seam.

LRU is normally the pool's own free queue (:class:`~hybridkv.core.pool.BlockPool`, no policy
object, vLLM 0.33's order at zero cost). A manager that takes hints runs every policy behind
the hint layer (:mod:`hybridkv.core.eviction.hint_layer`), so ``lru`` there is this class: one
ordered dict of the held blocks in free order, victims from its front. It evicts exactly the
blocks the pool's queue would (a differential test drives both with the same operations), so a
hinted manager whose requests carry no hints behaves as the plain one. It is not in the
registry: the name ``lru`` means the pool's own queue everywhere else.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Sequence

from hybridkv.core.eviction.base import EvictionPolicy


class LRUPolicy(EvictionPolicy):
    """Least recently freed first; a batch freed together leaves in the order it was freed."""

    name = "lru"
    __slots__ = ("order",)

    def __init__(self) -> None:
        super().__init__()
        self.order: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, b: int) -> bool:
        return b in self.order

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def on_free(self, blocks: Sequence[int]) -> None:
        order = self.order
        for b in blocks:
            order[b] = None

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            del self.order[b]

    def pop(self, n: int) -> list[int]:
        popitem = self.order.popitem
        return [popitem(last=False)[0] for _ in range(n)]

    def forget(self, blocks: Sequence[int]) -> None:
        """Nothing is kept per block beyond its place in the order."""
