"""Recurrent state (gated delta net, Mamba2): a hit at e needs the checkpoint at exactly e.

A recurrent layer's state after t tokens depends on every token before t and is updated in
place, so it cannot be assembled from pages: a hit ending at ``t = e * a`` (``a`` = the
spec's ``block_size``, the checkpoint granularity) needs a stored copy of the state at
exactly t. Table entry ``j`` of a state group holds the checkpoint "after ``(j + 1) * a``
tokens" (or the null block where none is kept), so the run of a hit at e is the single entry
``e - 1``: ``lo(e) = e - 1``.

A running request reads its *live* state (an extent the coordinator holds outside the table,
docs/state-groups.md §2.3), never an old checkpoint, so every entry below the computed count
leaves the table (``skipped_tokens(c) = c``, minus the write path's hold): checkpoints it
wrote stay cached. The per-query cost is one state read/update per token (``key_pairs(x) =
x``), and recomputing the tokens since the previous checkpoint is ``a`` tokens
(``recompute_cost``, Marconi's FLOPs-saved numerator).
"""

from __future__ import annotations

from typing import Any, ClassVar

from hybridkv.core.rules.base import RULES, HitRule
from hybridkv.core.specs import StateSpec


@RULES.register(StateSpec)
class StateRule(HitRule):
    """The hit rule of a :class:`~hybridkv.core.specs.StateSpec` group.

    ``max_blocks`` counts *entries* (states): the live state, the checkpoints the write
    path may still hold (the hold window) and the one being written. The coordinator
    multiplies entries by the config's extent size (block ids per state).
    """

    kind: ClassVar[str] = "state"
    cost_kind: ClassVar[str] = "state"
    wire_kind: ClassVar[str] = "mamba"
    sparse: ClassVar[bool] = True   # only positions that hold a checkpoint are non-null
    __slots__ = ()

    def lo(self, e: int) -> int:
        return e - 1 if e > 0 else 0

    def skipped_tokens(self, num_computed: int, hold: int = 0) -> int:
        return max(0, num_computed - hold)

    def next_skip_growth(self, num_computed: int, hold: int = 0) -> float:
        bs = self.block_size
        return (self.skipped_tokens(num_computed, hold) // bs + 1) * bs + hold

    def max_blocks(self, length: int, hold: int = 0) -> int:
        held = min(-(-length // self.block_size), -(-hold // self.block_size) + 2)
        return 1 + held

    def admission_cap(self, max_in_flight_tokens: int | None, max_len: float) -> int | None:
        return 2

    def first_key(self, q: Any) -> Any:
        return q

    def key_pairs(self, x: Any) -> Any:
        return x
