"""The consumer-side index against a brute-force model (hypothesis): random store/remove/clear
events of several instances and groups; prefix_match against a direct scan."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.core.events import AllBlocksCleared, BlockRemoved, BlockStored
from hybridkv.events.index import KVEventIndex

OPS = st.lists(st.tuples(st.sampled_from(["store", "remove", "clear"]), st.integers(0, 2),
                         st.integers(0, 1), st.lists(st.integers(0, 7), min_size=1, max_size=5)),
               max_size=60)


def h(i: int) -> bytes:
    return bytes([i]) * 4


@settings(max_examples=150, deadline=None)
@given(OPS, st.lists(st.integers(0, 7), max_size=8))
def test_index_matches_a_multiset_model(ops, query) -> None:
    index = KVEventIndex()
    model: dict[int, Counter] = {0: Counter(), 1: Counter(), 2: Counter()}
    for op, inst, group, ids in ops:
        hashes = [h(i) for i in ids]
        if op == "store":
            index.apply(inst, BlockStored(hashes, None, [0] * len(ids), 1, None, "GPU", group))
            model[inst].update((group, x) for x in hashes)
        elif op == "remove":
            present = [x for x in hashes if model[inst][(group, x)] > 0]
            index.apply(inst, BlockRemoved(present, "GPU", group))
            for x in present:
                model[inst][(group, x)] -= 1
            model[inst] = +model[inst]
        else:
            index.apply(inst, AllBlocksCleared())
            model[inst] = Counter()
        index.check()
    for inst in model:
        for (g, x) in model[inst]:
            assert inst in index.holders(g, x)
    for g in (0, 1):
        for i in range(8):
            assert index.holders(g, h(i)) == {inst for inst in model if model[inst][(g, h(i))] > 0}
    qs = [h(i) for i in query]
    got = index.prefix_match(qs, group=0)
    for inst in model:
        n = 0
        while n < len(qs) and model[inst][(0, qs[n])] > 0:
            n += 1
        assert got.get(inst, 0) == n


def test_gap_detection_by_sequence_number() -> None:
    class B:
        events: list = []
    index = KVEventIndex()
    assert index.apply_batch("a", B(), 0) and index.apply_batch("a", B(), 1)
    assert not index.apply_batch("a", B(), 3) and index.gaps == 1
    assert index.apply_batch("b", B(), 7)
