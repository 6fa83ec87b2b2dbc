"""Which hit ends the write path promises to serve (sliding-window retention).

A retention policy turns a request into a set of *promised hit ends* (token counts, multiples
of the alignment A = LCM of block sizes). Each group then caches the union of the runs its
hit rule needs for those ends (:mod:`hybridkv.core.rules`); blocks outside every run stay
hash-less scratch and are reused first.

==============  =============================================================================
interval        promised ends
==============  =============================================================================
None (dense)    every multiple of A
0               replay boundaries only (+ the shared-prefix junction found at lookup)
N > 0           every multiple of N, plus the replay boundaries (and the junction)
==============  =============================================================================

*Replay boundaries* are the hits later requests are expected to ask for:

* the identical resend of the prompt: ``P - 1`` (the last token is always recomputed);
  in vLLM's EAGLE drop mode, vLLM's pair ``{resend - A, extension - A}``;
* (default mode) one alignment unit below each boundary, so a request that shares the prompt
  but diverges inside its last aligned block still hits (fixes vLLM #57610);
* (default mode) the request's final length when it is freed, so the next chat turn (which
  contains this turn's answer) hits all of it.

Retention applies to sliding-window and chunked-local groups. Full-attention groups cache
every aligned block as it is computed, in both modes: every prefix of a full-attention run is
itself a servable run, and the request holds those blocks anyway, so caching them early costs
no memory (and lets a request that arrives mid-decode, such as the next chat turn, hit them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybridkv.core.rules import HitRule


#: Classes of hit points by where they end against their request's prompt (:func:`hit_point_class`).
HIT_POINT_CLASSES = 4


def hit_point_class(end: int, prompt_tokens: int, alignment: int) -> int:
    """The class of a hit point ending at token ``end`` (a multiple of ``alignment``) stored
    by a request of ``prompt_tokens`` prompt tokens: 3 past the prompt's last aligned end
    ``r = floor((prompt_tokens - 1) / alignment) * alignment`` (an answer's tokens: a chat
    turn's final length), 2 at ``r`` (the prompt resent), 1 at ``r - alignment`` (a turn
    that diverges inside the prompt's last aligned block), 0 further below (a shared prefix's
    junction, an interval point)."""
    d = ((prompt_tokens - 1) // alignment * alignment - end) // alignment
    return 3 if d < 0 else 2 - d if d < 2 else 0


def validate_retention_interval(interval: int | None, alignment: int, has_local_groups: bool) -> None:
    """Raise ValueError for an interval the manager cannot honour.

    None (dense) is always valid; 0 is valid (and ignored without local groups); N > 0 needs a
    sliding-window or chunked-local group and must be a multiple of ``alignment``.
    """
    if interval is None:
        return
    if isinstance(interval, bool) or not isinstance(interval, int):
        raise ValueError(f"retention_interval must be None or an integer, got {interval!r}")
    if interval < 0:
        raise ValueError(
            f"retention_interval must be non-negative and a multiple of the scheduler block "
            f"size ({alignment}), got {interval}"
        )
    if interval > 0 and not has_local_groups:
        raise ValueError(
            f"retention_interval={interval} needs a sliding-window or chunked-local KV-cache "
            "group, and this config has none; set it to 0 or None"
        )
    if interval % alignment:
        raise ValueError(
            f"retention_interval must be non-negative and a multiple of the scheduler block "
            f"size ({alignment}, the LCM of the group block sizes), got {interval}"
        )


def replay_boundaries(num_prompt_tokens: int, alignment: int, drop_mode: bool,
                      below_boundary: bool) -> tuple[int, ...]:
    """Aligned hit ends a replay of this prompt asks for, ascending.

    Args:
        num_prompt_tokens: P.
        alignment: A, the hit alignment.
        drop_mode: vLLM's EAGLE drop semantics (its ``{resend - A, extension - A}`` pair).
        below_boundary: also promise one alignment unit below each boundary (#57610 fix).
    """
    p = num_prompt_tokens
    if drop_mode:
        resend = (p - 1) // alignment * alignment
        extension = p // alignment * alignment
        ends = {max(resend - alignment, 0), max(extension - alignment, 0)}
    else:
        ends = {(p - 1) // alignment * alignment}
    if below_boundary:
        ends |= {e - alignment for e in ends if e >= alignment}
    ends.discard(0)
    return tuple(sorted(ends))


class Retention:
    """The promised-end generator of one manager.

    Args:
        interval: None, 0 or N (validated by :func:`validate_retention_interval`).
        alignment: A.
    """

    __slots__ = ("interval", "alignment")

    def __init__(self, interval: int | None, alignment: int) -> None:
        self.interval = interval
        self.alignment = alignment

    @property
    def dense(self) -> bool:
        return self.interval is None

    def ends_between(self, after: int, upto: int, extra: tuple[int, ...]) -> list[int]:
        """Promised ends t with ``after < t <= upto``, ascending.

        ``extra`` holds the request's own boundaries (replay, junction, final length).
        """
        step = self.alignment if self.interval is None else self.interval
        ends = set(multiples_between(after, upto, step)) if step else set()
        ends.update(e for e in extra if after < e <= upto)
        return sorted(ends)

    def next_end(self, after: int, extra: tuple[int, ...]) -> float:
        """The smallest promised end t > ``after`` (``inf`` if there is none)."""
        step = self.alignment if self.interval is None else self.interval
        nxt = min((e for e in extra if e > after), default=math.inf)
        if step:
            nxt = min(nxt, (after // step + 1) * step)
        return nxt


    def next_masked_block(self, rule: HitRule, j: int, ends: tuple[int, ...]) -> float:
        """vLLM 0.33's per-block write mask (compat mode, sparse retention): the smallest
        block ``i >= j`` inside ``rule.span(e)`` for a promised end ``e`` (in the rule's
        blocks): every multiple of the interval (block count ``N // block_size``, k >= 1)
        and the request's boundary ``ends``. ``inf`` if none.

        vLLM (``SlidingWindowManager.reachable_block_mask``) applies this mask block by
        block as blocks fill, so the tail of a segment the request never completes is
        cached too; hybridkv's default mode caches an end's run only once it is complete.
        """
        return self.next_masked_run(rule, j, ends)[0]

    def next_masked_run(self, rule: HitRule, j: int, ends: tuple[int, ...]) -> tuple[float, int]:
        """``(i, stop)``: ``i`` as :meth:`next_masked_block`, and every block of ``[i, stop)``
        is masked too (the end of the span that starts at ``i``; ``stop`` 0 when ``i`` is
        ``inf``). The masked blocks from ``j`` on are those of the runs found from ``j``,
        then from each run's ``stop``."""
        proof = rule.proof
        best = math.inf
        stop = 0
        if self.interval:
            per = self.interval // rule.block_size
            k = max((j - proof) // per + 1, 1)       # smallest k >= 1 with k*per + proof > j
            e = k * per
            lo = rule.lo(e)
            best = lo if lo > j else j
            stop = e + proof
        for e in ends:
            hi = e + proof
            if hi > j:
                lo = rule.lo(e)
                i = lo if lo > j else j
                if i < best or (i == best and hi > stop):
                    best = i
                    stop = hi
        return best, stop


def multiples_between(after: int, upto: int, step: int) -> range:
    """The multiples t of ``step`` with ``after < t <= upto``."""
    return range((after // step + 1) * step, upto + 1, step)
