"""Hints in the shapes public serving APIs send them, mapped onto :class:`~hybridkv.core.hints.Hint`.

A request body may carry cache-control fields of three public APIs; :func:`public_hint` turns
the ones it has into one hint (trace lines and ``LLM.generate`` accept the same fields):

========================================================  ==================================
field (API)                                               hint
========================================================  ==================================
``cache_control: {"type": "ephemeral", "ttl"?: T}``       ``pin_s`` = T (``"5m"``: 300 s,
(Anthropic; ``ttl`` ``"5m"`` (default) or ``"1h"``)        ``"1h"``: 3600 s), soft
``prompt_cache_retention: "in_memory" | "24h"``            ``pin_s`` = 600 s / 86400 s, soft
(OpenAI)
``prompt_cache_key: str`` (OpenAI)                         ``session`` (when none is given)
``nvext.cache_control: {"type": "ephemeral", "ttl"?: T}``  ``pin_s`` = T (``"<N>s"``, ``"<N>m"``,
(Dynamo; default ``"5m"``)                                 ``"<N>h"``), soft
``nvext.agent_hints.prefix_id: str`` (Dynamo)              ``session`` (when none is given)
``nvext.agent_hints.speculative_prefill: true``            ``continues=1.0`` (a next turn comes)
``nvext.agent_hints.priority``, ``strict_priority``,       accepted; scheduling only, no hint
``osl``, ``total_requests``
========================================================  ==================================

Every TTL shape is *soft* retention (``Hint(soft=True)``): each API documents its cache as kept
for that long after the last use (Anthropic: refreshed each time it is read; OpenAI in-memory:
cleared after 5 to 10 minutes of inactivity, so 600 s; Dynamo pins the prefix for the TTL
after the request, ai-dynamo/dynamo#6213, and the SGLang pin it calls is refreshed on hit,
sglang#18941), which is what a soft pin does. The whole prompt is retained (a trace
line or a prompt has no message boundaries to place a breakpoint at).

Errors (``ValueError``, naming the field, the bad value and what is valid): a field that is not
an object where one is needed, an unknown field inside one, a ``type`` other than
``"ephemeral"``, a TTL outside its API's values, a retention TTL given twice (two shapes, or a
shape beside ``hint.pin_s``), or two different session keys.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Mapping

from hybridkv.core.hints import Hint

#: The public fields :func:`public_hint` reads (top level of a request body or trace line).
PUBLIC_HINT_FIELDS = ("cache_control", "prompt_cache_key", "prompt_cache_retention", "nvext")
#: Anthropic's ``cache_control.ttl`` values, in seconds.
ANTHROPIC_TTLS = {"5m": 300.0, "1h": 3600.0}
#: OpenAI's ``prompt_cache_retention`` values, in seconds.
OPENAI_RETENTION = {"in_memory": 600.0, "24h": 86400.0}
#: The TTL of a ``cache_control`` object without ``ttl`` (both APIs: five minutes).
DEFAULT_TTL = "5m"
#: The fields of ``nvext`` and of ``nvext.agent_hints`` that are read.
NVEXT_FIELDS = ("cache_control", "agent_hints")
AGENT_HINT_FIELDS = ("priority", "strict_priority", "osl", "speculative_prefill", "prefix_id",
                     "total_requests")
_CACHE_CONTROL_FIELDS = ("type", "ttl")
_DYNAMO_TTL = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smh])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _unknown(obj: Mapping[str, Any], known: tuple[str, ...], what: str) -> None:
    extra = sorted(set(obj) - set(known))
    if extra:
        raise ValueError(f"unknown {what} field {extra[0]!r}; valid: {', '.join(known)}")


def _object(value: object, what: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be an object with fields among {', '.join(known)}, got {value!r}")
    _unknown(value, known, what)
    return value


def dynamo_ttl_seconds(text: object) -> float:
    """Seconds of a Dynamo TTL string: ``"<N>s"``, ``"<N>m"`` or ``"<N>h"`` (N > 0)."""
    m = _DYNAMO_TTL.match(text) if isinstance(text, str) else None
    secs = float(m.group(1)) * _UNIT_S[m.group(2)] if m else 0.0
    if not m or not 0.0 < secs < math.inf:
        raise ValueError(f"nvext.cache_control ttl must be a duration like \"300s\", \"5m\" or "
                         f"\"1h\" (> 0), got {text!r}")
    return secs


def _cache_control(value: object, what: str, dynamo: bool) -> float:
    obj = _object(value, what, _CACHE_CONTROL_FIELDS)
    kind = obj.get("type")
    if kind != "ephemeral":
        raise ValueError(f"{what} type must be \"ephemeral\", got {kind!r}")
    ttl = obj.get("ttl", DEFAULT_TTL)
    if dynamo:
        return dynamo_ttl_seconds(ttl)
    if not isinstance(ttl, str) or ttl not in ANTHROPIC_TTLS:
        raise ValueError(f"{what} ttl must be one of {', '.join(map(repr, ANTHROPIC_TTLS))}, got {ttl!r}")
    return ANTHROPIC_TTLS[ttl]


def _key(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _int(value: object, what: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")


def public_hint(body: Mapping[str, Any], session: object = None, base: Hint | None = None) -> Hint | None:
    """The hint of ``body``'s public cache fields (:data:`PUBLIC_HINT_FIELDS`; others are
    ignored), merged into ``base`` (a hybridkv hint given beside them, or None). ``session``
    is the request's own session; without one, ``prompt_cache_key`` or
    ``nvext.agent_hints.prefix_id`` names it. Returns ``base`` when ``body`` has none of the
    fields. Raises ValueError as the module docstring says."""
    if not any(f in body for f in PUBLIC_HINT_FIELDS):
        return base
    ttls: list[tuple[str, float]] = []
    keys: list[tuple[str, str]] = []
    continues = None
    if "cache_control" in body:
        ttls.append(("cache_control", _cache_control(body["cache_control"], "cache_control", False)))
    if "prompt_cache_retention" in body:
        v = body["prompt_cache_retention"]
        if not isinstance(v, str) or v not in OPENAI_RETENTION:
            raise ValueError(f"prompt_cache_retention must be one of "
                             f"{', '.join(map(repr, OPENAI_RETENTION))}, got {v!r}")
        ttls.append(("prompt_cache_retention", OPENAI_RETENTION[v]))
    if "prompt_cache_key" in body:
        keys.append(("prompt_cache_key", _key(body["prompt_cache_key"], "prompt_cache_key")))
    if "nvext" in body:
        nv = _object(body["nvext"], "nvext", NVEXT_FIELDS)
        if "cache_control" in nv:
            ttls.append(("nvext.cache_control", _cache_control(nv["cache_control"], "nvext.cache_control",
                                                               True)))
        if "agent_hints" in nv:
            ah = _object(nv["agent_hints"], "nvext.agent_hints", AGENT_HINT_FIELDS)
            for name in ("priority", "strict_priority"):
                if name in ah:
                    _int(ah[name], f"nvext.agent_hints.{name}", -2**31)
            if "osl" in ah:
                _int(ah["osl"], "nvext.agent_hints.osl", 0)
            if "total_requests" in ah:
                _int(ah["total_requests"], "nvext.agent_hints.total_requests", 1)
            if "prefix_id" in ah:
                keys.append(("nvext.agent_hints.prefix_id", _key(ah["prefix_id"], "nvext.agent_hints.prefix_id")))
            sp = ah.get("speculative_prefill")
            if sp is not None and not isinstance(sp, bool):
                raise ValueError(f"nvext.agent_hints.speculative_prefill must be true or false, got {sp!r}")
            if sp:
                continues = 1.0
    hint = base if base is not None else Hint(session=session)
    if base is not None and base.pin_s is not None:
        ttls.insert(0, ("hint.pin_s", base.pin_s))
    if len(ttls) > 1:
        raise ValueError(f"{ttls[0][0]} and {ttls[1][0]} both set how long the prompt stays cached; "
                         "give one")
    if len({k for _, k in keys}) > 1:
        raise ValueError(f"{keys[0][0]}={keys[0][1]!r} and {keys[1][0]}={keys[1][1]!r} name "
                         "different sessions; give one")
    changes: dict[str, Any] = {}
    if ttls and (base is None or base.pin_s is None):
        changes.update(pin_s=ttls[0][1], soft=True)
    if hint.session is None and keys:
        changes["session"] = keys[0][1]
    if continues is not None and not hint.ends and hint.continues is None:
        changes["continues"] = continues
    return replace(hint, **changes) if changes else hint


__all__ = ["AGENT_HINT_FIELDS", "ANTHROPIC_TTLS", "DEFAULT_TTL", "NVEXT_FIELDS", "OPENAI_RETENTION",
           "PUBLIC_HINT_FIELDS", "dynamo_ttl_seconds", "public_hint"]
