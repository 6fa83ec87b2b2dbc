"""``--eviction-policy`` (simulate, sweep) and ``--eviction-policies`` (sweep): the CLI of
:mod:`hybridkv.core.eviction`. Kept out of :mod:`hybridkv.sim.commands` but for three hooks."""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from typing import Callable

from hybridkv.core.eviction import POLICIES, RECOMMENDED, resolve_policy

# ``all``: the policies that order on their own (``priority`` without retention configs is LRU;
# it is swept with ``--prefix-retention`` and ``--eviction-policies priority``).
CONCRETE = tuple(p for p in POLICIES if p not in ("recommended", "priority"))


def parse_policy(text: str) -> str:
    """One policy name (``recommended`` kept as given; the manager resolves it)."""
    try:
        resolve_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_policy_list(text: str) -> list[str]:
    """``a,b,c`` or ``all`` -> distinct resolved names, in the given order."""
    if text.strip() == "all":
        return list(CONCRETE)
    out: list[str] = []
    for part in text.split(","):
        name = parse_policy(part.strip())
        name = resolve_policy(name)
        if name not in out:
            out.append(name)
    return out


def add_policy_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eviction-policy", type=parse_policy, default="lru", metavar="NAME",
                   help=f"order cached free blocks are reused in: {', '.join(POLICIES)} "
                        f"(default lru, vLLM's; recommended = {RECOMMENDED})")
    add_retention_option(p)


def parse_prefix_retention(text: str):
    """``TOKENS:PRIORITY[:TTL_S]`` -> :class:`~hybridkv.sim.simulator.PrefixRetention`."""
    from hybridkv.sim.simulator import PrefixRetention
    try:
        return PrefixRetention.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_retention_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix-retention", type=parse_prefix_retention, metavar="TOKENS:PRIORITY[:TTL_S]",
                   help="give every request's first TOKENS prompt tokens PRIORITY (0..100, default "
                        "35; lower is evicted first) for TTL_S simulated seconds after each use "
                        "(none: no expiry), e.g. 2048:100:600 pins a system prompt for 10 minutes; "
                        "needs --eviction-policy priority")


def add_sweep_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eviction-policies", type=parse_policy_list, metavar="A,B,C|all",
                   help=f"sweep these policies too (all = {','.join(CONCRETE)}); prints "
                        "policy x cache size -> hit rate and fraction of the optimum")


def check_args(args: argparse.Namespace) -> None:
    """Option rules (ValueError): compat mode is LRU only; several policies sweep sizes only
    (``--plot`` then draws every policy)."""
    names = getattr(args, "eviction_policies", None) or [resolve_policy(args.eviction_policy)]
    if getattr(args, "prefix_retention", None) is not None and any(n != "priority" for n in names):
        raise ValueError(f"--prefix-retention needs --eviction-policy priority (the only policy that "
                         f"reads retention); got {', '.join(names)}")
    if args.vllm_compat and any(n != "lru" for n in names):
        raise ValueError(f"--vllm-compat pins vLLM's LRU order; drop it or use --eviction-policy lru "
                         f"(got {', '.join(names)})")
    if getattr(args, "eviction_policies", None):
        if getattr(args, "retention_intervals", None) is not None:
            raise ValueError("sweep one thing at a time: --eviction-policies sweeps cache sizes "
                             "(--cache-tokens-list), not --retention-intervals")


def sweep_policies(args: argparse.Namespace, runs: list, items: list,
                   run_sweep: Callable, write_output: Callable | None = None) -> tuple[list[dict], int]:
    """Run ``runs`` (value, SimConfig) once per policy of ``args.eviction_policies``; print a
    policy x size table (with each policy's cost per pool operation against LRU, measured now)
    and, with ``--plot``, draw it (through ``write_output(path, write, what)``, the command's
    writer that never loses a finished result). Returns the JSON rows (each with ``config.eviction_policy``)
    and the number of failed configurations."""
    names = args.eviction_policies
    all_runs = [(v, dataclasses.replace(cfg, eviction_policy=p)) for p in names for v, cfg in runs]
    rows, results, failed = run_sweep(args, all_runs, items)
    values = [v for v, _ in runs]
    cost = op_cost(names)
    lines = ["", f"{'policy':>8} " + " ".join(f"{str(v):>22}" for v in values) + f"{'op cost':>9}",
             f"{'':>8} " + " ".join(f"{'hit rate / of optimum':>22}" for _ in values) + f"{'/ lru':>9}"]
    for i, p in enumerate(names):
        cells = []
        for j in range(len(values)):
            r = rows[i * len(values) + j]
            if "error" in r:
                cells.append(f"{'error':>22}")
            else:
                frac = r["fraction_of_optimal"]
                cells.append(f"{r['block_hit_rate']:>13.4f} / {'-' if frac is None else f'{frac:.3f}':>5}")
        lines.append(f"{p:>8} " + " ".join(cells) + f"{cost[p]:>9.2f}")
    print("\n".join(lines), file=sys.stdout)
    if getattr(args, "plot", None) and not failed and write_output is not None:
        print("wrote " + write_output(args.plot, lambda path: plot_policies(
            names, values, rows, path, title=args.trace or args.workload), "the plot"))
    return rows, failed


def pool_op_mix(pool, steps: int, seed: int, after_step=None) -> list[list[int]]:
    """Run a seeded mix of pool operations on ``pool`` (allocate runs of 1-4 blocks and cache
    their first two under fresh hashes; free a random held run tail first; after a free, 30%
    of the time take a hit on a random earlier hash); keeps at most half the pool held unless
    a coin says otherwise. ``after_step(pool)`` runs after every step. Returns the runs still
    held. The same mix times every policy here and in ``benchmarks/bench_pool.py`` /
    ``bench_policies.py``, and drives the policies' integrity test."""
    rng = random.Random(seed)
    held: list[list[int]] = []
    h = 0
    n = pool.num_blocks
    for _ in range(steps):
        k = rng.randrange(1, 5)
        if pool.num_free >= k and (len(held) < n // 2 or rng.random() < 0.5):
            got = pool.allocate(k)
            for b in got[:2]:
                h += 1
                pool.insert(0, h.to_bytes(8, "little"), b)
            held.append(got)
        elif held:
            pool.free(held.pop(rng.randrange(len(held)))[::-1])
            if rng.random() < 0.3:
                hb = pool.cached_block(0, rng.randrange(1, h + 1).to_bytes(8, "little"))
                if hb is not None:
                    pool.touch([hb])
                    held.append([hb])
        if after_step is not None:
            after_step(pool)
    return held


def _op_mix(pool, steps: int, seed: int) -> float:
    """:func:`pool_op_mix`'s process CPU seconds."""
    t0 = time.process_time()
    pool_op_mix(pool, steps, seed)
    return time.process_time() - t0


def op_cost(names: list[str], steps: int = 20_000, blocks: int = 4_000, rounds: int = 3) -> dict[str, float]:
    """Per policy: CPU time of the same pool-operation mix over LRU's (best of ``rounds``,
    alternating, in this process). ``benchmarks/bench_policies.py`` is the longer version."""
    from hybridkv.core.eviction import make_policy
    from hybridkv.core.pool import BlockPool, PolicyBlockPool
    every = ["lru"] + [p for p in names if p != "lru"]
    best = {p: math.inf for p in every}
    for _ in range(rounds):
        for p in every:
            pol = make_policy(p)
            pool = BlockPool(blocks, 1) if pol is None else PolicyBlockPool(blocks, 1, pol)
            best[p] = min(best[p], _op_mix(pool, steps, seed=0))
    return {p: best[p] / best["lru"] for p in every}


def plot_policies(names: list[str], values: list, rows: list[dict], path, title: str = "") -> None:
    """PNG: per policy, block hit rate (left, optimum dashed) and fraction of the optimum (right)
    against the cache size."""
    from hybridkv.sim.report import _pyplot
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
