"""Manager cost per request on a multi-turn chat trace: full attention only and full + sliding
window, with a 10k-block and a 1M-block pool (cost must not grow with the pool).

Each row runs with the lazy pool (``hybridkv.core.pool``) and, when the repository's tests are
importable, with the eager pool it replaced (``tests/support/eager_pool.py``), the two alternating
in the same process; ``build ms`` is the manager's construction, the rest times only calls.

Each request: lookup, allocate the uncached prompt, one allocate per decoded token (the answer
the next turn contains), free. Only manager calls are timed (hashing included).

    python benchmarks/bench_manager_pools.py     (the speed benchmark with spec modes: bench_manager.py)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hybridkv.core.manager as manager_mod
from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      SlidingWindow)
from hybridkv.sim.traffic.workloads import ChatWorkload, multi_turn_chat

from bench_manager import answers  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from hybridkv.core.cache_options import CacheOptions


def run(groups, num_blocks, trace, ans, pool_cls) -> tuple[float, float, int, float]:
    manager_mod.BlockPool = pool_cls
    b0 = time.perf_counter()
    kv = KVCacheManager(KVCacheConfig(groups, num_blocks=num_blocks), CacheOptions(retention_interval=0))
    build = time.perf_counter() - b0
    reqs = [Request(r.request_id, r.prompt) for r in trace]
    t0 = time.perf_counter()
    steps = 0
    for r, req in zip(trace, reqs):
        hit = kv.lookup(req)
        assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        for tok in ans.get(r.request_id, [1] * r.output_len):
            req.append_tokens((tok,))
            kv.allocate(req, 1)
            req.num_computed_tokens += 1
            steps += 1
        kv.free(req)
    dt = time.perf_counter() - t0
    s = kv.stats()
    return dt, s.hits / s.queries, steps, build


def pools() -> dict[str, type]:
    out = {"lazy": manager_mod.BlockPool}
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from tests.support.eager_pool import BlockPool as Eager
        out = {"eager": Eager, **out}
    except ImportError:
        pass
    return out


def main() -> None:
    trace = multi_turn_chat(ChatWorkload(
        num_conversations=48, turns=5, system_tokens=1024, user_tokens=(64, 512),
        answer_tokens=(32, 128), concurrency=8, arrival_rate=None), seed=1)
    ans = answers(trace)
    spec = dict(num_kv_heads=8, head_dim=128)
    configs = {
        "full": (KVCacheGroup("full", FullAttention(16, **spec), ("l0",)),),
        "full+swa": (KVCacheGroup("full", FullAttention(16, **spec), ("l0",)),
                     KVCacheGroup("swa", SlidingWindow(16, window=1024, **spec), ("l1",))),
    }
    tokens = sum(len(r.prompt) for r in trace)
    print(f"trace: {len(trace)} requests, {tokens} prompt tokens")
    impls = pools()
    print(f"{'config':<10}{'blocks':>10}{'pool':>7}{'hit rate':>10}{'build ms':>10}{'total s':>9}"
          f"{'us/request':>12}{'us/step':>9}")
    for name, groups in configs.items():
        for nb in (10_000, 1_000_000):
            best: dict[str, tuple] = {}
            for _ in range(3):                       # best of 3, the pools alternating
                for label, cls in impls.items():
                    r = run(groups, nb, trace, ans, cls)
                    if label not in best or r[0] < best[label][0]:
                        best[label] = r
            for label, (dt, rate, steps, build) in best.items():
                per = dt / len(trace) * 1e6
                ratio = f"   lazy/eager: {dt / best['eager'][0]:.2f}" if label == "lazy" and "eager" in best else ""
                print(f"{name:<10}{nb:>10}{label:>7}{rate:>10.3f}{build * 1e3:>10.1f}{dt:>9.3f}{per:>12.1f}"
                      f"{dt / steps * 1e6:>9.2f}{ratio}")


if __name__ == "__main__":
    main()
