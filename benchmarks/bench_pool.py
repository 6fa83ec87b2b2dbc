"""Block-pool operations alone: the lazy pool against the eager pool it replaced.

    python benchmarks/bench_pool.py

A seeded mix of allocate (2 of every allocation's blocks get a hash), free in reverse order and
cache hits (touch of a freed cached block), 60,000 steps, on a 10,000-block pool (saturated:
every id used, allocations evict) and a 1,000,000-block pool (still growing). Process CPU time,
best of 11, the two pools alternating in the same process; the eager pool is
``tests/support/eager_pool.py`` (the oracle of the lazy pool's property tests).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hybridkv.core.pool import BlockPool as Lazy  # noqa: E402
from hybridkv.sim.policy_cost import pool_op_mix  # noqa: E402
from tests.support.eager_pool import BlockPool as Eager  # noqa: E402


def workload(pool_cls, num_blocks: int, seed: int = 0) -> float:
    """CPU seconds of 60,000 steps of the shared pool-operation mix on a fresh pool."""
    p = pool_cls(num_blocks, 1)
    t0 = time.process_time()
    pool_op_mix(p, 60_000, seed)
    return time.process_time() - t0


def main() -> None:
    print(f"{'blocks':>10}{'eager ms':>10}{'lazy ms':>10}{'lazy/eager':>12}")
    for n in (10_000, 1_000_000):
        best = {"eager": float("inf"), "lazy": float("inf")}
        for _ in range(11):
            for name, cls in (("eager", Eager), ("lazy", Lazy)):
                best[name] = min(best[name], workload(cls, n))
        print(f"{n:>10}{best['eager'] * 1e3:>10.1f}{best['lazy'] * 1e3:>10.1f}"
              f"{best['lazy'] / best['eager']:>12.3f}")


if __name__ == "__main__":
    main()
