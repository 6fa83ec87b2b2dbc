"""Per-operation cost of each eviction policy against LRU, in the same run.

    python benchmarks/bench_policies.py

The seeded pool workload of ``bench_pool.py`` (allocate with 2 hashed blocks per allocation,
free in reverse order, cache hits that touch a freed cached block), 60,000 steps on a saturated
10,000-block pool (allocations evict) and on a 1,000,000-block pool (still growing). Process CPU
time, best of 7, policies alternating in the same process; ratio against ``lru`` (the plain
:class:`BlockPool`, which the seam leaves untouched). ``priority+ttl``: see :class:`MarkedPool`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_pool import workload  # noqa: E402
from hybridkv.core.eviction import POLICIES, make_policy  # noqa: E402
from hybridkv.core.policy_pool import PolicyBlockPool  # noqa: E402
from hybridkv.core.pool import BlockPool  # noqa: E402
from hybridkv.core.retention_config import DEFAULT_PRIORITY, RetentionMark  # noqa: E402

# priority+ttl: the priority policy with retention marks on every other free (priority 90 for
# 200 ticks of a clock that advances one tick per free, over the default), so marks merge,
# expire and move blocks between levels; plain ``priority`` has no marks (it orders like LRU).
NAMES = [p for p in POLICIES if p != "recommended"] + ["priority+ttl"]


class MarkedPool(PolicyBlockPool):
    """A priority pool whose frees carry retention marks (what a request with a config does)."""

    __slots__ = ("ticks",)

    def __init__(self, n: int, g: int) -> None:
        self.ticks = 0
        super().__init__(n, g, make_policy("priority", clock=lambda: float(self.ticks)))

    def free(self, blocks) -> None:
        self.ticks += 1
        if self.ticks % 2:
            run = list(blocks)
            self.retain(run, range(len(run)), MARKS)
            blocks = run
        super().free(blocks)


MARKS = (RetentionMark(2, 90, 200.0), RetentionMark(4, DEFAULT_PRIORITY, None))


def factory(name: str):
    if name == "lru":
        return BlockPool
    if name == "priority+ttl":
        return MarkedPool
    return lambda n, g: PolicyBlockPool(n, g, make_policy(name))


def main() -> None:
    print(f"{'blocks':>10}" + "".join(f"{n + ' ms':>16}{'/lru':>7}" for n in NAMES))
    for n in (10_000, 1_000_000):
        best = {name: float("inf") for name in NAMES}
        for _ in range(7):
            for name in NAMES:
                best[name] = min(best[name], workload(factory(name), n))
        print(f"{n:>10}" + "".join(f"{best[k] * 1e3:>16.1f}{best[k] / best['lru']:>7.2f}" for k in NAMES))


if __name__ == "__main__":
    main()
