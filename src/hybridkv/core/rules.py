"""One hit rule per attention type; lookup and the write path both derive from it.

A rule answers one question: *which blocks must be cached for a hit that ends at block
boundary e* (tokens ``[0, e*bs)`` reused, the next token computed at position ``e*bs``)?
The answer is always a contiguous run ``[lo(e), hi(e))`` with lo and hi non-decreasing in e::

    full / MLA        [0, e)                      every earlier token
    sliding window    [max(0, e - need), e)       need = cdiv(W - 1, bs): the query's window
    chunked local     [chunk_start(e*bs)/bs, e)   only the current chunk

    with a boundary proof (EAGLE drop mode, draft groups): hi(e) = e + 1, i.e. the block
    after the hit must be cached too (it proves the token the drafter read at e*bs - 1).

* **Read path** (:meth:`HitRule.longest_hit`): the largest aligned e <= e_max whose run is
  cached.
* **Write path** (:meth:`HitRule.span`): the retention policy promises a set of hit ends; a
  request caches exactly the union of their runs. So what is written is what can be read.
"""

from __future__ import annotations

import math

from typing import Callable

from hybridkv.core.specs import RULE_CHUNKED, RULE_FULL, RULE_SLIDING, AttentionSpec


class HitRule:
    """The hit rule of one group (or of identical sibling groups looked up together).

    Args:
        spec: the attention spec (its ``rule`` and block size).
        proof: True for draft groups in EAGLE drop mode (the block after a hit is required).
    """

    __slots__ = ("kind", "block_size", "need", "window", "chunk_blocks", "proof")

    def __init__(self, spec: AttentionSpec, proof: bool = False) -> None:
        self.kind = spec.rule
        self.block_size = spec.block_size
        self.proof = int(proof)
        self.need = 0
        self.window = 0
        self.chunk_blocks = 0
        if self.kind == RULE_SLIDING:
            self.window = spec.window_tokens
            self.need = -(-(self.window - 1) // spec.block_size)
        elif self.kind == RULE_CHUNKED:
            self.chunk_blocks = spec.chunk_size // spec.block_size  # type: ignore[attr-defined]
        elif self.kind != RULE_FULL:
            raise ValueError(f"unknown hit rule {self.kind!r}")

    def lo(self, e: int) -> int:
        """First block a hit ending at block boundary e needs."""
        if self.kind == RULE_FULL:
            return 0
        if self.kind == RULE_SLIDING:
            return e - self.need if e > self.need else 0
        return e // self.chunk_blocks * self.chunk_blocks

    def span(self, e: int) -> tuple[int, int]:
        """The blocks ``[lo, hi)`` a hit ending at block boundary e needs cached."""
        return self.lo(e), e + self.proof

    def skipped_tokens(self, num_computed: int, hold: int = 0) -> int:
        """Leading tokens that no query at or after position ``num_computed`` reads.

        ``hold`` keeps that many more tokens: the write path caches an end's run only once
        every group's run for it is complete, which a proof block delays (one block).
        """
        if self.kind == RULE_SLIDING:
            return max(0, num_computed - self.window + 1 - hold)
        if self.kind == RULE_CHUNKED:
            c = self.chunk_blocks * self.block_size
            return max(0, num_computed - hold) // c * c
        return 0

    def next_skip_growth(self, num_computed: int, hold: int = 0) -> float:
        """The smallest ``c > num_computed`` whose ``skipped_tokens(c) // block_size`` is larger
        (``inf`` for full attention): below it, no block leaves the window."""
        bs = self.block_size
        target = (self.skipped_tokens(num_computed, hold) // bs + 1) * bs
        if self.kind == RULE_SLIDING:
            return target + self.window - 1 + hold
        if self.kind == RULE_CHUNKED:
            c = self.chunk_blocks * bs
            return -(-target // c) * c + hold
        return math.inf

    def longest_hit(self, probe: Callable[[int], object], e_max: int, step: int) -> int:
        """The largest e <= e_max, e a multiple of ``step``, whose run is cached (0 if none).

        ``probe(i)`` returns a truthy value iff block i is cached; e_max must already respect
        the blocks that exist (``hi(e_max) <= number of hashed blocks``). Each block is probed
        at most once.
        """
        proof = self.proof
        e = e_max // step * step
        if e <= 0:
            return 0
        if self.kind == RULE_FULL:
            # [0, e + proof) cached: scan left to right to the first miss.
            j = 0
            limit = e + proof
            while j < limit and probe(j):
                j += 1
            e = (j - proof) // step * step
            return e if e > 0 else 0
        while e > 0:
            lo = self.lo(e)
            j = e + proof - 1
            while j >= lo and probe(j):
                j -= 1
            if j < lo:
                return e
            # block j misses: every candidate whose run contains j fails; runs only move
            # left as e shrinks, so the next candidate must end (with its proof) at or below j.
            e = (j - proof) // step * step
        return 0
