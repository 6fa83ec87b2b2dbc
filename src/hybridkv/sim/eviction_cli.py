"""``--eviction-policy`` (simulate, sweep) and ``--eviction-policies`` (sweep): the CLI of
:mod:`hybridkv.core.eviction`. Kept out of :mod:`hybridkv.sim.commands` but for three hooks."""

from __future__ import annotations

import argparse
import dataclasses
import sys
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
    """Option rules (ValueError): compat mode is LRU only; several policies sweep sizes only."""
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
        if getattr(args, "plot", None):
            raise ValueError("--plot draws one policy; drop --plot or give one --eviction-policy")


def sweep_policies(args: argparse.Namespace, runs: list, items: list,
                   run_sweep: Callable) -> tuple[list[dict], int]:
    """Run ``runs`` (value, SimConfig) once per policy of ``args.eviction_policies``; print a
    policy x size table. Returns the JSON rows (each with ``config.eviction_policy``) and the
    number of failed configurations."""
    names = args.eviction_policies
    all_runs = [(v, dataclasses.replace(cfg, eviction_policy=p)) for p in names for v, cfg in runs]
    rows, results, failed = run_sweep(args, all_runs, items)
    values = [v for v, _ in runs]
    lines = ["", f"{'policy':>8} " + " ".join(f"{str(v):>22}" for v in values),
             f"{'':>8} " + " ".join(f"{'hit rate / of optimum':>22}" for _ in values)]
    for i, p in enumerate(names):
        cells = []
        for j in range(len(values)):
            r = rows[i * len(values) + j]
            if "error" in r:
                cells.append(f"{'error':>22}")
            else:
                frac = r["fraction_of_optimal"]
                cells.append(f"{r['block_hit_rate']:>13.4f} / {'-' if frac is None else f'{frac:.3f}':>5}")
        lines.append(f"{p:>8} " + " ".join(cells))
    print("\n".join(lines), file=sys.stdout)
    return rows, failed
