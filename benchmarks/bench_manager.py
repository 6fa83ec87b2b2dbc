"""Manager cost per request on a multi-turn chat trace: full attention only and full + sliding
window, with a 10k-block and a 1M-block pool (cost must not grow with the pool), then with
EAGLE (k = 3): lookahead hashing, vLLM's drop mode, and the lookahead passed explicitly.

Each request: lookup, allocate the uncached prompt, one allocate per decoded token (the answer
the next turn contains), free. Only manager calls are timed (hashing included).

    python benchmarks/bench_manager.py
"""

from __future__ import annotations

import time

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      SlidingWindow, SpecDecode)
from hybridkv.sim.traces import multi_turn_chat


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


def run(groups, num_blocks, trace, ans, spec=None, explicit=False) -> tuple[float, float, int]:
    """``spec``: a SpecDecode; ``explicit``: pass its lookahead to every decode allocate as
    ``num_lookahead_tokens`` (what vLLM's scheduler does)."""
    kv = KVCacheManager(KVCacheConfig(groups, num_blocks=num_blocks), retention_interval=0,
                        spec_decode=spec)
    la = kv.lookahead_slots if explicit else None
    reqs = [Request(r.request_id, r.prompt) for r in trace]
    t0 = time.perf_counter()
    steps = 0
    for r, req in zip(trace, reqs):
        hit = kv.lookup(req)
        assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        for tok in ans.get(r.request_id, [1] * r.output_len):
            req.append_tokens((tok,))
            kv.allocate(req, 1, None, la)
            req.num_computed_tokens += 1
            steps += 1
        kv.free(req)
    dt = time.perf_counter() - t0
    s = kv.stats()
    return dt, s.hits / s.queries, steps


def main() -> None:
    trace = multi_turn_chat(num_conversations=48, turns=5, system_tokens=1024,
                            user_tokens=(64, 512), answer_tokens=(32, 128), concurrency=8,
                            arrival_rate=None, seed=1)
    ans = answers(trace)
    spec = dict(num_kv_heads=8, head_dim=128)
    configs = {
        "full": (KVCacheGroup("full", FullAttention(16, **spec), ("l0",)),),
        "full+swa": (KVCacheGroup("full", FullAttention(16, **spec), ("l0",)),
                     KVCacheGroup("swa", SlidingWindow(16, window=1024, **spec), ("l1",))),
    }
    tokens = sum(len(r.prompt) for r in trace)
    print(f"trace: {len(trace)} requests, {tokens} prompt tokens")
    print(f"{'config':<10}{'blocks':>10}{'hit rate':>10}{'total s':>9}{'us/request':>12}{'us/step':>9}")
    for name, groups in configs.items():
        base = None
        for nb in (10_000, 1_000_000):
            dt, rate, steps = min((run(groups, nb, trace, ans) for _ in range(3)), key=lambda x: x[0])
            per = dt / len(trace) * 1e6
            base = base or per
            print(f"{name:<10}{nb:>10}{rate:>10.3f}{dt:>9.3f}{per:>12.1f}{dt / steps * 1e6:>9.2f}"
                  f"   ratio vs 10k: {per / base:.2f}")
    # Speculative decoding, 10k blocks: EAGLE k=3 with lookahead hashing, in vLLM's drop mode,
    # and with the lookahead passed explicitly on every decode step (as vLLM's scheduler does).
    modes = {
        "eagle": (SpecDecode("eagle", 3), False),
        "eagle-drop": (SpecDecode("eagle", 3, hash_lookahead=False), False),
        "eagle-explicit": (SpecDecode("eagle", 3), True),
    }
    print(f"{'config':<10}{'spec':>16}{'hit rate':>10}{'total s':>9}{'us/request':>12}{'us/step':>9}")
    for name, groups in configs.items():
        for mode, (spec, explicit) in modes.items():
            dt, rate, steps = min((run(groups, 10_000, trace, ans, spec, explicit) for _ in range(3)),
                                  key=lambda x: x[0])
            print(f"{name:<10}{mode:>16}{rate:>10.3f}{dt:>9.3f}{dt / len(trace) * 1e6:>12.1f}"
                  f"{dt / steps * 1e6:>9.2f}")


if __name__ == "__main__":
    main()
