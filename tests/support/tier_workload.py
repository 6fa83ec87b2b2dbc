"""The hybrid model and the chat-like workload that the tier tests run on both sides: the
engine's CPU tier (``tests/connectors/test_tier_differential.py``) and the simulator's
(``tests/sim/test_tiers.py``)."""

from __future__ import annotations

import random

from hybridkv.core.specs import FullAttention, KVCacheGroup, SlidingWindow

BS, WINDOW = 4, 8


def tier_groups(swa_layers: int) -> tuple[KVCacheGroup, ...]:
    spec = dict(block_size=BS, num_kv_heads=1, head_dim=4, dtype="float32")
    return (KVCacheGroup("full", FullAttention(**spec), ("l0", "l1")),
            KVCacheGroup("swa", SlidingWindow(window=WINDOW, **spec),
                         tuple(f"s{i}" for i in range(swa_layers))))


def tier_workload(seed: int, n: int) -> list[tuple[str, list[int], list[int]]]:
    """Requests that share prefixes (a few stems, then the previous answer repeated: chat-like),
    each with its answer."""
    rng = random.Random(seed)
    stems = [[rng.randrange(1000) for _ in range(rng.randrange(4, 30))] for _ in range(3)]
    history: list[list[int]] = []
    out = []
    for i in range(n):
        if history and rng.random() < 0.5:
            prompt = rng.choice(history) + [rng.randrange(1000) for _ in range(rng.randrange(1, 9))]
        else:
            prompt = rng.choice(stems) + [rng.randrange(1000) for _ in range(rng.randrange(0, 12))]
        answer = [2000 + rng.randrange(1000) for _ in range(rng.randrange(1, 6))]
        history.append(prompt + answer)
        out.append((f"r{i}", prompt, answer))
    return out
