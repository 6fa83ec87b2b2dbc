"""A pytest plugin that registers a throwaway eviction policy, router and attention type the
way docs/extending.md says (one class, one registration each) before the suite's registry
tests run: ``tests/test_extending.py`` runs them with ``-p tests.support.throwaways`` to show
that adding each needs no edit to an existing test."""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.core.eviction.base import EVICTION_POLICIES, EvictionPolicy
from hybridkv.core.rules import RULES, HitRule
from hybridkv.core.specs import AttentionSpec
from hybridkv.sim.cluster.routing import ROUTERS, RouteDecision, Router


@EVICTION_POLICIES.register("throwaway-fifo")
class ThrowawayFIFO(EvictionPolicy):
    """First freed first (a request frees its tail first, so its tail goes first)."""

    name = "throwaway-fifo"
    __slots__ = ("held",)

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[int, None] = {}

    def __len__(self): return len(self.held)
    def __contains__(self, b): return b in self.held
    def __iter__(self): return iter(self.held)
    def on_free(self, blocks): self.held.update(dict.fromkeys(blocks))

    def on_hit(self, b, held):
        if held:
            del self.held[b]

    def pop(self, n):
        out = []
        for b in self.held:
            if len(out) == n:
                break
            out.append(b)
        for b in out:
            del self.held[b]
        return out

    def forget(self, blocks): pass


@ROUTERS.register("throwaway-first")
class ThrowawayFirst(Router):
    """Always the first instance."""

    def route(self, hashes, prompt_len, loads):
        return RouteDecision(0, 0)


@dataclass(frozen=True, slots=True)
class ThrowawayLast(AttentionSpec):
    """Reads only the block before the query (a checkpoint-style layer)."""


@RULES.register(ThrowawayLast)
class ThrowawayLastRule(HitRule):
    kind = "throwaway-last"
    cost_kind = "sliding"
    wire_kind = "unknown"
    __slots__ = ()

    def lo(self, e): return e - 1 if e > 0 else 0
    def first_key(self, q): return q
    def key_pairs(self, x): return x
