"""Chain ARC (``eviction/arc.py``): returning conversations in t2, one-off tails in t1, ghosts
that move the target p; against a model written from the module docstring.
"""

from __future__ import annotations

import pytest

from hybridkv.core.eviction import ChainARCPolicy
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import BlockPool
from tests.support.helpers import content_key
from tests.support.policies import (Cache, check_fails, eviction_order, model_workload,
                                    serve_contents)


def _returning_then_one_offs(num_blocks: int, one_offs: list[int]) -> Cache:
    """Chain [1, 2] computed, then come back as [1, 2, 3] (its deepest reused block, 2, was
    reused once: the whole batch, new tail 3 included, goes to t2 as 3, 2, 1); then one-off
    first turns (t1, in free order)."""
    c = Cache(ChainARCPolicy(), num_blocks)
    c.serve([1, 2])
    assert c.serve([1, 2, 3]) == 2
    for t in one_offs:
        c.serve([t])
    return c


def test_arc_takes_t1_only_while_it_is_over_its_target():
    """Victims come from t1 while it holds more than p blocks (p starts at half the capacity),
    else from t2. Capacity 6, p = 3: t1 holds 3 (not over): t2 first (3, 2, 1: tail first),
    then t1. Capacity 7, p = 3.5: t1 holds 4 (over): 10 leaves, then t1 holds 3: t2, then t1."""
    assert _returning_then_one_offs(7, [10, 11, 12]).drain() == [3, 2, 1, 10, 11, 12]
    assert _returning_then_one_offs(8, [10, 11, 12, 13]).drain() == [10, 3, 2, 1, 11, 12, 13]


def test_arc_content_shared_by_eight_requests_marks_a_first_turn():
    """A chain whose deepest reused block has been reused 1..7 times is a returning
    conversation (all of it to t2); reused SHARED_REUSES = 8 times or more it is shared content
    (a system prompt), so the chain is a first turn: its new blocks go to t1, the reused root
    to t2. Root 0, then [0, 100 + i] for i = 0..7: tails 100..106 land in t2, 107 in t1.
    Capacity 9, p = 4.5: t1 (1 block) is not over: t2 in order (100..106, then 0, re-freed
    last), then 107."""
    c = Cache(ChainARCPolicy(), 10)
    c.serve([0])
    for i in range(8):
        assert c.serve([0, 100 + i]) == 1
    assert c.drain() == [100, 101, 102, 103, 104, 105, 106, 0, 107]


def test_arc_recomputed_t1_ghost_grows_t1s_target():
    """Content remembered in b1 (evicted from t1) and computed again: t1 was too small, p grows
    by max(1, |b2| / |b1|) = 1 (2 -> 3), and the content (reused once now) goes to t2.
    Capacity 4, p = 2: 1, 2, 3, 4 in t1; 5 evicts 1; recomputing 1 evicts 2 (t1 3 > 2) and
    finds 1 in b1: p = 3. Drain: t1 holds 3, not over 3: t2's 1 first, then 3, 4, 5. (With p
    still 2, 3 would leave first.)"""
    c = Cache(ChainARCPolicy(), 5)
    for t in (1, 2, 3, 4, 5, 1):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2]
    assert c.policy.p == 3
    assert c.drain() == [1, 3, 4, 5]


def test_arc_recomputed_t2_ghost_shrinks_t1s_target():
    """Content remembered in b2 (evicted from t2) and computed again: p shrinks by max(1,
    |b1| / |b2|). Capacity 4, p = 2: [1, 2] twice (t2: 2, 1); 3, 4 in t1; 5 evicts 2 (t1 2 is
    not over 2: from t2; b2 = {2}); recomputing 2 evicts 3 (t1 3 > 2; b1 = {3}) and finds 2 in
    b2: p = 2 - max(1, 1 / 1) = 1; 2 (reused twice) goes to t2. Drain: t1 (4, 5) is over 1:
    4; then t1 1 is not over 1: t2 (1, 2); then 5."""
    c = Cache(ChainARCPolicy(), 5)
    c.serve([1, 2])
    c.serve([1, 2])
    for t in (3, 4, 5, 2):
        assert c.serve([t]) == 0
    assert c.evicted == [2, 3]
    assert c.policy.p == 1
    assert c.drain() == [4, 1, 2, 5]


def test_arc_check_rejects_a_corrupted_state():
    """Both lists holding a block; a ghost list over int(ghost_ratio x capacity); the target
    p outside [0, capacity] (both ends allowed)."""
    c = Cache(ChainARCPolicy(), 9)
    c.serve(list(range(1, 8)))                       # 7 blocks in t1
    pol = c.policy
    for b in pol.t1:
        pol.t2[b] = None
    check_fails(pol.check, "arc: blocks [1, 2, 3, 4, 5] are in both lists")
    for ratio, cap in ((2.0, 16), (0.1, 1), (0.5, 4)):
        for lst in ("b1", "b2"):
            c = Cache(ChainARCPolicy(ghost_ratio=ratio), 9)
            ghosts = getattr(c.policy, lst)
            for k in range(cap):
                ghosts[k] = 0
            c.policy.check()
            ghosts[cap] = 0
            n1, n2 = len(c.policy.b1), len(c.policy.b2)
            check_fails(c.policy.check, f"arc: ghost lists {n1}, {n2} over {cap}")
    c = Cache(ChainARCPolicy(), 9)
    for p in (0.0, 8.0):
        c.policy.p = p
        c.policy.check()
    for p in (-0.5, 8.5):
        c.policy.p = p
        check_fails(c.policy.check, f"arc: target {p} outside [0, 8]")


def test_arc_discard_remembers_the_ghost_like_an_eviction():
    """discard(b): block b leaves its list (another policy chose it) and its content is
    remembered in that list's ghost with its reuse count, at most int(ghost_ratio x capacity)
    ghosts, the oldest forgotten first. Capacity 4, ghost_ratio 0.5: 2 ghosts per list."""
    pol = ChainARCPolicy(ghost_ratio=0.5)
    c = Cache(pol, 5)
    c.serve([1])
    c.serve([1])                                     # reused once: t2
    for t in (2, 3, 4):
        c.serve([t])                                 # t1
    pol.discard(c.block(1))
    assert dict(pol.b2) == {content_key(1): 1} and c.block(1) not in pol
    for t in (2, 3, 4):
        pol.discard(c.block(t))
    assert list(pol.b1.items()) == [(content_key(3), 0), (content_key(4), 0)]
    assert len(pol) == 0


class ArcModel:
    """Chain ARC as the module docstring states it, on plain lists: t1 / t2 in free order,
    ghosts b1 / b2 (content, reuses) of at most int(ghost_ratio x capacity) entries, target p
    from half the capacity, moved by recomputed ghosts; victims from t1 while it holds more
    than p blocks (or t2 is empty)."""

    def __init__(self, capacity: int, ghost_ratio: float) -> None:
        self.cap = capacity
        self.gcap = max(1, int(ghost_ratio * capacity))
        self.p = capacity / 2
        self.t1: list[int] = []
        self.t2: list[int] = []
        self.b1: list[list] = []                          # [content, reuses], oldest first
        self.b2: list[list] = []
        self.reuses: dict[int, int] = {}
        self.content: dict[int, int] = {}

    def hit(self, b: int, free: bool) -> None:
        if free:
            (self.t1 if b in self.t1 else self.t2).remove(b)
        self.reuses[b] = self.reuses.get(b, 0) + 1

    def forget(self, blocks) -> None:
        for b in blocks:
            self.reuses.pop(b, None)

    @staticmethod
    def _take(ghosts: list, t: int):
        for i, (u, r) in enumerate(ghosts):
            if u == t:
                del ghosts[i]
                return r
        return None

    def free(self, blocks, contents) -> None:
        for b, t in zip(blocks, contents):
            self.content[b] = t
            r = self._take(self.b1, t)
            if r is not None:
                self.reuses[b] = r + 1
                self.p = min(self.cap, self.p + max(1.0, len(self.b2) / max(1, len(self.b1))))
                continue
            r = self._take(self.b2, t)
            if r is not None:
                self.reuses[b] = r + 1
                self.p = max(0.0, self.p - max(1.0, len(self.b1) / max(1, len(self.b2))))
        deepest = next((self.reuses[b] for b in blocks if self.reuses.get(b)), 0)
        for b in blocks:
            returning = 0 < deepest < 8 or self.reuses.get(b, 0) > 0
            (self.t2 if returning else self.t1).append(b)

    def pop(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            if self.t1 and (not self.t2 or len(self.t1) > self.p):
                b, ghosts = self.t1.pop(0), self.b1
            else:
                b, ghosts = self.t2.pop(0), self.b2
            ghosts.append([self.content[b], self.reuses.get(b, 0)])
            if len(ghosts) > self.gcap:
                del ghosts[0]
            out.append(b)
        return out

    def compare(self, pol) -> None:
        assert pol.p == pytest.approx(self.p)


@pytest.mark.parametrize("num_blocks, ghost_ratio, seed", [(13, 2.0, 1), (9, 0.5, 2), (17, 1.0, 3),
                                                           (8, 0.3, 4), (21, 2.0, 5)])
def test_arc_matches_a_model_of_the_docstring(num_blocks, ghost_ratio, seed):
    """Every victim, and the target p after every request, equal the model's."""
    model = ArcModel(num_blocks - 1, ghost_ratio)
    assert model_workload(ChainARCPolicy(ghost_ratio), model, num_blocks, 400, seed) > 250


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, "2", None])
def test_arc_ghost_ratio_must_be_a_positive_number(bad):
    with pytest.raises(ValueError) as exc:
        ChainARCPolicy(ghost_ratio=bad)
    assert str(exc.value) == f"ghost_ratio must be a number > 0, got {bad!r}"


def test_arc_a_recomputed_ghost_keeps_its_reuse_count_plus_one():
    """A recomputed ghost's block gets the ghost's reuse count + 1, so a conversation that
    comes back is recognized as returning until its deepest reuse count reaches
    SHARED_REUSES = 8 (then it is shared content: the new blocks go to t1).

    From b1 (capacity 4, p = 2): 1..4 in t1; 5 evicts 1 (b1: 1 with 0 reuses); recomputing 1
    evicts 2 and readmits 1 (reuses 1, p = 3, t2); five hits make 6; [1, 6] hits it (7:
    returning) and evicts 3 from t1 (t2 is empty while 1 is held): t2 = 6, 1. Drain: t1 (4, 5)
    is not over 3: 6, 1, then 4, 5.

    From b2 (capacity 3, p = 1.5): 1 hit 5 times, 2 and 3 once (all t2); 5 evicts 1 (t1 is
    empty; b2: 1 with 5); recomputing 1 evicts 2 (t1 holds 1, not over 1.5) and readmits 1
    (reuses 6, p = 1.5 - 1 = 0.5); [1, 6] hits it (7: returning) and evicts 5 (t1 over 0.5):
    t2 = 3, 6, 1. With one more hit before the eviction the count reaches 8 at [1, 6]: 6 goes
    to t1 and leaves first."""
    c = Cache(ChainARCPolicy(), 5)
    for t in (1, 2, 3, 4, 5, 1):
        assert c.serve([t]) == 0
    for _ in range(5):
        assert c.serve([1]) == 1
    assert c.serve([1, 6]) == 1
    assert c.evicted == [1, 2, 3]
    assert c.drain() == [6, 1, 4, 5]
    for hits, drain in ((5, [3, 6, 1]), (6, [6, 3, 1])):
        c = Cache(ChainARCPolicy(), 4)
        for t, n in ((1, hits), (2, 1), (3, 1)):
            for _ in range(n + 1):
                c.serve([t])
        for t in (5, 1):
            assert c.serve([t]) == 0
        assert c.policy.p == 0.5
        assert c.serve([1, 6]) == 1
        assert c.evicted == [1, 2, 5]
        assert c.drain() == drain


def _conversation_vs_flood(pool: BlockPool) -> int:
    """A shared root hit by 8 first turns, a conversation that comes back once, then a flood of
    first turns larger than the cache; returns the conversation's hits on its third turn."""
    for i in range(8):
        serve_contents(pool, [0, 1000 + i])
    serve_contents(pool, [0, 1, 2])
    assert serve_contents(pool, [0, 1, 2, 3]) == 3
    for i in range(40):
        serve_contents(pool, [0, 2000 + 2 * i, 2001 + 2 * i])
    return serve_contents(pool, [0, 1, 2, 3, 4])


def test_arc_keeps_a_returning_conversation_through_a_flood():
    """LRU loses the conversation to 40 one-off first turns (80 blocks > 30); chain ARC files
    the returning chain in t2 and the one-off tails in t1, which alone are evicted."""
    from hybridkv.core.eviction.arc import ChainARCPolicy
    assert _conversation_vs_flood(BlockPool(31, 1)) == 1          # only the shared root survives
    pol = ChainARCPolicy()
    pool = PolicyBlockPool(31, 1, pol)
    assert _conversation_vs_flood(pool) == 4
    t2 = {int.from_bytes(pool.block_hash[b], "little") for b in pol.t2}
    assert {0, 1, 2, 3, 4} <= t2 and all(t >= 2000 for t in
                                         (int.from_bytes(pool.block_hash[b], "little") for b in pol.t1))


def test_arc_order_tail_first_within_a_list():
    from hybridkv.core.eviction.arc import ChainARCPolicy
    evicted: list[bytes] = []
    pool = PolicyBlockPool(12, 1, ChainARCPolicy(), on_evict=lambda g, h: evicted.append(h))
    serve_contents(pool, [10, 11, 12])
    serve_contents(pool, [20, 21])
    assert eviction_order(pool, evicted) == [12, 11, 10, 21, 20]
