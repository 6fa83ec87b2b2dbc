"""Each bound of a run, the per-key model (the reference) against the key stream, on a trace.

    python benchmarks/bench_bounds.py --limit 4000          # Mooncake conversation, 3M tokens

Hashes the first ``--limit`` requests of the Mooncake conversation trace at ``--block-size``
(the simulator's bound keys), then times, one after the other in this process, every bound
both ways: Belady at the capacity and at 2x, the block-level LRU model at 1x and 2x, the
unlimited cache and the hazard-rate reference (the per-key code of ``sim/bounds/optimal.py`` and
``sim/bounds/hazard.py``; ``sim/bounds/key_stream.py`` and the modules that read it). Every answer must be
equal, floats included, or the script exits 1.
"""

from __future__ import annotations

import argparse
import time

from hybridkv.sim.bounds.bound_inputs import _compute_bound_keys
from hybridkv.sim.bounds.hazard import hazard_bound, hazard_table, hazard_uses
from hybridkv.sim.bounds.hazard_stream import hazard_classes, stream_hazard_bound, stream_hazard_table
from hybridkv.sim.bounds.key_stream import key_stream, unlimited_hits
from hybridkv.sim.bounds.optimal import (belady_block_hit_rate, infinite_block_hit_rate,
                                  lru_block_hit_rate, next_use_indices)
from hybridkv.sim.bounds.stream_caches import belady_hits, lru_hits
from hybridkv.sim.traffic.traces import resolve_trace
from hybridkv.sim.traffic.workitems import items_from_mooncake, served_workload


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=4000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=187_500, help="key blocks (3M tokens at 16)")
    args = ap.parse_args()
    served, _ = served_workload(items_from_mooncake(resolve_trace("mooncake-conversation"), args.limit), None)
    (keys, limits), t_keys = timed(lambda: _compute_bound_keys(served, args.block_size))
    cap = args.capacity
    print(f"{len(keys)} requests, {sum(map(len, keys)):,} references; hashing {t_keys:.2f} s")
    old: dict[str, tuple] = {}
    new: dict[str, tuple] = {}
    uses, t = timed(lambda: next_use_indices(keys))
    old["next uses"] = (None, t)
    st, t = timed(lambda: key_stream(keys, limits))
    new["key stream"] = (None, t)
    old["optimum"] = timed(lambda: belady_block_hit_rate(keys, cap, limits, next_uses=uses).block_hits)
    new["optimum"] = timed(lambda: belady_hits(st, cap))
    old["optimum_2x"] = timed(lambda: belady_block_hit_rate(keys, 2 * cap, limits, next_uses=uses).block_hits)
    new["optimum_2x"] = timed(lambda: belady_hits(st, 2 * cap))
    old["lru"] = timed(lambda: lru_block_hit_rate(keys, cap, hit_limits=limits).block_hits)
    new["lru"] = timed(lambda: lru_hits(st, cap))
    old["lru_2x"] = timed(lambda: lru_block_hit_rate(keys, 2 * cap, hit_limits=limits).block_hits)
    new["lru_2x"] = timed(lambda: lru_hits(st, 2 * cap))
    old["unlimited"] = timed(lambda: infinite_block_hit_rate(keys).request_hits)
    new["unlimited"] = timed(lambda: tuple(unlimited_hits(st).tolist()))

    def per_key_hazard():
        hu = hazard_uses(keys)
        return hazard_bound(keys, limits, cap, hazard_table(keys, limits, hu), hu)

    def stream_hazard():
        classes = hazard_classes(st)
        return stream_hazard_bound(st, cap, classes, stream_hazard_table(st, classes))
    old["hazard"] = timed(per_key_hazard)
    new["hazard"] = timed(stream_hazard)
    bad = 0
    print(f"{'bound':>12} {'per key s':>10} {'stream s':>9}  equal")
    for name in ("next uses", "key stream", "optimum", "optimum_2x", "lru", "lru_2x", "unlimited", "hazard"):
        o, n = old.get(name), new.get(name)
        both = o is not None and n is not None
        same = not both or o[0] == n[0]
        bad += not same
        print(f"{name:>12} {'' if o is None else f'{o[1]:.2f}':>10} {'' if n is None else f'{n[1]:.2f}':>9}  "
              f"{same if both else ''}")
    total_old = sum(t for _, t in old.values())
    total_new = sum(t for _, t in new.values())
    print(f"{'total':>12} {total_old:10.2f} {total_new:9.2f}  (hashing {t_keys:.2f} s apart)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
