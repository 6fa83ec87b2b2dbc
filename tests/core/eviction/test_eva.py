"""``eva`` and ``eva-turns`` (``eviction/eva.py``, ``eviction/turns.py``): hit density learned by
age, per class of conversation turn; against a brute-force model of the module docstring.
"""

from __future__ import annotations

import pytest

from hybridkv.core.eviction import EVAPolicy, TurnEVAPolicy
from hybridkv.core.policy_pool import PolicyBlockPool
from tests.support.helpers import content_key
from tests.support.policies import Cache, check_fails, eviction_order, model_workload


def test_eva_accepts_the_smallest_valid_arguments():
    """ages >= 2 (an integer), width >= 1 or None, min_events > 0: the boundaries are valid."""
    for kw in ({"ages": 2}, {"width": 1}, {"min_events": 1}, {"min_events": 0.5}):
        pol = EVAPolicy(**kw)
        Cache(pol, 6).serve([1, 2, 3])
        assert getattr(pol, next(iter(kw))) == next(iter(kw.values()))


def test_eva_turns_passes_its_arguments_on():
    """TurnEVAPolicy(ages, width, min_events) overrides eva's bucket count, bucket width and
    events per curve (the width otherwise comes from the pool at attach)."""
    pol = TurnEVAPolicy(ages=8, width=3, min_events=5)
    PolicyBlockPool(40, 1, pol)
    assert (pol.ages, pol.width, pol.min_events) == (8, 3, 5)
    pol = TurnEVAPolicy()
    PolicyBlockPool(41, 1, pol)
    assert (pol.ages, pol.width, pol.min_events) == (64, 10, 128)


@pytest.mark.parametrize("reuses, cls", [(1, 1), (3, 3), (4, 4), (7, 4), (8, 0), (9, 0)])
def test_eva_turns_ignores_blocks_reused_eight_times_or_more(reuses, cls):
    """Class of a batch: min(4, r), r the largest reuse count below SHARED_REUSES = 8 among its
    blocks. A new block freed with a root reused ``reuses`` times: 7 counts (class 4), 8 is
    shared content and ignored (class 0)."""
    pol = TurnEVAPolicy(width=1000)
    c = Cache(pol, 16)
    c.serve([0])
    for _ in range(reuses - 1):
        c.serve([0])
    assert c.serve([0, 1]) == 1                       # the root's reuses-th hit
    assert pol.where[c.block(1)][0] == cls


def test_eva_check_rejects_a_corrupted_state():
    """A block queued under one key but recorded under another; a held block in no queue; a
    ghost table over max(64, ages x width) entries."""
    pol = EVAPolicy(ages=4, width=2)
    c = Cache(pol, 9)
    c.serve([1, 2])
    b = c.block(1)
    key = pol.where[b]
    pol.where[b] = (3, 7)
    check_fails(pol.check, f"eva: block {b} in queue {key} but recorded in (3, 7)")
    pol.where[b] = key
    pol.where[99] = key
    check_fails(pol.check, "eva: 3 held blocks but 2 queued")
    for ages, width, cap in ((4, 2, 64), (8, 10, 80)):
        pol = EVAPolicy(ages=ages, width=width)
        c = Cache(pol, 9)
        for k in range(cap):
            pol.ghost[k] = (0, 0, 0)
        pol.check()
        pol.ghost[cap] = (0, 0, 0)
        check_fails(pol.check, "eva: ghost table over its capacity")


class EvaModel:
    """eva / eva-turns as the module docstring states it, block by block (no queues, no
    ranking cache, no cursor): the clock counts freed blocks, a block's age is the number of
    buckets (``width`` clock units) since it was freed, capped at ``ages - 1``; per class and
    age, E counts the blocks (held, or evicted and remembered as a ghost within the horizon)
    that entered that age and H the reuses there (a hit on a free cached block, or a ghost's
    content freed again); counts halve once per horizon; the value of an age is the expected
    reuses until the next one over the buckets held until then, from the H / E hazards
    (pooled over the classes where a class has fewer than ``min_events`` entries); the victim
    is the held block of lowest (value, -age, class), oldest first."""

    def __init__(self, ages: int, width: int, min_events: float, turns: bool) -> None:
        self.A, self.W, self.m, self.turns = ages, width, min_events, turns
        self.clock = self.epoch = self.seq = 0
        self.held: dict[int, tuple[int, int, int]] = {}     # block -> (class, free epoch, seq)
        self.content: dict[int, int] = {}
        self.hits: dict[int, int] = {}
        self.ghost: dict[int, tuple[int, int, int]] = {}    # content -> (class, epoch, reuses)
        self.H = [[0.0] * ages for _ in range(5)]
        self.E = [[0.0] * ages for _ in range(5)]
        self.value = [[0.0] * ages for _ in range(5)]
        self.next_decay = width * ages
        self.ghost_cap = max(64, ages * width)

    def age(self, e: int) -> int:
        return min(self.A - 1, self.epoch - e)

    def batch_class(self, blocks) -> int:
        if self.turns:
            r = max([0] + [self.hits.get(b, 0) for b in blocks if self.hits.get(b, 0) < 8])
            return min(4, r)
        for b in blocks:                                   # tail first: the deepest reused
            if self.hits.get(b, 0):
                return min(4, (0, 1, 2, 3, 3, 3, 3, 3)[self.hits[b]] if self.hits[b] < 8 else 4)
        return 0

    def hit(self, b: int, free: bool) -> None:
        if free:
            c, e, _ = self.held.pop(b)
            self.H[c][self.age(e)] += 1
        self.hits[b] = self.hits.get(b, 0) + 1

    def forget(self, blocks) -> None:
        for b in blocks:
            self.hits.pop(b, None)

    def free(self, blocks, contents) -> None:
        for b, t in zip(blocks, contents):
            self.content[b] = t
            g = self.ghost.pop(t, None)
            if g is not None:
                self.hits[b] = g[2] + 1
                if self.epoch - g[1] < self.A:             # still within the horizon
                    self.H[g[0]][self.epoch - g[1]] += 1
        c = self.batch_class(blocks)
        for b in blocks:
            self.seq += 1
            self.held[b] = (c, self.epoch, self.seq)
        self.E[c][0] += len(blocks)
        self.clock += len(blocks)
        new = self.clock // self.W
        if new == self.epoch:
            return
        A = self.A
        for step in range(max(self.epoch + 1, new - A), new + 1):
            for c, e, _ in self.held.values():
                self.E[c][min(A - 1, step - e)] += 1
            for c, e, _ in self.ghost.values():
                if step - e < A:
                    self.E[c][step - e] += 1
        self.epoch = new
        if self.clock >= self.next_decay:
            self.next_decay = self.clock + self.W * A
            for rows in (self.H, self.E):
                for row in rows:
                    row[:] = [x / 2 for x in row]
        for c in range(5):
            hazard = []
            for a in range(A):
                h, e = self.H[c][a], self.E[c][a]
                if e < self.m:
                    h, e = sum(r[a] for r in self.H), sum(r[a] for r in self.E)
                hazard.append(min(1.0, h / e) if e >= self.m else None)
            self.value[c] = self.density(hazard)

    def density(self, hazard) -> list[float]:
        A = self.A
        if all(h is None for h in hazard):
            return [0.0] * A
        h = hazard[-1] or 0.0
        reuse, space = (1.0, 1 / h) if h else (0.0, float(A))   # the last bucket, for ever
        out = [reuse / space]
        for a in range(A - 2, -1, -1):
            h = hazard[a] or 0.0
            reuse, space = h + (1 - h) * reuse, 1 + (1 - h) * space
            out.append(reuse / space)
        return out[::-1]

    def compare(self, pol) -> None:
        for mine, theirs in ((self.E, pol.exp_n), (self.H, pol.hit_n), (self.value, pol.value)):
            assert [x for row in mine for x in row] == pytest.approx(
                [x for row in theirs for x in row], rel=1e-9, abs=1e-12)

    def pop(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b = min(self.held, key=lambda x: (self.value[self.held[x][0]][self.age(self.held[x][1])],
                                              -self.age(self.held[x][1]), self.held[x][0],
                                              self.held[x][2]))
            c, e, _ = self.held.pop(b)
            self.ghost[self.content[b]] = (c, max(e, self.epoch - self.A + 1), self.hits.get(b, 0))
            out.append(b)
        while len(self.ghost) > self.ghost_cap:
            del self.ghost[next(iter(self.ghost))]
        return out


@pytest.mark.parametrize("cls, ages, width, min_events, num_blocks, seed", [
    (EVAPolicy, 6, 2, 3, 13, 1),
    (EVAPolicy, 4, 1, 2, 9, 2),
    (EVAPolicy, 5, None, 4.5, 17, 3),
    (EVAPolicy, 4, None, 2, 8, 6),
    (EVAPolicy, 3, None, 3, 12, 7),
    (TurnEVAPolicy, 6, 2, 3, 13, 4),
    (TurnEVAPolicy, 4, 1, 2, 9, 5),
])
def test_eva_matches_a_brute_force_model(cls, ages, width, min_events, num_blocks, seed):
    """Every victim, and after every request the learned counts (E, H) and value curves,
    equal the model's. Without ``width`` the bucket is max(1, capacity // 4) blocks."""
    pol = cls(ages=ages, width=width, min_events=min_events)
    model = EvaModel(ages, width or max(1, (num_blocks - 1) // 4), min_events, cls is TurnEVAPolicy)
    assert model_workload(pol, model, num_blocks, 400, seed) > 250
    assert any(v > 0 for row in model.value for v in row)


def test_eva_without_statistics_is_lru_by_batch():
    """Before it has learned anything every value is 0, and ties go oldest bucket first: with
    one bucket per freed block that is exactly LRU, each batch tail first."""
    from hybridkv.core.eviction.eva import EVAPolicy
    evicted: list[bytes] = []
    pool = PolicyBlockPool(16, 1, EVAPolicy(ages=64, width=1, min_events=10**9),
                           on_evict=lambda g, h: evicted.append(h))
    chains = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    for chain in chains:
        blocks = pool.allocate(len(chain))
        for b, t in zip(blocks, chain):
            pool.insert(0, content_key(t), b)
        pool.free(blocks[::-1])                      # tail first, as the coordinator frees
    hit = pool.cached_block(0, content_key(3))              # a hit makes block 3 the newest
    pool.touch([hit])
    pool.free([hit])
    assert eviction_order(pool, evicted) == [2, 1, 0, 4, 8, 7, 6, 5, 3]


def test_eva_learns_a_dead_time():
    """Every block is read again about 7 buckets after it was first freed, never earlier and
    never a second time. The policy learns both: blocks already reused once (class 1, never
    reused again) go first, oldest first; the blocks still waiting for their reuse go last,
    youngest first (the furthest from their reuse) — the opposite of LRU."""
    from hybridkv.core.eviction.eva import EVAPolicy
    evicted: list[bytes] = []
    pol = EVAPolicy(ages=16, width=1, min_events=4)
    pool = PolicyBlockPool(200, 1, pol, on_evict=lambda g, h: evicted.append(h))
    for t in range(60):
        b, = pool.allocate(1)
        pool.insert(0, content_key(t), b)
        pool.free([b])
        if t >= 3:                                   # content t-3 comes back now
            c = pool.cached_block(0, content_key(t - 3))
            pool.touch([c])
            pool.free([c])
        pool.check()
    state = {int.from_bytes(pool.block_hash[b], "little"): (k[0], pol._age(k[1]))
             for b, k in pol.where.items()}
    waiting = sorted((t for t, (c, _) in state.items() if c == 0), key=lambda t: state[t][1])
    assert waiting == [59, 58, 57] and [state[t][1] for t in waiting] == [2, 4, 6]
    order = eviction_order(pool, evicted)
    assert order[-3:] == waiting                     # youngest first, the one due next last
    done = order[:-3]
    assert all(state[t][0] == 1 for t in done)
    assert [state[t][1] for t in done] == sorted((state[t][1] for t in done), reverse=True)


def test_eva_turns_classes_count_turns():
    """A conversation that comes back k times is freed in class k (capped at 4); a block reused
    SHARED_REUSES times or more (a system prompt) does not count. ``eva`` classes a first turn
    by the system prompt (8+ reuses: its last class) and every returning conversation as 1 (its
    deepest reused block was read once)."""
    from hybridkv.core.eviction.eva import EVAPolicy
    from hybridkv.core.eviction.turns import SHARED_REUSES, TurnEVAPolicy
    classes: dict[str, list[int]] = {}
    for policy in (TurnEVAPolicy(ages=64, width=1000), EVAPolicy(ages=64, width=1000)):
        pool = PolicyBlockPool(64, 1, policy)
        system = pool.allocate(1)
        pool.insert(0, content_key(0), system[0])
        pool.free(system)
        for _ in range(SHARED_REUSES):               # the system prompt: shared content
            pool.touch(system)
            pool.free(system)
        chain, seen = list(system), []
        for turn in range(6):                        # each turn re-reads the whole chain
            pool.touch(chain)
            new = pool.allocate(2)
            for b in new:
                pool.insert(0, content_key(100 * turn + b + 1), b)
            chain = chain + new
            pool.free(chain[::-1])
            seen.append(policy.where[chain[-1]][0])
            pool.check()
        classes[policy.name] = seen
    assert classes == {"eva-turns": [0, 1, 2, 3, 4, 4], "eva": [4, 1, 1, 1, 1, 1]}


def test_eva_bad_arguments():
    from hybridkv.core.eviction.eva import EVAPolicy
    for kw in ({"ages": 1}, {"ages": 2.5}, {"width": 0}, {"min_events": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            EVAPolicy(**kw)
