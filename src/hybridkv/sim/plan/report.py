"""A plan's report: the candidates table, the choice and its cost, the goodput table, the
"saved by" lines, the search's own numbers and the honest limits; its JSON and its plot.

Costs are at the trace's load (:class:`Window`: the window's arrival span is what every
deployment is billed for, :mod:`hybridkv.sim.plan.pricing`). A candidate's ``command`` is the
``hybridkv simulate`` command line that reproduces its run: the workload's own options
(``base``), then :meth:`~hybridkv.sim.plan.space.Candidate.flags`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hybridkv.sim.plan.pricing import PRICE_SOURCE, TokenCost, token_cost
from hybridkv.sim.plan.search import Goodput, Run, Saved, Stats, pareto_front
from hybridkv.sim.plan.slo import EDGE_RATIO, SLO
from hybridkv.sim.plan.space import Candidate, Space

NODE_GPUS = 8
"""GPUs of one node (an NVLink domain of an HGX H100/H200/B200 board)."""
FEATURE_NAMES = {"cpu-tier": "CPU tier", "hints": "hints", "kv-routing": "KV-aware routing"}


@dataclass(frozen=True, slots=True)
class Window:
    """The traffic a plan is for: requests served, their arrival span and tokens (prompt, and
    output as served)."""

    requests: int
    span_s: float
    prompt_tokens: int
    output_tokens: int

    @property
    def req_s(self) -> float:
        return self.requests / self.span_s if self.span_s > 0 else 0.0

    def to_json(self) -> dict:
        return {"requests": self.requests, "span_s": self.span_s, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "req_s": self.req_s,
                "prompt_tok_s": self.prompt_tokens / self.span_s if self.span_s > 0 else None,
                "output_tok_s": self.output_tokens / self.span_s if self.span_s > 0 else None}


@dataclass
class Plan:
    """Everything a plan found (:mod:`hybridkv.sim.plan.search`), ready to print or write.

    ``listed``: the runs at the trace's load, cheapest first (the JSON's ``candidates``);
    ``chosen``: the cheapest that meets the SLO, or None; ``runs``: every run, other loads
    too (the plot's points)."""

    slo: SLO
    space: Space
    window: Window
    base: list[str]
    listed: list[Run]
    chosen: Run | None
    goodput: list[Goodput]
    saved: list[Saved]
    runs: list[Run]
    stats: Stats
    limits: list[str]

    def cost(self, c: Candidate) -> TokenCost:
        return token_cost(c.deployment.gpus, self.space.prices[c.deployment.gpu],
                          self.window.span_s, self.window.prompt_tokens, self.window.output_tokens)

    def command(self, c: Candidate, scale: float = 1.0) -> str:
        return shlex.join([*self.base, *c.flags(scale)])


# ---- numbers of a run ------------------------------------------------------------------------


def per_gpu(run: Run) -> float | None:
    """Output tokens per second per GPU (the run's throughput over its GPUs)."""
    tput = run.summary.get("throughput_tok_s")
    return None if tput is None else tput / run.candidate.deployment.gpus


def per_user(run: Run) -> float | None:
    """Output tokens per second a user sees while decoding: 1 / mean inter-token latency."""
    itl = run.summary.get("itl_mean_s")
    return 1.0 / itl if itl else None


def _t(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.4g} s"


def _usd(v: float | None) -> str:
    return "n/a" if v is None else f"${v:.4g}"


# ---- JSON -------------------------------------------------------------------------------------


def run_json(plan: Plan, r: Run) -> dict:
    c = r.candidate
    d = {"label": c.label(), "deployment": c.deployment.to_json(), "options": c.options.to_json(),
         "gpus": c.deployment.gpus, "rate_scale": r.scale, "command": plan.command(c, r.scale),
         "simulated": r.simulated, "meets_slo": r.meets,
         "at_edge": r.meets and r.ratio > EDGE_RATIO, "slo_ratio": r.ratio if r.ratio != float("inf") else None,
         **dict(r.values), "ttft_lower_bound_s": r.bound_s, "stopped_early": r.stopped,
         "error": r.error,
         **{k: v for k, v in r.summary.items()},
         "output_tok_s_per_gpu": per_gpu(r), "output_tok_s_per_user": per_user(r),
         "wall_s": r.wall_s}
    if r.scale == 1:
        d.update(plan.cost(c).to_json())
    return d


def to_json(plan: Plan) -> dict:
    listed = {(r.candidate, r.scale): i for i, r in enumerate(plan.listed)}

    def index(r: Run | None) -> int | None:
        return None if r is None else listed.get((r.candidate, r.scale))

    def goodput_json(g: Goodput) -> dict:
        run = g.run
        s = g.scale
        w = plan.window
        return {"label": g.candidate.label(), "deployment": g.candidate.deployment.to_json(),
                "options": g.candidate.options.to_json(), "gpus": g.candidate.deployment.gpus,
                "rate_scale": s, "fails_at_rate_scale": g.fails_at,
                "req_s": None if s is None else w.req_s * s,
                "prompt_tok_s": None if s is None or w.span_s <= 0 else w.prompt_tokens / w.span_s * s,
                "output_tok_s_per_gpu": None if run is None else per_gpu(run),
                "output_tok_s_per_user": None if run is None else per_user(run),
                "command": None if s is None else plan.command(g.candidate, s),
                "runs": [run_json(plan, r) for r in g.runs]}

    def saved_json(s: Saved) -> dict:
        d: dict = {"feature": s.feature, "searched": s.searched}
        if not s.searched:
            return d
        w, wo = s.with_, s.without
        d.update(with_candidate=index(w), without_candidate=index(wo),
                 gpus_with=None if w is None else w.candidate.deployment.gpus,
                 gpus_without=None if wo is None else wo.candidate.deployment.gpus,
                 usd_per_mtok_with=None if w is None else plan.cost(w.candidate).per_mtok,
                 usd_per_mtok_without=None if wo is None else plan.cost(wo.candidate).per_mtok)
        both = w is not None and wo is not None
        d["gpus_saved"] = (wo.candidate.deployment.gpus - w.candidate.deployment.gpus) if both else None  # type: ignore[union-attr]
        d["usd_per_mtok_saved"] = (d["usd_per_mtok_without"] - d["usd_per_mtok_with"]) if both else None
        return d

    front = _front(plan.runs)
    return {"slo": str(plan.slo), "window": plan.window.to_json(),
            "prices_usd_per_gpu_hour": dict(plan.space.prices), "price_source": PRICE_SOURCE,
            "candidates": [run_json(plan, r) for r in plan.listed], "chosen": index(plan.chosen),
            "goodput": [goodput_json(g) for g in plan.goodput],
            "saved": [saved_json(s) for s in plan.saved],
            "front": [{"label": r.candidate.label(), "rate_scale": r.scale,
                       "output_tok_s_per_user": per_user(r), "output_tok_s_per_gpu": per_gpu(r),
                       "command": plan.command(r.candidate, r.scale)} for r in front],
            "search": plan.stats.to_json(), "limits": list(plan.limits)}


def _front(runs: Sequence[Run]) -> list[Run]:
    """The simulated runs meeting the SLO that no other beats in both tokens/s/user and
    tokens/s/GPU."""
    ok = [r for r in runs if r.meets and per_gpu(r) is not None and per_user(r) is not None]
    pts = [(per_user(r), per_gpu(r)) for r in ok]
    return [ok[i] for i in pareto_front(pts)]  # type: ignore[arg-type]


# ---- text ------------------------------------------------------------------------------------


def _ranges(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``#0-2, #5, #7-8``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"#{a}" if a == b else f"#{a}-{b}" for a, b in runs)


def candidates_table(plan: Plan, full: bool = False) -> str:
    """The candidates at the trace's load; without ``full`` the pruned ones as one line of
    their numbers (their bounds are in the JSON)."""
    keys = [t.key for t in plan.slo.targets]
    names = [t.name.upper().replace("-P", " p") for t in plan.slo.targets]
    head = f"  {'#':>3} {'GPUs':>4}  {'deployment (instances x GPUs): options':<60} " + " ".join(f"{n:>10}" for n in names)
    lines = [head + f" {'meets':>6} {'$/M tok':>9}"]
    pruned = [i for i, r in enumerate(plan.listed) if not r.simulated]
    for i, r in enumerate(plan.listed):
        if not r.simulated and not full:
            continue
        if r.stopped:
            vals = " ".join(f"{'missed' if k.startswith('ttft') else 'n/a':>10}" for k in keys)
        elif r.simulated:
            vals = " ".join(f"{_t(r.values.get(k)):>10}" for k in keys)
        else:
            vals = " ".join(f"{('>' + _t(r.bound_s)) if k.startswith('ttft') and r.bound_s is not None else 'n/a':>10}"
                            for k in keys)
        meets = "yes" if r.meets else ("pruned" if not r.simulated else (
            "error" if r.error else "stop" if r.stopped else "no"))
        mark = "*" if plan.chosen is not None and r is plan.chosen else " "
        lines.append(f" {mark}{i:>3} {r.candidate.deployment.gpus:>4}  {r.candidate.label():<60.60} {vals} "
                     f"{meets:>6} {_usd(plan.cost(r.candidate).per_mtok):>9}")
    if pruned and not full:
        lines.append(f"  pruned by the prefill bound (TTFT missed for sure; bounds in --json): "
                     f"{_ranges(pruned)}")
    return "\n".join(lines)


def chosen_lines(plan: Plan) -> str:
    r = plan.chosen
    if r is None:
        return (f"no candidate meets {plan.slo} at the trace's load within {plan.space.max_gpus} "
                "GPUs: raise --max-gpus, add GPU kinds, or relax the SLO")
    c, cost = r.candidate, plan.cost(r.candidate)
    vals = ", ".join(f"{t.name} {_t(r.values.get(t.key))} (limit {_t(t.limit_s)})" for t in plan.slo.targets)
    edge = (f"\n  at the edge: a metric is at {r.ratio:.0%} of its limit (above {EDGE_RATIO:.0%}); a little "
            "more traffic or slower steps break it" if r.ratio > EDGE_RATIO else "")
    return (f"chosen: #{plan.listed.index(r)} {c.label()}\n  {vals}\n"
            f"  cost at the trace's load: {_usd(cost.per_mtok)} per M tokens ({_usd(cost.per_m_input)} per M "
            f"input if input paid alone, {_usd(cost.per_m_output)} per M output if output paid alone); "
            f"{_usd(cost.usd)} for the window's {plan.window.span_s:,.0f} s{edge}\n"
            f"  reproduce: {plan.command(c)}")


def goodput_table(plan: Plan) -> str:
    lines = [f"  {'deployment (instances x GPUs): options':<60} {'rate scale':>10} {'req/s':>7} {'out tok/s/GPU':>13} "
             f"{'tok/s/user':>10}  first failing"]
    for g in plan.goodput:
        run, s = g.run, g.scale
        scale = (f"< {g.fails_at:g}" if s is None else f">= {s:g}" if g.fails_at is None else f"{s:g}")
        req = "n/a" if s is None else f"{plan.window.req_s * s:.3g}"
        gpu = None if run is None else per_gpu(run)
        user = None if run is None else per_user(run)
        lines.append(f"  {g.candidate.label():<60.60} {scale:>10} {req:>7} "
                     f"{'n/a' if gpu is None else f'{gpu:,.0f}':>13} {'n/a' if user is None else f'{user:.1f}':>10}  "
                     f"{'none tried' if g.fails_at is None else f'{g.fails_at:g}'}")
    return "\n".join(lines)


def saved_lines(plan: Plan) -> str:
    lines = []
    for s in plan.saved:
        name = FEATURE_NAMES[s.feature]
        if not s.searched:
            lines.append(f"  {name}: not searched (the options hold it only on or only off)")
            continue
        w, wo = s.with_, s.without
        if w is None and wo is None:
            lines.append(f"  {name}: nothing meets the SLO with or without it")
        elif w is None:
            lines.append(f"  {name}: nothing meets the SLO with it")
        elif wo is None:
            lines.append(f"  {name}: needed: without it nothing meets the SLO within "
                         f"{plan.space.max_gpus} GPUs (with it: {w.candidate.deployment.label()})")
        else:
            dg = wo.candidate.deployment.gpus - w.candidate.deployment.gpus
            dc = (plan.cost(wo.candidate).per_mtok or 0) - (plan.cost(w.candidate).per_mtok or 0)
            if abs(dc) < 1e-12:
                lines.append(f"  {name}: saves nothing here: the cheapest without it costs the same "
                             f"(#{plan.listed.index(wo)} {wo.candidate.label()})")
            else:
                lines.append(f"  {name}: saves {dg:d} GPU(s), {_usd(dc)} per M tokens: without it the "
                             f"cheapest is #{plan.listed.index(wo)} {wo.candidate.label()}")
    return "\n".join(lines)


def format_plan(plan: Plan, title: str) -> str:
    w = plan.window
    out = [title,
           f"  window: {w.requests:,} requests over {w.span_s:,.0f} s ({w.req_s:.3g} req/s, "
           f"{w.prompt_tokens / max(w.span_s, 1e-9):,.0f} prompt and {w.output_tokens / max(w.span_s, 1e-9):,.0f} "
           f"output tok/s); SLO {plan.slo}",
           "  prices: " + ", ".join(f"{k} ${v:g}/GPU-hour" for k, v in plan.space.prices.items()
                                    if k in plan.space.gpus) + f" ({PRICE_SOURCE} unless given)",
           "candidates at the trace's load, cheapest first (* chosen; stop: the run stopped once "
           "it had missed a TTFT limit for sure):",
           candidates_table(plan), chosen_lines(plan),
           "goodput: the highest load each deployment meets the SLO at (rate scale x the trace's):",
           goodput_table(plan), "saved by (the same search with the feature off):", saved_lines(plan)]
    s = plan.stats
    out.append(f"search: {s.simulated} simulations ({s.sim_s:,.1f} s of simulation, {s.wall_s:,.1f} s "
               f"wall; {s.stopped} stopped once a TTFT target was missed for sure), {s.pruned} pruned "
               f"by the prefill bound, {s.reused} answered from earlier runs"
               + (f", {s.failed} failed" if s.failed else ""))
    out.append("limits:")
    out += [f"  - {line}" for line in plan.limits]
    return "\n".join(out)


# ---- plot ------------------------------------------------------------------------------------


def plot_front(plan: Plan, path: str | Path, title: str = "") -> None:
    """PNG: output tokens/s per GPU against tokens/s per user, one point per simulated run
    (filled: meets the SLO), the runs no other beats in both joined as the front."""
    from hybridkv.sim.report.summary import _pyplot
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    runs = [r for r in plan.runs if r.simulated and per_gpu(r) is not None and per_user(r) is not None]
    labels = sorted({r.candidate.deployment.label() for r in runs})
    colors = {lab: plt.cm.tab10(i % 10) for i, lab in enumerate(labels)}
    for lab in labels:
        ok = [r for r in runs if r.candidate.deployment.label() == lab and r.meets]
        bad = [r for r in runs if r.candidate.deployment.label() == lab and not r.meets]
        ax.scatter([per_user(r) for r in ok], [per_gpu(r) for r in ok], color=colors[lab], label=lab)
        for r in ok:
            ax.annotate(f"x{r.scale:g}", (per_user(r), per_gpu(r)), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
        ax.scatter([per_user(r) for r in bad], [per_gpu(r) for r in bad], facecolors="none",
                   edgecolors=colors[lab])
    front = _front(plan.runs)
    if front:
        ax.plot([per_user(r) for r in front], [per_gpu(r) for r in front], color="black",
                linewidth=1, label="front (meets the SLO)")
    ax.set_xlabel("output tokens/s per user (1 / mean inter-token latency)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.legend(fontsize=8, title=f"filled: meets {plan.slo}", title_fontsize=8)
    ax.set_title(title or "hybridkv plan", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def limits(sources: Mapping[str, str], space: Space, window: Window) -> list[str]:
    """The honest-limits lines: where each GPU kind's step times come from, the deployment
    model, the tiers' and hints' one-instance rule, the prices, the window."""
    out = [f"step times, {gpu}: {src}" + (" (measured)" if "fitted to" in src or "profile" in src
                                           else " (datasheet scaling, not measured on it)")
           for gpu, src in sources.items()]
    if any(n > 1 for sizes in space.gpus.values() for n in sizes):
        out.append("GPUs inside one instance are tensor parallel, their all-reduces priced from "
                   "published collective measurements (not measured here); above "
                   f"{NODE_GPUS} GPUs an instance spans nodes and its collectives cross the inter-node link")
    out.append("a CPU tier and hints are simulated on one instance only, so candidates with "
               "several instances run without them")
    out.append(f"prices are one provider's on-demand list ({PRICE_SOURCE}) unless --gpu-hour-usd "
               "gives yours; host memory for the CPU tier is taken as included")
    out.append(f"the plan holds for this window ({window.requests:,} requests, {window.span_s:,.0f} s); "
               "goodput assumes meeting the SLO is monotone in load")
    return out


__all__ = ["FEATURE_NAMES", "Plan", "Window", "candidates_table", "chosen_lines", "format_plan",
           "goodput_table", "limits", "per_gpu", "per_user", "plot_front", "run_json", "saved_lines",
           "to_json"]
