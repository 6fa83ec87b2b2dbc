"""Timing one callable: warm-ups, then repetitions, median and minimum.

On CUDA each repetition is bracketed by CUDA events (the GPU's own clock); ``graph=True``
captures the callable once as a CUDA graph and times its replays (how engines run decode
steps). On a CPU each repetition is timed with ``time.perf_counter``. The number of
repetitions adapts to the callable's duration: as many as fit in ``target_s`` after the
first, between ``min_repeats`` and ``max_repeats``.

An eager step is a few hundred kernels issued one by one from Python. When the host issues
them more slowly than the GPU runs them, the GPU waits and the events measure the host's
speed, which drifts with the machine's load and clocks. With ``queue_ahead`` (the default)
each CUDA repetition is queued behind a GPU sleep kernel long enough to cover the host's
issue time, so the start event fires only once the whole step is queued and the events
measure the GPU's time alone; the host's issue time is recorded beside it. A repetition whose
step was not fully queued when the GPU reached it (the sleep was too short) is repeated with a
longer sleep, up to three times, and counted in :attr:`Timing.unqueued` when that does not
help (a step with more kernels than the GPU's launch queue holds blocks the host whatever the
sleep; the point's later repetitions then run once each).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Timing", "TimingOptions", "attention_kernel_names", "time_call"]

_SLEEP_MARGIN_S = 0.0005
_MAX_SLEEP_S = 2.0
_RETRIES = 3


@dataclass(frozen=True, slots=True)
class TimingOptions:
    """How many times to run a measured callable, and whether to queue CUDA steps ahead."""

    warmup: int = 2
    min_repeats: int = 6
    max_repeats: int = 20
    target_s: float = 1.0
    queue_ahead: bool = True

    def to_json(self) -> dict:
        return {"warmup": self.warmup, "min_repeats": self.min_repeats,
                "max_repeats": self.max_repeats, "target_s": self.target_s,
                "queue_ahead": self.queue_ahead}


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds of each timed repetition, the host's issue time of each, and how many
    repetitions were not fully queued ahead of the GPU (0 when queueing ahead was off)."""

    seconds: tuple[float, ...]
    host_seconds: tuple[float, ...] = ()
    unqueued: int = 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min_s(self) -> float:
        return min(self.seconds)

    @property
    def host_s(self) -> float:
        """Median host issue time (0 when not recorded)."""
        return statistics.median(self.host_seconds) if self.host_seconds else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_CYCLES_PER_S: dict[int, float] = {}


def _cycles_per_second(device: torch.device) -> float:
    """GPU clock cycles per second of ``torch.cuda._sleep`` on ``device`` (measured once)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CYCLES_PER_S:
        cycles = 2_000_000
        torch.cuda._sleep(1000)
        torch.cuda.synchronize(device)
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        _CYCLES_PER_S[index] = cycles / max(best, 1e-6)
    return _CYCLES_PER_S[index]


def _one(fn: Callable[[], object], device: torch.device, sleep_cycles: int = 0) -> tuple[float, float, bool]:
    """(seconds, host issue seconds, fully queued) of one call; ``sleep_cycles`` > 0 queues it
    behind a GPU sleep of that many cycles (CUDA)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        start.record()
        t0 = time.perf_counter()
        fn()
        host = time.perf_counter() - t0
        queued = bool(sleep_cycles) and not start.query()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, host, queued
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return seconds, seconds, False


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
    ahead = opts.queue_ahead and device.type == "cuda"
    issue = 0.0
    for _ in range(opts.warmup):               # the last warm-up's issue time sizes the sleep
        t0 = time.perf_counter()
        run()
        issue = time.perf_counter() - t0
        _sync(device)
    _sync(device)
    cps = _cycles_per_second(device) if ahead else 0.0
    sleep_s = 1.5 * issue + _SLEEP_MARGIN_S
    unqueued = 0
    retries = _RETRIES

    def rep() -> tuple[float, float]:
        nonlocal sleep_s, unqueued, retries
        for _ in range(retries + 1):
            seconds, host, queued = _one(run, device, int(sleep_s * cps) if ahead else 0)
            if not ahead or queued:
                return seconds, host
            sleep_s = min(2.0 * max(sleep_s, host) + _SLEEP_MARGIN_S, _MAX_SLEEP_S)
        unqueued += 1
        retries = 0            # a longer sleep did not help (the launch queue is full): stop trying
        return seconds, host

    first, first_host = rep()
    extra = int(opts.target_s / max(first, 1e-9))
    count = max(opts.min_repeats, min(opts.max_repeats, extra))
    reps = [(first, first_host)] + [rep() for _ in range(count - 1)]
    del keep
    return Timing(tuple(s for s, _ in reps), tuple(h for _, h in reps), unqueued)


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
