"""TierHierarchy: write policies, the load rule, cascades, against hand-worked cases."""

from __future__ import annotations

import pytest

from hybridkv.tiers import OFFLOAD_ON_EVICT, WRITE_THROUGH, TierHierarchy


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_write_through_writes_every_tier_in_group_order() -> None:
    t = TierHierarchy([25, 100], [10, 5], WRITE_THROUGH)
    written = t.save([(1, h(1)), (0, h(2)), (1, h(3)), (0, h(4))])
    assert written == [30, 30]
    # group 0 first (stable), then group 1; tier 0 (25 B) let the oldest go
    assert t.keys(1) == [(0, h(2)), (0, h(4)), (1, h(1)), (1, h(3))]
    assert t.keys(0) == [(0, h(4)), (1, h(1)), (1, h(3))]


def test_a_load_refreshes_and_a_missing_block_stops_at_its_run() -> None:
    t = TierHierarchy([100], [10, 10], WRITE_THROUGH)
    t.save([(0, h(1)), (0, h(2)), (1, h(3))])
    res = t.load([(0, h(1)), (0, h(9)), (0, h(2)), (1, h(3))])
    assert not res.ok
    # the whole failing run was read (h(1) and h(2) refreshed), the next run was not
    assert res.served == [0, -1, 0]
    assert t.keys(0) == [(1, h(3)), (0, h(1)), (0, h(2))]


def test_write_through_keeps_a_block_loaded_from_a_lower_tier_in_the_faster_ones() -> None:
    t = TierHierarchy([10, 100], [10], WRITE_THROUGH)
    t.save([(0, h(1))])
    t.save([(0, h(2))])                        # tier 0 holds one entry: h(1) left it
    res = t.load([(0, h(1))])
    assert res.ok and res.served == [1] and res.written == [10, 0]
    assert t.keys(0) == [(0, h(1))] and set(t.keys(1)) == {(0, h(1)), (0, h(2))}


def test_offload_on_evict_cascades_and_a_load_moves_blocks_up() -> None:
    t = TierHierarchy([20, 20], [10], OFFLOAD_ON_EVICT)
    for i in range(1, 6):
        t.offload(0, h(i))
    # tier 0: the two newest; tier 1: the two before them; h(1) fell off the end
    assert t.keys(0) == [(0, h(4)), (0, h(5))]
    assert t.keys(1) == [(0, h(2)), (0, h(3))]
    assert not t.contains(0, h(1))
    res = t.load([(0, h(3)), (0, h(4))])
    assert res.ok and res.served == [1, 0]
    assert t.keys(0) == [(0, h(5))] and t.keys(1) == [(0, h(2))]       # exclusive


def test_offload_of_an_entry_too_large_for_a_tier_goes_on_down() -> None:
    t = TierHierarchy([5, 100], [10], OFFLOAD_ON_EVICT)
    assert t.offload(0, h(1)) == [0, 10]
    assert t.find(0, h(1)) == 1


def test_a_failed_load_moves_nothing() -> None:
    t = TierHierarchy([100], [10], OFFLOAD_ON_EVICT)
    t.offload(0, h(1))
    res = t.load([(0, h(1)), (0, h(2))])
    assert not res.ok and t.keys(0) == [(0, h(1))]


@pytest.mark.parametrize("kwargs, message", [
    (dict(capacities=[10], entry_bytes=[1], policy="write-back"), "unknown tier policy 'write-back'"),
    (dict(capacities=[], entry_bytes=[1]), "at least one tier"),
    (dict(capacities=[10], entry_bytes=[0]), "entry_bytes must be positive"),
    (dict(capacities=[-1], entry_bytes=[1]), "capacity must be an integer >= 0"),
])
def test_bad_hierarchies_are_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TierHierarchy(**kwargs)
