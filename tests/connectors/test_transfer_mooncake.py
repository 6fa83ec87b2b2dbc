"""KVTransfer through a real Mooncake Store (master + storage node on loopback, private netns)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import torch

from hybridkv.connectors.layout import KVLayout
from hybridkv.connectors.stores import MooncakeStore, MooncakeStoreConfig
from hybridkv.connectors.transfer import KVTransfer
from hybridkv.core.specs import FullAttention, KVCacheConfig, KVCacheGroup
from hybridkv.testing import MooncakeCluster

from .kv_helpers import alloc, engine, h, mixed_config, refs, same_block, scramble, snapshot
from hybridkv.connectors.transfer import TransferOptions
from hybridkv.testing.mooncake_cluster import MasterOptions

MIB = 1 << 20


def client(cluster: MooncakeCluster, prefix: str) -> MooncakeStore:
    store = MooncakeStore(MooncakeStoreConfig(
        master_address=cluster.master_address, key_prefix=prefix, retry_backoff_s=0.2,
        max_backoff_s=1.0))
    assert store.healthy
    return store


@pytest.fixture
def own_cluster(loopback: None) -> Iterator[MooncakeCluster]:
    """A private 16 MiB cluster for tests that fill or break it."""
    with MooncakeCluster([16 * MIB], MasterOptions(client_ttl_s=2)) as c:
        yield c


def big_config(num_blocks: int) -> KVCacheConfig:
    """4 layers x 64 KiB pages: 256 KiB per block."""
    spec = FullAttention(block_size=16, num_kv_heads=8, head_dim=128, dtype="bfloat16")
    return KVCacheConfig(KVCacheGroup("full", spec, tuple(f"l{i}" for i in range(4))),
                         num_blocks=num_blocks)


def test_mixed_round_trip_between_two_workers(store: MooncakeStore,
                                              cluster: MooncakeCluster) -> None:
    """Worker A saves MLA and EAGLE-draft blocks; worker B (its own client and cache) loads."""
    cfg = mixed_config(num_blocks=12)
    kv_a = engine(cfg, seed=11)
    a = KVTransfer(KVLayout.register(kv_a, cfg), store, TransferOptions(namespace="ds-v3"))
    assert a.mode == "staged"  # Mooncake has a zero-copy path
    assert a.save(refs(a, "mla", [(h(1), 3), (h(2), 1), (h(3), 7)])) == [True] * 3
    assert a.save(refs(a, "draft", [(h(1), 5), (h(2), 9)])) == [True] * 2
    assert store.stats.puts == 5

    other = client(cluster, store.config.key_prefix)
    try:
        kv_b = engine(cfg, seed=12)
        b = KVTransfer(KVLayout.register(kv_b, cfg), other, TransferOptions(namespace="ds-v3"))
        assert b.lookup("mla", [h(1), h(2), h(3), h(4)]) == 3
        assert b.load(refs(b, "mla", [(h(1), 2), (h(2), 4), (h(3), 6), (h(4), 8)])) == 3
        assert b.load(refs(b, "draft", [(h(1), 10), (h(2), 11)])) == 2
        for src, dst in [(3, 2), (1, 4), (7, 6)]:
            assert same_block(kv_b, kv_a, ("m0", "m1", "m2"), dst, src, mla=True)
        for src, dst in [(5, 10), (9, 11)]:
            assert same_block(kv_b, kv_a, ("eagle.0",), dst, src)
        st = b.stats
        assert (st.loaded, st.load_failed, st.load_misses, st.corrupt) == (5, 1, 1, 0)
        # a worker of another model finds nothing under the same hashes
        c = KVTransfer(b.layout, other, TransferOptions(namespace="llama"))
        assert c.load(refs(c, "mla", [(h(1), 2)])) == 0
    finally:
        other.close()


def test_corrupt_and_truncated_payloads_rejected(store: MooncakeStore) -> None:
    cfg = mixed_config()
    kv = engine(cfg, seed=13)
    tr = KVTransfer(KVLayout.register(kv, cfg), store)
    assert all(tr.save(refs(tr, "mla", [(h(1), 1), (h(2), 2)])))
    (good,) = store.batch_get([tr.key("mla", h(2))])
    assert good is not None and len(good) == tr.payload_bytes("mla")
    flipped = bytearray(good)
    flipped[len(good) // 3] ^= 0x10
    # Mooncake keeps the first payload of a key: plant the damage under fresh hashes
    assert store.batch_put([tr.key("mla", h(8)), tr.key("mla", h(9))],
                           [bytes(flipped), good[:-7]]) == [True, True]
    before = snapshot(kv)
    assert tr.load(refs(tr, "mla", [(h(1), 4), (h(8), 5)])) == 1
    assert tr.load(refs(tr, "mla", [(h(9), 6), (h(2), 7)])) == 0
    assert same_block(kv, before, ("m0", "m1", "m2"), 5, 5, mla=True)
    assert same_block(kv, before, ("m0", "m1", "m2"), 6, 6, mla=True)
    st = tr.stats
    assert (st.loaded, st.corrupt, st.load_misses) == (1, 2, 0)


def test_full_store_drops_saves_and_reads_stay_exact(own_cluster: MooncakeCluster) -> None:
    store = client(own_cluster, "full/")
    try:
        cfg = big_config(num_blocks=97)
        kv = alloc(cfg, seed=14)
        tr = KVTransfer(KVLayout.register(kv, cfg), store, TransferOptions(staging_bytes=32 * MIB))
        blocks = [(h(i), i + 1) for i in range(96)]  # 24 MiB offered to a 16 MiB node
        ok = tr.save(refs(tr, "full", blocks))
        assert any(ok) and not all(ok)
        st = tr.stats
        assert st.save_dropped == ok.count(False) and st.saved == ok.count(True)
        kept = [blk for blk, good in zip(blocks, ok) if good]
        ref = snapshot(kv)
        scramble(kv, seed=15)
        n = tr.load(refs(tr, "full", kept))
        assert n > 0
        for (_, b) in kept[:n]:
            assert same_block(kv, ref, cfg.groups[0].layer_names, b, b)
    finally:
        store.close()


def test_master_killed_saves_dropped_loads_zero(own_cluster: MooncakeCluster) -> None:
    store = client(own_cluster, "kill/")
    try:
        cfg = mixed_config()
        kv = engine(cfg, seed=16)
        tr = KVTransfer(KVLayout.register(kv, cfg), store)
        assert all(tr.save(refs(tr, "mla", [(h(1), 1), (h(2), 2)])))
        own_cluster.kill_master()
        before = snapshot(kv)
        assert tr.save(refs(tr, "mla", [(h(3), 3), (h(4), 4)])) == [False, False]
        assert not store.healthy
        marked = store.stats
        assert tr.load(refs(tr, "mla", [(h(1), 5), (h(2), 6)])) == 0
        assert tr.lookup("mla", [h(1)]) == 0
        assert tr.save(refs(tr, "draft", [(h(5), 7)])) == [False]
        # once the first failure marked the store unhealthy, nothing else contacts the master
        assert store.stats.errors == marked.errors and store.stats.unavailable > marked.unavailable
        assert all(torch.equal(before[n].view(torch.int16), kv[n].view(torch.int16)) for n in kv)
        st = tr.stats
        assert (st.saved, st.save_dropped, st.loaded, st.load_failed) == (2, 3, 0, 2)
        assert st.store_errors == 0  # the store reported failures; nothing raised
    finally:
        store.close()


def test_uuid_namespaced_keys_do_not_collide(store: MooncakeStore) -> None:
    """Two transfers with different namespaces on one client keep separate objects."""
    cfg = mixed_config()
    kv = engine(cfg, seed=17)
    layout = KVLayout.register(kv, cfg)
    x = KVTransfer(layout, store, TransferOptions(namespace=uuid.uuid4().hex))
    y = KVTransfer(layout, store, TransferOptions(namespace=uuid.uuid4().hex))
    assert x.save(refs(x, "draft", [(h(1), 1)])) == [True]
    assert y.save(refs(y, "draft", [(h(1), 2)])) == [True]  # a new object, not "already exists"
    ref = snapshot(kv)
    scramble(kv, seed=18)
    assert x.load(refs(x, "draft", [(h(1), 3)])) == 1 and y.load(refs(y, "draft", [(h(1), 4)])) == 1
    assert same_block(kv, ref, ("eagle.0",), 3, 1) and same_block(kv, ref, ("eagle.0",), 4, 2)
