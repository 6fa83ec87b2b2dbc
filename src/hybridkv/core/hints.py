"""Application hints: what a request can tell the cache about its session's future.

A :class:`Hint` rides on a :class:`~hybridkv.core.request.Request` (``Request(..., hint=)``)
and says one or more of:

* **the session ends here** (``last_turn=True``, or ``continues`` = the probability that the
  session sends another request, below :data:`ENDS_BELOW`): the request's own blocks are
  evicted before every other cached block;
* **pin this prefix** for ``pin_s`` seconds (``pin_tokens`` prompt tokens, default the whole
  prompt; Anthropic-style prompt caching, SGLang's ``cache_control`` TTLs): the blocks are
  evicted after every unpinned one until the TTL runs out. A *hard* pin (the default) lasts
  ``pin_s`` from the release that pinned it; a *soft* one (``soft=True``, SGLang's
  ``retention_seconds``: "a bias, not a lock") is refreshed by every release of the block, hinted
  or not (a hit refreshes it), and is broken before hard pins when pins must go;
* **the session resumes in about** ``resume_s`` seconds (a tool call): the request's whole
  chain, prompt and output, is pinned for ``RESUME_FACTOR * resume_s + RESUME_MARGIN_S``, at
  :data:`RESUME_PRIORITY` (a predicted return: when pins do not fit, the latest goes first).

One mechanism: a hint is turned into retention marks (:func:`hint_marks`) by the same rule as a
:class:`~hybridkv.core.retention_config.RetentionConfig` (:func:`block_marks`: a range's mark
covers every earlier block of the request too), pins as priority :data:`PIN_PRIORITY` with a
TTL, an ending session as priority :data:`~hybridkv.core.retention_config.MIN_PRIORITY`. The
pool's hint layer (:mod:`hybridkv.core.eviction.hint_layer`), which every eviction policy sits
behind when a manager takes hints, reads a mark above the default priority as "pinned until
its expiry" and one below as "evict first"; the policy orders the rest.

Hints are advice, not contracts: the layer runs shadow caches that honour and ignore each kind
of hint and honours a kind only while honouring it would have hit more (see the layer). An ending session demotes only the blocks its own session released
(the *owner* rule of the layer): a prefix another session has used (a system prompt) is never
demoted by one session's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybridkv.core.retention_config import (MAX_PRIORITY, MIN_PRIORITY, RetentionConfig,
                                            RetentionMark, TokenRange, block_marks)

#: The priority a pin's marks carry (the retention scale's top).
PIN_PRIORITY = MAX_PRIORITY
#: The priority of a resume time's pin: a predicted return, broken before TTL pins when the
#: pinned blocks do not fit (latest return first).
RESUME_PRIORITY = MAX_PRIORITY - 1
#: The priority of a soft pin's marks (a retention refreshed on hit, broken before hard pins).
SOFT_PIN_PRIORITY = MAX_PRIORITY - 2
#: Pin kinds (:attr:`Hint.soft`: ``"soft"``), the spelling ``--retention`` takes.
RETENTION_KINDS = ("hard", "soft")
#: A session whose ``continues`` probability is below this is treated as ending.
ENDS_BELOW = 0.5
#: "Resumes in about S seconds" pins the chain for ``RESUME_FACTOR * S + RESUME_MARGIN_S``: the
#: estimate may be short, and a pin that lapses just before the session returns is worth nothing.
RESUME_FACTOR = 1.5
RESUME_MARGIN_S = 1.0


def _check_seconds(value: object, what: str, allow_zero: bool) -> None:
    if value is None:
        return
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{what} must be None or a finite number of seconds {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Hint:
    """What the application knows about a request's session (see the module docstring).

    Args:
        session: the conversation or agent the request belongs to (any hashable; None: the
            request alone). An ending session demotes the blocks this session released.
        last_turn: this is the session's last request.
        continues: the probability in [0, 1] that the session sends another request (None:
            unknown); below :data:`ENDS_BELOW` it counts as the last turn.
        pin_s: pin the prompt's first ``pin_tokens`` tokens for this many seconds after each
            release (None: no pin).
        pin_tokens: how many prompt tokens ``pin_s`` covers (None: the whole prompt).
        resume_s: the session resumes in about this many seconds (None: unknown).
        soft: the pin is soft retention (refreshed whenever the block is released again, by any
            request; broken before hard pins), not a hard pin (needs ``pin_s``).

    Raises ValueError naming the bad value: a negative or non-finite time, a probability outside
    [0, 1], ``pin_tokens`` without ``pin_s`` or below 1, an unhashable session, or a hint that
    both ends the session and says it resumes.
    """

    session: object = None
    last_turn: bool = False
    continues: float | None = None
    pin_s: float | None = None
    pin_tokens: int | None = None
    resume_s: float | None = None
    soft: bool = False

    def __post_init__(self) -> None:
        try:
            hash(self.session)
        except TypeError:
            raise ValueError(f"Hint session must be hashable (a str or an int), got {self.session!r}") from None
        if not isinstance(self.last_turn, bool):
            raise ValueError(f"Hint last_turn must be True or False, got {self.last_turn!r}")
        c = self.continues
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))
                              or not 0.0 <= c <= 1.0):
            raise ValueError(f"Hint continues must be None or a probability in [0, 1], got {c!r}")
        if self.last_turn and c not in (None, 0, 0.0):
            raise ValueError(f"Hint last_turn=True means continues=0; got continues={c!r}")
        _check_seconds(self.pin_s, "Hint pin_s", allow_zero=False)
        _check_seconds(self.resume_s, "Hint resume_s", allow_zero=True)
        t = self.pin_tokens
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, int) or t < 1:
                raise ValueError(f"Hint pin_tokens must be None (the whole prompt) or an integer >= 1, "
                                 f"got {t!r}")
            if self.pin_s is None:
                raise ValueError(f"Hint pin_tokens={t} needs pin_s (how long to pin them)")
        if not isinstance(self.soft, bool):
            raise ValueError(f"Hint soft must be True or False, got {self.soft!r}")
        if self.soft and self.pin_s is None:
            raise ValueError("Hint soft=True makes a pin soft retention; it needs pin_s (how long)")
        if self.ends and self.resume_s is not None:
            raise ValueError(f"Hint says the session ends (last_turn={self.last_turn}, continues={c!r}) "
                             f"and that it resumes in {self.resume_s!r} s; give one of them")

    @property
    def ends(self) -> bool:
        """Whether the hint says the session sends no further request."""
        return self.last_turn or (self.continues is not None and self.continues < ENDS_BELOW)

    @property
    def empty(self) -> bool:
        """A hint that asks for nothing (no end, no pin, no resume)."""
        return not self.ends and self.pin_s is None and self.resume_s is None

    def check_prompt(self, num_prompt_tokens: int, what: str) -> None:
        """ValueError if ``pin_tokens`` reaches past the prompt's ``num_prompt_tokens`` tokens."""
        if self.pin_tokens is not None and self.pin_tokens > num_prompt_tokens:
            raise ValueError(f"{what}: hint pin_tokens={self.pin_tokens} lies outside the prompt "
                             f"({num_prompt_tokens} tokens); valid: 1 <= pin_tokens <= {num_prompt_tokens}")

    def configs(self, num_prompt_tokens: int) -> tuple[RetentionConfig, ...]:
        """The retention configs this hint stands for (pins, resume, end), in that order."""
        out = []
        if self.pin_s is not None:
            end = num_prompt_tokens if self.pin_tokens is None else min(self.pin_tokens, num_prompt_tokens)
            level = SOFT_PIN_PRIORITY if self.soft else PIN_PRIORITY
            out.append(RetentionConfig((TokenRange(0, end, level, float(self.pin_s)),)))
        if self.resume_s is not None:
            ttl = RESUME_FACTOR * float(self.resume_s) + RESUME_MARGIN_S
            out.append(RetentionConfig((TokenRange(0, None, RESUME_PRIORITY, ttl),),
                                       decode_priority=RESUME_PRIORITY, decode_ttl_s=ttl))
        if self.ends:
            out.append(RetentionConfig((TokenRange(0, None, MIN_PRIORITY),), decode_priority=MIN_PRIORITY))
        return tuple(out)


def hint_marks(hint: Hint, block_size: int, num_prompt_tokens: int,
               num_tokens: int) -> tuple[RetentionMark, ...]:
    """The retention marks ``hint`` gives a request's blocks of ``block_size`` tokens when it
    releases them (``num_tokens`` long, ``num_prompt_tokens`` of them the prompt): the marks of
    each of :meth:`Hint.configs`, by :func:`~hybridkv.core.retention_config.block_marks`."""
    marks: list[RetentionMark] = []
    for config in hint.configs(num_prompt_tokens):
        marks.extend(block_marks(config, block_size, num_prompt_tokens, num_tokens))
    return tuple(marks)


@dataclass(frozen=True, slots=True)
class HintStats:
    """What the pool's hint layer did (``KVCacheManager.hint_stats()``), in blocks.

    Attributes:
        releases: requests released with a non-empty hint.
        demoted: blocks freed into the evict-first region (an ending session's, honoured).
        pinned: blocks freed into the pinned region (honoured pins).
        ignored_demotions, ignored_pins: blocks a hint would have demoted or pinned while the
            layer did not honour that kind (its shadows said it would not help).
        pins_broken: pinned blocks evicted before their TTL because nothing else was free (a
            pin never makes the cache refuse work).
        pins_lapsed: pins whose TTL ran out while the block was free.
        soft_refreshes: soft pins extended by a release that did not pin (a hit refreshed them).
        shadow_plain_hits, shadow_demoting_hits, shadow_pinning_hits: the decayed hit counts of
            the layer's three shadow caches (sampled blocks): hints ignored, demotions honoured,
            pins honoured.
        honour_demotions, honour_pins: whether the layer honours that kind now.
        forced: the layer follows every hint untested (``hints="force"``; no shadows run).
    """

    releases: int = 0
    demoted: int = 0
    pinned: int = 0
    ignored_demotions: int = 0
    ignored_pins: int = 0
    pins_broken: int = 0
    pins_lapsed: int = 0
    shadow_plain_hits: float = 0.0
    shadow_demoting_hits: float = 0.0
    shadow_pinning_hits: float = 0.0
    honour_demotions: bool = False
    honour_pins: bool = False
    forced: bool = False
    soft_refreshes: int = 0


__all__ = ["ENDS_BELOW", "Hint", "HintStats", "PIN_PRIORITY", "RESUME_PRIORITY", "RETENTION_KINDS",
           "SOFT_PIN_PRIORITY", "RESUME_FACTOR", "RESUME_MARGIN_S",
           "hint_marks"]
