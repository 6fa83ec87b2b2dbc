"""Chunked local attention (Llama 4): a query reads only its own chunk of ``C`` tokens, so a
hit at e needs the blocks from the start of e's chunk."""

from __future__ import annotations

from typing import Any, ClassVar, cast

from hybridkv.core.rules.base import RULES, HitRule
from hybridkv.core.specs import AttentionSpec, ChunkedLocal


@RULES.register(ChunkedLocal)
class ChunkedRule(HitRule):
    """Chunk ``C`` = ``spec.chunk_size`` (a multiple of the block size)."""

    kind: ClassVar[str] = "chunked"
    cost_kind: ClassVar[str] = "chunked"
    wire_kind: ClassVar[str] = "chunked_local_attention"
    __slots__ = ("_chunk", "chunk_blocks")

    def __init__(self, spec: AttentionSpec, proof: bool = False) -> None:
        super().__init__(spec, proof)
        self._chunk = cast(ChunkedLocal, spec).chunk_size     # (registered for ChunkedLocal)
        self.chunk_blocks = self._chunk // self.block_size

    @property
    def chunk(self) -> int:
        return self._chunk

    def admission_cap(self, max_in_flight_tokens: int | None, max_len: float) -> int | None:
        # vLLM: one chunk plus the in-flight tokens
        reach = self._chunk + max_in_flight_tokens if max_in_flight_tokens is not None \
            else max_len
        reach = min(reach, max_len)
        if reach == float("inf"):
            return None
        return -(-int(reach) // self.block_size)

    def lo(self, e: int) -> int:
        return e // self.chunk_blocks * self.chunk_blocks

    def skipped_tokens(self, num_computed: int, hold: int = 0) -> int:
        c = self._chunk
        return max(0, num_computed - hold) // c * c

    def next_skip_growth(self, num_computed: int, hold: int = 0) -> float:
        bs = self.block_size
        c = self._chunk
        target = (self.skipped_tokens(num_computed, hold) // bs + 1) * bs
        return -(-target // c) * c + hold

    def max_blocks(self, length: int, hold: int = 0) -> int:
        return min(-(-length // self.block_size), -(-(self._chunk + hold) // self.block_size) + 2)

    def first_key(self, q: Any) -> Any:
        return q // self._chunk * self._chunk

    def key_pairs(self, x: Any) -> Any:
        # Σ_{q<x} (q mod C + 1)
        c = self._chunk
        n = x // c
        r = x - n * c
        return n * (c * (c + 1) // 2) + r * (r + 1) // 2
