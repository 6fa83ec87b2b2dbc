"""``tier-aware``: the kv-aware score over what every instance holds, GPU and tiers below it.

An instance with KV tiers (``simulate --instances N --cpu-cache-tokens M``) serves a prefix
from its GPU *or* its tiers (a block past the GPU's hit is loaded), but its KV events speak of
the GPU pool only: a router that reads them alone under-counts what the instance can serve
(llm-d-router#1650). This router reads both: per instance the longest run of leading blocks
each of which the instance's GPU (the event index) or its tiers (``RouterSetup.tier_holds``)
holds, then scores exactly as ``kv-aware`` does (a loaded block counts as a hit: its copy
overlaps compute layer by layer), within the same load-skew bound. Without tiers it is
``kv-aware``.
"""

from __future__ import annotations

from typing import Sequence

from hybridkv.events.index import KVEventIndex
from hybridkv.sim.cluster.routing.base import ROUTERS, RouterSetup
from hybridkv.sim.cluster.routing.kv_aware import KVAwareRouter


@ROUTERS.register("tier-aware")
class TierAwareRouter(KVAwareRouter):
    """:class:`KVAwareRouter` whose held prefix counts the instances' tiers too (module
    docstring). ``tier_holds(instance, group, hash)`` says what a tier holds; None: no tiers."""

    def __init__(self, setup: RouterSetup) -> None:
        index = setup.index if setup.index is not None else KVEventIndex()
        super().__init__(index, setup.block_size, setup.group, setup.overlap_weight, setup.max_skew)
        self.num_instances = setup.num_instances
        self.tier_holds = setup.tier_holds

    @classmethod
    def from_setup(cls, setup: RouterSetup) -> TierAwareRouter:
        return cls(setup)

    def matched_blocks(self, hashes: Sequence[bytes]) -> dict:
        gpu = self.index.prefix_match(hashes, self.group)
        holds = self.tier_holds
        if holds is None:
            return gpu
        index, g = self.index, self.group
        out = {}
        for i in range(self.num_instances):
            j = gpu.get(i, 0)
            while j < len(hashes) and (holds(i, g, hashes[j]) or i in index.holders(g, hashes[j])):
                j += 1
            if j:
                out[i] = j
        return out
