"""Bytes per block of the block pool: its per-block lists, free-queue links and hash index,
measured with ``tracemalloc``.

    python benchmarks/pool_memory.py [--blocks 200000]

A one-group pool of ``--blocks`` usable blocks: every block allocated, hashed with a 16-byte
xxh3-128 digest (``insert_run``, as a request's prompt) and freed (so each is a cached free
block, in the free queue and in the index: the pool at its fullest). Prints the memory the
pool holds per block, without the digest objects (which the requests that computed them
share) and with them (what the pool alone keeps alive once those requests are gone).
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import xxhash

from hybridkv.core import COMPILED
from hybridkv.core.pool import BlockPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=200_000)
    n = ap.parse_args().blocks
    digests = [xxhash.xxh3_128_digest(i.to_bytes(8, "little")) for i in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pool = BlockPool(n + 1, 1)
    blocks = pool.allocate(n)
    pool.insert_run(0, digests, blocks)
    pool.free(blocks[::-1])
    del blocks
    gc.collect()
    structures = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_digest = digests[0].__sizeof__()
    print(f"compiled core: {COMPILED}; {n:,} cached free blocks")
    print(f"pool structures: {structures / n:.1f} B per block")
    print(f"with the digests: {(structures + n * per_digest) / n:.1f} B per block "
          f"({per_digest} B per 16-byte digest object)")
    assert pool.num_free == n


if __name__ == "__main__":
    main()
