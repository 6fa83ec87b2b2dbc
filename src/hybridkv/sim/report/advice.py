"""What to do next, computed from a finished run: the lines ``simulate`` ends with.

Each line is a number the run measured or a labelled estimate, and the option to act on it:

* **cache size** — from the run's :class:`~hybridkv.sim.bounds.whatif.WhatIf`: when the optimum at
  this size is below an unlimited cache, the hit rate a 2x cache would give, *estimated* as
  the online rate plus the block-level LRU model's gain from 1x to 2x (capped by the optimum at
  2x), with the option that measures it; otherwise that a larger cache would not help, and
  what the misses are instead;
* **retention** — blocks the full-attention groups held but a sliding-window group or a
  recurrent-state group could not serve (the gap report's ``retained_blocks``): the retention
  (checkpoint) interval to sweep;
* **instances** — the offered load against one instance's prefill rate by the cost model
  (:class:`~hybridkv.sim.cluster.loop.OfferedLoad`): the instances that keep up with the uncached
  prompt tokens at the measured hit rate. An average below capacity is not enough to say the
  instances keep up: the busiest minute's uncached rate must be within capacity too, and the
  run's TTFT p99 at most :data:`TAIL_TTFT_S`; otherwise the line says which one failed and
  asks for the instances the peak needs;
* **a shared prefix** — when many requests start with the same prompt prefix and some missed
  part of it online: the ``--prefix-retention`` that pins it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hybridkv.sim.cluster.loop import OfferedLoad
from hybridkv.sim.simulator import SimResult

__all__ = ["next_steps", "instances_needed"]

RETAINED_SHARE = 0.01
"""Retention advice needs at least this share of the prompt blocks lost to it."""

TAIL_TTFT_S = 10.0
"""A TTFT p99 above this many seconds is a backlog, not a load the instances keep up with (no
interactive service accepts it; prefilling even a 128k-token prompt alone takes a few seconds
on one H100)."""


def instances_needed(load: OfferedLoad, hit_rate: float) -> int:
    """Instances whose prefill (by the cost model) keeps up with the uncached prompt tokens."""
    uncached = load.prompt_tok_s * (1.0 - hit_rate)
    if load.capacity_tok_s <= 0 or not math.isfinite(load.capacity_tok_s):
        return 1
    return max(1, math.ceil(uncached / load.capacity_tok_s))


def next_steps(res: SimResult, load: OfferedLoad | None, instances: int = 1,
               larger_cache: Callable[[int], str] | None = None,
               has_state: bool = False,
               instances_option: Callable[[int], str | None] | None = None) -> list[str]:
    """The next-step sentences for ``res`` (``[]`` when there is nothing to say).

    Args:
        res: the finished run (its ``what_if`` and ``gap`` come from the optimum pass).
        load: the offered load of the same workload (None: sequential or one request).
        instances: how many instances served it.
        larger_cache: ``larger_cache(tokens)`` -> how to ask for a cache of that many tokens
            (e.g. ``--cache-tokens 7.7M --gpus 32``); None: ``--cache-tokens``.
        has_state: the preset has recurrent-state groups (retention means checkpoints).
        instances_option: ``instances_option(n)`` -> the options that run ``n`` instances
            (default ``--instances n``; a deployment's ``--dp n``), or None where ``n`` cannot
            run (fewer ranks of a data-parallel-attention deployment may not hold the experts).
    """
    steps: list[str] = []
    cache = _cache_step(res, larger_cache)
    if cache:
        steps.append(cache)
    retained = _retention_step(res, has_state)
    if retained:
        steps.append(retained)
    if load is not None and load.prompt_tok_s > 0:
        steps.append(_load_step(load, res.hit_rate, instances, _p99(res),
                                instances_option or (lambda n: f"--instances {n}")))
    prefix = _prefix_step(res)
    if prefix:
        steps.append(prefix)
    return steps


def _cache_step(res: SimResult, larger_cache: Callable[[int], str] | None) -> str | None:
    w, g = res.what_if, res.gap
    pb = res.prompt_blocks
    if w is None or g is None or pb == 0:
        return None
    online = res.block_hit_rate
    opt, ceiling = g.optimum_blocks / pb, g.ceiling_blocks / pb
    tokens = 2 * res.config.get("cache_tokens", 0)
    how = (larger_cache(tokens) if larger_cache is not None and tokens
           else f"--cache-tokens {tokens:,}" if tokens else "twice --cache-tokens")
    if g.online_blocks >= g.ceiling_blocks:
        return (f"cache size: the online run already hits what an unlimited cache would "
                f"({ceiling:.3f}); a larger cache would not raise it")
    if g.optimum_blocks >= g.ceiling_blocks:
        if res.evictions and (g.retained_blocks or g.evicted_blocks):
            return (f"cache size: the offline optimum keeps every block an unlimited cache hits "
                    f"({ceiling:.3f}), but the online run lost {g.evicted_blocks / pb:.1%} of the "
                    f"blocks to eviction and {g.retained_blocks / pb:.1%} where other groups' "
                    f"windows or checkpoints were gone ({res.evictions:,} evictions); a larger "
                    f"cache may recover them, which only a run shows: measure it with {how}")
        return (f"cache size: a larger cache would not raise the hit rate; at this size the "
                f"optimum already equals an unlimited cache ({ceiling:.3f}); the online run's "
                f"misses are timing ({g.in_flight_blocks / pb:.1%}), other groups' windows or "
                f"checkpoints ({g.retained_blocks / pb:.1%}) and eviction ({g.evicted_blocks / pb:.1%})")
    lru, lru2, opt2 = w.lru_blocks / pb, w.lru_blocks_2x / pb, w.optimum_blocks_2x / pb
    estimate = min(opt2, max(online, online + lru2 - lru))
    return (f"cache size: a 2x cache would raise the block hit rate from {online:.3f} to about "
            f"{estimate:.3f} (estimated: the block-level LRU model goes {lru:.3f} -> {lru2:.3f} "
            f"at 2x, the optimum {opt:.3f} -> {opt2:.3f}); measure it with {how}")


def _retention_step(res: SimResult, has_state: bool) -> str | None:
    g = res.gap
    pb = res.prompt_blocks
    if g is None or pb == 0 or g.retained_blocks < RETAINED_SHARE * pb or res.evictions:
        return None        # with evictions, the cache-size step speaks for these blocks
    interval = res.config.get("retention_interval")
    now = "none" if interval is None else interval
    what = "recurrent-state checkpoints" if has_state else "sliding windows"
    return (f"retention: {g.retained_blocks:,} blocks ({g.retained_blocks / pb:.1%}) were held by "
            f"full attention but no {what} were kept at those lengths (--retention-interval "
            f"{now}, nothing evicted); compare intervals with hybridkv sweep --retention-intervals "
            f"0,64,256,1024 on the same options")


def _p99(res: SimResult) -> float | None:
    return float(np.percentile(res.ttft_s, 99)) if res.ttft_s else None


def _load_step(load: OfferedLoad, hit_rate: float, instances: int,
               ttft_p99: float | None = None,
               option: Callable[[int], str | None] = lambda n: f"--instances {n}") -> str:
    need = instances_needed(load, hit_rate)
    uncached = load.prompt_tok_s * (1.0 - hit_rate)
    each = load.capacity_tok_s
    if need <= instances:
        share = uncached / (instances * each) if each else 0.0
        peak = load.peak_prompt_tok_s
        peak_uncached = (peak if peak is not None else load.prompt_tok_s) * (1.0 - hit_rate)
        peak_share = peak_uncached / (instances * each) if each else 0.0
        tail = ttft_p99 is not None and ttft_p99 > TAIL_TTFT_S
        p99 = "" if ttft_p99 is None else f"; TTFT p99 {ttft_p99:,.2f} s"
        busiest = (f"the busiest {load.peak_window_s:,.0f} s bring {peak_uncached:,.0f} uncached "
                   f"tok/s ({_share(peak_share)} of it)")
        if peak_share > 1 or tail:
            more = max(instances + 1, math.ceil(peak_uncached / each) if each else instances + 1)
            who = "one instance keeps" if instances == 1 else f"{instances} instances keep"
            why = " and ".join(w for w, bad in (
                (busiest, peak_share > 1),
                (f"TTFT p99 is {ttft_p99:,.1f} s (over {TAIL_TTFT_S:g} s: a backlog)", tail)) if bad)
            return (f"instances: {who} up only on average ({uncached:,.0f} uncached tok/s, "
                    f"{_share(share)} of the prefill rate of {each:,.0f} tok/s per instance by "
                    f"the cost model), not at the peak or in the tail: {why}"
                    + _try(option(more)))
        who = "one instance keeps" if instances == 1 else f"{instances} instances keep"
        fewer_option = option(need) if need < instances else None
        fewer = f"; {need} would do (try {fewer_option})" if fewer_option else ""
        peak_text = f", {busiest}" if peak is not None else ""
        return (f"instances: {who} up with this load: uncached prompt tokens arrive at "
                f"{uncached:,.0f} tok/s ({1 - hit_rate:.0%} of {load.prompt_tok_s:,.0f}), "
                f"{_share(share)} of the prefill rate ({each:,.0f} tok/s per instance by the "
                f"cost model){peak_text}{p99}{fewer}")
    return (f"instances: this load needs {need} instances to keep up with prefill: uncached "
            f"prompt tokens arrive at {uncached:,.0f} tok/s ({1 - hit_rate:.0%} of "
            f"{load.prompt_tok_s:,.0f}) and one instance prefills about {each:,.0f} tok/s (the "
            f"cost model)" + _try(option(need)))


def _try(opts: str | None) -> str:
    """``; try OPTIONS --router kv-aware`` (nothing when no options run it)."""
    return f"; try {opts} --router kv-aware" if opts else ""


def _prefix_step(res: SimResult) -> str | None:
    w = res.what_if
    if w is None or not w.prefix_blocks or not w.prefix_missed:
        return None
    if res.config.get("prefix_retention"):
        return None
    tokens = w.prefix_blocks * res.config.get("key_block_size", 1)
    return (f"shared prefix: {w.prefix_requests:,} requests start with the same {tokens:,}-token "
            f"prefix and {w.prefix_missed:,} of them missed part of it online; pin it with "
            f"--eviction-policy priority --prefix-retention {tokens}:100")


def _share(x: float) -> str:
    return "under 1%" if 0 < x < 0.01 else f"{x:.0%}"
