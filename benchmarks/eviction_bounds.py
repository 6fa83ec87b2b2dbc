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
  are dead" rather than timing);
* three references for policies that evict by *age and class* (the shape of ``eva`` /
  ``eva-turns``), each evicting the (request chain, age) with the lowest hit density, tail
  first, where density(class, age) = P(next turn within H | idle for ``age`` requests) /
  E[requests held until then] is computed from the *whole trace's* turn gaps (the best curves
  an online learner could converge to; the best of a few horizons H): classes = the
  conversation's turn count 0/1/2/3/4+ (what a pool can count); turn x requests since the
  previous turn (none, < 300, more) x prompt blocks (< 16, < 32, more) x output tokens (< 200,
  < 400, more), fitted in-sample on 135 cells (generous to the policy); and turn classes told
  whether the conversation comes back at all (not when: future knowledge, a reference).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, OrderedDict, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hybridkv.sim.bounds.optimal import (belady_block_hit_rate, infinite_block_hit_rate,  # noqa: E402
                                  lru_block_hit_rate, next_use_indices)
from hybridkv.sim.traffic.traces import iter_mooncake_records, resolve_trace  # noqa: E402

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


#: Age buckets (requests since a chain was last used) of the class-age references.
AGE_EDGES = (0, 25, 50, 75, 100, 150, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200, 5000,
             8000, math.inf)


def turn_structure(sessions):
    """Per request: its turn index in its conversation and the index of the next turn (None)."""
    turn, nxt, last, seen = [0] * len(sessions), [None] * len(sessions), {}, Counter()
    for i, s in enumerate(sessions):
        turn[i] = seen[s]
        seen[s] += 1
        if s in last:
            nxt[last[s]] = i
        last[s] = i
    return turn, nxt


def density_table(classes, nxt, horizon: int) -> np.ndarray:
    """density[class, age bucket] = P(next turn within ``horizon`` | idle > age) / expected
    requests held until the next turn or the horizon, from the whole trace's gaps."""
    gaps = defaultdict(list)
    for i, c in enumerate(classes):
        gaps[c].append(math.inf if nxt[i] is None else nxt[i] - i)
    table = np.zeros((max(classes) + 1, len(AGE_EDGES) - 1))
    for c, g in gaps.items():
        g = np.array(g, dtype=float)
        for b in range(len(AGE_EDGES) - 1):
            lo, hi = AGE_EDGES[b], AGE_EDGES[b + 1]
            age = lo if b == 0 else (lo + hi) / 2 if hi < math.inf else 1.5 * lo
            alive = g[g > age]
            if age < horizon and len(alive):
                held = np.minimum(alive, horizon) - age
                table[c, b] = np.mean(alive <= horizon) / max(1.0, float(np.mean(held)))
    return table


def class_age_policy(keys, limits, capacity: int, classes, table: np.ndarray) -> float:
    """Block hit rate of a cache that evicts the request chain (the blocks a request used
    last) of lowest ``table[class, age bucket]``, oldest first among equals, tail first."""
    owner: dict = {}                 # block -> request that used it last
    chains: dict[int, list] = {}     # request -> its blocks, root first (stale entries skipped)
    edges = np.array(AGE_EDGES[:-1])
    size = hits = refs = 0
    for i, (ks, lim) in enumerate(zip(keys, limits)):
        h = 0
        for k in ks[:lim]:
            if k not in owner:
                break
            h += 1
        hits += h
        refs += lim
        for k in ks:
            size += k not in owner
            owner[k] = i
        chains[i] = list(ks)
        if size <= capacity:
            continue
        ids = np.fromiter(chains, dtype=np.int64)
        cls = np.array([classes[g] for g in ids])
        dens = table[cls, np.searchsorted(edges, i - ids, side="right") - 1]
        for g in ids[np.lexsort((ids, dens))]:
            chain = chains[int(g)]
            while chain and size > capacity:
                k = chain.pop()
                if owner.get(k) == g:
                    del owner[k]
                    size -= 1
            chain[:] = [k for k in chain if owner.get(k) == g]
            if not chain:
                del chains[int(g)]
            if size <= capacity:
                break
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
          f"{'lru+dead-oracle':>16} {'age x turn':>16} {'age x 4 features':>16} "
          f"{'age x turn+returns':>19}")
    turn, nxt = turn_structure(sessions)
    by_turn = [min(t, 4) for t in turn]
    by_return = [2 * c + (n is not None) for c, n in zip(by_turn, nxt)]
    last, prev_gap = {}, []
    for i, s in enumerate(sessions):
        prev_gap.append(0 if s not in last else 1 if i - last[s] < 300 else 2)
        last[s] = i
    by_features = [((t * 3 + g) * 3 + min(len(ks) // 16, 2)) * 3 + min(o // 200, 2)
                   for t, g, ks, o in zip(by_turn, prev_gap, keys, outputs)]
    nus = next_use_indices(keys)
    for text in args.sizes.split(","):
        cap = parse_size(text) // BLOCK
        b = belady_block_hit_rate(keys, cap, limits, next_uses=nus)
        f = belady_block_hit_rate(keys, cap, limits, next_uses=nus, footprints=fps)
        lru = lru_block_hit_rate(keys, cap)
        lru_rate = lru.block_hits / b.block_refs
        oracle = lru_dead_oracle(keys, limits, cap)
        ages = [max(class_age_policy(keys, limits, cap, cls, density_table(cls, nxt, hz))
                    for hz in (800, 1600, 3200)) for cls in (by_turn, by_features, by_return)]
        print(f"{text:>8} {cap:>7} {b.hit_rate:>8.4f} {f.hit_rate:>12.4f} {lru_rate:>8.4f} "
              f"{lru_rate / b.hit_rate:>11.3f} {oracle:>9.4f} ({oracle / b.hit_rate:.3f})"
              + "".join(f" {a:>9.4f} ({a / b.hit_rate:.3f})" for a in ages), flush=True)


if __name__ == "__main__":
    main()
