"""Sliding-window attention: a query at q reads ``(q - W, q]``, so a hit at e needs the
``need = cdiv(W - 1, bs)`` blocks before e."""

from __future__ import annotations

from typing import Any, ClassVar, cast

from hybridkv.core.rules.base import RULES, HitRule
from hybridkv.core.specs import AttentionSpec, SlidingWindow


@RULES.register(SlidingWindow)
class SlidingRule(HitRule):
    """Window ``W`` = ``spec.window_tokens``."""

    kind: ClassVar[str] = "sliding"
    cost_kind: ClassVar[str] = "sliding"
    wire_kind: ClassVar[str] = "sliding_window"
    __slots__ = ("_window", "need")

    def __init__(self, spec: AttentionSpec, proof: bool = False) -> None:
        super().__init__(spec, proof)
        self._window = cast(int, spec.window_tokens)          # a SlidingWindow's: set
        self.need = -(-(self._window - 1) // self.block_size)

    @property
    def window(self) -> int:
        return self._window

    def lo(self, e: int) -> int:
        return e - self.need if e > self.need else 0

    def skipped_tokens(self, num_computed: int, hold: int = 0) -> int:
        skipped = num_computed - self._window + 1 - hold
        return skipped if skipped > 0 else 0

    def next_skip_growth(self, num_computed: int, hold: int = 0) -> float:
        bs = self.block_size
        skipped = num_computed - self._window + 1 - hold      # skipped_tokens, inlined
        if skipped < 0:
            skipped = 0
        return (skipped // bs + 1) * bs + self._window - 1 + hold

    def max_blocks(self, length: int, hold: int = 0) -> int:
        return min(-(-length // self.block_size), -(-(self._window + hold) // self.block_size) + 2)

    def admission_cap(self, max_in_flight_tokens: int | None, max_len: float) -> int | None:
        # vLLM: the last W - 1 tokens plus the in-flight tokens, plus one block (a chunk
        # boundary need not be block-aligned)
        reach = self._window - 1 + max_in_flight_tokens if max_in_flight_tokens is not None \
            else max_len
        reach = min(reach, max_len)
        if reach == float("inf"):
            return None
        return -(-int(reach) // self.block_size) + 1

    def first_key(self, q: Any) -> Any:
        return q - self._window + 1

    def key_pairs(self, x: Any) -> Any:
        # Σ_{q<x} min(q + 1, W): written without min() so arrays work elementwise
        w = self._window
        m = x - (x - w) * (x > w)
        return m * (m + 1) // 2 + (x - m) * w
