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


def test_stored_events_teach_each_groups_kind_and_window() -> None:
    """A BlockStored that names its group's spec kind records ``(kind, window)`` for the group
    (the last one seen wins); one without a kind, and removals, record nothing."""
    from hybridkv.events.wire import BlockRemoved as WireRemoved
    from hybridkv.events.wire import BlockStored as WireStored
    index = KVEventIndex()
    index.apply("a", WireStored([h(1)], None, [0], 1, None, "GPU", None, group_idx=1,
                                kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=64))
    index.apply("a", WireStored([h(2)], None, [0], 1, None, "GPU", None, group_idx=0))
    index.apply("b", WireStored([h(3)], None, [0], 1, None, "GPU", None,
                                kv_cache_spec_kind="full_attention"))
    index.apply("a", WireRemoved([h(1)], "GPU", group_idx=1))
    assert index.kinds == {1: ("sliding_window", 64), None: ("full_attention", None)}
    assert index.holders(0, h(2)) == {"a"} and index.holders(None, h(3)) == {"b"}
    assert index.holders(1, h(1)) == frozenset()
    index.apply("a", WireStored([h(4)], None, [0], 1, None, "GPU", None, group_idx=1,
                                kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128))
    assert index.kinds[1] == ("sliding_window", 128)


def test_copies_clears_and_unknown_events() -> None:
    """Two copies of one block need two removals; a clear drops only its instance; removing
    what an unknown instance never stored changes nothing; anything but the three events is
    refused by name."""
    index = KVEventIndex()
    index.apply("a", BlockStored([h(1), h(1), h(2)], None, [0] * 3, 1, None, "GPU", 0))
    index.apply("b", BlockStored([h(1)], None, [0], 1, None, "GPU", 0))
    assert index.num_blocks("a") == 2 and index.num_blocks("b") == 1 and index.num_blocks("z") == 0
    index.remove("a", 0, [h(1)])
    assert index.holders(0, h(1)) == {"a", "b"}
    index.remove("a", 0, [h(1), h(9)])
    assert index.holders(0, h(1)) == {"b"} and index.num_blocks("a") == 1
    index.remove("z", 0, [h(1)])
    index.apply("a", AllBlocksCleared())
    assert index.holders(0, h(2)) == frozenset() and index.holders(0, h(1)) == {"b"}
    assert index.num_blocks("a") == 0
    index.check()
    index.apply("b", BlockRemoved([h(1)], "GPU", 0))
    assert index.holders(0, h(1)) == frozenset() and index._where == {}
    index.check()

    class Odd:
        pass
    import pytest
    with pytest.raises(TypeError, match="not a KV event: <"):
        index.apply("a", Odd())


def test_prefix_match_counts_each_holders_consecutive_leading_blocks() -> None:
    """Hand-built: a holds blocks 0-3, b holds 0-1 and 3, c holds 1-3 (not 0). For the query
    0,1,2,3: a matches 4, b 2 (block 2 missing), c is absent (no block 0)."""
    index = KVEventIndex()
    index.add("a", 0, [h(0), h(1), h(2), h(3)])
    index.add("b", 0, [h(0), h(1), h(3)])
    index.add("c", 0, [h(1), h(2), h(3)])
    index.add("d", 1, [h(0)])
    q = [h(0), h(1), h(2), h(3)]
    assert index.prefix_match(q) == {"a": 4, "b": 2}
    assert index.prefix_match(q[:1]) == {"a": 1, "b": 1}
    assert index.prefix_match(q, group=1) == {"d": 1}
    assert index.prefix_match([]) == {} and index.prefix_match([h(7)]) == {}
    assert index.prefix_match([h(0), h(7)]) == {"a": 1, "b": 1}
    index.add("b", 0, [h(2)])
    assert index.prefix_match(q) == {"a": 4, "b": 4}


def test_a_gap_is_reported_once_and_numbering_resumes_from_the_new_seq() -> None:
    class B:
        events: list = []
    index = KVEventIndex()
    assert index.apply_batch("a", B(), 5)                  # the first batch seen: no gap
    assert not index.apply_batch("a", B(), 5)              # a repeat is not the next one either
    assert index.apply_batch("a", B(), 6) and index.last_seq == {"a": 6}
    assert index.apply_batch("a", B(), 9) is False and index.apply_batch("a", B(), 10) is True
    assert index.apply_batch("a", B()) and index.last_seq == {"a": 10}   # no seq: no check
    assert index.gaps == 2


def test_check_names_each_broken_invariant() -> None:
    """White box: each invariant of ``check`` broken on purpose after legal operations."""
    import pytest

    def fresh() -> KVEventIndex:
        index = KVEventIndex()
        index.add("a", 0, [h(1), h(2)])
        index.add("b", 0, [h(1)])
        index.check()
        return index

    breaks = [
        (lambda ix: ix._held["a"].__setitem__((0, h(1)), 0), "keeps a zero count"),
        (lambda ix: ix._where[(0, h(2))].discard("a"), "holds .* unindexed"),
        (lambda ix: ix._where.__delitem__((0, h(2))), "holds .* unindexed"),
        (lambda ix: ix._where[(0, h(2))].add("b"), "^index has extra entries$"),
        (lambda ix: ix._where.__setitem__((0, h(9)), set()), "^empty holder set kept$"),
    ]
    for brk, message in breaks:
        index = fresh()
        brk(index)
        with pytest.raises(AssertionError, match=message):
            index.check()
