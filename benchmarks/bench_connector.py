"""KV connector throughput vs the raw store API, measured in the same run.

For each store (LocalCPUStore, and Mooncake on a local master + storage node inside a
loopback-only network namespace) and each cache layout, times:

* raw:   ``batch_put_from`` / ``batch_get_into`` of N payloads of the connector's payload size
         from / into a registered contiguous host buffer (``hybridkv.testing.store_bench``'s method);
* save:  ``KVTransfer.save`` of N blocks of a paged cache (gather + checksum + one store call);
* load:  ``KVTransfer.load`` of the same N blocks into other block ids (one store call +
         verification + scatter).

Connector and raw runs alternate; each repeat uses fresh keys and removes them afterwards; best
of ``--repeats``. Ratios are
connector GiB/s over raw GiB/s (1.0 = no overhead). Mode ``-nv`` loads without the checksum
pass (``TransferOptions(verify=False)``).

    python benchmarks/bench_connector.py [--blocks 1000] [--repeats 3] [--no-mooncake]
        [--no-local] [--layouts engine-gqa,kv-first-gqa,mla] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from hybridkv.connectors.layout import KVLayout
from hybridkv.connectors.stores import LocalCPUStore
from hybridkv.connectors.stores.base import KVStore
from hybridkv.connectors.transfer import TRAILER_BYTES, KVTransfer
from hybridkv.core.blockref import BlockRef
from hybridkv.core.specs import MLA, FullAttention, KVCacheConfig, KVCacheGroup
from hybridkv.engine import PagedKVCache
from hybridkv.connectors.transfer import TransferOptions

GIB = 1 << 30


def gqa_config(num_blocks: int) -> KVCacheConfig:
    """4 GQA layers, 16 tokens x 8 heads x 128 dims bf16: 64 KiB per layer, 256 KiB per block."""
    spec = FullAttention(block_size=16, num_kv_heads=8, head_dim=128, dtype="bfloat16")
    return KVCacheConfig(KVCacheGroup("full", spec, tuple(f"l{i}" for i in range(4))),
                         num_blocks=num_blocks)


def mla_config(num_blocks: int) -> KVCacheConfig:
    """8 MLA layers, 64 tokens x 576 bf16: 72 KiB per layer, 576 KiB per block."""
    spec = MLA(block_size=64, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16")
    return KVCacheConfig(KVCacheGroup("mla", spec, tuple(f"m{i}" for i in range(8))),
                         num_blocks=num_blocks)


def caches(kind: str, num_blocks: int) -> tuple[KVCacheConfig, dict[str, torch.Tensor]]:
    """Cache tensors filled with random bytes: the engine's page layout or separate tensors."""
    if kind == "engine-gqa":
        cfg = gqa_config(num_blocks)
        cache = PagedKVCache(cfg)
        kv = {n: cache.layer(n) for n in cache.layer_names}
        for slot in cache._slots:
            slot.random_(0, 256)
        return cfg, kv
    if kind == "kv-first-gqa":
        cfg = gqa_config(num_blocks)
        spec = cfg.groups[0].spec
        shape = (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
    else:
        cfg = mla_config(num_blocks)
        spec = cfg.groups[0].spec
        shape = (num_blocks, spec.block_size, spec.latent_dim)
    kv = {}
    for name in cfg.groups[0].layer_names:
        t = torch.empty(shape, dtype=torch.bfloat16)
        t.view(torch.uint8).random_(0, 256)
        kv[name] = t
    return cfg, kv


class RawBench:
    """The baseline: N payloads of ``size`` bytes from / into registered contiguous buffers."""

    def __init__(self, store: KVStore, n: int, size: int) -> None:
        self.store, self.n, self.size = store, n, size
        self.src = np.random.default_rng(0).integers(0, 256, n * size, dtype=np.uint8)
        self.dst = np.zeros_like(self.src)
        store.register_buffer(self.src)
        store.register_buffer(self.dst)
        self.offsets = [i * size for i in range(n)]
        self.sizes = [size] * n

    def once(self, r: int) -> tuple[float, float]:
        keys = [b"raw/%d/%d" % (r, i) for i in range(self.n)]
        t0 = time.perf_counter()
        ok = self.store.batch_put_from(keys, self.src, self.offsets, self.sizes)
        put = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = self.store.batch_get_into(keys, self.dst, self.offsets, self.sizes)
        get = time.perf_counter() - t0
        assert all(ok) and got == self.sizes and np.array_equal(self.src, self.dst), "raw failed"
        self.store.remove(keys)
        return put, get


class ConnectorBench:
    """KVTransfer.save of N blocks of a paged cache, then load of them into other block ids."""

    def __init__(self, store: KVStore, kind: str, n: int, mode: str, verify: bool) -> None:
        self.cfg, self.kv = caches(kind, 2 * n + 1)
        layout = KVLayout.register(self.kv, self.cfg)
        self.group = self.cfg.groups[0].name
        self.layout = layout[self.group]
        self.payload = self.layout.block_bytes + TRAILER_BYTES
        self.tr = KVTransfer(layout, store, TransferOptions(
            mode=mode, staging_bytes=n * (self.payload + 64), verify=verify))
        rng = np.random.default_rng(1)
        self.src_ids = [int(b) for b in rng.permutation(np.arange(1, n + 1))]
        self.dst_ids = [int(b) for b in rng.permutation(np.arange(n + 1, 2 * n + 1))]
        self.store, self.n = store, n

    def once(self, r: int) -> tuple[float, float]:
        hashes = [r.to_bytes(4, "big") + i.to_bytes(12, "big") for i in range(self.n)]
        t0 = time.perf_counter()
        ok = self.tr.save([BlockRef(0, b, h) for h, b in zip(hashes, self.src_ids)])
        save = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded = self.tr.load([BlockRef(0, b, h) for h, b in zip(hashes, self.dst_ids)])
        load = time.perf_counter() - t0
        assert all(ok) and loaded == self.n, f"connector: {sum(ok)} saved, {loaded} loaded"
        assert self.layout.gather(self.src_ids[:8]).equal(self.layout.gather(self.dst_ids[:8]))
        self.store.remove([self.tr.key(self.group, x) for x in hashes])
        return save, load


def run_store(name: str, store: KVStore, kinds: list[str], n: int, repeats: int,
              modes: list[str]) -> list[dict[str, Any]]:
    """Per layout and mode: connector and raw runs alternate, best of ``repeats`` each."""
    rows = []
    for kind in kinds:
        for mode in modes:
            verify = not mode.endswith("-nv")
            conn = ConnectorBench(store, kind, n, mode.removesuffix("-nv"), verify)
            raw = RawBench(store, n, conn.payload)
            times = [(conn.once(r), raw.once(r)) for r in range(repeats)]
            save_s, load_s = (min(t[0][k] for t in times) for k in (0, 1))
            put_s, get_s = (min(t[1][k] for t in times) for k in (0, 1))
            gib = n * conn.payload / GIB
            rows.append({
                "store": name, "layout": kind, "mode": mode, "blocks": n,
                "runs_per_block": conn.layout.num_runs, "payload_bytes": conn.payload,
                "raw_put_gib_s": gib / put_s, "raw_get_gib_s": gib / get_s,
                "save_gib_s": gib / save_s, "load_gib_s": gib / load_s,
                "save_ratio": put_s / save_s, "load_ratio": get_s / load_s,
            })
            del conn, raw
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-mooncake", action="store_true")
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--layouts", default="engine-gqa,kv-first-gqa,mla",
                        help="comma-separated: engine-gqa, kv-first-gqa, mla")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args()
    torch.manual_seed(0)
    kinds = args.layouts.split(",")
    n = args.blocks
    largest = n * (576 << 10) * 2
    rows = [] if args.no_local else run_store(
        "local", LocalCPUStore(2 * largest), kinds, n, args.repeats,
        ["direct", "direct-nv", "staged"])
    if not args.no_mooncake:
        from hybridkv.connectors.stores import MooncakeStore, MooncakeStoreConfig
        from hybridkv.testing import MooncakeCluster, loopback_netns

        with loopback_netns(), MooncakeCluster([largest + (256 << 20)]) as cluster:
            store = MooncakeStore(MooncakeStoreConfig(master_address=cluster.master_address))
            try:
                rows += run_store("mooncake", store, kinds, n, args.repeats, ["staged"])
            finally:
                store.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{n} blocks per call, best of {args.repeats}; GiB/s of payload bytes")
    print(f"{'store':9} {'layout':13} {'mode':9} {'runs':>4} {'KiB':>5} | {'raw put':>8} "
          f"{'save':>7} {'ratio':>6} | {'raw get':>8} {'load':>7} {'ratio':>6}")
    for r in rows:
        print(f"{r['store']:9} {r['layout']:13} {r['mode']:9} {r['runs_per_block']:>4} "
              f"{r['payload_bytes'] >> 10:>5} | {r['raw_put_gib_s']:8.2f} {r['save_gib_s']:7.2f} "
              f"{r['save_ratio']:6.2f} | {r['raw_get_gib_s']:8.2f} {r['load_gib_s']:7.2f} "
              f"{r['load_ratio']:6.2f}")


if __name__ == "__main__":
    main()
