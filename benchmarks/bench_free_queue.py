"""The pool's free queue: links in lists (the reference) against links in C arrays (the
compiled pool's), on the pool's access pattern, side by side in one process.

    python benchmarks/bench_free_queue.py [--blocks 200000] [--batch 16 256] [--rounds 3]

The pattern (an LRU pool under pressure): every block free in a shuffled order (the order a
long run leaves), then per step a popleft of ``--batch`` blocks (an allocation) and the
append of a random earlier batch once half the pool is held (a request freeing its blocks),
so each pop follows links to ids scattered over the pool. Both queues run compiled (the reference
module ``hybridkv.core.free_queue`` is compiled with the core); only their links differ.
Prints ns per block moved (a pop and, later, its append), best of ``--rounds``, each round
alternating which runs first, and the ratio lists / arrays. Needs the compiled build.
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def run(cls: type, blocks: int, batch: int, steps: int, seed: int = 0) -> float:
    rng = random.Random(seed)
    ids = list(range(1, blocks))
    rng.shuffle(ids)
    q = cls(blocks, ids)
    held: list[list[int]] = []
    keep = blocks // (2 * batch)
    t = time.perf_counter()
    for _ in range(steps):
        held.append(q.popleft_n(batch))
        if len(held) > keep:
            q.append_n(held.pop(rng.randrange(len(held))))
    return (time.perf_counter() - t) / (steps * batch) * 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=200_000)
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default: 1M blocks' worth)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.rounds < 1 or min(args.batch) < 1 or args.blocks < 4 * max(args.batch):
        ap.error("--rounds >= 1, --batch >= 1, --blocks >= 4 x the largest batch")
    try:
        from hybridkv.core.free_queue_native import FreeBlockQueue as Arrays
    except ImportError:
        print("needs the compiled build (pip install -e . with Cython)", file=sys.stderr)
        return 2
    from hybridkv.core.free_queue import FreeBlockQueue as Lists
    print(f"{args.blocks:,} blocks, best of {args.rounds}; ns per block moved (popped, later appended)")
    for batch in args.batch:
        steps = args.steps or max(1, 1_000_000 // batch)
        best = {Lists: float("inf"), Arrays: float("inf")}
        for r in range(args.rounds):
            for cls in ((Lists, Arrays) if r % 2 == 0 else (Arrays, Lists)):
                best[cls] = min(best[cls], run(cls, args.blocks, batch, steps))
        print(f"  batch {batch:>4}: lists {best[Lists]:7.1f}  arrays {best[Arrays]:7.1f}  "
              f"({best[Lists] / best[Arrays]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
