"""The waiting queues (``hybridkv.sched.queues``): the admission order and the preemption victim
of each policy, as the module's table states them, on hand-built requests.

Every priority key is unique (the scheduler stamps a submission number, ``_seq``), so the
orders below are fully determined by the contract; the tests set ``_seq`` as the scheduler
would.
"""

from __future__ import annotations

import pytest

from hybridkv import Request
from hybridkv.sched import EngineRequest, FCFSQueue, PriorityQueue
from hybridkv.sched.queues import POLICIES, make_waiting_queue


def reqs(*keys: tuple[int, float]) -> list[EngineRequest]:
    """One request per ``(priority, arrival_time)``, submitted in the given order."""
    out = []
    for seq, (prio, at) in enumerate(keys):
        r = EngineRequest(Request(f"r{seq}", [1, 2]), 1, priority=prio, arrival_time=at)
        r._seq = seq
        out.append(r)
    return out


def ids(rs) -> list[str]:
    return [r.request_id for r in rs]


def test_make_waiting_queue_builds_each_policy() -> None:
    assert POLICIES == ("fcfs", "priority")
    assert type(make_waiting_queue("fcfs")) is FCFSQueue
    assert type(make_waiting_queue("priority")) is PriorityQueue
    assert make_waiting_queue("fcfs").policy == "fcfs"
    with pytest.raises(ValueError, match=r"^unknown scheduling policy 'lifo'; valid: fcfs, priority$"):
        make_waiting_queue("lifo")


@pytest.mark.parametrize("policy", POLICIES)
def test_truth_length_and_membership(policy) -> None:
    """A queue is true when it holds one request or more; membership is by identity (two
    requests with equal fields are different requests)."""
    q = make_waiting_queue(policy)
    a, b, c = reqs((0, 0.0), (0, 0.0), (0, 0.0))
    assert not q and len(q) == 0 and q.peek() is None and list(q) == []
    q.push(a)
    assert q and len(q) == 1 and a in q and b not in q
    q.push(b)
    assert len(q) == 2 and c not in q and "r0" not in q
    q.remove(a)
    assert a not in q and b in q and len(q) == 1
    assert q.pop() is b and not q
    with pytest.raises(IndexError):
        q.pop()


def test_fcfs_admits_in_arrival_order_and_a_preempted_request_first() -> None:
    q = FCFSQueue()
    a, b, c = reqs((5, 0.0), (0, 1.0), (9, 2.0))
    for r in (a, b):
        q.push(r)
    q.push_preempted(c)
    assert ids(q) == ["r2", "r0", "r1"] and q.peek() is c
    assert ids(q) == ["r2", "r0", "r1"]                      # iterating changes nothing
    assert q.pop() is c and q.pop() is a and ids(q) == ["r1"]
    with pytest.raises(ValueError):
        q.remove(c)


def test_fcfs_victim_is_the_last_running_request() -> None:
    running = reqs((9, 0.0), (0, 1.0), (5, 2.0))
    assert FCFSQueue.victim(running) is running[-1]
    assert FCFSQueue.victim(running[:1]) is running[0]


def test_priority_admits_lowest_priority_then_earliest_arrival_then_submission() -> None:
    """Keys (priority, arrival, submission): (1, 5.0), (0, 9.0), (1, 2.0), (0, 9.0) are
    admitted as r1, r3 (same key as r1 but submitted later), r2 (earlier arrival), r0."""
    q = PriorityQueue()
    rs = reqs((1, 5.0), (0, 9.0), (1, 2.0), (0, 9.0))
    for r in rs:
        q.push(r)
    assert ids(q) == ["r1", "r3", "r2", "r0"] and q.peek() is rs[1]
    assert [q.pop().request_id for _ in range(4)] == ["r1", "r3", "r2", "r0"]


def test_priority_iteration_follows_submission_among_equal_keys_after_the_heap_moves() -> None:
    """Ten requests with one priority and one arrival time: admission order is submission order,
    however the heap array was shuffled by pops and removals (the iteration sorts by the whole
    key, the submission number included)."""
    q = PriorityQueue()
    rs = reqs(*[(0, 0.0)] * 10)
    for r in rs:
        q.push(r)
    assert q.pop() is rs[0]
    q.remove(rs[4])
    q.push_preempted(rs[0])                                  # back by its key: first again
    want = ["r0", "r1", "r2", "r3", "r5", "r6", "r7", "r8", "r9"]
    assert ids(q) == want
    assert [q.pop().request_id for _ in range(9)] == want


def test_priority_remove_names_a_request_that_is_not_waiting() -> None:
    q = PriorityQueue()
    a, b, c = reqs((0, 0.0), (1, 0.0), (2, 0.0))
    q.push(a)
    q.push(b)
    with pytest.raises(ValueError, match=r"^request 'r2' is not waiting$"):
        q.remove(c)
    assert ids(q) == ["r0", "r1"]
    q.remove(a)
    assert ids(q) == ["r1"] and q.peek() is b


def test_priority_victim_is_the_highest_key() -> None:
    """The victim is the running request admitted last by the key: highest priority value,
    then latest arrival, then latest submission."""
    rs = reqs((1, 0.0), (3, 1.0), (3, 2.0), (2, 9.0))
    assert PriorityQueue.victim(rs) is rs[2]
    rs = reqs((3, 5.0), (3, 5.0), (0, 9.0))
    assert PriorityQueue.victim(rs) is rs[1]
    assert PriorityQueue.victim(rs[:1]) is rs[0]
