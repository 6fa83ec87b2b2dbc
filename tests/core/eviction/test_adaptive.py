"""``adaptive`` and ``adaptive-turns`` (``eviction/adaptive.py``): LRU until a challenger's
shadow cache would have hit more; the shadows key content by group.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hybridkv.core.eviction import AdaptivePolicy, ChainARCPolicy, make_policy
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import BlockPool
from tests.hypothesis_budget import examples
from tests.support.helpers import content_key, serve_chain
from tests.support.policies import Cache, check_fails, serve_contents


def _hold(alt, b: int, key=None) -> None:
    """Make challenger ``alt`` hold block ``b`` too (consistently with its own check)."""
    if isinstance(alt, ChainARCPolicy):
        alt.t1[b] = None
    else:
        alt.where[b] = key
        alt.queues[key][b] = None


def _drop(alt, b: int):
    if isinstance(alt, ChainARCPolicy):
        alt.t1.pop(b, None) or alt.t2.pop(b, None)
        return None
    key = alt.where.pop(b)
    del alt.queues[key][b]
    return key


@pytest.mark.parametrize("name", ["adaptive", "adaptive-turns"])
def test_adaptive_check_rejects_a_corrupted_state(name):
    """Every challenger's own check runs; each must hold the same blocks as the LRU list (the
    same count and each block); the shadows must fit the pool's capacity."""
    def fresh():
        pol = make_policy(name)
        Cache(pol, 6).serve([1, 2, 3])
        pol.check()
        return pol

    for i in range(len(fresh().alts)):
        pol = fresh()
        alt = pol.alts[i]
        _hold(alt, 99, _drop(alt, next(iter(pol.fifo))))          # same count, another block
        check_fails(pol.check, f"adaptive: LRU list (3) and {alt.name} (3) hold different blocks")
        pol = fresh()
        alt = pol.alts[i]
        _hold(alt, 77, None if isinstance(alt, ChainARCPolicy) else alt.where[next(iter(pol.fifo))])
        check_fails(pol.check, f"adaptive: LRU list (3) and {alt.name} (4) hold different blocks")
    pol = fresh()
    arc = pol.alts[0]
    for b in list(arc.t1):
        arc.t2[b] = None
    with pytest.raises(AssertionError, match="arc: blocks"):
        pol.check()
    for over in ("lru", "shadow"):                       # capacity 5, 3 keys in each shadow
        pol = fresh()
        if over == "lru":
            def add(k):
                pol.shadow_lru[k] = None
        else:
            def add(k):
                pol.shadows[-1].on_free([k])
        add(("x", 0))
        add(("x", 1))
        pol.check()                                      # 5: at the capacity
        add(("x", 2))
        check_fails(pol.check, "adaptive: a shadow is over the pool's capacity")


def _requests(seed: int, n: int, keys: int):
    """One-block requests: a few popular contents, a stream of one-offs, and contents that
    come back after a while (a skewed, drifting mix)."""
    import random
    rng = random.Random(seed)
    for k in range(n):
        r = rng.random()
        if r < 0.3:
            yield [rng.randint(1, 3)]
        elif r < 0.6:
            yield [10 + rng.randint(0, keys)]
        elif r < 0.8:
            yield [100 + (k // 7) % (2 * keys)]
        else:
            yield [1000 + k]


@pytest.mark.parametrize("name, num_blocks, seed, switches", [
    ("adaptive", 2, 1, False), ("adaptive", 7, 2, True), ("adaptive", 31, 3, False),
    ("adaptive-turns", 9, 4, True), ("adaptive-turns", 31, 5, False), ("margin 0", 7, 7, True),
    ("margin 0", 5, 6, True)])
def test_adaptive_shadows_score_what_lru_and_each_challenger_would_hit(name, num_blocks, seed, switches):
    """The shadows are caches of the pool's capacity on content keys: after every request
    each shadow's count equals the leading hits a real pool of that capacity (plain LRU, and
    one per challenger policy) has had; the counts halve once DECAY_CAPACITIES = 8
    capacities of blocks have been freed since the last halving; the policy evicts like the
    first challenger with the top count once that count exceeds (1 + margin) x LRU's + 1
    (margin 0.1 by default), else LRU
    (from the start: nothing is ahead). One-block requests, so "leading hits" and "a hit"
    are the same thing for the shadows and the pools."""
    from hybridkv.core.pool import BlockPool
    pol = AdaptivePolicy(margin=0) if name == "margin 0" else make_policy(name)
    assert pol.use_arc is False and pol.mode == -1
    real = Cache(pol, num_blocks)
    pools = [BlockPool(num_blocks, 1)] + [
        PolicyBlockPool(num_blocks, 1, type(a)()) for a in pol.alts]
    cap = num_blocks - 1
    scores = [0.0] * len(pools)
    freed = 0
    switched = ties = 0
    for chain in _requests(seed, 400, cap + 2):
        real.serve(chain)
        for i, p in enumerate(pools):
            scores[i] += serve_chain(p, [content_key(t) for t in chain])
        freed += len(chain)
        if freed >= 8 * cap:
            freed = 0
            scores = [x * 0.5 for x in scores]
        assert [pol.score_lru] + pol.scores == scores
        top = max(range(1, len(scores)), key=scores.__getitem__)
        ahead = scores[top] > scores[0] * (1.0 + pol.margin) + 1.0
        ties += scores[top] == scores[0] * (1.0 + pol.margin) + 1.0
        assert pol.mode == (top - 1 if ahead else -1) and pol.use_arc == ahead
        switched += ahead
    assert 0 < scores[0] and (0 < switched < 400) == switches
    assert ties or name != "margin 0"                # exactly at the threshold is not ahead


def test_adaptive_margin_bounds():
    """margin must be a number in [0, 1): 0 is valid (switch as soon as a challenger leads by
    more than one hit); the message names the bad value; challengers cannot be empty."""
    assert AdaptivePolicy(margin=0).margin == 0.0
    assert AdaptivePolicy(margin=0.99).margin == 0.99
    for bad in (-0.01, 1, 1.0, "0.1", None):
        with pytest.raises(ValueError) as exc:
            AdaptivePolicy(margin=bad)
        assert str(exc.value) == f"margin must be a number in [0, 1), got {bad!r}"
    with pytest.raises(ValueError) as exc:
        AdaptivePolicy(challengers=())
    assert str(exc.value) == "challengers must name at least one policy factory"


def test_adaptive_shadows_key_content_by_group():
    """The shadows key a block by its group and hash: the same hash in two groups (the same
    tokens in two KV-cache groups) is two contents, not a hit."""
    pol = AdaptivePolicy()
    c = Cache(pol, 9, num_groups=3)
    for g in (0, 1, 2):
        assert c.serve([1], group=g) == 0
    assert pol.score_lru == 0 and pol.scores == [0]
    for g in (2, 1, 0):
        assert c.serve([1], group=g) == 1
    assert pol.score_lru == 3 and pol.scores == [3]


def _rounds(pool: BlockPool, n: int = 8) -> list[int]:
    """Two conversations come back once per round, each after a flood of 12 one-off first
    turns (24 blocks, most of the 30-block cache); per round, the conversations' hits."""
    for i in range(8):
        serve_contents(pool, [0, 1000 + i])                         # the root becomes shared
    convs = {1: [0, 10, 11], 2: [0, 20, 21]}
    for c in convs.values():
        serve_contents(pool, c)
    out, f = [], 0
    for r in range(n):
        for _ in range(12):
            serve_contents(pool, [0, 5000 + f, 5001 + f])
            f += 2
        hits = 0
        for k, c in convs.items():
            c.append(100 * k + r)
            hits += serve_contents(pool, c)
        out.append(hits)
    return out


def test_adaptive_switches_to_arc_when_its_shadow_is_ahead():
    """Exactly LRU while the shadows are level or LRU leads; once ARC's shadow is ahead, the
    real cache evicts like chain ARC and hits what ARC hits."""
    from hybridkv.core.eviction.adaptive import AdaptivePolicy
    from hybridkv.core.eviction.arc import ChainARCPolicy
    lru = _rounds(BlockPool(31, 1))
    arc = _rounds(PolicyBlockPool(31, 1, ChainARCPolicy()))
    pol = AdaptivePolicy()
    adaptive = _rounds(PolicyBlockPool(31, 1, pol))
    assert lru == [6, 5, 3, 2, 2, 2, 2, 2] and arc == [2, 8, 10, 9, 14, 16, 18, 20]
    assert adaptive[:4] == lru[:4] and adaptive[4:] == arc[4:]
    assert pol.use_arc and pol.scores[0] > pol.score_lru


@pytest.mark.parametrize("name", ["adaptive", "adaptive-turns"])
@settings(max_examples=examples(60), deadline=None)
@given(num_blocks=st.integers(2, 40),
       ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)), min_size=1, max_size=120))
def test_adaptive_is_exactly_lru_while_lru_leads(name, num_blocks, ops):
    """The same operations on plain LRU and on ``adaptive`` / ``adaptive-turns``: while no
    challenger's shadow has been ahead, every allocation returns the same blocks (victims
    included) and every lookup hits the same block."""
    pol = make_policy(name)
    pools = (BlockPool(num_blocks, 1), PolicyBlockPool(num_blocks, 1, pol))
    held: list[list[int]] = []
    h = 0
    for op, x in ops:
        if pol.use_arc:
            break
        if op <= 1 and pools[0].num_free:
            k = 1 + x % pools[0].num_free
            got = [p.allocate(k) for p in pools]
            assert got[0] == got[1]
            for b in got[0][: 1 + x % 3]:
                h += 1
                for p in pools:
                    p.insert(0, h.to_bytes(8, "little"), b)
            held.append(got[0])
        elif op == 2 and held:
            run = held.pop(x % len(held))
            for p in pools:
                p.free(run[::-1])
        elif op == 3 and h:
            key = (1 + x % h).to_bytes(8, "little")
            b = pools[0].cached_block(0, key)
            assert b == pools[1].cached_block(0, key)
            if b is not None:
                for p in pools:
                    p.touch([b])
                held.append([b])
        for p in pools:
            p.check()
        assert pools[0].num_free == pools[1].num_free
