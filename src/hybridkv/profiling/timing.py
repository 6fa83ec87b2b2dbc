"""Timing one callable: warm-ups, then repetitions, median and minimum.

On CUDA each repetition is bracketed by CUDA events (the GPU's own clock, launch overhead
included as the GPU sees it); ``graph=True`` captures the callable once as a CUDA graph and
times its replays (how engines run decode steps). On a CPU each repetition is timed with
``time.perf_counter``. The number of repetitions adapts to the callable's duration: as many
as fit in ``target_s`` after the first, between ``min_repeats`` and ``max_repeats``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Timing", "TimingOptions", "attention_kernel_names", "time_call"]


@dataclass(frozen=True, slots=True)
class TimingOptions:
    """How many times to run a measured callable."""

    warmup: int = 2
    min_repeats: int = 6
    max_repeats: int = 20
    target_s: float = 1.0

    def to_json(self) -> dict:
        return {"warmup": self.warmup, "min_repeats": self.min_repeats,
                "max_repeats": self.max_repeats, "target_s": self.target_s}


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds of each timed repetition."""

    seconds: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min_s(self) -> float:
        return min(self.seconds)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _one(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_call(fn: Callable[[], object], device: torch.device, opts: TimingOptions,
              graph: bool = False) -> Timing:
    """Time ``fn`` on ``device`` (``graph``: as a replayed CUDA graph; CUDA only)."""
    run = fn
    keep = None
    if graph:
        if device.type != "cuda":
            raise ValueError("CUDA-graph timing needs a CUDA device")
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(max(1, opts.warmup)):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            keep = fn()                         # the graph's outputs stay alive while it replays
        run = g.replay
    for _ in range(opts.warmup):
        run()
    _sync(device)
    first = _one(run, device)
    extra = int(opts.target_s / max(first, 1e-9))
    count = max(opts.min_repeats, min(opts.max_repeats, extra))
    seconds = [first] + [_one(run, device) for _ in range(count - 1)]
    del keep
    return Timing(tuple(seconds))


def attention_kernel_names(fn: Callable[[], object], device: torch.device) -> list[str]:
    """Names of the GPU kernels one call of ``fn`` runs whose name says attention (flash,
    fmha, sdpa, attention, cudnn), via ``torch.profiler``; empty off CUDA or on failure."""
    if device.type != "cuda":
        return []
    try:
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(device)
        names = {e.key for e in prof.key_averages()}
    except Exception:  # noqa: BLE001 - evidence only; never fail a profile over it
        return []
    words = ("flash", "fmha", "sdpa", "attention", "attn", "cudnn")
    return sorted(n[:120] for n in names if any(w in n.lower() for w in words))
