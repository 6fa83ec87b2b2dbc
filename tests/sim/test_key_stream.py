"""The bounds on a key stream (sim/bounds/key_stream.py, stream_caches.py, hazard_stream.py,
bound_inputs.py) against the per-key models of sim/bounds/optimal.py and sim/bounds/hazard.py, which stay the
reference: every count and every float must be equal, not close."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from hybridkv.sim.bounds.bound_inputs import BoundInputs
from hybridkv.sim.bounds.hazard import hazard_bound
from hybridkv.sim.bounds.hazard_stream import hazard_classes, stream_hazard_bound, stream_hazard_table
from hybridkv.sim.bounds.key_stream import key_stream, next_counted, unlimited_hits
from hybridkv.sim.bounds.optimal import (belady_block_hit_rate, gap_inputs, infinite_block_hit_rate,
                                  lru_block_hit_rate, next_read_indices)
from hybridkv.sim.bounds.stream_caches import belady_hits, lru_hits


def _workload(seed: int, n: int = 40, digest: int = 16) -> tuple[list[list[bytes]], list[int]]:
    """Chat-like chained keys: most requests continue an earlier one's prefix, then add blocks
    from a 4-token alphabet (so unrelated chains meet too); limits cut 0-2 blocks."""
    rng = random.Random(seed)
    keys: list[list[bytes]] = []
    for _ in range(n):
        ks = list(rng.choice(keys)[:rng.randint(0, 12)]) if keys and rng.random() < 0.7 else []
        parent = ks[-1] if ks else b""
        for _ in range(rng.randint(0, 10)):
            parent = hashlib.blake2b(parent + bytes([rng.randint(0, 3)]), digest_size=digest).digest()
            ks.append(parent)
        keys.append(ks)
    return keys, [max(0, len(k) - rng.randint(0, 2)) for k in keys]


CAPACITIES = (0, 1, 4, 15, 60, 10_000)


@pytest.mark.parametrize("seed", range(12))
def test_every_bound_on_the_stream_equals_the_per_key_model(seed: int) -> None:
    """Belady, the LRU model, the unlimited cache, the hazard reference (both floats) and the
    hybrid bound's counted Belady agree with the per-key code at every capacity."""
    keys, limits = _workload(seed)
    st = key_stream(keys, limits)
    assert st is not None
    classes = hazard_classes(st)
    table = stream_hazard_table(st, classes)
    rng = random.Random(seed)
    cut = [min(lim, rng.randint(0, 8)) for lim in limits]
    for cap in CAPACITIES:
        assert belady_hits(st, cap) == belady_block_hit_rate(keys, cap, limits).block_hits
        assert lru_hits(st, cap) == lru_block_hit_rate(keys, cap, hit_limits=limits).block_hits
        assert stream_hazard_bound(st, cap, classes, table) == hazard_bound(keys, limits, cap)
        counted = belady_block_hit_rate(keys, cap, cut, next_uses=next_read_indices(keys, cut))
        lim = np.minimum(np.array(cut), st.limits)
        assert belady_hits(st, cap, lim, next_counted(st, lim)) == counted.block_hits
    assert unlimited_hits(st).tolist() == list(infinite_block_hit_rate(keys).request_hits)
    mine, theirs = BoundInputs(keys, limits).gap_inputs(), gap_inputs(keys, limits)
    assert (mine.ceiling, mine.offsets) == (theirs.ceiling, theirs.offsets)
    assert mine.producer.tolist() == theirs.producer.tolist()


def test_the_stream_by_hand() -> None:
    """Three requests A B C / A B / A D: ids by key, each reference's previous and next
    request, earlier uses and producer, worked out by hand."""
    a, b, c, d = (bytes([i]) * 16 for i in range(4))
    st = key_stream([[a, b, c], [a, b], [a, d]], [3, 2, 1])
    assert st.starts.tolist() == [0, 3, 5, 7] and st.limits.tolist() == [3, 2, 1]
    assert st.ids.tolist() == [0, 1, 2, 0, 1, 0, 3] and st.num_keys == 4
    assert st.prev_req.tolist() == [-1, -1, -1, 0, 0, 1, -1]
    assert st.prev_ref.tolist() == [-1, -1, -1, 0, 1, 3, -1]
    assert st.next_req.tolist() == [1, 1, 3, 2, 3, 3, 3]          # 3 = n: never again
    assert st.uses_before.tolist() == [0, 0, 0, 1, 1, 2, 0]
    assert st.first_req.tolist() == [0, 0, 0, 0, 0, 0, 2]
    assert unlimited_hits(st).tolist() == [0, 2, 1]
    assert belady_hits(st, 1) == 2 and belady_hits(st, 2) == 3      # 1: A kept, 2: A and B
    assert lru_hits(st, 1) == 2 and lru_hits(st, 3) == 3            # 1: only A (touched last) left


def test_keys_that_share_a_first_word_or_are_not_whole_words_are_told_apart() -> None:
    """Keys equal in their first 8 bytes (sorted by all bytes instead) and keys of other lengths
    (numbered in a dict) get one id per distinct key, like any hashable key."""
    x, y = b"\x01" * 8 + b"\x02" * 8, b"\x01" * 8 + b"\x03" * 8
    st = key_stream([[x, y], [y], [x]], [2, 1, 1])
    assert st.ids[0] != st.ids[1] and st.prev_req.tolist() == [-1, -1, 0, 0]
    odd = key_stream([[b"abc", b"de"], [b"abc"]], [2, 1])
    assert odd.ids.tolist() == [0, 1, 0] and odd.prev_req.tolist() == [-1, -1, 0]
    empty = key_stream([[], []], [0, 0])
    assert unlimited_hits(empty).tolist() == [0, 0] and belady_hits(empty, 3) == 0


def test_a_request_that_repeats_a_key_falls_back_to_the_per_key_models() -> None:
    """No stream when a request names a key twice; BoundInputs then answers with the per-key
    models (same numbers as calling them)."""
    keys, limits = [[b"a" * 16, b"a" * 16], [b"a" * 16]], [2, 1]
    assert key_stream(keys, limits) is None
    inputs = BoundInputs(keys, limits)
    assert inputs.stream is None
    assert inputs.belady(1) == belady_block_hit_rate(keys, 1, limits).block_hits == 1
    assert inputs.lru(1) == lru_block_hit_rate(keys, 1, hit_limits=limits).block_hits
    assert inputs.hazard(1) == hazard_bound(keys, limits, 1)
    assert inputs.unlimited() == list(infinite_block_hit_rate(keys).request_hits)


def test_a_heap_entry_past_63_bits_falls_back_to_the_per_key_model(monkeypatch) -> None:
    """Belady's heap entries are int64 on the stream; when they would not fit, belady_hits says
    None and BoundInputs asks the per-key model (exact Python integers)."""
    import hybridkv.sim.bounds.stream_caches as caches
    keys, limits = _workload(3)
    inputs = BoundInputs(keys, limits)
    want = belady_block_hit_rate(keys, 4, limits).block_hits
    monkeypatch.setattr(caches, "ENTRY_LIMIT", 1000)
    assert belady_hits(inputs.stream, 4) is None
    assert inputs.belady(4) == want
