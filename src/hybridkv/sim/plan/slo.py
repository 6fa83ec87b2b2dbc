"""Service-level objectives: what a planned deployment must meet, and whether a run met it.

An :class:`SLO` is a set of :class:`Target` s, each a latency percentile over a run's requests
and its limit: ``ttft-p99=2s`` (time to first token, 99th percentile, at most 2 s),
``itl-p99=100ms`` (inter-token latency: each request's mean time per output token after its
first, 99th percentile over requests; AIConfigurator's TPOT). Percentiles are 50, 90 or 99,
computed as ``numpy.percentile`` (linear interpolation) over the requests a run served: the
``ttft_pNN_s`` / ``itl_pNN_s`` keys of ``hybridkv simulate --json``, which :func:`metrics`
reads, so a plan's verdict and a rerun's JSON are the same numbers.

A run *meets* an SLO when every target's value is at most its limit; its *headroom ratio* is
the largest value / limit (<= 1 meets). A run that meets it with a ratio above
:data:`EDGE_RATIO` is *at the edge*: a small change in traffic or step times may break it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

METRICS = ("ttft", "itl")
PERCENTILES = (50, 90, 99)
EDGE_RATIO = 0.9
"""A run meeting its SLO with some metric above this share of its limit is flagged."""

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True, slots=True)
class Target:
    """One objective: ``metric`` (``ttft`` or ``itl``) at ``percentile`` at most ``limit_s``."""

    metric: str
    percentile: int
    limit_s: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown SLO metric {self.metric!r}; valid: {', '.join(METRICS)}")
        if self.percentile not in PERCENTILES:
            raise ValueError(f"SLO percentile must be one of {', '.join(map(str, PERCENTILES))}, "
                             f"got {self.percentile!r}")
        if not (isinstance(self.limit_s, (int, float)) and 0 < self.limit_s < float("inf")):
            raise ValueError(f"an SLO limit must be a finite time > 0, got {self.limit_s!r}")

    @property
    def name(self) -> str:
        """``ttft-p99``."""
        return f"{self.metric}-p{self.percentile}"

    @property
    def key(self) -> str:
        """The key of ``simulate --json`` holding the value (``ttft_p99_s``)."""
        return f"{self.metric}_p{self.percentile}_s"

    def __str__(self) -> str:
        return f"{self.name}={_seconds(self.limit_s)}"


def _seconds(t: float) -> str:
    return f"{t * 1e3:g}ms" if t < 1 else f"{t:g}s"


@dataclass(frozen=True, slots=True)
class SLO:
    """The targets a deployment must meet (at least one, each metric-percentile once)."""

    targets: tuple[Target, ...]

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("an SLO needs at least one target, e.g. ttft-p99=2s")
        names = [t.name for t in self.targets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"SLO target {dup[0]} is given twice")

    @classmethod
    def parse(cls, text: str) -> SLO:
        """``ttft-p99=2s,itl-p99=100ms`` (units s, ms, us; a bare number is seconds)."""
        targets = []
        for i, part in enumerate(str(text).split(","), 1):
            m = re.fullmatch(r"\s*(\w+)-p(\d+)\s*=\s*([0-9.eE+-]+)\s*(s|ms|us)?\s*", part)
            if not m:
                raise ValueError(f"SLO item {i} of {text!r} is not METRIC-pNN=TIME (e.g. "
                                 "ttft-p99=2s or itl-p90=50ms)")
            try:
                value = float(m[3]) * _UNITS[m[4] or "s"]
            except ValueError:
                raise ValueError(f"SLO item {i} of {text!r}: not a time: {m[3]!r}") from None
            targets.append(Target(m[1].lower(), int(m[2]), value))
        return cls(tuple(targets))

    def __str__(self) -> str:
        return ",".join(map(str, self.targets))

    def ratio(self, values: Mapping[str, float | None]) -> float:
        """The largest value / limit over the targets (``values``: :func:`metrics`); inf when a
        value is missing (no request finished its first token or a second one)."""
        worst = 0.0
        for t in self.targets:
            v = values.get(t.key)
            worst = max(worst, float("inf") if v is None else v / t.limit_s)
        return worst

    def meets(self, values: Mapping[str, float | None]) -> bool:
        return self.ratio(values) <= 1.0

    def at_edge(self, values: Mapping[str, float | None]) -> bool:
        """Meets it, but with some metric above :data:`EDGE_RATIO` of its limit."""
        r = self.ratio(values)
        return EDGE_RATIO < r <= 1.0


def metrics(result_json: Mapping[str, object]) -> dict[str, float | None]:
    """Every SLO metric of a run: the ``ttft_pNN_s`` and ``itl_pNN_s`` keys of its JSON
    (``SimResult.to_json()``, a cluster's too)."""
    out: dict[str, float | None] = {}
    for m in METRICS:
        for p in PERCENTILES:
            v = result_json.get(f"{m}_p{p}_s")
            out[f"{m}_p{p}_s"] = None if v is None else float(v)  # type: ignore[arg-type]
    return out


__all__ = ["EDGE_RATIO", "METRICS", "PERCENTILES", "SLO", "Target", "metrics"]
