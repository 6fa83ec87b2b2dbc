"""Manager cost per request on a multi-turn chat trace: full attention only and full + sliding
window, with a 10k-block and a 1M-block pool (cost must not grow with the pool), then with
EAGLE (k = 3): lookahead hashing, vLLM's drop mode, and the lookahead passed explicitly.

Each request: lookup, allocate the uncached prompt, one allocate per decoded token (the answer
the next turn contains), free. Only manager calls are timed (hashing included). Two figures
per decode step: the whole run's time per decode step (lookups, prompts and frees included)
and a decode step's manager call alone (the decode loops' time less the same loops without
the call).

    python benchmarks/bench_manager.py
    python benchmarks/bench_manager.py --compare OLD/src [--rounds 5]
    python benchmarks/bench_manager.py --compare pure        # this tree: pure Python vs compiled

``--compare`` measures this tree against another checkout's ``src`` in the same run: the two
alternate in fresh processes, each config's time is the CPU time of its process (so other
jobs on the machine count less), best of 3 per process and best over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      SlidingWindow, SpecDecode)
from hybridkv.sim.traffic.workloads import ChatWorkload, multi_turn_chat
from hybridkv.core.cache_options import CacheOptions


def answers(trace):
    """Per request, the answer tokens the same session's next turn contains."""
    last = {}
    out = {}
    for r in trace:
        prev = last.get(r.session)
        if prev is not None:
            n = len(prev.prompt)
            out[prev.request_id] = r.prompt[n:n + prev.output_len].tolist()
        last[r.session] = r
    return out


def run(groups, num_blocks, trace, ans, spec=None, explicit=False,
        clock=time.perf_counter) -> tuple[float, float, int, float]:
    """``spec``: a SpecDecode; ``explicit``: pass its lookahead to every decode allocate as
    ``num_lookahead_tokens`` (what vLLM's scheduler does); ``clock``: wall or CPU time.
    Returns the whole run's time, the hit rate, the decode steps and the decode steps' manager
    time: the time of the decode loops less :func:`loop_cost` (their appends and counting)."""
    kv = KVCacheManager(KVCacheConfig(groups, num_blocks=num_blocks), CacheOptions(
        retention_interval=0, spec_decode=spec))
    la = kv.lookahead_slots if explicit else None
    reqs = [Request(r.request_id, r.prompt) for r in trace]
    loop = loop_cost(trace, ans, clock)
    t0 = clock()
    steps = 0
    decode = 0.0
    for r, req in zip(trace, reqs):
        hit = kv.lookup(req)
        assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        t1 = clock()
        for tok in ans.get(r.request_id, [1] * r.output_len):
            req.append_tokens((tok,))
            kv.allocate(req, 1, None, la)
            req.num_computed_tokens += 1
            steps += 1
        decode += clock() - t1
        kv.free(req)
    dt = clock() - t0
    s = kv.stats()
    return dt, s.hits / s.queries, steps, decode - loop


def loop_cost(trace, ans, clock) -> float:
    """The decode loops of :func:`run` without the manager's call (each token appended to a
    fresh request and counted): what the decode loops cost besides the manager, best of 3."""
    best = float("inf")
    for _ in range(3):
        reqs = [Request(r.request_id, r.prompt) for r in trace]
        total = 0.0
        for r, req in zip(trace, reqs):
            req.num_computed_tokens = req.num_tokens
            steps = 0
            t1 = clock()
            for tok in ans.get(r.request_id, [1] * r.output_len):
                req.append_tokens((tok,))
                req.num_computed_tokens += 1
                steps += 1                  # (as run's loop counts)
            total += clock() - t1
        best = min(best, total)
    return best


MODES = {
    "plain": (None, False),
    "eagle": (SpecDecode("eagle", 3), False),
    "eagle-drop": (SpecDecode("eagle", 3, hash_lookahead=False), False),
    "eagle-explicit": (SpecDecode("eagle", 3), True),
}


def setup():
    trace = multi_turn_chat(ChatWorkload(
        num_conversations=48, turns=5, system_tokens=1024, user_tokens=(64, 512),
        answer_tokens=(32, 128), concurrency=8, arrival_rate=None), seed=1)
    spec = dict(num_kv_heads=8, head_dim=128)
    configs = {
        "full": (KVCacheGroup("full", FullAttention(16, **spec), ("l0",)),),
        "full+swa": (KVCacheGroup("full", FullAttention(16, **spec), ("l0",)),
                     KVCacheGroup("swa", SlidingWindow(16, window=1024, **spec), ("l1",))),
    }
    return trace, answers(trace), configs


def measure_json() -> None:
    """One process of ``--compare``: every config x mode at 10k blocks, CPU time, as JSON."""
    trace, ans, configs = setup()
    out = {}
    for name, groups in configs.items():
        for mode, (spec, explicit) in MODES.items():
            dt, rate, steps, decode = min((run(groups, 10_000, trace, ans, spec, explicit,
                                               time.process_time) for _ in range(3)),
                                          key=lambda x: x[0])
            out[f"{name}/{mode}"] = [dt, rate, steps, decode]
    print(json.dumps(out))


def compare(old_src: str, rounds: int) -> None:
    import hybridkv
    new_src = os.path.dirname(os.path.dirname(os.path.abspath(hybridkv.__file__)))
    results: dict[str, list[dict]] = {"old": [], "new": []}
    for i in range(rounds):
        for side, src in (("old", old_src), ("new", new_src)):
            env = dict(os.environ, PYTHONPATH=new_src if src == "pure" else src)
            if src == "pure":            # the old side: this tree's .py source, never compiled
                env["HYBRIDKV_PURE_PYTHON"] = "1"
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json"], env=env,
                                 check=True, capture_output=True, text=True).stdout
            results[side].append(json.loads(out))
            print(f"round {i + 1} {side} done", file=sys.stderr)
    print(f"old: {old_src}\nnew: {new_src}")
    print(f"{'config':<26}{'old ms':>9}{'new ms':>9}{'new/old':>9}{'old us/step':>13}{'new us/step':>13}"
          f"{'old decode':>12}{'new decode':>12}{'hit rate':>10}")
    for key in results["old"][0]:
        old = min(r[key][0] for r in results["old"])
        new = min(r[key][0] for r in results["new"])
        steps = results["old"][0][key][2]
        old_dec = min(r[key][3] for r in results["old"])
        new_dec = min(r[key][3] for r in results["new"])
        rates = {r[key][1] for r in results["old"] + results["new"]}
        rate = f"{rates.pop():.3f}" if len(rates) == 1 else "DIFFERS"
        print(f"{key:<26}{old * 1e3:>9.1f}{new * 1e3:>9.1f}{new / old:>9.2f}"
              f"{old / steps * 1e6:>13.2f}{new / steps * 1e6:>13.2f}"
              f"{old_dec / steps * 1e6:>12.2f}{new_dec / steps * 1e6:>12.2f}{rate:>10}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", metavar="OLD_SRC",
                    help="another checkout's src directory, or 'pure': this tree's pure Python")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        measure_json()
    elif args.compare:
        compare(args.compare, args.rounds)
    else:
        table()


def table() -> None:
    trace, ans, configs = setup()
    tokens = sum(len(r.prompt) for r in trace)
    import hybridkv.core
    print(f"trace: {len(trace)} requests, {tokens} prompt tokens; core compiled: "
          f"{hybridkv.core.COMPILED}")
    print("us/step: the whole run per decode step; decode: a decode step's manager call alone")
    print(f"{'config':<10}{'blocks':>10}{'hit rate':>10}{'total s':>9}{'us/request':>12}{'us/step':>9}"
          f"{'decode':>8}")
    for name, groups in configs.items():
        base = None
        for nb in (10_000, 1_000_000):
            dt, rate, steps, dec = min((run(groups, nb, trace, ans) for _ in range(3)),
                                       key=lambda x: x[0])
            per = dt / len(trace) * 1e6
            base = base or per
            print(f"{name:<10}{nb:>10}{rate:>10.3f}{dt:>9.3f}{per:>12.1f}{dt / steps * 1e6:>9.2f}"
                  f"{dec / steps * 1e6:>8.2f}   ratio vs 10k: {per / base:.2f}")
    # Speculative decoding, 10k blocks: EAGLE k=3 with lookahead hashing, in vLLM's drop mode,
    # and with the lookahead passed explicitly on every decode step (as vLLM's scheduler does).
    modes = {k: v for k, v in MODES.items() if k != "plain"}
    print(f"{'config':<10}{'spec':>16}{'hit rate':>10}{'total s':>9}{'us/request':>12}{'us/step':>9}"
          f"{'decode':>8}")
    for name, groups in configs.items():
        for mode, (spec, explicit) in modes.items():
            dt, rate, steps, dec = min((run(groups, 10_000, trace, ans, spec, explicit)
                                        for _ in range(3)), key=lambda x: x[0])
            print(f"{name:<10}{mode:>16}{rate:>10.3f}{dt:>9.3f}{dt / len(trace) * 1e6:>12.1f}"
                  f"{dt / steps * 1e6:>9.2f}{dec / steps * 1e6:>8.2f}")


if __name__ == "__main__":
    main()
