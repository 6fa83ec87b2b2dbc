"""``priority`` (``eviction/priority.py``): per-block marks (priority, expiry) kept as a Pareto
list, levels with a FIFO each in free order, expiries that move a block down, rebuilds that
drop dead entries; against a brute-force model at the pool level. Retention configs through
the manager: ``tests/core/test_retention_config.py``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from hybridkv.core.eviction import PriorityPolicy, make_policy
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.retention_config import DEFAULT_PRIORITY, RetentionMark
from tests.hypothesis_budget import budgeted, examples, note
from tests.support.helpers import content_key
from tests.support.policies import Cache, Clock, check_fails


def test_priority_rebuild_keeps_levels_moved_entries_and_expiries():
    """Dead entries (one per hit) are dropped once they outnumber the live ones by 64; the
    rebuild must keep every live entry of every level (0..100), the entries an expiry moved,
    the expiries still pending, and the mask bit of every level that still holds entries.
    5 blocks, freed 5 first (so no entry's seq equals its block id), t = 0: 1 priority 90
    until t = 10, 2 priority 60 until t = 1 then 50, 3 default (35), 4 priority 100, 5
    priority 61. At t = 2 one victim is taken: 2's mark lapses first (moved to level 50,
    leaving a dead entry at 60), the victim is 3 (lowest level). Then 4 is hit and freed 70
    times (a rebuild on the way), each step checked. At t = 11 1's mark has lapsed too (to
    the default level): the drain goes level by level, 1 (35), 2 (50), 5 (61), 4 (100)."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 6)
    pool = c.pool
    blocks = pool.allocate(5)
    for k, b in enumerate(blocks, 1):
        pool.insert(0, content_key(k), b)
    for b, marks in zip(blocks, ([RetentionMark(1, 90, 10.0)],
                                 [RetentionMark(1, 60, 1.0), RetentionMark(1, 50, None)], [],
                                 [RetentionMark(1, 100, None)], [RetentionMark(1, 61, None)])):
        if marks:
            pool.retain([b], [0], marks)
    pool.free(blocks[::-1])
    t[0] = 2.0
    victim = pool.allocate(1)
    assert c.evicted == [3]
    pool.free(victim)                                # back hash-less (scratch)
    d = c.block(4)
    entries = []
    for _ in range(70):
        pool.touch([d])
        pool.free([d])
        pool.check()
        entries.append(pol._entries)
    assert min(entries) < 10                         # rebuilt
    t[0] = 11.0
    assert c.drain() == [1, 2, 5, 4]


def test_priority_check_rejects_a_corrupted_state():
    """A level holding entries with its mask bit clear; a level's FIFO out of free order;
    more held blocks than live entries; an entry count that disagrees; seq and level tables
    with different blocks; a block's marks that are not a Pareto list (priority descending,
    expiry ascending). Levels 35 (the default) and 100 (the top) are both checked."""
    from hybridkv.core.retention_config import RetentionMark

    def fresh():
        pol = PriorityPolicy(lambda: 0.0)
        c = Cache(pol, 8)
        blocks = c.pool.allocate(5)
        for k, b in enumerate(blocks, 1):
            c.pool.insert(0, content_key(k), b)
        c.pool.retain(blocks[:2], [0, 1], [RetentionMark(2, 100, None)])
        c.pool.free(blocks)                          # 1, 2 at level 100; 3, 4, 5 at 35
        pol.check()
        return pol

    for lv in (35, 100):
        pol = fresh()
        pol.mask &= ~(1 << lv)
        check_fails(pol.check, f"priority: level {lv} holds entries but its mask bit is clear")
        pol = fresh()
        pol.fifo[lv].reverse()
        check_fails(pol.check, f"priority: level {lv}'s FIFO is not in free order")
    pol = fresh()
    pol.seq_of[99] = 1000
    pol.level_of[99] = 35
    check_fails(pol.check, "priority: 6 held blocks but 5 live entries")
    pol = fresh()
    pol._entries += 1
    check_fails(pol.check, "priority: counts 6 entries, holds 5")
    pol = fresh()
    pol.level_of[99] = 35
    check_fails(pol.check, "priority: seq and level tables disagree")
    for marks in ([(50, 10.0), (60, 5.0)], [(60, 10.0), (50, 5.0)], [(60, 5.0), (60, 10.0)],
                  [(60, 5.0), (50, 5.0)], [(90, 1.0), (60, 5.0), (50, 5.0)]):
        pol = fresh()
        pol.marks[5] = marks
        check_fails(pol.check, f"priority: block 5's marks are not a Pareto list: {marks}")
    pol = fresh()
    pol.marks[5] = [(90, 1.0), (60, 5.0), (50, math.inf)]
    pol.check()


def test_priority_marks_reach_the_positions_below_their_block_count():
    """retain(blocks, positions, marks): the block at table position j gets the marks with
    j < num_blocks, whatever order the marks and the positions come in (a sliding window
    releases its blocks back to front). Marks reaching 1, 3 and 2 blocks (priorities 90, 60,
    75, no TTL): position 0 -> 90, 1 -> 75, 2 -> 60, 3 -> none (the default, 35). Freed in
    position order, they leave lowest level first: 3, 2, 1, 0."""
    from hybridkv.core.retention_config import RetentionMark
    pol = PriorityPolicy(lambda: 0.0)
    c = Cache(pol, 6)
    table = c.pool.allocate(4)
    for j, b in enumerate(table):
        c.pool.insert(0, content_key(10 + j), b)
    c.pool.retain(table, [3, 2, 1, 0], [RetentionMark(1, 90, None), RetentionMark(3, 60, None),
                                        RetentionMark(2, 75, None)])
    assert [pol.level(b, 0.0)[0] for b in table] == [90, 75, 60, 35]
    c.pool.free(table)
    assert c.drain() == [13, 12, 11, 10]


def test_priority_a_dominated_mark_is_not_kept():
    """A block's marks form a Pareto list: a new mark with the same priority and an earlier
    expiry than one it holds adds nothing (the list stays valid for check())."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 4)
    b, = c.pool.allocate(1)
    c.pool.insert(0, content_key(1), b)
    c.pool.retain([b], [0], [RetentionMark(1, 60, 10.0)])
    c.pool.retain([b], [0], [RetentionMark(1, 60, 5.0)])
    c.pool.retain([b], [0], [RetentionMark(1, 50, 8.0)])
    assert pol.marks[b] == [(60, 10.0)]
    c.pool.free([b])
    c.pool.check()


def test_priority_a_block_steps_down_through_each_timed_mark():
    """A block with several timed marks drops to the next live one when the first lapses, and
    from it to the default when that one lapses too. 1: 90 until t = 5, then 60 until t = 10;
    2: default (35); 3: 70; 4: 50 (no TTL). At t = 6 one victim: 1 is at 60 now, 2 (35)
    leaves. At t = 11 1 is at the default: 1 (35), 4 (50), 3 (70)."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 5)
    blocks = c.pool.allocate(4)
    for k, b in enumerate(blocks, 1):
        c.pool.insert(0, content_key(k), b)
    c.pool.retain(blocks[:1], [0], [RetentionMark(1, 90, 5.0), RetentionMark(1, 60, 10.0)])
    c.pool.retain(blocks[2:3], [0], [RetentionMark(1, 70, None)])
    c.pool.retain(blocks[3:], [0], [RetentionMark(1, 50, None)])
    c.pool.free(blocks)
    t[0] = 6.0
    c.pool.free(c.pool.allocate(1))
    assert c.evicted == [2]
    t[0] = 11.0
    assert c.drain() == [1, 4, 3]


def test_priority_an_expired_block_merges_into_its_new_level_by_free_time():
    """A block moved to a lower level by an expiry keeps its free time: within the level it
    goes between the blocks freed before and after it. Freed in the order 1 (default), 3
    (priority 90 until t = 5), 2 (default); the block holding 3 has the highest id. At t = 6
    the drain is 1, 3, 2."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = PriorityPolicy(lambda: t[0])
    c = Cache(pol, 4)
    b1, b2, b3 = c.pool.allocate(3)
    for k, b in ((1, b1), (2, b2), (3, b3)):
        c.pool.insert(0, content_key(k), b)
    c.pool.retain([b3], [0], [RetentionMark(1, 90, 5.0)])
    c.pool.free([b1, b3, b2])
    t[0] = 6.0
    assert c.drain() == [1, 3, 2]


@pytest.mark.parametrize("first, second, want", [
    ((90, 10.0), (60, 10.0), [(90, 10.0)]),                  # dominated: same expiry, lower
    ((90, 5.0), (60, 10.0), [(90, 5.0), (60, 10.0)]),        # neither dominates: both kept
    ((60, 5.0), (60, 10.0), [(60, 10.0)]),                   # same priority, later expiry wins
    ((60, 10.0), (90, 10.0), [(90, 10.0)]),                  # same expiry, higher priority wins
    ((60, 10.0), (60, 10.0), [(60, 10.0)]),
])
def test_priority_marks_stay_a_pareto_list(first, second, want):
    """A block's marks (priority, expiry) keep only the ones no other mark beats on both
    (priority descending, expiry ascending): what the block's level follows over time."""
    from hybridkv.core.retention_config import RetentionMark
    pol = PriorityPolicy(lambda: 0.0)
    c = Cache(pol, 4)
    b, = c.pool.allocate(1)
    c.pool.insert(0, content_key(1), b)
    for p, e in (first, second):
        c.pool.retain([b], [0], [RetentionMark(1, p, e)])
    assert pol.marks[b] == want
    assert pol.level(b, 0.0) == want[0]
    c.pool.free([b])
    c.pool.check()


def test_priority_clock_must_be_callable():
    with pytest.raises(ValueError) as exc:
        PriorityPolicy(3)
    assert str(exc.value) == "clock must be a callable returning seconds, got 3"


def test_make_policy_registers_priority():
    policy = make_policy("priority", clock=Clock())
    assert isinstance(policy, PriorityPolicy) and policy.uses_retention
    with pytest.raises(ValueError, match="clock must be a callable"):
        PriorityPolicy(None)


@settings(max_examples=examples(150), deadline=None)
@given(num_blocks=st.integers(2, 30),
       ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), min_size=10, max_size=120))
@budgeted(0.03)
def test_eviction_order_matches_a_brute_force_model(num_blocks, ops):
    """Pool level, against a brute-force model: every victim is the held block with the lowest
    (highest live mark at now, else the default; free order), every step ``check()``s."""
    clock = Clock()
    pool = PolicyBlockPool(num_blocks, 1, PriorityPolicy(clock))
    marks: dict[int, list[tuple[int, float]]] = {}       # every mark since the block's content
    freed_at: dict[int, int] = {}                        # cached free block -> free order
    order = 0
    held: list[int] = []
    h = 0

    def level(b: int) -> int:
        return max((p for p, e in marks.get(b, ()) if e > clock.t), default=DEFAULT_PRIORITY)

    for op, x in ops:
        if op <= 1 and pool.num_free:
            k = 1 + x % pool.num_free
            uncached = pool.num_free - len(pool.policy)
            victims = sorted(freed_at, key=lambda b: (level(b), freed_at[b]))[:max(0, k - uncached)]
            got = pool.allocate(k)
            assert got[len(got) - len(victims):] == victims
            note("priority victims checked against the model", len(victims))
            note("victims above or below the default", sum(level(b) != DEFAULT_PRIORITY for b in victims))
            for b in got:
                freed_at.pop(b, None)
                marks.pop(b, None)
            for b in got[x % 3 == 0:]:
                h += 1
                pool.insert(0, h.to_bytes(8, "little"), b)
            held.extend(got)
        elif op == 2 and held:
            i = x % len(held)
            run = held[i:i + 1 + x % 4]
            del held[i:i + len(run)]
            if x % 3:
                m = [RetentionMark(1 + (x >> (4 + 2 * r)) % len(run), (x >> (10 + 7 * r)) % 101,
                                   None if (x >> (17 + r)) % 3 == 0 else float(1 + (x >> 19) % 4))
                     for r in range(1 + (x >> 2) % 2)]
                pool.retain(run, range(len(run)), m)
                for j, b in enumerate(run):
                    if pool.block_hash[b] is not None:
                        marks.setdefault(b, []).extend(
                            (mk.priority, math.inf if mk.ttl_s is None else clock.t + mk.ttl_s)
                            for mk in m if j < mk.num_blocks)
            pool.free(run[::-1])
            for b in run[::-1]:
                if pool.ref_cnt[b] == 0 and pool.block_hash[b] is not None:
                    order += 1
                    freed_at[b] = order
        elif op == 3 and h:
            b = pool.cached_block(0, (1 + x % h).to_bytes(8, "little"))
            if b is not None:
                freed_at.pop(b, None)
                pool.touch([b])
                held.append(b)
        elif op == 4:
            clock.t += x % 5 * 0.5
        elif op == 5 and held:
            b = held[x % len(held)]
            held.remove(b)
            held.extend([b, b])
            pool.touch([b])                              # a second reference
        pool.check()
