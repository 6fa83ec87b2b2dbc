"""Raw throughput of a store's zero-copy path, the baseline the connector is compared with.

    python -m hybridkv.testing.store_bench [--blocks 1000] [--block-kib 256] [--repeats 3]

starts a Mooncake master and one storage node inside a loopback-only network namespace (needs
root) and prints JSON. :func:`bench_zero_copy` measures any :class:`KVStore`.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from hybridkv.connectors.stores.base import KVStore

__all__ = ["bench_zero_copy"]


def bench_zero_copy(
    store: KVStore, num_blocks: int = 1000, block_bytes: int = 256 << 10, repeats: int = 3
) -> dict[str, Any]:
    """Time ``batch_put_from`` and ``batch_get_into`` of ``num_blocks`` blocks in one call each.

    Each repeat writes fresh keys (so puts are real inserts), reads them back into a second
    buffer and checks the bytes. The store must hold ``num_blocks * block_bytes`` at least.

    Returns:
        best-of-``repeats`` seconds and GiB/s for put and get, the per-repeat seconds, and
        whether every block came back intact.
    """
    import numpy as np

    total = num_blocks * block_bytes
    src = np.random.default_rng(0).integers(0, 256, total, dtype=np.uint8)
    dst = np.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    offsets = [i * block_bytes for i in range(num_blocks)]
    sizes = [block_bytes] * num_blocks
    put_s: list[float] = []
    get_s: list[float] = []
    intact = True
    for r in range(repeats):
        keys = [b"bench" + r.to_bytes(4, "little") + i.to_bytes(8, "little")
                for i in range(num_blocks)]
        t0 = time.perf_counter()
        ok = store.batch_put_from(keys, src, offsets, sizes)
        put_s.append(time.perf_counter() - t0)
        dst[:] = 0
        t0 = time.perf_counter()
        got = store.batch_get_into(keys, dst, offsets, sizes)
        get_s.append(time.perf_counter() - t0)
        intact &= all(ok) and got == sizes and bool(np.array_equal(src, dst))
        store.remove(keys)
    gib = total / (1 << 30)
    return {
        "num_blocks": num_blocks,
        "block_bytes": block_bytes,
        "put_s": min(put_s),
        "get_s": min(get_s),
        "put_gib_s": gib / min(put_s),
        "get_gib_s": gib / min(get_s),
        "put_s_all": put_s,
        "get_s_all": get_s,
        "intact": intact,
    }


def main(argv: list[str] | None = None) -> None:
    """Benchmark Mooncake on a fresh local cluster inside a loopback-only namespace."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from hybridkv.connectors.stores.mooncake import MooncakeStore
    from hybridkv.connectors.stores.mooncake_config import MooncakeStoreConfig

    from .mooncake_cluster import MooncakeCluster
    from .netns import loopback_netns

    block = args.block_kib << 10
    pool = max(256 << 20, 2 * args.blocks * block)
    with loopback_netns(), MooncakeCluster([pool]) as cluster:
        store = MooncakeStore(MooncakeStoreConfig(master_address=cluster.master_address))
        try:
            result = bench_zero_copy(store, args.blocks, block, args.repeats)
        finally:
            store.close()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
