"""A lower bound on a deployment's TTFT percentile, to skip simulations that cannot meet a
TTFT target.

Every served request must prefill at least its *uncached* prompt tokens: its prompt less the
most an unlimited cache could serve it (:func:`~hybridkv.sim.bounds.bound_inputs.reuse_ceiling_tokens`;
no cache, tier, hint or router hits more). A deployment of ``n`` instances prefills at most
``n x C*`` tokens per second, ``C*`` being the best prefill rate the cost model gives one
instance (:func:`peak_prefill_rate`: a step of at most the token budget, no cached context,
split into chunks any way, raised by the model's non-monotone slack). So, for any window of
requests ``j..k`` (in arrival order, arrival ``a``) and any ``m`` of them, the ``m`` that
get their first token last get it no earlier than ``a_j + (U - top_{m-1}) / (n C*)``, where
``U`` is the window's uncached tokens and ``top_{m-1}`` its ``m - 1`` largest; each of them
arrived by ``a_k``, so each waits at least ``a_j - a_k + (U - top_{m-1}) / (n C*)``.

A request is also prefilled on one instance, at most ``budget`` of its tokens per step: its
TTFT is at least the steps of its own uncached tokens alone, in chunks of the full budget from
its longest possible hit on (:meth:`PrefillBound.request_floors`; each chunk's step time by the
cost model, less its slack: extra work in a step, smaller chunks, more context never make a step
faster by more than that). This one does not depend on load or on the number of instances: a
deployment whose instances cannot prefill the longest prompts within the limit fails at any load.

With ``m = N - floor(p/100 (N - 1))`` requests above a value, ``numpy.percentile(ttfts, p)``
(linear interpolation) is above it too, so the largest such wait over the windows tried, or
the ``m``-th largest request floor (:meth:`PrefillBound.ttft_lower_bound`), is a lower bound
on TTFT pNN. A candidate whose bound exceeds its TTFT limit fails without being simulated. The
bounds ignore decode steps, queueing order and routing (all of which only add time), so they
are loose, never wrong by the cost model.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hybridkv.cost.calibrated import MONOTONE_SLACK

#: Window starts tried: the first request and this many evenly spaced others.
WINDOW_STARTS = 16


def peak_prefill_rate(cost, budget: int) -> float:
    """The most prompt tokens per second one instance prefills by ``cost`` (a cost model with
    ``step_time_arrays``): over steps of ``budget``, ``budget/2``, ``budget/4`` and ``budget/8``
    tokens with no cached context, each as one chunk or split into 2..64 equal chunks, the
    best tokens / step time, times ``1 + MONOTONE_SLACK``."""
    best = 0.0
    for tokens in {max(1, budget >> s) for s in range(4)}:
        for chunks in (1, 2, 4, 8, 16, 32, 64):
            if chunks > tokens:
                break
            new = np.full(chunks, tokens / chunks)
            t = cost.step_time_arrays(new, np.zeros(chunks))
            if t > 0:
                best = max(best, tokens / t)
    return best * (1.0 + MONOTONE_SLACK)


@dataclass(frozen=True)
class PrefillBound:
    """The served requests' arrival times, uncached prompt tokens and longest possible hits
    (arrival order)."""

    arrivals_s: np.ndarray
    uncached: np.ndarray
    hits: np.ndarray

    @classmethod
    def of(cls, arrivals_s: Sequence[float], prompt_lens: Sequence[int],
           ceiling_tokens: Sequence[int]) -> PrefillBound:
        if not len(arrivals_s) == len(prompt_lens) == len(ceiling_tokens):
            raise ValueError("arrivals, prompt lengths and ceilings must be per request")
        hits = np.minimum(np.asarray(ceiling_tokens, dtype=np.float64),
                          np.asarray(prompt_lens, dtype=np.float64))
        u = np.maximum(0, np.asarray(prompt_lens, dtype=np.float64) - hits)
        return cls(np.asarray(arrivals_s, dtype=np.float64), u, hits)

    def request_floors(self, cost, budget: int) -> np.ndarray:
        """Per request, the least time its own prefill takes on one instance timed by ``cost``:
        its uncached tokens in chunks of ``budget`` from its longest hit on, each chunk's step
        alone, over ``1 + MONOTONE_SLACK`` (module docstring)."""
        memo: dict[tuple[int, int], float] = {}
        out = np.zeros(len(self.uncached))
        for i, (u, h) in enumerate(zip(self.uncached.tolist(), self.hits.tolist())):
            t, at, left = 0.0, int(h), int(u)
            while left > 0:
                x = min(budget, left)
                key = (x, at)
                if key not in memo:
                    memo[key] = cost.step_time_arrays(np.array([float(x)]), np.array([float(at)]))
                t += memo[key]
                at += x
                left -= x
            out[i] = t / (1.0 + MONOTONE_SLACK)
        return out

    @staticmethod
    def over(percentile: float, n: int) -> int:
        """How many of ``n`` values must exceed x for ``numpy.percentile`` to exceed it."""
        return n - math.floor(percentile / 100.0 * (n - 1))

    def ttft_lower_bound(self, capacity_tok_s: float, percentile: float,
                         rate_scale: float = 1.0, floors: np.ndarray | None = None) -> float:
        """A lower bound on TTFT pNN (seconds, >= 0) at ``capacity_tok_s`` prefill tokens per
        second in all, with arrivals ``rate_scale`` times as fast, and with ``floors``
        (:meth:`request_floors` of one instance) the longest prompts' own prefill too (module
        docstring)."""
        n = len(self.uncached)
        if n == 0 or capacity_tok_s <= 0:
            return 0.0 if n == 0 else math.inf
        m = self.over(percentile, n)
        alone = float(np.sort(floors)[n - m]) if floors is not None and len(floors) == n else 0.0
        return max(alone, self._queue_bound(capacity_tok_s, m, rate_scale))

    def _queue_bound(self, capacity_tok_s: float, m: int, rate_scale: float) -> float:
        n = len(self.uncached)
        a = self.arrivals_s[0] + (self.arrivals_s - self.arrivals_s[0]) / rate_scale
        work = self.uncached / capacity_tok_s
        best = 0.0
        starts = sorted({0, *(i * n // (WINDOW_STARTS + 1) for i in range(1, WINDOW_STARTS + 1))})
        for j in starts:
            if n - j < m:
                break
            best = max(best, _window_bound(a, work, j, m))
        return best


def _window_bound(a: np.ndarray, work: np.ndarray, j: int, m: int) -> float:
    """max over k >= j + m - 1 of a_j - a_k + (sum work[j..k] - the m-1 largest of them)."""
    top: list[float] = []          # min-heap of the m - 1 largest works so far
    top_sum = total = 0.0
    best = 0.0
    aj = float(a[j])
    for k in range(j, len(work)):
        w = float(work[k])
        total += w
        if m > 1:
            if len(top) < m - 1:
                heapq.heappush(top, w)
                top_sum += w
            elif w > top[0]:
                top_sum += w - heapq.heapreplace(top, w)
        if k - j + 1 >= m:
            best = max(best, aj - float(a[k]) + total - top_sum)
    return best


__all__ = ["PrefillBound", "WINDOW_STARTS", "peak_prefill_rate"]
