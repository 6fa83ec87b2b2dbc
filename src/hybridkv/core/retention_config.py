"""Per-request cache retention: a priority (and an optional time to live) per token range.

Modelled on TensorRT-LLM's ``KvCacheRetentionConfig`` (token ranges with a priority on a 0..100
scale, default 35, and an optional duration after which the priority lapses; one more
priority/duration pair for generated tokens; see
https://nvidia.github.io/TensorRT-LLM/latest/examples/kvcacheretentionconfig.html). Only the
``priority`` eviction policy (:mod:`hybridkv.core.eviction.priority`) reads it; the manager
refuses a config under any other policy.

Rules (one source of truth: :func:`block_marks` and the priority policy):

* A token's priority is the priority of the range that covers it; uncovered prompt tokens have
  :data:`DEFAULT_PRIORITY`; generated tokens (past the prompt) ``decode_priority``.
* **A block is kept at least as long as any later block of the same request** (a later block of
  a full-attention chain is useless without it): when a request releases block ``j`` of a
  group, the block receives a *mark* ``(priority, expiry)`` for every range, uncovered prompt
  stretch and decode stretch that ends after the block's first token. So a prefix's priority is
  never below its tail's, and the pool's "tail before prefix" order holds. (For a
  sliding-window group this keeps some blocks a later hit would not need: conservative.)
* The expiry is the release time plus ``ttl_s`` (``inf`` without one): the TTL restarts each
  time a request with the config releases the block, so a pinned system prompt stays pinned
  while it is used and ``ttl_s`` after its last use.
* **A block's priority is the highest live mark it received since it got its content** (marks
  from every request that released it; a mark is live until its expiry), or
  :data:`DEFAULT_PRIORITY` when none is live. Requests without a config record no mark (they
  leave a block's marks as they are). Lower priority is evicted first; equal priorities in LRU
  order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

MIN_PRIORITY = 0
MAX_PRIORITY = 100
#: The priority of tokens no range covers (TensorRT-LLM's default).
DEFAULT_PRIORITY = 35


def _check_priority(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{what} must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}] "
                         f"(default {DEFAULT_PRIORITY}), got {value!r}")


def _check_ttl(value: object, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{what} must be None (no expiry) or a finite number of seconds > 0, "
                         f"got {value!r}")


@dataclass(frozen=True, slots=True)
class TokenRange:
    """Tokens ``[start, end)`` of the prompt get ``priority`` for ``ttl_s`` seconds after each
    release (None: no expiry), then fall back to the default.

    ``end=None`` means the end of the prompt. Raises ValueError for a negative start, an empty
    or reversed range, a priority outside 0..100 or a TTL <= 0."""

    start: int
    end: int | None
    priority: int
    ttl_s: float | None = None

    def __post_init__(self) -> None:
        s, e = self.start, self.end
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"TokenRange start must be a non-negative integer, got {s!r}")
        if e is not None and (isinstance(e, bool) or not isinstance(e, int) or e <= s):
            raise ValueError(f"TokenRange end must be None (end of the prompt) or an integer > "
                             f"start ({s}), got {e!r}")
        _check_priority(self.priority, "TokenRange priority")
        _check_ttl(self.ttl_s, "TokenRange ttl_s")


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """How long a request's blocks should stay cached after it releases them.

    Args:
        ranges: prompt token ranges with their priority and TTL (they must not overlap).
        decode_priority: priority of blocks holding generated tokens.
        decode_ttl_s: TTL of ``decode_priority`` (None: no expiry).
    """

    ranges: tuple[TokenRange, ...] = ()
    decode_priority: int = DEFAULT_PRIORITY
    decode_ttl_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ranges, tuple):
            if not isinstance(self.ranges, list):
                raise ValueError(f"RetentionConfig ranges must be a sequence of TokenRange, got {self.ranges!r}")
            object.__setattr__(self, "ranges", tuple(self.ranges))
        bad = [r for r in self.ranges if not isinstance(r, TokenRange)]
        if bad:
            raise ValueError(f"RetentionConfig ranges must hold TokenRange, got {bad[0]!r}")
        ordered = sorted(self.ranges, key=lambda r: r.start)
        for a, b in zip(ordered, ordered[1:]):
            if a.end is None or a.end > b.start:
                raise ValueError(f"RetentionConfig ranges must not overlap: {a} and {b}")
        _check_priority(self.decode_priority, "RetentionConfig decode_priority")
        _check_ttl(self.decode_ttl_s, "RetentionConfig decode_ttl_s")

    def check_prompt(self, num_prompt_tokens: int, what: str) -> None:
        """ValueError if a range ends past the prompt's ``num_prompt_tokens`` tokens."""
        for r in self.ranges:
            if r.start >= num_prompt_tokens or (r.end is not None and r.end > num_prompt_tokens):
                raise ValueError(f"{what}: retention range [{r.start}, {r.end}) lies outside the "
                                 f"prompt [0, {num_prompt_tokens}); valid ranges: 0 <= start < end "
                                 f"<= {num_prompt_tokens}")


class RetentionMark(NamedTuple):
    """Blocks at positions ``< num_blocks`` of one group get ``priority`` until ``ttl_s`` after
    the release (None: no expiry)."""

    num_blocks: int
    priority: int
    ttl_s: float | None


def block_marks(config: RetentionConfig, block_size: int, num_prompt_tokens: int,
                num_tokens: int) -> tuple[RetentionMark, ...]:
    """The marks a request with ``config`` gives its blocks (of ``block_size`` tokens) when it
    releases them, ``num_tokens`` tokens long of which ``num_prompt_tokens`` are the prompt.

    One mark per range, one for the uncovered prompt tokens (default priority, up to the last
    uncovered token) and one for the generated tokens; a block at position ``j`` receives the
    marks with ``j < num_blocks`` (see the module docstring). Marks with the same priority and
    TTL are merged (the longest wins)."""
    p = num_prompt_tokens
    best: dict[tuple[int, float | None], int] = {}

    def add(end_token: int, priority: int, ttl: float | None) -> None:
        k = -(-end_token // block_size)
        key = (priority, ttl)
        if k > best.get(key, 0):
            best[key] = k

    covered_to = 0                      # uncovered prompt tokens: the last one decides the reach
    last_gap_end = 0
    for r in sorted(config.ranges, key=lambda r: r.start):
        end = p if r.end is None else min(r.end, p)
        if r.start > covered_to:
            last_gap_end = min(r.start, p)
        covered_to = max(covered_to, end)
        if r.start < p:
            add(end, r.priority, r.ttl_s)
    if covered_to < p:
        last_gap_end = p
    if last_gap_end:
        add(last_gap_end, DEFAULT_PRIORITY, None)
    if num_tokens > p:
        add(num_tokens, config.decode_priority, config.decode_ttl_s)
    return tuple(RetentionMark(k, pr, ttl) for (pr, ttl), k in best.items())
