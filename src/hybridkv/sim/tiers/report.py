"""KV tiers in words and pictures: the per-tier table of one run, the table and plot of a sweep
over CPU tier sizes (hit rate and TTFT against size)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hybridkv.sim.simulator import SimResult

__all__ = ["plot_tier_sweep", "tier_summary", "tier_sweep_table"]


def _tokens(n: int) -> str:
    for unit, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return str(n)


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g} s"


def tier_summary(res: SimResult, without: SimResult | None = None) -> str:
    """Per tier: capacity, hit rate, tokens and GB loaded, GB written; the transfer time and what
    the steps waited for it; TTFT and hit rate without the tiers beside the run's ("" without
    tiers)."""
    t = res.tiers
    if t is None:
        return ""
    d = res.to_json()
    by_tier = d["hit_rate_by_tier"]
    tiers = t.config.get("tiers", {})
    admit = t.config.get("admit_after", 1)
    policy = t.policy + (f", a block written at sighting {admit}" if admit > 1 else "")
    lines = [f"KV tiers ({policy}; the optimum above bounds the whole hierarchy, free transfers):",
             f"  {'tier':<7}{'capacity':>10}{'hit rate':>10}{'tokens loaded':>15}{'GB loaded':>11}"
             f"{'GB written':>12}  link",
             f"  {'gpu':<7}{_tokens(res.config.get('cache_tokens', 0)):>10}{by_tier['gpu']:>10.4f}"]
    for name in t.names:
        link = tiers.get(name, {}).get("link", {})
        bw = link.get("h2d_bw")
        lines.append(
            f"  {name:<7}{_tokens(tiers.get(name, {}).get('capacity_tokens', 0)):>10}"
            f"{by_tier.get(name, 0.0):>10.4f}{t.loaded_tokens[name]:>15,}"
            f"{t.loaded_bytes[name] / 1e9:>11.1f}{t.written_bytes[name] / 1e9:>12.1f}  "
            + ("unlimited" if bw is None else f"{bw / 1e9:.3g} GB/s") + f", {link.get('latency_s', 0) * 1e6:.3g} us")
    wait = "" if t.load_wait_s_total is None else f", steps waited {t.load_wait_s_total:.4g} s for it"
    lines.append(f"  transfers: loads {t.load_s_total:.4g} s ({t.loads:,} loads, {t.loads_failed:,} "
                 f"failed and recomputed){wait}; writes {t.offload_s_total:.4g} s")
    extra = []
    if t.contention_s_total:
        extra.append(f"copies overlapping steps added {t.contention_s_total:.4g} s to them")
    if t.admission_refused:
        extra.append(f"{t.admission_refused:,} writes refused by the admission filter")
    if extra:
        lines.append("  " + "; ".join(extra))
    if without is not None:
        w = without.to_json()
        lines.append(f"  without tiers: token hit rate {w['hit_rate']:.4f} (with: {d['hit_rate']:.4f}), "
                     f"TTFT p50 / p99 {_s(w['ttft_p50_s'])} / {_s(w['ttft_p99_s'])} "
                     f"(with: {_s(d['ttft_p50_s'])} / {_s(d['ttft_p99_s'])}), "
                     f"ITL p50 / p99 {_s(w['itl_p50_s'])} / {_s(w['itl_p99_s'])} "
                     f"(with: {_s(d['itl_p50_s'])} / {_s(d['itl_p99_s'])})")
    return "\n".join(lines)


def tier_sweep_table(sizes: Sequence[int], rows: Sequence[dict]) -> str:
    """The table of a CPU tier size sweep: per size the token hit rate (all, GPU, CPU), the
    block hit rate beside the hierarchy's optimum (blocks), TTFT p50 / p99, tokens loaded and
    their transfer time."""
    lines = [f"{'CPU tier':>9} {'token hit rate: all':>19} {'gpu':>7} {'cpu':>7}  "
             f"{'blocks':>7} {'optimum':>8}  {'TTFT p50':>10} {'TTFT p99':>10}  "
             f"{'tokens loaded':>14} {'load s':>8}"]
    for size, r in zip(sizes, rows):
        if "error" in r:
            lines.append(f"{_tokens(size):>9} error: {r['error']}")
            continue
        by = r["hit_rate_by_tier"]
        tiers = r.get("tiers") or {}
        loaded = sum((tiers.get("loaded_tokens") or {}).values())
        opt = r["optimal_block_hit_rate"]
        p50, p99 = r["ttft_p50_s"], r["ttft_p99_s"]
        lines.append(f"{_tokens(size):>9} {r['hit_rate']:>19.4f} {by['gpu']:>7.4f} {by.get('cpu', 0.0):>7.4f}  "
                     f"{r['block_hit_rate']:>7.4f} {'n/a' if opt is None else f'{opt:.4f}':>8}  "
                     f"{'n/a' if p50 is None else f'{p50:.4g} s':>10} {'n/a' if p99 is None else f'{p99:.4g} s':>10}  "
                     f"{loaded:>14,} {r['load_s_total']:>8.2f}")
    return "\n".join(lines)


def plot_tier_sweep(sizes: Sequence[int], rows: Sequence[dict], path: str | Path, title: str = "") -> None:
    """PNG: block hit rate with the hierarchy's optimum, the token hit rate's GPU and CPU parts,
    and TTFT p50 / p99 against the CPU tier size (x on a symmetric log scale, so size 0 shows)."""
    from hybridkv.sim.report.summary import _pyplot
    plt = _pyplot()
    ok = [(s, r) for s, r in zip(sizes, rows) if "error" not in r]
    xs = [s for s, _ in ok]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax1.plot(xs, [r["block_hit_rate"] for _, r in ok], marker="o", label="block hit rate (all tiers)")
    ax1.plot(xs, [r["hit_rate_by_tier"]["gpu"] for _, r in ok], marker=".", linestyle=":",
             label="token hit rate served by the GPU")
    ax1.plot(xs, [r["hit_rate_by_tier"].get("cpu", 0.0) for _, r in ok], marker=".", linestyle=":",
             label="token hit rate loaded from the CPU tier")
    opts = [r["optimal_block_hit_rate"] for _, r in ok]
    if opts and all(o is not None for o in opts):
        ax1.plot(xs, opts, marker="s", linestyle="--", color="tab:red",
                 label="offline optimum of the hierarchy (blocks)")
    ax1.set_ylabel("hit rate")
    ax1.set_ylim(0, 1)
    timed = [(s, r) for s, r in ok if r["ttft_p50_s"] is not None]
    if timed:
        ax2.plot([s for s, _ in timed], [r["ttft_p50_s"] for _, r in timed], marker="o", label="TTFT p50")
        ax2.plot([s for s, _ in timed], [r["ttft_p99_s"] for _, r in timed], marker="o", label="TTFT p99")
    else:
        ax2.text(0.5, 0.5, "no TTFT in a sequential run", ha="center", transform=ax2.transAxes)
    ax2.set_ylabel("seconds")
    ax2.set_ylim(bottom=0)
    nonzero = [s for s in xs if s > 0]
    for ax in (ax1, ax2):
        if nonzero:
            ax.set_xscale("symlog", linthresh=min(nonzero))
        ax.set_xlabel("CPU tier size (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "hybridkv sweep: CPU tier size", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
