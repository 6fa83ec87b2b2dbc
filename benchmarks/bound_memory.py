"""Peak memory the offline bounds add, per prompt block (the basis of
``hybridkv.sim.bounds.optimum_memory.BYTES_PER_BLOCK``).

    python benchmarks/bound_memory.py --limit 1500        # first 1,500 Mooncake conversation requests

Loads the first ``--limit`` requests of the Mooncake conversation trace, then computes every
bound of a run on them at ``--block-size`` (the optimum's parts with the what-if extra, then
the gap report, as ``OptimumJob`` does in its child) and prints the peak resident memory this
added (``ru_maxrss`` after minus before) divided by the prompt blocks.
"""

from __future__ import annotations

import argparse
import gc
import math
import resource

from hybridkv.sim.bounds.optimal import OnlineHits
from hybridkv.sim.bounds.optimum_job import _bound_parts, _finish
from hybridkv.sim.traffic.traces import resolve_trace
from hybridkv.sim.bounds.whatif import WHAT_IF
from hybridkv.sim.traffic.workitems import items_from_mooncake, served_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=1500)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=187_500, help="key blocks (3M tokens at 16)")
    args = ap.parse_args()
    items = items_from_mooncake(resolve_trace("mooncake-conversation"), args.limit)
    served, _ = served_workload(items, None)
    blocks = sum(-(-it.prompt_len // args.block_size) for it in items)
    n = len(served)
    online = OnlineHits([0] * n, [0.0] * n, [math.inf] * n)
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    parts = _bound_parts(served, args.block_size, args.capacity, WHAT_IF, None)
    _finish(parts, online, WHAT_IF)
    added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    print(f"{n} requests, {blocks:,} prompt blocks of {args.block_size} tokens: the bounds added "
          f"{added / 2**20:,.0f} MiB at peak, {added / blocks:,.0f} B per block")


if __name__ == "__main__":
    main()
