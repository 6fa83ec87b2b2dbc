"""LocalCPUStore: LRU order, byte budget, drops, size checks and the zero-copy defaults."""

from __future__ import annotations

import numpy as np
import pytest

from hybridkv.connectors.stores import MISS, WRONG_SIZE, LocalCPUStore


def k(i: int) -> bytes:
    return i.to_bytes(16, "little") + b"\x00"


def test_round_trip_and_misses() -> None:
    s = LocalCPUStore(1 << 20)
    payloads = [bytes([i]) * (100 + i) for i in range(10)]
    assert s.batch_put([k(i) for i in range(10)], payloads) == [True] * 10
    assert s.batch_get([k(i) for i in range(10)]) == payloads
    assert s.batch_get([k(99)]) == [None]
    assert s.batch_exists([k(0), k(99)]) == [True, False]
    st = s.stats
    assert (st.puts, st.drops, st.gets, st.hits, st.misses) == (10, 0, 11, 10, 1)
    assert st.put_bytes == sum(map(len, payloads)) == s.used_bytes


def test_lru_evicts_oldest_to_fit_budget() -> None:
    s = LocalCPUStore(1000)
    s.batch_put([k(0), k(1), k(2)], [b"a" * 300, b"b" * 300, b"c" * 300])
    s.batch_get([k(0)])                      # 0 becomes most recent; 1 is now the oldest
    s.batch_exists([k(1)])                   # exists does not refresh
    assert s.batch_put([k(3)], [b"d" * 300]) == [True]
    assert s.batch_exists([k(0), k(1), k(2), k(3)]) == [True, False, True, True]
    assert s.used_bytes == 900 <= s.capacity_bytes
    assert s.batch_put([k(4)], [b"e" * 700]) == [True]   # needs two more evictions
    assert s.batch_exists([k(0), k(2), k(3), k(4)]) == [False, False, True, True]
    assert s.stats.evictions == 3
    assert s.used_bytes == 1000


def test_oversized_payload_dropped_without_evicting() -> None:
    s = LocalCPUStore(1000)
    s.batch_put([k(0)], [b"x" * 600])
    assert s.batch_put([k(1), k(2)], [b"y" * 1001, b"z" * 400]) == [False, True]
    assert s.batch_exists([k(0), k(1), k(2)]) == [True, False, True]
    st = s.stats
    assert (st.puts, st.drops, st.evictions) == (2, 1, 0)


def test_replacing_a_key_updates_bytes() -> None:
    s = LocalCPUStore(1000)
    s.batch_put([k(0)], [b"a" * 500])
    s.batch_put([k(0)], [b"b" * 200])
    assert s.used_bytes == 200 and len(s) == 1
    assert s.batch_get([k(0)]) == [b"b" * 200]


def test_size_mismatch_is_a_miss() -> None:
    s = LocalCPUStore(1000)
    s.batch_put([k(0)], [b"a" * 100])
    assert s.batch_get([k(0), k(0)], expected_sizes=[99, 100]) == [None, b"a" * 100]
    assert s.stats.size_mismatches == 1 and s.stats.misses == 1


def test_zero_copy_default_path() -> None:
    s = LocalCPUStore(1 << 20)
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, dtype=np.uint8)
    s.register_buffer(src)
    s.register_buffer(dst)
    keys = [k(i) for i in range(4)]
    assert s.batch_put_from(keys, src, [0, 1024, 2048, 3072], [1024] * 4) == [True] * 4
    got = s.batch_get_into(keys + [k(9)], dst, [3072, 2048, 1024, 0, 0], [1024] * 5)
    assert got == [1024, 1024, 1024, 1024, MISS]
    # blocks come back in reverse order
    assert np.array_equal(dst.reshape(4, 1024), src.reshape(4, 1024)[::-1])
    assert s.batch_get_into([k(0)], dst, [0], [512]) == [WRONG_SIZE]  # stored 1024 B, asked 512 B
    assert s.stats.size_mismatches == 1


def test_caller_errors_raise() -> None:
    with pytest.raises(ValueError):
        LocalCPUStore(0)
    s = LocalCPUStore(1000)
    with pytest.raises(ValueError):
        s.batch_put([k(0)], [])
    with pytest.raises(ValueError):
        s.batch_put([k(0)], [b""])
    buf = np.zeros(100, dtype=np.uint8)
    with pytest.raises(ValueError, match="registered"):
        s.batch_put_from([k(0)], buf, [0], [10])
    s.register_buffer(buf)
    with pytest.raises(ValueError, match="outside"):
        s.batch_put_from([k(0)], buf, [95], [10])


def test_closed_store_drops_and_misses() -> None:
    s = LocalCPUStore(1000)
    s.batch_put([k(0)], [b"a"])
    s.close()
    assert s.batch_put([k(1)], [b"b"]) == [False]
    assert s.batch_get([k(0)]) == [None]
    assert not s.healthy
