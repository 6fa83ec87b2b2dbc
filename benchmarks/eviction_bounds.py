"""What a Mooncake trace allows an eviction policy: its reuse structure and the bounds.

    python benchmarks/eviction_bounds.py [--trace mooncake-conversation] [--sizes 1M,3M,10M]

Block level (512-token blocks, one request at a time, no simulator: a few seconds), on the
trace's own chained block ids. Prints

* structure: requests, block references, distinct blocks and how many are ever reused, the
  conversations (requests grouped by their second block id: the first is the system prompt all
  share), how often a conversation comes back after its k-th turn and after how many requests;
* how well what a policy can see predicts whether a conversation comes back: requests are
  put in cells by (turn index, requests since the previous turn, output length, prompt length)
  and the share of prompt blocks in cells (of 20+ requests) whose return rate is below 0.2 or
  above 0.8 is printed — the blocks an online policy could confidently call dead or alive;
* per cache size, as hit rates: the infinite cache (the reuse ceiling); Belady with bypass (the
  offline optimum the simulator reports); Belady under the pool's footprint (a running request's
  misses hold blocks of their own: a tighter bound on every policy, online or not,
  ``belady_block_hit_rate(..., footprints=...)``); LRU; and LRU told which blocks are never
  used again (a reference that uses the future: how much of LRU's gap is "keeping blocks that
  are dead" rather than timing).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, OrderedDict, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hybridkv.sim.optimal import (belady_block_hit_rate, infinite_block_hit_rate,  # noqa: E402
                                  lru_block_hit_rate, next_use_indices)
from hybridkv.sim.traces import iter_mooncake_records, resolve_trace  # noqa: E402

BLOCK = 512


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6}.get(text[-1], 1)
    return int(float(text.rstrip("KM")) * mult)


def load(trace: str):
    keys, limits, footprints, sessions, outputs = [], [], [], [], []
    for rec in iter_mooncake_records(resolve_trace(trace)):
        chain, k = [], ()
        for h in rec.hash_ids[: rec.input_length // BLOCK]:   # full blocks only are cached
            k = hash((k, h))
            chain.append(k)
        keys.append(chain)
        limits.append((rec.input_length - 1) // BLOCK)
        footprints.append(-(-(rec.input_length + rec.output_length) // BLOCK))
        sessions.append(rec.hash_ids[1] if len(rec.hash_ids) > 1 else None)
        outputs.append(rec.output_length)
    return keys, limits, footprints, sessions, outputs


def lru_dead_oracle(keys, limits, capacity: int) -> float:
    """LRU that never keeps a block with no next use (future knowledge: a reference only)."""
    nus = next_use_indices(keys)
    cache: OrderedDict = OrderedDict()
    hits = refs = 0
    for i, (ks, lim) in enumerate(zip(keys, limits)):
        h = 0
        for k in ks[:lim]:
            if k not in cache:
                break
            h += 1
        hits += h
        refs += lim
        for k, nu in zip(reversed(ks), reversed(nus[i])):
            if nu == math.inf:
                cache.pop(k, None)
            else:
                cache[k] = None
                cache.move_to_end(k)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits / refs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="mooncake-conversation")
    ap.add_argument("--sizes", default="1M,3M,10M")
    args = ap.parse_args()
    keys, limits, fps, sessions, outputs = load(args.trace)
    uses = Counter(k for ks in keys for k in ks)
    print(f"{args.trace}: {len(keys)} requests, {sum(map(len, keys))} cached-block references, "
          f"{len(uses)} distinct blocks, {sum(1 for v in uses.values() if v > 1)} reused")
    turns = defaultdict(list)
    for i, s in enumerate(sessions):
        if s is not None:
            turns[s].append(i)
    sizes = Counter(len(v) for v in turns.values())
    at_least = lambda n: sum(c for k, c in sizes.items() if k >= n)  # noqa: E731
    print(f"conversations (second block id): {len(turns)}; come back after turn 1/2/3/4: "
          + " / ".join(f"{at_least(k + 1) / max(1, at_least(k)):.2f}" for k in (1, 2, 3, 4)))
    gaps = [b - a for v in turns.values() for a, b in zip(v, v[1:])]
    if gaps:
        pct = np.percentile(gaps, [10, 50, 90])
        mean_blocks = sum(map(len, keys)) / len(keys)
        print(f"requests between two turns: p10 {pct[0]:.0f}, p50 {pct[1]:.0f}, p90 {pct[2]:.0f} "
              f"(one request adds {mean_blocks:.1f} blocks on average)")
    cells: dict = defaultdict(lambda: [0, 0, 0])     # cell -> requests, returns, blocks
    for v in turns.values():
        for j, i in enumerate(v):
            gap = None if j == 0 else min((v[j] - v[j - 1]) // 200, 5)
            cell = (min(j, 5), gap, min(outputs[i] // 200, 5), min(len(keys[i]) // 16, 6))
            c = cells[cell]
            c[0] += 1
            c[1] += j + 1 < len(v)
            c[2] += len(keys[i])
    sure = sum(c[2] for c in cells.values() if c[0] >= 20 and not 0.2 <= c[1] / c[0] <= 0.8)
    print(f"prompt blocks whose return an online policy can call (cells with rate < 0.2 or > 0.8): "
          f"{sure / max(1, sum(c[2] for c in cells.values())):.3f}")
    inf = infinite_block_hit_rate(keys)
    print(f"infinite cache: {inf.hit_rate:.4f}\n")
    print(f"{'cache':>8} {'blocks':>7} {'belady':>8} {'pool-belady':>12} {'lru':>8} {'lru/belady':>11} "
          f"{'lru+dead-oracle':>16}")
    nus = next_use_indices(keys)
    for text in args.sizes.split(","):
        cap = parse_size(text) // BLOCK
        b = belady_block_hit_rate(keys, cap, limits, next_uses=nus)
        f = belady_block_hit_rate(keys, cap, limits, next_uses=nus, footprints=fps)
        lru = lru_block_hit_rate(keys, cap)
        lru_rate = lru.block_hits / b.block_refs
        oracle = lru_dead_oracle(keys, limits, cap)
        print(f"{text:>8} {cap:>7} {b.hit_rate:>8.4f} {f.hit_rate:>12.4f} {lru_rate:>8.4f} "
              f"{lru_rate / b.hit_rate:>11.3f} {oracle:>9.4f} ({oracle / b.hit_rate:.3f})")


if __name__ == "__main__":
    main()
