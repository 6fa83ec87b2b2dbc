"""One plan from start to end: the cheapest choice, what each feature saves, the goodput of
the deployments up to the choice, and the :class:`~hybridkv.sim.plan.report.Plan` record."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from hybridkv.core.validation import check_int
from hybridkv.sim.plan.report import NODE_GPUS, Plan, Window
from hybridkv.sim.plan.search import Planner, Run
from hybridkv.sim.plan.slo import EDGE_RATIO
from hybridkv.sim.plan.space import Candidate, Deployment, Space


@dataclass(frozen=True)
class GoodputSearch:
    """How a plan measures goodput (``plan --goodput-rows/--goodput-precision/--goodput-runs``).

    Attributes:
        rows: candidates whose goodput is measured (:func:`goodput_candidates`; 0: none).
        precision: > 1: the ratio of a bisection bracket's ends to stop at.
        max_runs: >= 1: simulations per candidate at most.
    """

    rows: int = 4
    precision: float = 1.25
    max_runs: int = 4

    def __post_init__(self) -> None:
        check_int("GoodputSearch.rows", self.rows, 0)
        if not (isinstance(self.precision, (int, float)) and self.precision > 1
                and math.isfinite(self.precision)):
            raise ValueError(f"goodput precision must be a finite number > 1, got {self.precision!r}")
        check_int("GoodputSearch.max_runs", self.max_runs, 1)


def goodput_candidates(space: Space, listed: Sequence[Run], chosen: Run | None,
                       rows: int) -> list[Candidate]:
    """Whose goodput a plan measures: per deployment evaluated at the trace's load and no
    dearer than the choice (all, without one), the candidate with the most headroom there (the
    choice itself for its deployment). The choice's deployment, then the others closest to
    meeting the SLO (lowest ratio; simulated before pruned, then the dearer), ``rows`` in all,
    cheapest first."""
    if rows <= 0:
        return []
    limit = None if chosen is None else space.cost(chosen.candidate)
    best: dict[Deployment, Run] = {}
    for r in listed:
        if limit is not None and space.cost(r.candidate) > limit + 1e-9:
            continue
        d = r.candidate.deployment
        cur = best.get(d)
        if r is chosen or cur is None or (cur is not chosen and r.ratio < cur.ratio):
            best[d] = r
    runs = list(best.values())
    rank = sorted(range(len(runs)), key=lambda i: (runs[i] is not chosen, not runs[i].simulated,
                                                   runs[i].ratio, -i))
    keep = set(rank[:rows])
    return [r.candidate for i, r in enumerate(runs) if i in keep]


def make_plan(planner: Planner, window: Window, base: list[str], limits: list[str],
              search: GoodputSearch | None = None) -> Plan:
    """Run the plan's searches on ``planner`` and gather them (``base``: the ``simulate``
    command's workload part, for the candidates' commands; ``search``: how goodput is measured,
    default :class:`GoodputSearch`)."""
    search = search if search is not None else GoodputSearch()
    chosen = planner.cheapest()
    saved = planner.saved(chosen)
    order = {c: i for i, c in enumerate(planner.space.candidates())}
    listed = sorted((r for (_, s), r in planner.runs.items() if s == 1.0),
                    key=lambda r: order[r.candidate])
    cands = goodput_candidates(planner.space, listed, chosen, search.rows)
    goodput = planner.goodput(cands, search.precision, search.max_runs)
    edge = [] if chosen is None or chosen.ratio <= EDGE_RATIO else [
        f"the choice meets the SLO at the edge ({chosen.ratio:.0%} of a limit): the next "
        "candidate up is the margin"]
    per = 0 if chosen is None else chosen.candidate.deployment.gpus_per_instance
    if per > NODE_GPUS:
        edge.append(f"the choice runs instances of {per} GPUs, more than one node's {NODE_GPUS}: "
                    "its tensor parallelism crosses nodes (priced over the inter-node link; "
                    "--gpus-per-instance caps it)")
    return Plan(planner.slo, planner.space, window, base, listed, chosen, goodput, saved,
                list(planner.runs.values()), planner.stats, limits + edge)


__all__ = ["goodput_candidates", "make_plan"]
