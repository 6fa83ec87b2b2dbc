"""Hints synthesised from a trace's own future, at a chosen accuracy: "what if my application
told the cache ...?" (``simulate`` / ``sweep --hints KIND[:ACCURACY]``).

**Sessions.** A workload's requests are grouped into sessions (conversations, agents) by the
trace's own ``session`` field where every request has one (token traces, the generators), else
by *hash-chain continuation* (:func:`sessions_from_chains`, the rule for Mooncake traces, which
carry no session): a request continues the session of the latest earlier request whose whole
chain of full blocks is a prefix of its own (a next turn re-reads the previous prompt, then its
answer and new text), unless that chain is made of shared content only; a block is shared
content when :data:`HUB_CHILDREN` or more distinct blocks follow it somewhere in the workload
(a system prompt every conversation starts with). A request that continues no chain starts a
session, so a retry or branch that re-reads only part of an earlier prompt is a session of its
own, and that earlier request's session ends where it stops being continued. The rule's error
where the truth is known (generated sessions with branches) and what it finds on the Mooncake
traces are measured in BENCHMARKS.md, "Application hints".

**The truth** of request ``i``: whether its session sends a later request (*continues*) and,
if so, the time to that request's arrival (*gap*).

**Kinds** (:class:`HintSpec`; every request gets a :class:`~hybridkv.core.hints.Hint` naming its
session, so the pool can tell whose blocks are whose):

* ``session-end``: the hint says "last turn" exactly when the session does not continue;
* ``ttl[=SECONDS]`` (default 300, the common five-minute prompt-cache TTL): a continuing
  session's request pins its prompt for that long;
* ``resume``: a continuing session's request says it resumes in ``gap`` seconds (a pin of
  about that long: :data:`hybridkv.core.hints.RESUME_FACTOR`).

**Accuracy** ``a`` (default 1): each request's hint is the true one with probability ``a``,
independently (seeded), else the wrong one: "last turn" for a continuing session and no end
for an ending one; a pin for an ending session and none for a continuing one; a resume time
(drawn from the trace's own gaps) for an ending session and none for a continuing one. At
``a = 0.5`` a hint is independent of the truth: random hints.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from hybridkv.core.hashing import BlockHasher
from hybridkv.core.hints import Hint
from hybridkv.core.request import Request
from hybridkv.sim.traffic.traces import MOONCAKE_BLOCK_TOKENS, MooncakeRecord

#: Hint kinds ``--hints`` accepts.
HINT_KINDS = ("session-end", "ttl", "resume")
#: The pin length of ``ttl`` without ``=SECONDS``.
DEFAULT_TTL_S = 300.0
#: A block with this many distinct next blocks in a workload is content sessions share.
HUB_CHILDREN = 8


@dataclass(frozen=True, slots=True)
class HintSpec:
    """Which hints to synthesise and how often they are right (see the module docstring).

    The CLI spelling is ``KIND[=SECONDS][:ACCURACY][:force]`` (:meth:`parse`, :meth:`__str__`),
    e.g. ``session-end:0.8``, ``ttl=600:0.9``, ``resume``, ``session-end:1:force``. ``force``:
    the pool follows every hint untested (``CacheOptions(hints="force")``) instead of testing
    them first. Raises ValueError naming the bad value: an unknown kind, an accuracy outside
    [0, 1], a TTL that is not a finite number > 0, ``=SECONDS`` on a kind other than ``ttl``,
    or a third part other than ``force``."""

    kind: str
    accuracy: float = 1.0
    ttl_s: float | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if self.kind not in HINT_KINDS:
            raise ValueError(f"unknown hint kind {self.kind!r}; valid: {', '.join(HINT_KINDS)}")
        a = self.accuracy
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            raise ValueError(f"hint accuracy must be a number in [0, 1], got {a!r}")
        object.__setattr__(self, "accuracy", float(a))
        if self.kind == "ttl":
            ttl = DEFAULT_TTL_S if self.ttl_s is None else self.ttl_s
            if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < math.inf:
                raise ValueError(f"hint TTL must be a finite number of seconds > 0, got {ttl!r}")
            object.__setattr__(self, "ttl_s", float(ttl))
        elif self.ttl_s is not None:
            raise ValueError(f"=SECONDS applies to the ttl hint kind only, not {self.kind!r}")
        if not isinstance(self.force, bool):
            raise ValueError(f"hint force must be True or False, got {self.force!r}")

    @classmethod
    def parse(cls, text: str) -> HintSpec:
        """``KIND[=SECONDS][:ACCURACY][:force]``."""
        kind, _, acc = str(text).strip().partition(":")
        acc, sep, mode = acc.partition(":")
        if sep and mode != "force":
            raise ValueError(f"hint mode must be 'force' (follow every hint untested), got {mode!r} "
                             f"(spelling: KIND[=SECONDS][:ACCURACY][:force], e.g. session-end:1:force)")
        kind, _, secs = kind.partition("=")
        try:
            accuracy = float(acc) if acc else 1.0
        except ValueError:
            raise ValueError(f"hint accuracy must be a number in [0, 1], got {acc!r} "
                             f"(spelling: KIND[=SECONDS][:ACCURACY], e.g. session-end:0.8)") from None
        try:
            ttl = float(secs) if secs else None
        except ValueError:
            raise ValueError(f"hint TTL must be a number of seconds, got {secs!r} "
                             f"(spelling: ttl=SECONDS[:ACCURACY], e.g. ttl=300:0.9)") from None
        return cls(kind, accuracy, ttl, bool(sep))

    def __str__(self) -> str:
        kind = f"ttl={self.ttl_s:g}" if self.kind == "ttl" else self.kind
        return f"{kind}:{self.accuracy:g}" + (":force" if self.force else "")


def sessions_from_chains(chains: Sequence[Sequence[Hashable]],
                         hub_children: int = HUB_CHILDREN) -> list[int]:
    """Session numbers of requests given their chained block keys (full blocks, in arrival
    order; equal keys mean equal prefixes), by hash-chain continuation (the module docstring's
    rule): request ``r`` continues the session of the latest earlier request whose whole chain
    is a prefix of ``r``'s and holds a block that is not shared content (fewer than
    ``hub_children`` distinct blocks follow it in the whole workload); otherwise ``r`` starts
    a session. Returns one number per request, numbered in order of first use."""
    children: dict[Hashable, set] = {}
    for keys in chains:
        for a, b in zip(keys, keys[1:]):
            kids = children.get(a)
            if kids is None:
                children[a] = {b}
            elif len(kids) < hub_children:
                kids.add(b)
    ends: dict[Hashable, int] = {}          # last key of a continuable chain -> its session
    out: list[int] = []
    count = 0
    for keys in chains:
        s = -1
        for k in reversed(keys):                 # the longest continued chain wins
            s = ends.get(k, -1)
            if s >= 0:
                break
        if s < 0:
            s = count
            count += 1
        out.append(s)
        if any(len(children.get(k, ())) < hub_children for k in keys):
            ends[keys[-1]] = s
    return out


def session_truth(sessions: Sequence[Hashable], arrivals: Sequence[float]) -> tuple[list[bool], list[float]]:
    """Per request: whether its session sends a later request, and the time until that one
    arrives (``inf`` when none)."""
    n = len(sessions)
    continues = [False] * n
    gap = [math.inf] * n
    last: dict[Hashable, int] = {}
    for i, s in enumerate(sessions):
        j = last.get(s)
        if j is not None:
            continues[j] = True
            gap[j] = max(0.0, arrivals[i] - arrivals[j])
        last[s] = i
    return continues, gap


def synthesize_hints(spec: HintSpec, sessions: Sequence[Hashable], arrivals: Sequence[float],
                     seed: int = 0) -> list[Hint]:
    """One hint per request (see the module docstring), seeded by ``seed``."""
    continues, gap = session_truth(sessions, arrivals)
    rng = np.random.default_rng([seed, 25])
    right = rng.random(len(sessions)) < spec.accuracy
    gaps = [g for g in gap if g != math.inf]
    draws = rng.choice(gaps, size=len(sessions)) if gaps else np.zeros(len(sessions))
    out: list[Hint] = []
    for i, s in enumerate(sessions):
        says_continue = continues[i] == bool(right[i])
        if spec.kind == "session-end":
            out.append(Hint(session=s, last_turn=not says_continue))
        elif spec.kind == "ttl":
            out.append(Hint(session=s, pin_s=spec.ttl_s) if says_continue else Hint(session=s))
        elif not says_continue:
            out.append(Hint(session=s))
        else:
            out.append(Hint(session=s, resume_s=gap[i] if continues[i] else float(draws[i])))
    return out


def workload_sessions(items: Sequence, block_size: int) -> list[Hashable]:
    """The session of each work item (:class:`~hybridkv.sim.traffic.workitems.WorkItem`, in order): the
    trace's own when every item names one, else :func:`sessions_from_chains` over the items'
    chains (a Mooncake record's ``hash_ids``; a token prompt's full ``block_size``-token
    blocks, hashed as the cache hashes them)."""
    named = [it.session for it in items]
    if items and all(s is not None for s in named):
        return named
    hasher = BlockHasher(block_size)
    chains: list[list[Hashable]] = []
    for it in items:
        src = it.source
        if isinstance(src, MooncakeRecord) or getattr(src, "block_ids", ()):
            ids = src.hash_ids if isinstance(src, MooncakeRecord) else src.block_ids
            keys, k = [], 0
            for h in ids[: it.prompt_len // MOONCAKE_BLOCK_TOKENS]:
                k = hash((k, h))                 # chained (tuples of ints hash the same in
                keys.append(k)                   # every process)
            chains.append(keys)
        else:
            req = Request(it.request_id, it.prompt())
            hasher.update(req)
            chains.append(req.block_hashes[: it.prompt_len // block_size])
    return sessions_from_chains(chains)


__all__ = ["DEFAULT_TTL_S", "HINT_KINDS", "HUB_CHILDREN", "HintSpec", "session_truth", "sessions_from_chains",
           "synthesize_hints", "workload_sessions"]
