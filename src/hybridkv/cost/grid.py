"""Steps as text and as measured grid points.

One syntax names a step everywhere (``hybridkv cost --step``, ``hybridkv profile --point``):
comma-separated items, each ``N@C`` (one request computing ``N`` new tokens after ``C``
cached ones) or ``N@CxB`` (``B`` such requests). ``2048@4096,1@1024x64`` is one step with a
2048-token prefill chunk after 4096 cached tokens and 64 decodes with 1024 cached tokens each.

A :class:`GridPoint` is one timed step of a profile: a prefill part (``batch`` requests of
``new_tokens`` after ``context``), a decode part (``decode_batch`` requests of one token after
``decode_context``), or both (a *mixed* step, as chunked prefill schedules it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["GridPoint", "format_step", "parse_step"]

_ITEM = re.compile(r"^(\d+)@(\d+)(?:x(\d+))?$")
_SYNTAX = "N@C or N@CxB (N new tokens >= 1 after C >= 0 cached tokens, B >= 1 requests)"

Work = list[tuple[int, int]]


def parse_step(text: str) -> Work:
    """The work list ``[(new_tokens, context), ...]`` of a step written as text.

    Raises:
        ValueError: one line naming the bad item and the syntax.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty step {text!r}; write items {_SYNTAX}, comma-separated")
    work: Work = []
    for raw in text.split(","):
        item = raw.strip()
        m = _ITEM.match(item)
        if m is None:
            raise ValueError(f"bad step item {item!r} in {text!r}: expected {_SYNTAX}")
        new, ctx, batch = int(m[1]), int(m[2]), int(m[3]) if m[3] is not None else 1
        if new < 1 or batch < 1:
            raise ValueError(f"bad step item {item!r} in {text!r}: N and B must be >= 1")
        work.extend([(new, ctx)] * batch)
    return work


def format_step(work: Work) -> str:
    """Inverse of :func:`parse_step` (runs of equal requests written ``N@CxB``)."""
    items: list[str] = []
    i = 0
    while i < len(work):
        j = i
        while j < len(work) and work[j] == work[i]:
            j += 1
        new, ctx = work[i]
        items.append(f"{new}@{ctx}" + (f"x{j - i}" if j - i > 1 else ""))
        i = j
    return ",".join(items)


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One measured step.

    Attributes:
        new_tokens: new tokens of each prefill request (0: no prefill part).
        context: cached tokens before each prefill request.
        batch: prefill requests.
        decode_batch: decode requests (one new token each; 0: no decode part).
        decode_context: cached tokens of each decode request.
        median_s, min_s: measured seconds (median and minimum of the repetitions).
        repeats: timed repetitions behind the figures.
        host_s: median seconds the host took to issue the step's kernels (0: not recorded).
    """

    new_tokens: int = 0
    context: int = 0
    batch: int = 1
    decode_batch: int = 0
    decode_context: int = 0
    median_s: float = 0.0
    min_s: float = 0.0
    repeats: int = 0
    host_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("new_tokens", "context", "batch", "decode_batch", "decode_context", "repeats"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"grid point {name} must be a non-negative integer, got {v!r}")
        if self.new_tokens == 0 and self.decode_batch == 0:
            raise ValueError("a grid point needs a prefill part (new_tokens >= 1) or a decode part "
                             "(decode_batch >= 1)")
        if self.new_tokens and self.batch < 1:
            raise ValueError(f"grid point batch must be >= 1 with a prefill part, got {self.batch}")
        if not (self.median_s >= 0 and self.min_s >= 0 and self.host_s >= 0):
            raise ValueError(f"grid point times must be >= 0, got {self.median_s!r}, {self.min_s!r}, "
                             f"{self.host_s!r}")

    @property
    def kind(self) -> str:
        """``"prefill"``, ``"decode"`` or ``"mixed"``."""
        if self.new_tokens and self.decode_batch:
            return "mixed"
        return "prefill" if self.new_tokens else "decode"

    def work(self) -> Work:
        """The step's work list (prefill requests first)."""
        pre = [(self.new_tokens, self.context)] * self.batch if self.new_tokens else []
        return pre + [(1, self.decode_context)] * self.decode_batch

    @property
    def step(self) -> str:
        """The step in :func:`parse_step` syntax."""
        return format_step(self.work())

    @classmethod
    def from_step(cls, text: str) -> GridPoint:
        """The (unmeasured) grid point of a step string.

        Raises:
            ValueError: the step is not one prefill shape plus one decode shape (the profiler
                times uniform parts), or has bad syntax.
        """
        work = parse_step(text)
        pre = sorted({w for w in work if w[0] > 1})
        dec = sorted({w for w in work if w[0] == 1})
        if len(pre) > 1 or len(dec) > 1:
            raise ValueError(f"step {text!r} mixes {len(pre)} prefill and {len(dec)} decode shapes; a "
                             "grid point has at most one of each (N@CxB for the prefill part, "
                             "1@CxB for the decodes)")
        n_pre = sum(1 for w in work if w[0] > 1)
        n_dec = len(work) - n_pre
        return cls(new_tokens=pre[0][0] if pre else 0, context=pre[0][1] if pre else 0,
                   batch=n_pre or 1, decode_batch=n_dec, decode_context=dec[0][1] if dec else 0)

    def to_json(self) -> dict[str, Any]:
        """A JSON object; prefill and decode points use the field names of the published
        H100 measurements (``kind``, ``new_tokens``, ``context``, ``batch``)."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "decode":
            out.update(batch=self.decode_batch, context=self.decode_context)
        else:
            out.update(new_tokens=self.new_tokens, context=self.context, batch=self.batch)
            if self.decode_batch:
                out.update(decode_batch=self.decode_batch, decode_context=self.decode_context)
        out.update(median_s=self.median_s, min_s=self.min_s)
        if self.repeats:
            out["repeats"] = self.repeats
        if self.host_s:
            out["host_s"] = self.host_s
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> GridPoint:
        """Inverse of :meth:`to_json` (``batch`` defaults to 1, ``min_s`` to ``median_s``).

        Raises:
            ValueError: unknown kind, or a missing or bad field (named).
        """
        try:
            kind = obj["kind"]
            median = float(obj["median_s"])
            common: dict[str, Any] = dict(median_s=median, min_s=float(obj.get("min_s", median)),
                                          repeats=int(obj.get("repeats", 0)), host_s=float(obj.get("host_s", 0.0)))
            if kind == "decode":
                return cls(decode_batch=int(obj["batch"]), decode_context=int(obj["context"]), **common)
            if kind in ("prefill", "mixed"):
                return cls(new_tokens=int(obj["new_tokens"]), context=int(obj["context"]),
                           batch=int(obj.get("batch", 1)),
                           decode_batch=int(obj.get("decode_batch", 0)) if kind == "mixed" else 0,
                           decode_context=int(obj.get("decode_context", 0)) if kind == "mixed" else 0,
                           **common)
        except KeyError as exc:
            raise ValueError(f"grid point {obj!r} lacks field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad grid point {obj!r}: {exc}") from None
        raise ValueError(f"unknown grid point kind {kind!r}; valid: prefill, decode, mixed")
