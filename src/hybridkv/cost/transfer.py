"""Host <-> device copy time: what moving KV between CPU memory and the GPU costs.

One copy call of ``n`` bytes takes ``max(per_copy_s, latency_s + n / bandwidth)``: large
copies run at the link's bandwidth, mid-size ones pay a fixed latency on top, and copy calls
issued back to back (a connector moving one block at a time) cannot go faster than one per
``per_copy_s`` however small they are. Pageable (not pinned) host memory copies at
``pageable_h2d_bw``.

:data:`DEFAULT_TRANSFER` is fitted by :func:`fit_transfer` to copies measured on one H100 SXM
machine with PyTorch 2.11 (pinned host memory, ``Tensor.copy_(non_blocking=True)``, CUDA
events): 55 GB/s for large copies each way, 46 GB/s at 1 MiB, about 13 us per copy call,
latency-bound below about 256 KiB. ``hybridkv profile`` measures the same quantities on the
machine it runs on and stores them in the profile's ``transfer`` section.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CopyPoint", "DEFAULT_TRANSFER", "TransferModel", "fit_transfer"]


@dataclass(frozen=True, slots=True)
class CopyPoint:
    """One measured copy: ``copies`` calls of ``bytes`` each, ``seconds`` for all of them.

    ``direction`` is ``"h2d"`` or ``"d2h"``; ``pinned`` is False for pageable host memory.
    """

    direction: str
    bytes: int
    seconds: float
    copies: int = 1
    pinned: bool = True

    def __post_init__(self) -> None:
        if self.direction not in ("h2d", "d2h"):
            raise ValueError(f"copy direction must be 'h2d' or 'd2h', got {self.direction!r}")
        if not (self.bytes > 0 and self.seconds > 0 and self.copies >= 1):
            raise ValueError(f"copy point needs bytes > 0, seconds > 0, copies >= 1, got {self!r}")

    def to_json(self) -> dict[str, Any]:
        return {"direction": self.direction, "bytes": self.bytes, "seconds": self.seconds,
                "copies": self.copies, "pinned": self.pinned}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CopyPoint:
        try:
            return cls(str(obj["direction"]), int(obj["bytes"]), float(obj["seconds"]),
                       int(obj.get("copies", 1)), bool(obj.get("pinned", True)))
        except KeyError as exc:
            raise ValueError(f"copy point {obj!r} lacks field {exc.args[0]!r}") from None


@dataclass(frozen=True, slots=True)
class TransferModel:
    """Copy-time constants (formula: module docstring).

    Attributes:
        h2d_bw, d2h_bw: large-copy bandwidth each way, bytes/s (pinned host memory).
        latency_s: fixed time of one copy on top of its bytes.
        per_copy_s: the shortest time of one copy call among many issued back to back.
        pageable_h2d_bw: host-to-device bandwidth from pageable host memory, bytes/s.
        source: where the constants come from.
        points: the measurements they were fitted to.
    """

    h2d_bw: float
    d2h_bw: float
    latency_s: float
    per_copy_s: float
    pageable_h2d_bw: float
    source: str = ""
    points: tuple[CopyPoint, ...] = ()

    def __post_init__(self) -> None:
        for name in ("h2d_bw", "d2h_bw", "pageable_h2d_bw"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TransferModel.{name} must be > 0 bytes/s, got {getattr(self, name)!r}")
        for name in ("latency_s", "per_copy_s"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"TransferModel.{name} must be in [0, 1) seconds, got {getattr(self, name)!r}")

    def copy_time(self, nbytes: int, copies: int = 1, direction: str = "h2d",
                  pinned: bool = True) -> float:
        """Seconds for ``copies`` copy calls of ``nbytes`` bytes each.

        Raises:
            ValueError: negative sizes, a bad direction, or pageable device-to-host (not
                measured).
        """
        if nbytes < 0 or copies < 0:
            raise ValueError(f"copy_time needs nbytes >= 0 and copies >= 0, got {nbytes}, {copies}")
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"copy direction must be 'h2d' or 'd2h', got {direction!r}")
        if nbytes == 0 or copies == 0:
            return 0.0
        if not pinned and direction != "h2d":
            raise ValueError("pageable copies are measured host-to-device only")
        bw = (self.h2d_bw if direction == "h2d" else self.d2h_bw) if pinned else self.pageable_h2d_bw
        one = max(self.per_copy_s, self.latency_s + nbytes / bw)
        return copies * one

    def to_json(self) -> dict[str, Any]:
        return {"h2d_bw": self.h2d_bw, "d2h_bw": self.d2h_bw, "latency_s": self.latency_s,
                "per_copy_s": self.per_copy_s, "pageable_h2d_bw": self.pageable_h2d_bw,
                "source": self.source, "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TransferModel:
        try:
            return cls(float(obj["h2d_bw"]), float(obj["d2h_bw"]), float(obj["latency_s"]),
                       float(obj["per_copy_s"]), float(obj["pageable_h2d_bw"]), str(obj.get("source", "")),
                       tuple(CopyPoint.from_json(p) for p in obj.get("points", ())))
        except KeyError as exc:
            raise ValueError(f"transfer section lacks field {exc.args[0]!r}") from None


def fit_transfer(points: Sequence[CopyPoint], source: str) -> TransferModel:
    """Constants from measured copies.

    Bandwidth each way: the median rate of pinned single copies of at least 64 MiB. Latency:
    the median excess over ``bytes / bandwidth`` of pinned single copies of 1-16 MiB. Per copy
    call: the median time per call of batched copies of at most 256 KiB (else of the smallest
    batched size measured). Pageable bandwidth: the median rate of pageable copies (else a
    third of the pinned one).

    Raises:
        ValueError: no large pinned copy in some direction.
    """
    single = [p for p in points if p.copies == 1 and p.pinned]
    bw = {}
    for d in ("h2d", "d2h"):
        large = [p.bytes / p.seconds for p in single if p.direction == d and p.bytes >= 64 << 20]
        if not large:
            raise ValueError(f"no pinned {d} copy of at least 64 MiB to fit the bandwidth from")
        bw[d] = float(np.median(large))
    mid = [p.seconds - p.bytes / bw[p.direction] for p in single if (1 << 20) <= p.bytes <= (16 << 20)]
    latency = max(0.0, float(np.median(mid))) if mid else 0.0
    batched = [p for p in points if p.copies > 1 and p.pinned]
    small = [p for p in batched if p.bytes <= 256 << 10]
    if not small and batched:
        least = min(p.bytes for p in batched)
        small = [p for p in batched if p.bytes == least]
    per_copy = float(np.median([p.seconds / p.copies for p in small])) if small else latency
    pageable = [p.bytes / p.seconds for p in points if not p.pinned and p.direction == "h2d"]
    page_bw = float(np.median(pageable)) if pageable else bw["h2d"] / 3
    return TransferModel(bw["h2d"], bw["d2h"], latency, per_copy, page_bw, source, tuple(points))


def _h100_points() -> tuple[CopyPoint, ...]:
    # One H100 SXM machine, PyTorch 2.11: single pinned copies (mean of 10 after one warm-up),
    # one pageable 256 MiB copy, and batched copies of 64 KiB - 2 MiB blocks from random pinned
    # offsets, one copy call per block.
    single = [(65536, 2.5325e-05, 1.4464e-05), (262144, 1.7661e-05, 1.4032e-05),
              (1048576, 2.2848e-05, 2.2509e-05), (4194304, 7.9622e-05, 7.929e-05),
              (16777216, 0.000307722, 0.000309242), (67108864, 0.001220243, 0.001220758),
              (268435456, 0.004871632, 0.004870803), (1073741824, 0.019445184, 0.019460435)]
    pts = [CopyPoint(d, n, s) for n, h, dd in single for d, s in (("h2d", h), ("d2h", dd))]
    pts.append(CopyPoint("h2d", 268435456, 268435456 / 17.001052644e9, pinned=False))
    pts += [CopyPoint("h2d", 65536, 0.013537034, copies=1024),
            CopyPoint("h2d", 262144, 0.006880939, copies=512),
            CopyPoint("h2d", 2097152, 0.010539552, copies=256)]
    return tuple(pts)


DEFAULT_TRANSFER = fit_transfer(_h100_points(), "measured on one H100 SXM machine "
                                                "(PyTorch 2.11, pinned host memory, PCIe)")
"""Copy-time constants of the H100 measurements (the default where no profile says otherwise)."""
