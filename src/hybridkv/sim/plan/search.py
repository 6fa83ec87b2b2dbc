"""The plan's search: the cheapest candidate that meets an SLO, each deployment's goodput, and
what each feature saves.

The planner never runs a simulation itself: it hands ``(candidate, rate scale)`` pairs to an
*evaluator* (the command line runs them on the sweep executors) and keeps every answer, so a
pair is simulated at most once however many questions need it. Before asking, it asks the
*bound* (:mod:`hybridkv.sim.plan.bound`) for a lower bound on each TTFT target; a pair whose
bound is over the limit fails unsimulated (*pruned*).

* :meth:`Planner.cheapest`: candidates are taken level by level in order of cost (equal cost:
  one level, all evaluated together); the first level with a candidate that meets the SLO
  gives the choice: the one with the most headroom (lowest :meth:`SLO.ratio`). So every
  cheaper candidate was evaluated and failed.
* :meth:`Planner.saved`: the same search over the candidates without a feature (CPU tier,
  hints, KV-aware routing); the space holds each feature's "off" value too, so the levels
  below the choice are answered from what was already run.
* :meth:`Planner.goodput`: per candidate, the highest rate scale it meets the SLO at: doubling
  (or halving) from the trace's load until the answer flips, then geometric bisection until the
  bracket is within ``precision``, at most ``max_runs`` simulations per candidate. All
  candidates step together, so each step is one batch for the executor. It assumes meeting
  the SLO is monotone in load (true of queues, not proven of every router).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Mapping, Sequence

from hybridkv.sim.plan.early import MISSED
from hybridkv.sim.plan.slo import SLO, metrics
from hybridkv.sim.plan.space import FEATURES, Candidate, Space


@dataclass(frozen=True)
class Measured:
    """What an evaluator returns for one pair: the run's JSON (``SimResult.to_json()`` keys,
    a cluster's too) or the error that stopped it, and the seconds it took."""

    result: Mapping[str, Any] | None
    error: str | None = None
    wall_s: float = 0.0


#: ``evaluate(pairs)`` -> one :class:`Measured` per ``(candidate, rate scale)``, in order.
Evaluator = Callable[[Sequence[tuple[Candidate, float]]], Sequence[Measured]]
#: ``bound(candidate, rate_scale, percentile)`` -> a lower bound on TTFT at that percentile.
Bound = Callable[[Candidate, float, int], float]

#: The keys of a run's JSON a plan keeps beside the SLO metrics.
SUMMARY_KEYS = ("requests", "rejected", "hit_rate", "throughput_tok_s", "itl_mean_s",
                "makespan_s", "preemptions", "output_tokens")


@dataclass(frozen=True)
class Run:
    """One evaluated ``(candidate, rate scale)``.

    ``values`` are the SLO metrics (:func:`~hybridkv.sim.plan.slo.metrics`, all None when it was
    pruned or failed), ``ratio`` the SLO ratio (inf: pruned, failed, or a metric missing),
    ``bound_s`` the TTFT lower bound that pruned it, ``stopped`` why the run was stopped once
    it had missed a TTFT target for sure (:mod:`hybridkv.sim.plan.early`), ``summary`` the
    :data:`SUMMARY_KEYS` of its JSON."""

    candidate: Candidate
    scale: float
    values: Mapping[str, float | None]
    ratio: float
    simulated: bool
    bound_s: float | None = None
    summary: Mapping[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None
    stopped: str | None = None

    @property
    def meets(self) -> bool:
        return self.error is None and self.stopped is None and self.ratio <= 1.0


@dataclass(frozen=True)
class Goodput:
    """The highest rate scale ``candidate`` was seen to meet the SLO at (``scale``; None: not
    even the lowest tried) and the lowest it failed at (``fails_at``; None: never failed up to
    the highest tried), with every run of its search."""

    candidate: Candidate
    scale: float | None
    fails_at: float | None
    runs: tuple[Run, ...]

    @property
    def run(self) -> Run | None:
        """The run at :attr:`scale`."""
        return next((r for r in self.runs if r.scale == self.scale), None)


@dataclass(frozen=True)
class Saved:
    """What ``feature`` saves: the cheapest candidate with everything (``with_``) against the
    cheapest without the feature (``without``; None: none within the space). ``searched``:
    False when the space never held the feature both on and off."""

    feature: str
    searched: bool
    with_: Run | None = None
    without: Run | None = None


@dataclass
class Stats:
    """How much the search ran: simulations, pairs pruned by the bound, pairs answered from
    earlier runs, and seconds (the simulations' own, and the evaluator's wall clock)."""

    simulated: int = 0
    pruned: int = 0
    reused: int = 0
    stopped: int = 0
    failed: int = 0
    sim_s: float = 0.0
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return {"simulations": self.simulated, "pruned": self.pruned, "reused": self.reused,
                "stopped_early": self.stopped, "failed": self.failed, "simulation_s": self.sim_s, "wall_s": self.wall_s}


class Planner:
    """Answers the plan's questions over ``space`` (module docstring)."""

    def __init__(self, space: Space, slo: SLO, evaluate: Evaluator, bound: Bound | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.space = space
        self.slo = slo
        self.evaluate = evaluate
        self.bound = bound
        self.progress = progress
        self.runs: dict[tuple[Candidate, float], Run] = {}
        self.stats = Stats()

    # ---- evaluation ----------------------------------------------------------------------
    def run_all(self, pairs: Sequence[tuple[Candidate, float]]) -> list[Run]:
        """Each pair's :class:`Run`: remembered, pruned by the bound, or evaluated (all the
        pairs left in one call)."""
        todo: list[tuple[Candidate, float]] = []
        for pair in dict.fromkeys(pairs):
            if pair in self.runs:
                self.stats.reused += 1
                continue
            pruned = self._prune(*pair)
            if pruned is not None:
                self.runs[pair] = pruned
                self.stats.pruned += 1
            else:
                todo.append(pair)
        if todo:
            if self.progress is not None:
                self.progress(f"simulating {len(todo)} configuration(s)")
            t0 = time.perf_counter()
            answers = self.evaluate(todo)
            self.stats.wall_s += time.perf_counter() - t0
            for pair, m in zip(todo, answers):
                self.runs[pair] = self._run(pair, m)
        return [self.runs[p] for p in pairs]

    def _prune(self, c: Candidate, scale: float) -> Run | None:
        if self.bound is None:
            return None
        for t in self.slo.targets:
            if t.metric != "ttft":
                continue
            lb = self.bound(c, scale, t.percentile)
            if lb > t.limit_s:
                return Run(c, scale, {k: None for k in metrics({})}, math.inf, False, bound_s=lb)
        return None

    def _run(self, pair: tuple[Candidate, float], m: Measured) -> Run:
        self.stats.simulated += 1
        self.stats.sim_s += m.wall_s
        if m.result is None and m.error is not None and m.error.startswith(MISSED):
            self.stats.stopped += 1
            return Run(pair[0], pair[1], {k: None for k in metrics({})}, math.inf, True,
                       wall_s=m.wall_s, stopped=m.error.split(": ", 1)[-1])
        if m.result is None:
            self.stats.failed += 1
            return Run(pair[0], pair[1], {k: None for k in metrics({})}, math.inf, True,
                       wall_s=m.wall_s, error=m.error or "no result")
        values = metrics(m.result)
        summary = {k: m.result.get(k) for k in SUMMARY_KEYS}
        return Run(pair[0], pair[1], values, self.slo.ratio(values), True, summary=summary,
                   wall_s=m.wall_s, error=m.error)

    # ---- the cheapest candidate ------------------------------------------------------------
    def cheapest(self, keep: Callable[[Candidate], bool] | None = None) -> Run | None:
        """The run of the cheapest candidate (of those ``keep`` accepts) meeting the SLO at
        the trace's load; None when none does within the space."""
        cands = [c for c in self.space.candidates() if keep is None or keep(c)]
        for level in self.space.levels(cands):
            runs = self.run_all([(c, 1.0) for c in level])
            ok = [r for r in runs if r.meets]
            if ok:
                return min(ok, key=lambda r: r.ratio)       # min keeps the first of equals
        return None

    def saved(self, chosen: Run | None) -> list[Saved]:
        """One :class:`Saved` per feature of :data:`FEATURES`."""
        out = []
        for f in FEATURES:
            if not self.space.searches(f):
                out.append(Saved(f, False))
                continue
            without = self.cheapest(lambda c, f=f: not self.space.feature_on(f, c))
            out.append(Saved(f, True, chosen, without))
        return out

    # ---- goodput -----------------------------------------------------------------------------
    def goodput(self, cands: Sequence[Candidate], precision: float = 1.25, max_runs: int = 4,
                lowest: float = 1 / 16, highest: float = 16.0) -> list[Goodput]:
        """Each candidate's :class:`Goodput` (module docstring); the candidates' searches step
        together. ``precision`` > 1: the ratio of the bracket's ends to stop at."""
        if not precision > 1:
            raise ValueError(f"goodput precision must be > 1, got {precision!r}")
        gens = [self._bisect(c, precision, max_runs, lowest, highest) for c in cands]
        results: list[Goodput | None] = [None] * len(gens)
        asks: dict[int, float] = {}
        for i, g in enumerate(gens):
            asks[i] = next(g)
        while asks:
            runs = self.run_all([(cands[i], s) for i, s in asks.items()])
            nxt: dict[int, float] = {}
            for (i, _), r in zip(list(asks.items()), runs):
                try:
                    nxt[i] = gens[i].send(r)
                except StopIteration as stop:
                    results[i] = stop.value
            asks = nxt
        return [r for r in results if r is not None]

    @staticmethod
    def _bisect(c: Candidate, precision: float, max_runs: int, lowest: float,
                highest: float) -> Generator[float, Run, Goodput]:
        runs: list[Run] = []
        lo: float | None = None
        hi: float | None = None

        def spent() -> bool:
            return sum(r.simulated for r in runs) >= max_runs

        s = 1.0
        while True:
            r = yield s
            runs.append(r)
            if r.meets:
                lo = s
            else:
                hi = s
            if lo is not None and hi is not None:
                break
            s = s * 2 if lo is not None else s / 2
            if spent() or not lowest <= s <= highest:
                return Goodput(c, lo, hi, tuple(runs))
        while hi / lo > precision and not spent():    # type: ignore[operator]
            s = float(f"{math.sqrt(lo * hi):.3g}")    # type: ignore[operator]
            if not lo < s < hi:                        # type: ignore[operator]
                break
            r = yield s
            runs.append(r)
            if r.meets:
                lo = s
            else:
                hi = s
        return Goodput(c, lo, hi, tuple(runs))


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (x, y) no other point beats in both (higher is better in each),
    in order of x descending; equal points keep the first."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1], i))
    front: list[int] = []
    best_y = -math.inf
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front


__all__ = ["Bound", "Evaluator", "Goodput", "Measured", "Planner", "Run", "SUMMARY_KEYS", "Saved",
           "Stats", "pareto_front"]
