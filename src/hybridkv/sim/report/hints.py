"""What hints did to a run: ``simulate``'s hint lines, ``sweep --hints``' accuracy table and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hybridkv.sim.simulator import SimResult


def _ttft(d: dict) -> str:
    v = d.get("ttft_p50_s")
    return "n/a" if v is None else f"{v:.3g} s"


def hint_summary(res: SimResult, base: SimResult | None) -> str:
    """The hints a run served and what the pool's hint layer did, with the run without hints
    (``base``, None: not run) beside it."""
    d = res.to_json()
    h = d["hints"]
    lines = [f"hints {h['source']}: {h['requests']:,} requests hinted ({h['last_turn_hints']:,} last "
             f"turns, {h['pin_hints']:,} pins, {h['resume_hints']:,} resume times)"]
    if base is not None:
        b = base.to_json()
        opt = d["optimal_block_hit_rate"]
        frac = (lambda x: f" ({x / opt:.3f} of the optimum)") if opt else (lambda x: "")
        lines.append(f"  block hit rate {b['block_hit_rate']:.4f}{frac(b['block_hit_rate'])} without "
                     f"hints -> {d['block_hit_rate']:.4f}{frac(d['block_hit_rate'])} with them; "
                     f"token hit rate {b['hit_rate']:.4f} -> {d['hit_rate']:.4f}; TTFT p50 "
                     f"{_ttft(b)} -> {_ttft(d)}")
    lines.append(f"  pool: {h['demoted']:,} blocks demoted, {h['pinned']:,} pinned; ignored {h['ignored_demotions']:,} demotions and {h['ignored_pins']:,} pins "
                 f"while honouring them did not pay; {h['pins_broken']:,} pinned blocks "
                 f"evicted early so a request could run, {h['pins_lapsed']:,} pins lapsed"
                 + (f"; {h['soft_pin_hints']:,} soft pins, refreshed {h['soft_refreshes']:,} times by a hit"
                    if h.get("soft_pin_hints") else ""))
    if h.get("forced"):
        lines.append("  every hint followed untested (:force): no shadow caches ran")
        return "\n".join(lines)
    lines.append(f"  shadow caches' recent hits (sampled blocks): hints ignored "
                 f"{h['shadow_plain_hits']:,.0f}, demotions honoured {h['shadow_demoting_hits']:,.0f}, "
                 f"pins honoured {h['shadow_pinning_hits']:,.0f}; honouring demotions now: "
                 f"{'yes' if h['honour_demotions'] else 'no'}, pins: {'yes' if h['honour_pins'] else 'no'}")
    return "\n".join(lines)


def hint_sweep_table(sizes: Sequence[object], labels: Sequence[str], rows: Sequence[dict],
                     timed: bool) -> str:
    """Rows in (size, label) order -> a table: label x size of block hit rate / fraction of
    the optimum (and TTFT p50 when ``timed``); the optimum and the non-anticipative reference
    of each size last."""
    n = len(labels)
    w = max(18, *(len(x) for x in labels))
    head = f"{'hints':>{w}} " + " ".join(f"{str(s):>24}" for s in sizes)
    sub = f"{'':>{w}} " + " ".join(f"{'hit rate / of optimum':>24}" for _ in sizes)
    lines = [head, sub]
    for i, label in enumerate(labels):
        cells = []
        for j in range(len(sizes)):
            r = rows[j * n + i]
            if "error" in r:
                cells.append(f"{'error':>24}")
                continue
            frac = r["fraction_of_optimal"]
            cell = f"{r['block_hit_rate']:.4f} / {'-' if frac is None else f'{frac:.3f}'}"
            if timed:
                cell += f" {_ttft(r)}"
            cells.append(f"{cell:>24}")
        lines.append(f"{label:>{w}} " + " ".join(cells))
    for key, name in (("optimal_block_hit_rate", "optimum (Belady)"),
                      ("hazard_bound_block_hit_rate", "non-anticipative")):
        vals = []
        for j in range(len(sizes)):
            r = next((rows[j * n + i] for i in range(n) if "error" not in rows[j * n + i]), {})
            v = r.get(key)
            vals.append(f"{'-' if v is None else f'{v:.4f}':>24}")
        lines.append(f"{name:>{w}} " + " ".join(vals))
    return "\n".join(lines)


def plot_hint_sweep(sizes: Sequence[object], accuracies: Sequence[float], rows: Sequence[dict],
                    path: str | Path, title: str, timed: bool) -> None:
    """Block hit rate (and TTFT p50 when ``timed``) against hint accuracy, one line per cache
    size; the run without hints and the optimum dashed. ``rows`` in (size, [none] + accuracies)
    order."""
    from hybridkv.sim.report.summary import _pyplot
    plt = _pyplot()
    n = len(accuracies) + 1
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 6.5, 4.2), squeeze=False)
    ax = axes[0][0]
    for j, size in enumerate(sizes):
        block = rows[j * n: (j + 1) * n]
        ys = [r.get("block_hit_rate") for r in block[1:]]
        line, = ax.plot(accuracies, ys, marker="o", label=f"{size} tokens")
        if "error" not in block[0]:
            ax.axhline(block[0]["block_hit_rate"], color=line.get_color(), linestyle=":", linewidth=1)
            opt = block[0].get("optimal_block_hit_rate")
            if opt is not None:
                ax.axhline(opt, color=line.get_color(), linestyle="--", linewidth=1)
    ax.set_xlabel("hint accuracy (0.5: random)")
    ax.set_ylabel("block hit rate")
    ax.set_title("hit rate (dotted: no hints; dashed: optimum)", fontsize=9)
    ax.legend(fontsize=8)
    if timed:
        ax2 = axes[0][1]
        for j, size in enumerate(sizes):
            block = rows[j * n: (j + 1) * n]
            ys = [r.get("ttft_p50_s") for r in block[1:]]
            line, = ax2.plot(accuracies, ys, marker="o", label=f"{size} tokens")
            if "error" not in block[0] and block[0].get("ttft_p50_s") is not None:
                ax2.axhline(block[0]["ttft_p50_s"], color=line.get_color(), linestyle=":", linewidth=1)
        ax2.set_xlabel("hint accuracy (0.5: random)")
        ax2.set_ylabel("TTFT p50 (s)")
        ax2.set_title("TTFT p50 (dotted: no hints)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["hint_summary", "hint_sweep_table", "plot_hint_sweep"]
