"""MooncakeStore against a real master + storage node on loopback, inside a private netns.

Every test here requests the package-scoped ``loopback`` fixture (directly or through
``cluster``/``store``), so no Mooncake port is reachable from outside this namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from hybridkv.connectors.stores import MISS, WRONG_SIZE, MooncakeStore, MooncakeStoreConfig
from hybridkv.testing import (MasterOptions, MooncakeCluster, bench_zero_copy, free_port,
                              non_loopback_interfaces)

KIB = 1 << 10
MIB = 1 << 20


def key(i: int, group: int = 0) -> bytes:
    """Shaped like the connector's keys: 16-byte block hash + group index."""
    return i.to_bytes(16, "little") + group.to_bytes(1, "little")


def blocks(n: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n * size, dtype=np.uint8)


@pytest.fixture
def own_cluster(loopback: None) -> Iterator[MooncakeCluster]:
    """A private cluster (16 MiB node, short client TTL) for tests that break or fill it."""
    with MooncakeCluster([16 * MIB], MasterOptions(client_ttl_s=2)) as c:
        yield c


def connect(cluster: MooncakeCluster, **kw: object) -> MooncakeStore:
    cfg = MooncakeStoreConfig(master_address=cluster.master_address, retry_backoff_s=0.2,
                              max_backoff_s=1.0, **kw)  # type: ignore[arg-type]
    store = MooncakeStore(cfg)
    assert store.healthy
    return store


def test_runs_isolated(cluster: MooncakeCluster) -> None:
    assert non_loopback_interfaces() == []
    assert cluster.master_running and cluster.node_running(0)


def test_copying_round_trip_exists_and_misses(store: MooncakeStore) -> None:
    n, size = 64, 16 * KIB
    data = blocks(n, size).reshape(n, size)
    keys = [key(i, g) for i in range(n // 2) for g in (0, 1)]
    assert store.batch_exists(keys) == [False] * n
    assert store.batch_put(keys, [row.tobytes() for row in data]) == [True] * n
    assert store.batch_exists(keys + [key(10_000)]) == [True] * n + [False]
    got = store.batch_get(keys + [key(10_000)])
    assert got[-1] is None
    assert all(g == row.tobytes() for g, row in zip(got, data))
    st = store.stats
    assert (st.puts, st.put_bytes, st.drops) == (n, n * size, 0)
    assert (st.gets, st.hits, st.misses, st.errors) == (n + 1, n, 1, 0)


def test_copying_batches_larger_than_client_buffers(cluster: MooncakeCluster) -> None:
    """16 MiB through an 8 MiB Mooncake local buffer and a 4 MiB staging buffer: chunked."""
    store = connect(cluster, local_buffer_bytes=8 * MIB, staging_bytes=4 * MIB,
                    key_prefix="chunked/")
    n, size = 64, 256 * KIB
    data = [row.tobytes() for row in blocks(n, size, seed=5).reshape(n, size)]
    keys = [key(i) for i in range(n)]
    assert store.batch_put(keys, data) == [True] * n
    assert store.batch_get(keys) == data
    assert store.batch_get(keys, expected_sizes=[size] * n) == data
    assert store.stats.misses == 0
    store.close()


def test_zero_copy_round_trip_many_blocks(store: MooncakeStore) -> None:
    n, size = 256, 64 * KIB
    src = blocks(n, size, seed=1)
    dst = np.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    keys = [key(i) for i in range(n)]
    offsets = [i * size for i in range(n)]
    assert store.batch_put_from(keys, src, offsets, [size] * n) == [True] * n
    # read back in reverse order, plus unknown keys that must miss
    rev = offsets[::-1]
    unknown = [key(i, 7) for i in range(4)]
    got = store.batch_get_into(keys + unknown, dst, rev + offsets[:4], [size] * (n + 4))
    assert got[:n] == [size] * n and got[n:] == [MISS] * 4
    assert np.array_equal(dst.reshape(n, size)[::-1][4:], src.reshape(n, size)[4:])
    st = store.stats
    assert (st.hits, st.misses, st.errors, st.get_bytes) == (n, 4, 0, n * size)


def test_zero_copy_from_torch_tensor(store: MooncakeStore) -> None:
    torch = pytest.importorskip("torch")
    src = torch.arange(8 * 4096, dtype=torch.float16)
    dst = torch.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    nbytes = src.numel() * src.element_size() // 8
    offs = [i * nbytes for i in range(8)]
    keys = [key(i, 3) for i in range(8)]
    assert store.batch_put_from(keys, src, offs, [nbytes] * 8) == [True] * 8
    assert store.batch_get_into(keys, dst, offs, [nbytes] * 8) == [nbytes] * 8
    assert torch.equal(src, dst)


def test_size_mismatch_rejected(store: MooncakeStore) -> None:
    buf = np.zeros(8 * KIB, dtype=np.uint8)
    store.register_buffer(buf)
    buf[:1000] = 7
    assert store.batch_put_from([key(1)], buf, [0], [1000]) == [True]
    # larger and smaller expectations than the stored 1000 bytes are both rejected, and said so
    got = store.batch_get_into([key(1), key(1), key(2)], buf, [2000, 4000, 6000], [2000, 500, 10])
    assert got == [WRONG_SIZE, WRONG_SIZE, MISS]
    assert store.batch_get_into([key(1)], buf, [4000], [1000]) == [1000]
    assert (buf[4000:5000] == 7).all()
    assert store.batch_get([key(1), key(1)], expected_sizes=[999, 1000]) == [None, b"\x07" * 1000]
    st = store.stats
    assert st.size_mismatches == 3 and st.errors == 0 and st.misses == 4


def test_caller_errors_raise(store: MooncakeStore) -> None:
    buf = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(ValueError, match="registered"):
        store.batch_put_from([key(0)], buf, [0], [10])
    store.register_buffer(buf)
    with pytest.raises(ValueError, match="lengths"):
        store.batch_get_into([key(0)], buf, [0, 10], [10])
    with pytest.raises(ValueError, match="outside"):
        store.batch_get_into([key(0)], buf, [4090], [10])
    with pytest.raises(ValueError):
        MooncakeStoreConfig(master_address="127.0.0.1")


def test_remove(store: MooncakeStore) -> None:
    store.batch_put([key(1), key(2)], [b"a" * 100, b"b" * 100])
    assert store.remove([key(1), key(3)]) == 1
    assert store.batch_exists([key(1), key(2)]) == [False, True]


def test_full_store_drops_or_evicts_and_reads_stay_exact(own_cluster: MooncakeCluster) -> None:
    store = connect(own_cluster)
    n, size = 96, 256 * KIB  # 24 MiB offered in one batch to a 16 MiB node
    src = blocks(n, size, seed=2)
    dst = np.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    offsets = [i * size for i in range(n)]
    keys = [key(i) for i in range(n)]
    ok = store.batch_put_from(keys, src, offsets, [size] * n)
    assert not all(ok) and any(ok)
    st = store.stats
    assert st.drops == ok.count(False) > 0 and st.puts == ok.count(True)
    assert st.errors == 0  # a full pool is a drop, not an error
    # later batches make Mooncake evict silently; every read is exact or a miss
    for r in range(3):
        more = [key(1000 * (r + 1) + i) for i in range(32)]
        store.batch_put_from(more, src, offsets[:32], [size] * 32)
    got = store.batch_get_into(keys, dst, offsets, [size] * n)
    hits = [i for i, g in enumerate(got) if g == size]
    assert len(hits) < n
    for i in hits:
        assert np.array_equal(dst[offsets[i]:offsets[i] + size], src[offsets[i]:offsets[i] + size])
    store.close()


def test_master_killed_mid_run_then_restarted(own_cluster: MooncakeCluster) -> None:
    store = connect(own_cluster)
    n, size = 16, 64 * KIB
    src = blocks(n, size, seed=3)
    dst = np.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    offsets = [i * size for i in range(n)]
    keys = [key(i) for i in range(n)]
    assert all(store.batch_put_from(keys, src, offsets, [size] * n))

    own_cluster.kill_master()
    assert store.batch_exists(keys) == [False] * n          # no exception escapes
    assert not store.healthy                                 # RPC failure marks it unhealthy
    before = store.stats
    assert store.batch_get_into(keys, dst, offsets, [size] * n) == [MISS] * n
    assert store.batch_put_from(keys, src, offsets, [size] * n) == [False] * n
    assert store.batch_get(keys) == [None] * n
    assert store.remove(keys) == 0
    st = store.stats
    # answered without contacting the master (so without RPC timeouts): every key of the three
    # calls is counted unavailable and none as a new store error
    assert st.unavailable - before.unavailable == 3 * n and st.errors == before.errors
    assert st.errors > 0 and st.drops == n

    own_cluster.restart_master()                             # node remounts its segment
    assert store.wait_healthy(10.0)
    # the master lost its index: old keys miss, new data round-trips
    assert store.batch_get_into(keys[:1], dst, [0], [size]) == [MISS]
    new = [key(i, 5) for i in range(n)]
    assert store.batch_put_from(new, src, offsets, [size] * n) == [True] * n
    dst[:] = 0
    assert store.batch_get_into(new, dst, offsets, [size] * n) == [size] * n
    assert np.array_equal(src, dst)
    assert store.clients_created == 1                        # the same client reconnected
    store.close()


def test_hung_master_costs_one_rpc_timeout(own_cluster: MooncakeCluster) -> None:
    store = connect(own_cluster, rpc_timeout_ms=1000)
    assert store.batch_put([key(1)], [b"x" * 1000]) == [True]
    own_cluster.pause_master()
    try:
        before = store.stats
        assert store.batch_exists([key(1)]) == [False]       # waits one RPC timeout
        assert not store.healthy
        mid = store.stats
        assert mid.errors == before.errors + 1               # that call paid for the failure
        assert store.batch_get([key(1)], [1000]) == [None]   # then answers at once:
        assert store.batch_put([key(2)], [b"y"]) == [False]
        after = store.stats                                  # no RPC, no further error
        assert after.errors == mid.errors and after.unavailable == mid.unavailable + 2
    finally:
        own_cluster.resume_master()
    assert store.wait_healthy(10.0)
    assert store.batch_get([key(1)], [1000]) == [b"x" * 1000]  # nothing was lost
    store.close()


def test_master_down_at_start_fails_fast_then_recovers(loopback: None) -> None:
    port = free_port()
    store = MooncakeStore(MooncakeStoreConfig(master_address=f"127.0.0.1:{port}",
                                              retry_backoff_s=0.2, max_backoff_s=0.5))
    # fails fast: the closed port is found by a TCP probe, no Mooncake client is set up
    assert not store.healthy and store.clients_created == 0
    assert store.batch_exists([key(0)]) == [False]
    assert store.batch_put([key(0)], [b"x"]) == [False]
    assert store.batch_get([key(0)]) == [None]
    # bring a master up on that very port: the store connects in the background
    with MooncakeCluster([16 * MIB], MasterOptions(rpc_port=port)):
        assert store.wait_healthy(15.0)
        assert store.batch_put([key(0)], [b"x" * 100]) == [True]
        assert store.batch_get([key(0)]) == [b"x" * 100]
    store.close()


def test_storage_node_lost_then_replaced(own_cluster: MooncakeCluster) -> None:
    store = connect(own_cluster)
    n, size = 8, 64 * KIB
    src = blocks(n, size, seed=4)
    dst = np.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    offsets = [i * size for i in range(n)]
    keys = [key(i) for i in range(n)]
    assert all(store.batch_put_from(keys, src, offsets, [size] * n))
    own_cluster.stop_node(0, kill=True)
    assert store.batch_get_into(keys, dst, offsets, [size] * n) == [MISS] * n
    assert store.stats.errors >= n                            # transfer failures, no exception
    own_cluster.wait_capacity(0, timeout_s=10)                # master drops the dead segment
    assert store.batch_put_from(keys, src, offsets, [size] * n) == [False] * n
    own_cluster.start_node(0)
    assert store.batch_put_from(keys, src, offsets, [size] * n) == [True] * n
    assert store.batch_get_into(keys, dst, offsets, [size] * n) == [size] * n
    assert np.array_equal(src, dst)
    store.close()


def test_benchmark_smoke(store: MooncakeStore) -> None:
    result = bench_zero_copy(store, num_blocks=32, block_bytes=256 * KIB, repeats=1)
    assert result["intact"] and result["put_gib_s"] > 0 and result["get_gib_s"] > 0


def test_master_options_record() -> None:
    """The master's options: defaults, refused values with their ranges, frozen."""
    m = MasterOptions()
    assert (m.client_ttl_s, m.eviction_high_watermark, m.extra_args, m.rpc_port) == (10, None, (), 0)
    assert MasterOptions(extra_args=["-a=1"]).extra_args == ("-a=1",)
    for kw, msg in (({"client_ttl_s": 0}, "client_ttl_s must be an integer >= 1, got 0"),
                    ({"eviction_high_watermark": 1.5},
                     "eviction_high_watermark must be None or in (0, 1], got 1.5"),
                    ({"rpc_port": 70000},
                     "rpc_port must be 0 (pick a free one) or in [1, 65535], got 70000")):
        with pytest.raises(ValueError) as exc:
            MasterOptions(**kw)
        assert str(exc.value) == msg
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.rpc_port = 1  # type: ignore[misc]
