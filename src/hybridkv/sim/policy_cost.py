"""What an eviction policy costs per pool operation: one seeded mix of pool operations
(:func:`pool_op_mix`) timed under each policy against LRU (:func:`op_cost`).
"""

from __future__ import annotations

import math
import random
import time


def pool_op_mix(pool, steps: int, seed: int, after_step=None) -> list[list[int]]:
    """Run a seeded mix of pool operations on ``pool`` (allocate runs of 1-4 blocks and cache
    their first two under fresh hashes; free a random held run tail first; after a free, 30%
    of the time take a hit on a random earlier hash); keeps at most half the pool held unless
    a coin says otherwise. ``after_step(pool)`` runs after every step. Returns the runs still
    held. The same mix times every policy here, in ``sweep --eviction-policies`` and in
    ``benchmarks/bench_pool.py`` / ``bench_policies.py``, and drives the policies' integrity
    test."""
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
    from hybridkv.core.policy_pool import PolicyBlockPool
    from hybridkv.core.pool import BlockPool
    every = ["lru"] + [p for p in names if p != "lru"]
    best = {p: math.inf for p in every}
    for _ in range(rounds):
        for p in every:
            pol = make_policy(p)
            pool = BlockPool(blocks, 1) if pol is None else PolicyBlockPool(blocks, 1, pol)
            best[p] = min(best[p], _op_mix(pool, steps, seed=0))
    return {p: best[p] / best["lru"] for p in every}


__all__ = ["op_cost", "pool_op_mix"]
