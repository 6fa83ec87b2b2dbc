"""The pool's free queue: the compiled build's native queue against the lists it replaces.

``hybridkv.core.free_queue_native.FreeBlockQueue`` (links in two C arrays, the sentinels' slots
after the ids, moved when the capacity grows) must be the same queue as the pure build's
``hybridkv.core.free_queue.FreeBlockQueue`` (two lists): after every operation of a random
sequence (pops across the gap and past it, appends and prepends of popped blocks, removals of
explicit and fresh ids, ``materialize``, unlinks) both hold the same blocks in the same order,
the same counters and the same links, and refuse the same calls with the same errors. Needs the
compiled build (as tests/core/test_compiled.py).
"""

from __future__ import annotations

import itertools
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.core.free_queue import FreeBlockQueue as Reference
from hybridkv.core.pool import BlockPool
from tests.core.test_compiled import _require_compiled


def _native():
    _require_compiled()
    from hybridkv.core.free_queue_native import FreeBlockQueue
    return FreeBlockQueue


def _walk(q) -> list[int]:
    """The nodes from the head on, read from the link snapshots (sentinels included), at most
    ``num_blocks + 4`` of them: a queue whose links cycle reads as too long, and never hangs."""
    nxt, out = q._next, []
    b = nxt[-3]
    while b != -1 and len(out) <= q.num_blocks + 3:
        out.append(b)
        b = nxt[b]
    return out


def _state(q) -> tuple:
    """What the two queues must agree on: the links first (so iterating is safe)."""
    return (_walk(q), len(q), q.num_free, q.next_fresh, q.capacity, q.num_blocks,
            list(q._prev), list(q._next))


def _same(nat, ref) -> bool:
    """The same links and counters, then (safe to iterate now) the same blocks in order."""
    return _state(nat) == _state(ref) and \
        list(itertools.islice(nat, nat.num_blocks + 2)) == list(ref)


def _apply(q, op: tuple, popped: list[int]) -> object:
    """Run ``op`` on ``q``; returns what it returned or the error it raised (type, message).
    ``popped``: blocks out of the queue, the ones appends and prepends may take back."""
    kind = op[0]
    try:
        if kind == "pop":
            out = q.popleft_n(op[1])
            return out
        if kind in ("append", "prepend"):
            k = op[1] % (len(popped) + 1)
            blocks = [b for b in popped[:k] if b < q.next_fresh]
            (q.append_n if kind == "append" else q.prepend_n)(blocks)
            return blocks
        if kind == "remove":
            queued = list(itertools.islice(q, q.num_blocks))
            if not queued:
                return None
            b = queued[op[1] % len(queued)]
            q.remove(b)
            return b
        if kind == "unlink":
            queued = [b for b in itertools.islice(q, q.num_blocks) if b < q.next_fresh]
            if not queued:
                return None
            b = queued[op[1] % len(queued)]
            q._unlink(b)
            q.num_free -= 1
            return b
        if kind == "materialize":
            q.materialize(op[1])
            return None
        if kind == "iter":
            return list(itertools.islice(q, q.num_blocks + 2))
    except (ValueError, IndexError) as exc:
        return (type(exc).__name__, str(exc))
    raise AssertionError(kind)


OPS = st.lists(st.one_of(
    st.tuples(st.just("pop"), st.integers(0, 40)),
    st.tuples(st.just("append"), st.integers(0, 30)),
    st.tuples(st.just("prepend"), st.integers(0, 30)),
    st.tuples(st.just("remove"), st.integers(0, 10**6)),
    st.tuples(st.just("unlink"), st.integers(0, 10**6)),
    st.tuples(st.just("materialize"), st.integers(0, 200)),
    st.tuples(st.just("iter"), st.just(0)),
), max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.integers(2, 160), st.booleans(), st.randoms(use_true_random=False), OPS)
def test_the_native_queue_is_the_reference_after_every_operation(num_blocks, explicit, rng, ops) -> None:
    """The same results, errors, blocks in order, counters and links after every operation,
    from an all-fresh queue (capacity doubling from 1) or an explicit initial order."""
    Native = _native()
    initial = None
    if explicit:
        initial = list(range(1, num_blocks))
        rng.shuffle(initial)
        initial = initial[:rng.randrange(0, num_blocks)]
    ref, nat = Reference(num_blocks, initial), Native(num_blocks, initial)
    assert _same(nat, ref)
    popped_ref: list[int] = []
    popped_nat: list[int] = []
    for op in ops:
        got_ref = _apply(ref, op, popped_ref)
        got_nat = _apply(nat, op, popped_nat)
        assert got_nat == got_ref, op
        for popped, got in ((popped_ref, got_ref), (popped_nat, got_nat)):
            if op[0] == "pop" and isinstance(got, list):
                popped.extend(got)
            elif op[0] in ("append", "prepend"):
                for b in got:                              # type: ignore[union-attr]
                    popped.remove(b)
            elif op[0] in ("remove", "unlink") and got is not None:
                popped.append(got)                         # type: ignore[arg-type]
        assert _same(nat, ref), op


def test_growth_moves_the_sentinels_and_keeps_the_links() -> None:
    """Pops through several capacity doublings (1 -> 64 -> 128 -> ... -> num_blocks), with
    blocks freed back to both ends in between: the same queue and links as the reference,
    every block handed out once, and the last fresh ids drop the gap from the list."""
    Native = _native()
    n = 1000
    ref, nat = Reference(n), Native(n)
    out_ref, out_nat = [], []
    for k in (3, 70, 3, 200, 150, 400):        # out keeps >= 3 blocks: the ends disjoint
        out_ref += ref.popleft_n(k)
        out_nat += nat.popleft_n(k)
        assert _same(nat, ref)
        ref.append_n(out_ref[-2:])
        nat.append_n(out_nat[-2:])
        ref.prepend_n(out_ref[:1])
        nat.prepend_n(out_nat[:1])
        del out_ref[-2:], out_ref[:1]
        del out_nat[-2:], out_nat[:1]
        assert _same(nat, ref)
    rest = nat.num_free
    assert ref.popleft_n(rest) == nat.popleft_n(rest)
    assert _same(nat, ref) and nat.capacity == n and nat.next_fresh == n
    assert nat._next[-3] == -1                        # HEAD -> TAIL: empty, no gap


def test_errors_and_memory() -> None:
    """Too many pops and an id out of range are refused with the reference's message and
    change nothing, as is a pool of no block; an id with no link slot (negative, past the
    capacity) is refused before anything is written; an all-fresh queue of a huge pool holds
    3 + 1 link slots (traced)."""
    Native = _native()
    for cls in (Reference, Native):
        q = cls(10)
        with pytest.raises(ValueError, match=r"^cannot pop 10 blocks, only 9 are free$"):
            q.popleft_n(10)
        with pytest.raises(ValueError, match=r"^block id 10 out of range \[1, 10\)$"):
            q.materialize(11)
        assert list(q) == list(range(1, 10)) and q.num_free == 9
    for cls in (Reference, Native):
        for n in (0, -1, -3):
            with pytest.raises(ValueError, match=rf"^a free queue needs num_blocks >= 1, got {n}$"):
                cls(n, [])
    q = Native(100)
    q.popleft_n(5)                                # capacity 64: ids 0..63 have link slots
    before = _state(q)
    for bad in (-1, -3, 64, 10**9):               # refused, never written outside the arrays
        with pytest.raises(IndexError, match=rf"^block id {bad} has no link slot \(explicit ids < 64\)$"):
            q._unlink(bad)
        with pytest.raises(IndexError, match=rf"^block id {bad} has no link slot"):
            q.append_n([bad])
    assert _state(q) == before
    tracemalloc.start()
    try:
        q = Native(10**12 // 16 + 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 and len(q._next) == len(q._prev) == 4
    assert q.popleft_n(3) == [1, 2, 3] and q.num_free == 10**12 // 16 - 3


def test_the_compiled_pool_uses_the_native_queue() -> None:
    """BlockPool's queue is the native one in the compiled build (what the tests above vouch
    for), and the pool's integrity check reads its links."""
    Native = _native()
    pool = BlockPool(100, 1)
    assert type(pool.queue) is Native
    pool.allocate(10)
    pool.touch([3, 50])
    pool.free([2, 3, 3, 50])
    pool.check()


@pytest.mark.parametrize("which", ["reference", "native"])
def test_links_worked_out_by_hand(which: str) -> None:
    """A 5-id pool (capacity 1 -> 5 on the first pop; the sentinels HEAD, GAP, TAIL move to
    slots 5, 6, 7): pop 2, free 2 to the tail and 1 to the head. Queue 1, 3, 4 (fresh, behind
    the gap), 2; every link as computed by hand."""
    cls = Reference if which == "reference" else _native()
    q = cls(5)
    assert q.capacity == 1 and list(q._next) == [0, -2, -1, 0]        # HEAD -> GAP -> TAIL
    assert q.popleft_n(2) == [1, 2] and q.capacity == 5 and q.next_fresh == 3
    q.append_n([2])
    q.prepend_n([1])
    assert list(q) == [1, 3, 4, 2] and q.num_free == 4
    assert list(q._next) == [0, -2, -1, 0, 0, 1, 2, 0]    # 1->GAP, 2->TAIL, HEAD->1, GAP->2
    assert list(q._prev) == [0, -3, -2, 0, 0, 0, 1, 2]    # 1<-HEAD, 2<-GAP, GAP<-1, TAIL<-2
    assert q.popleft_n(3) == [1, 3, 4] and q.next_fresh == 5 and list(q) == [2]
    assert list(q._next)[5] == 2 and list(q._prev)[2] == -3   # the gap left: HEAD -> 2
