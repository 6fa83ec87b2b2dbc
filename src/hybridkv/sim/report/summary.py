"""Turning simulation results into a table, JSON and plots (matplotlib, Agg backend)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

from hybridkv.sim.simulator import SimResult


def _fmt(v: object, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}{unit}"
    return f"{v}{unit}"


def bounds_line(seconds: dict[str, float], reused: bool) -> str:
    """What each bound took, slowest first (``keys``: hashing the workload and its key stream;
    ``gap``: the gap report after the step loop; the rest ran beside it in a large run)."""
    text = ", ".join(f"{k} {v:.2f}" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]))
    return text + ("  (the rest reused from an earlier run of this workload and size)" if reused
                   else "")


def summary_table(res: SimResult, verbose: bool = False) -> str:
    """A human-readable summary of one run; ``verbose`` adds the seconds each bound took."""
    d = res.to_json()
    frac = d["fraction_of_optimal"]
    rows = [
        ("requests", _fmt(d["requests"]) + (f"  ({d['rejected']} rejected: prompt >= max_model_len)"
                                             if d["rejected"] else "")
         + ("  (PARTIAL: interrupted; admitted so far)" if d["partial"] else "")),
        ("prompt tokens", _fmt(d["prompt_tokens"])),
        ("token hit rate", f"{d['hit_rate']:.4f}  ({d['hit_tokens']} hit tokens)"),
        ("block hit rate", f"{d['block_hit_rate']:.4f}"),
        *([("block hit rate by group", ", ".join(f"{k}={v:.4f}" for k, v in d["block_hit_rate_by_group"].items())
            + "  (each group's own hit: a group below the rest cut the hit)")]
          if len(d["block_hit_rate_by_group"]) > 1 else []),
        ("offline optimum (Belady)", _fmt(d["optimal_block_hit_rate"])
         + (f"  (online = {frac:.1%} of it)" if frac is not None else "")),
        *([("hybrid bound", f"{d['hybrid_bound_block_hit_rate']:.4f}  ("
            + (f"online = {d['fraction_of_hybrid_bound']:.1%} of it; "
               if d["fraction_of_hybrid_bound"] is not None else "")
            + "a hit must end where every group kept its span)")]
          if d["hybrid_bound_block_hit_rate"] is not None else []),
        ("unlimited cache", _fmt(d["unlimited_cache_block_hit_rate"])
         + ("  (one request at a time, same requests)" if d["gap"] else "")),
        ("non-anticipative (hazard)", _fmt(d["hazard_bound_block_hit_rate"])
         + (f"  (online = {d['fraction_of_hazard_bound']:.1%} of it; ranks by age x turn, "
            "curves fitted on this run)" if d["fraction_of_hazard_bound"] is not None else "")),
        ("TTFT p50 / p90 / p99", " / ".join(_fmt(d[k], " s") for k in
                                            ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"))),
        ("inter-token latency", _fmt(d["itl_mean_s"], " s")),
        ("output throughput", _fmt(d["throughput_tok_s"], " tok/s")),
        ("preemptions", _fmt(d["preemptions"])),
        ("evictions", _fmt(d["evictions"])),
        ("blocks in use mean / peak", f"{d['mean_cache_usage']:.3f} / {d['peak_cache_usage']:.3f} of the "
         "pool, held by running requests (cached free blocks are evictable, not counted)"),
        ("retained blocks per group", ", ".join(f"{k}={v}" for k, v in d["retained_blocks"].items())),
        ("engine steps", _fmt(d["steps"])),
        ("wall time", f"{d['wall_s']:.2f} s"),
    ]
    if d.get("sim_steps_per_s") is not None:
        rows.append(("simulator speed", f"{d['sim_steps_per_s']:,.0f} steps/s, "
                     f"{d['sim_requests_per_s']:,.1f} requests/s (step loop {d['sim_s']:.2f} s)"))
    if verbose and (d["bounds_s"] or d["bounds_reused"]):
        rows.append(("bounds (seconds)", bounds_line(d["bounds_s"], d["bounds_reused"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def explain_gap(res: SimResult, has_state: bool = False) -> str:
    """Why the online block hit rate is below the optimum, from the measured
    :class:`~hybridkv.sim.bounds.optimal.GapReport` ("" when there is no gap or no report).
    ``has_state``: the preset has recurrent-state groups (retention is where checkpoints are)."""
    g = res.gap
    if g is None or res.prompt_blocks == 0 or g.online_blocks >= g.optimum_blocks:
        return ""
    # the optimum and the unlimited cache count the full-attention blocks only
    pb = res.prompt_blocks
    lines = [f"why online < optimum ({g.online_blocks:,} vs {g.optimum_blocks:,} of {pb:,} prompt "
             f"blocks hit; an unlimited cache would hit {g.ceiling_blocks:,}):"]
    if g.ceiling_blocks > g.optimum_blocks:
        lines.append(f"  cache size: even the optimum misses {g.ceiling_blocks - g.optimum_blocks:,} "
                     f"blocks ({(g.ceiling_blocks - g.optimum_blocks) / pb:.1%}) an unlimited cache hits")
    if g.in_flight_blocks:
        lines.append(f"  timing: {g.in_flight_blocks:,} blocks ({g.in_flight_blocks / pb:.1%}) missed by "
                     f"{_requests(g.in_flight_requests)} admitted before the request that first "
                     "computed them had finished (concurrent serving; the bounds serve one at a time)")
    if g.retained_blocks:
        gone = "evicted, or never stored" if res.evictions else "never stored: nothing was evicted"
        label, where = (("checkpoints", f"the recurrent-state groups had no checkpoint at that "
                         f"length ({gone}; checkpoints are written where requests ended, at "
                         f"shared-prefix junctions and every --retention-interval tokens: "
                         f"{_interval(res)})") if has_state else
                        ("windows", f"a sliding-window or chunked group no longer held the tokens "
                         f"before that point ({gone}; --retention-interval {_interval(res)})"))
        lines.append(f"  {label}: {g.retained_blocks:,} blocks ({g.retained_blocks / pb:.1%}) missed "
                     f"by {_requests(g.retained_requests)} whose full-attention blocks were cached, "
                     f"but {where}")
    never = res.hybrid_unservable_blocks
    if never:
        lines.append(f"  never servable: {never:,} of the blocks an unlimited cache hits ({never / pb:.1%}) "
                     f"no cache of this configuration serves: no {'checkpoint' if has_state else 'window'} "
                     f"is ever stored where they end (the hybrid bound's own limit; --retention-interval "
                     f"{_interval(res)})")
    if g.routed_blocks:
        lines.append(f"  routing: {g.routed_blocks:,} blocks ({g.routed_blocks / pb:.1%}) missed by "
                     f"{_requests(g.routed_requests)} routed to another instance than the one that "
                     "had computed them")
    if g.evicted_blocks:
        lines.append(f"  eviction: {g.evicted_blocks:,} blocks ({g.evicted_blocks / pb:.1%}) missed by "
                     f"{_requests(g.evicted_requests)} because the full-attention blocks were no "
                     f"longer (or never) cached ({res.evictions:,} evictions in all)")
    return "\n".join(lines)


def _interval(res: SimResult) -> str:
    v = res.config.get("retention_interval", 0)
    return "none" if v is None else str(v)


def format_next_steps(steps: list[str]) -> str:
    """The ``next steps:`` block (``""`` for no steps)."""
    if not steps:
        return ""
    return "\n".join(["next steps:", *(f"  - {s}" for s in steps)])


def _requests(n: int) -> str:
    return f"{n:,} request" + ("" if n == 1 else "s")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plots need matplotlib: pip install 'hybridkv[sim]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_run(res: SimResult, path: str | Path, title: str = "") -> None:
    """PNG: cumulative block hit rate (with the optimum) and cache usage over time."""
    plt = _pyplot()
    t = [p[0] for p in res.timeline]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(t, [p[1] for p in res.timeline], label="online block hit rate (cumulative)")
    opt = res.optimal_block_hit_rate
    if opt is not None:
        ax1.axhline(opt, color="tab:red", linestyle="--", label=f"offline optimum {opt:.3f}")
    ax1.set_ylabel("hit rate")
    ax1.set_ylim(0, 1)
    ax1.legend(loc="lower right")
    ax2.plot(t, [p[2] for p in res.timeline], color="tab:green")
    ax2.set_ylabel("blocks in use (running requests)")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("request" if res.config.get("sequential") else "simulated time (s)")
    fig.suptitle(textwrap.fill(title or "hybridkv simulate", 80), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cluster(res, path: str | Path, title: str = "") -> None:
    """PNG: each instance's cumulative block hit rate (with the cluster's optimum) and blocks in
    use over time (``res``: a :class:`~hybridkv.sim.cluster.loop.ClusterResult`)."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    many = len(res.instances) > 8
    for i, r in enumerate(res.instances):
        t = [p[0] for p in r.timeline]
        label = None if many else f"instance {i}"
        ax1.plot(t, [p[1] for p in r.timeline], linewidth=0.8, label=label)
        ax2.plot(t, [p[2] for p in r.timeline], linewidth=0.8, label=label)
    opt = res.overall.optimal_block_hit_rate if res.overall is not None else None
    if opt is not None:
        ax1.axhline(opt, color="black", linestyle="--", label=f"offline optimum {opt:.3f}")
    ax1.set_ylabel("block hit rate (cumulative)")
    ax1.set_ylim(0, 1)
    ax1.legend(loc="lower right", fontsize=8)
    ax2.set_ylabel("blocks in use")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("simulated time (s)")
    fig.suptitle(textwrap.fill(title or f"{len(res.instances)} instances, router {res.router}", 80),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(xs: Sequence[float], results: Sequence[SimResult], path: str | Path, xlabel: str,
               title: str = "", log_x: bool = True) -> None:
    """PNG: block hit rate (and token hit rate) against the swept value, optimum drawn."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [r.block_hit_rate for r in results], marker="o", label="online block hit rate")
    ax.plot(xs, [r.hit_rate for r in results], marker=".", linestyle=":", label="online token hit rate")
    opts = [r.optimal_block_hit_rate for r in results]
    if all(o is not None for o in opts):
        ax.plot(xs, opts, marker="s", linestyle="--", color="tab:red", label="offline optimum (Belady)")
    if log_x and min(xs) > 0:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title or "hybridkv sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_policies(names: list[str], values: list, rows: list[dict], path, title: str = "") -> None:
    """PNG: per policy, block hit rate (left, optimum dashed) and fraction of the optimum (right)
    against the cache size."""
    plt = _pyplot()
    xs = list(values)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, p in enumerate(names):
        rs = rows[i * len(xs):(i + 1) * len(xs)]
        ax1.plot(xs, [r["block_hit_rate"] for r in rs], marker="o", label=p)
        ax2.plot(xs, [r["fraction_of_optimal"] or 0.0 for r in rs], marker="o", label=p)
    ax1.plot(xs, [r["optimal_block_hit_rate"] or 0.0 for r in rows[:len(xs)]], marker="s",
             linestyle="--", color="black", label="offline optimum (Belady)")
    for ax, label in ((ax1, "block hit rate"), (ax2, "fraction of the offline optimum")):
        if min(xs) > 0:
            ax.set_xscale("log")
        ax.set_xlabel("KV cache size (tokens)")
        ax.set_ylabel(label)
        ax.set_ylim(0, 1.05 if ax is ax2 else None)
        ax.grid(alpha=0.3)
    ax1.set_ylim(bottom=0)
    ax2.legend(fontsize=8)
    ax1.legend(fontsize=8)
    fig.suptitle(f"eviction policies: {title}" if title else "eviction policies", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
