"""Hashing a 100k-token prompt at block 16: hybridkv's raw-bytes hashing vs sha256 over pickled
tuples (vLLM's default serialization), measured in the same run.

    python benchmarks/bench_hashing.py
"""

from __future__ import annotations

import hashlib
import pickle
import random
import time

from hybridkv.core import BlockHasher, Request


def sha256_pickle_chain(tokens: list[int], bs: int) -> list[bytes]:
    parent = hashlib.sha256(b"seed").digest()
    out = []
    for i in range(0, len(tokens) - bs + 1, bs):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i:i + bs]), None),
                                             protocol=pickle.HIGHEST_PROTOCOL)).digest()
        out.append(parent)
    return out


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    rng = random.Random(0)
    tokens = [rng.randrange(150_000) for _ in range(100_000)]
    bs = 16
    base = best_of(lambda: sha256_pickle_chain(tokens, bs))
    print(f"{'method':<28}{'ms':>9}{'speedup':>10}")
    print(f"{'sha256(pickle(tuple))':<28}{base * 1e3:>9.2f}{1.0:>10.2f}")
    for algo in ("xxh3_128", "sha256"):
        hasher = BlockHasher(bs, algo, seed="bench")
        reqs = [Request(i, tokens) for i in range(5)]
        it = iter(reqs)

        def hash_only() -> None:
            req = next(it)
            hasher.update(req)
            assert len(req.block_hashes) == len(tokens) // bs

        def with_ingest() -> None:
            req = Request("r", tokens)          # list -> int64 array, then hash
            hasher.update(req)

        t = best_of(hash_only)
        print(f"{'hybridkv ' + algo:<28}{t * 1e3:>9.2f}{base / t:>10.2f}")
        t = best_of(with_ingest)
        print(f"{'  + Request(list) ingest':<28}{t * 1e3:>9.2f}{base / t:>10.2f}")

if __name__ == "__main__":
    main()
