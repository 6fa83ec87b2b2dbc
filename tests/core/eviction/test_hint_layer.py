"""The hint layer in front of every eviction policy, driven through the manager.

* random operation sequences with random hints keep ``check_integrity`` green under every
  policy, and every hit equals the oracle over the KV-event mirror (hints never make a hit
  read a block that was evicted);
* a hinted manager whose requests carry no hints evicts exactly like the plain one (the
  exact-LRU policy object against the pool's own queue);
* honoured, an ending session's blocks go first and a pin's blocks last; a prefix another
  session shares is not demoted by one session's end;
* pins never make the cache refuse work: a request that needs every block is admitted, the pins
  it breaks are counted (``pins_broken``);
* the layer's test of the hints: right end hints are honoured after a warm-up, coin flips never.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv import Hint, KVCacheManager, Request
from hybridkv.core.eviction import POLICIES
from hybridkv.core.eviction import LRUPolicy
from hybridkv.core.eviction.hint_layer import HintLayer
from tests.hypothesis_budget import budgeted, examples, note
from tests.support.policies import policy_config
from tests.support.random_ops import MAX_OPS, MIN_OPS, Model, configs, decode_ops
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

CONCRETE = [p for p in POLICIES if p != "recommended"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _honour_always(monkeypatch) -> None:
    """Make every hint layer honour both kinds (the regions' behaviour, apart from the test)."""
    real = HintLayer._test

    def test(self, sample, now):
        real(self, sample, now)
        self.honour = [True, True]
    monkeypatch.setattr(HintLayer, "_test", test)
    orig_hint = HintLayer.hint

    def hint(self, *a):
        self.honour = [True, True]
        orig_hint(self, *a)
    monkeypatch.setattr(HintLayer, "hint", hint)


class HintedModel(Model):
    """The shared random-operation model, each request with a random hint."""

    def __init__(self, kv, spec, rng: random.Random) -> None:
        super().__init__(kv, spec, False)
        self.rng = rng

    def make_request(self, rid, tokens, salt, **options):
        r = self.rng.random()
        session = self.rng.randrange(3)
        hint = (None if r < 0.2 else Hint(session=session, last_turn=True) if r < 0.45
                else Hint(session=session, pin_s=self.rng.choice([0.5, 5.0]),
                          pin_tokens=min(len(tokens), 1 + self.rng.randrange(8))) if r < 0.7
                else Hint(session=session, resume_s=self.rng.choice([0.0, 2.0])) if r < 0.85
                else Hint(session=session, continues=self.rng.random()))
        return Request(rid, tokens, RequestCacheParams(cache_salt=salt, hint=hint, **options))


def _run_hinted(cfg_args, ops, policy: str, seed: int) -> None:
    cfg, retention, spec, _ = cfg_args
    clock = Clock()
    kv = KVCacheManager(cfg, CacheOptions(
        retention_interval=retention, spec_decode=spec, enable_events=True, eviction_policy=policy,
        hints=True), clock=clock)
    m = HintedModel(kv, spec, random.Random(seed))
    for op, x in ops:
        clock.now += (x % 4) * 0.5
        if op == 7:
            assert kv.reset_prefix_cache() == (not m.running)
        elif op <= 1 or not m.running:
            base = m.prompts[x % len(m.prompts)] if m.prompts and x % 3 else []
            keep = base[: (x // 7) % (len(base) + 1)]
            tokens = keep + [(x >> k) % 5 for k in range(1 + x % 13)]
            try:
                m.admit(tokens, None, chunk=1 + x % 40)
            except ValueError as exc:          # a pin larger than this small cache
                assert "more than the cache holds" in str(exc)
                note("pins refused (larger than the cache)")
        elif op <= 4:
            m.step(sorted(m.running)[x % len(m.running)], x % 5)
        else:
            m.finish(sorted(m.running)[x % len(m.running)])
        kv.check_integrity()
    st_ = kv.hint_stats()
    note("pins broken", st_.pins_broken)
    for rid in list(m.running):
        m.finish(rid)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1


@pytest.mark.parametrize("policy", CONCRETE)
@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg_args=configs(states=False), ops=st.binary(min_size=4 * MIN_OPS, max_size=4 * MAX_OPS).map(decode_ops),
       seed=st.integers(0, 1000))
@budgeted(0.1)
def test_random_hinted_operations_keep_invariants(policy, cfg_args, ops, seed):
    _run_hinted(cfg_args, ops, policy, seed)


@pytest.mark.parametrize("policy", ["lru", "arc", "priority"])
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg_args=configs(states=False), ops=st.binary(min_size=4 * MIN_OPS, max_size=4 * MAX_OPS).map(decode_ops),
       seed=st.integers(0, 1000))
@budgeted(0.05)
def test_random_hints_honoured_keep_invariants(policy, cfg_args, ops, seed):
    """The same with every hint honoured at once (pins and demotions fill their regions)."""
    with pytest.MonkeyPatch.context() as mp:
        _honour_always(mp)
        _run_hinted(cfg_args, ops, policy, seed)


def _serve(kv, rid, tokens, hint=None, out: int = 0) -> int:
    req = Request(rid, tokens, RequestCacheParams(hint=hint))
    hit = kv.lookup(req)
    assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
    req.num_computed_tokens = req.num_tokens
    if out:
        req.append_tokens([9000 + k for k in range(out)])
        assert kv.allocate(req, out) is not None
        req.num_computed_tokens = req.num_tokens
    kv.free(req)
    kv.check_integrity()
    return hit.num_tokens


def test_hinted_manager_without_hints_evicts_like_the_plain_one():
    """Exact LRU as a policy object behind the layer = the pool's own queue (same hits, same
    evictions, same free count) on a random multi-turn workload."""
    rng = random.Random(7)
    plain = KVCacheManager(policy_config(40))
    hinted = KVCacheManager(policy_config(40), CacheOptions(hints=True))
    convs = [[1000 * c + k for k in range(rng.randrange(3, 12))] for c in range(30)]
    for i in range(600):
        c = rng.randrange(30)
        convs[c] = convs[c] + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        a = _serve(plain, f"r{i}", convs[c])
        b = _serve(hinted, f"r{i}", convs[c])
        assert a == b, i
    assert plain.stats().evictions == hinted.stats().evictions > 0
    assert hinted.hint_stats().releases == 0


@pytest.mark.parametrize("policy", CONCRETE)
def test_ending_session_goes_first_pins_last(monkeypatch, policy):
    _honour_always(monkeypatch)
    kv = KVCacheManager(policy_config(13), CacheOptions(eviction_policy=policy, hints=True), clock=Clock())
    a = list(range(100, 117))            # 4 full blocks + 1
    b = list(range(200, 217))
    c = list(range(300, 317))
    _serve(kv, "a", a, Hint(session="A", pin_s=100.0))
    _serve(kv, "b", b, Hint(session="B", last_turn=True))
    _serve(kv, "c", c, Hint(session="C"))
    _serve(kv, "d", list(range(400, 413)))       # 4 blocks: every evicted one must be b's
    assert _serve(kv, "a2", a) == 16, policy
    assert _serve(kv, "c2", c) == 16, policy
    assert _serve(kv, "b2", b) == 0, policy


def test_shared_prefix_not_demoted_by_one_end(monkeypatch):
    _honour_always(monkeypatch)
    kv = KVCacheManager(policy_config(13), CacheOptions(hints=True), clock=Clock())
    system = list(range(50, 58))                 # 2 shared blocks
    _serve(kv, "x", system + list(range(500, 509)), Hint(session="X"))
    _serve(kv, "y", system + list(range(600, 609)), Hint(session="Y", last_turn=True))
    _serve(kv, "z", list(range(700, 713)))                  # 4 blocks: Y's private ones go
    assert _serve(kv, "w", system + [1, 2, 3, 4, 5]) == 8   # the shared prefix survived
    assert _serve(kv, "x2", system + list(range(500, 509))) == 16


@pytest.mark.parametrize("policy", ["lru", "arc", "adaptive"])
def test_pins_never_refuse_work(monkeypatch, policy):
    """Every cached block pinned for an hour; a request needing the whole cache is admitted,
    and each pinned block it took is counted as a broken pin."""
    _honour_always(monkeypatch)
    kv = KVCacheManager(policy_config(13), CacheOptions(eviction_policy=policy, hints=True), clock=Clock())
    for i in range(3):
        _serve(kv, f"p{i}", [100 * i + k for k in range(16)], Hint(session=i, pin_s=3600.0))
    assert kv.hint_stats().pinned == 12
    req = Request("big", list(range(5000, 5048)))      # 12 blocks
    assert kv.allocate(req, 48) is not None
    kv.check_integrity()
    assert kv.hint_stats().pins_broken == 12
    kv.free(req)
    kv.check_integrity()


def test_pin_lapses_after_its_ttl(monkeypatch):
    _honour_always(monkeypatch)
    clock = Clock()
    kv = KVCacheManager(policy_config(9), CacheOptions(hints=True), clock=clock)
    _serve(kv, "a", list(range(100, 117)), Hint(session="A", pin_s=10.0))
    _serve(kv, "b", list(range(200, 209)))
    clock.now = 11.0                           # a's pin ran out: a goes first
    _serve(kv, "c", list(range(300, 317)))     # needs 5 blocks: 2 free, 3 of a's
    assert _serve(kv, "b2", list(range(200, 209))) == 8
    assert _serve(kv, "a2", list(range(100, 117))) == 4
    assert kv.hint_stats().pins_lapsed >= 1
    assert kv.hint_stats().pins_broken == 0


def _conversations(kv, accuracy: float | None, seed: int) -> None:
    """Conversations of 1 to 4 turns, interleaved, each turn re-reading its history; every
    request's hint says "last turn" rightly with probability ``accuracy`` (None: no hints)."""
    rng = random.Random(seed)
    plan = []
    for c in range(600):
        turns = rng.choice([1, 1, 2, 3, 4])
        start = rng.randrange(4000)
        plan += [(start + 40 * t + rng.randrange(30), c, t, turns) for t in range(turns)]
    plan.sort()
    hist = {}
    for i, (_, c, t, turns) in enumerate(plan):
        hist[c] = hist.get(c, []) + [c * 1000 + len(hist.get(c, [])) + k for k in range(12)]
        last = t == turns - 1
        says = last if rng.random() < (accuracy or 0) else not last
        _serve(kv, f"r{i}", hist[c], None if accuracy is None else Hint(session=c, last_turn=says),
               out=4)


def test_right_end_hints_are_honoured_coin_flips_never():
    """100 blocks (the conversations' working set is about twice that): right hints are
    honoured and multiply the hits; coin flips are never honoured and hit exactly as LRU does."""
    runs = {}
    for acc in (1.0, 0.5, None):
        kv = KVCacheManager(policy_config(100), CacheOptions(hints=True), clock=Clock())
        _conversations(kv, acc, 1)
        runs[acc] = (kv.stats().hits, kv.hint_stats())
    (right, s_right), (coin, s_coin), (plain, _) = runs[1.0], runs[0.5], runs[None]
    assert s_right.honour_demotions and s_right.demoted > s_right.ignored_demotions
    assert right > 1.2 * plain
    assert not s_coin.honour_demotions and s_coin.demoted == 0
    assert coin == plain


def _judged(ins: list[float], reused: list[float], lead: float, share: float | None = None) -> HintLayer:
    """A hint layer on a 1,001-block pool whose plain shadow counts ``ins`` / ``reused``
    (rest, hinted dead, pinned) and whose demoting shadow hits ``lead`` more than the plain
    one's 100 (plus its 5 % margin), judged once."""
    from hybridkv.core.policy_pool import PolicyBlockPool
    layer = HintLayer(LRUPolicy(), Clock())
    PolicyBlockPool(1001, 1, layer)
    if share is not None:
        layer.scale_capacity(share)
    plain, demoting, _ = layer.shadows
    plain.ins, plain.reused, plain.hits = list(ins), list(reused), 100.0
    demoting.hits = 105.0 + lead
    layer._test([], 0.0)
    return layer


def test_demotions_are_honoured_once_the_hinted_releases_would_show_their_reuses():
    """Hinted-dead releases are judged once, at the other releases' reuse rate, MIN_EXPECTED
    (16) of them would have been reused: 10 reuses in 64 others (0.15625) and 102 hinted
    releases expect 15.94, 103 expect 16.09; none of them reused (or once MIN_EVENTS, 32,
    reuses were seen: 32 in 200 others, 0.16, and 64 hinted releases). The demoting shadow must
    lead by MIN_LEAD (8) blocks, or by that many of the pool's blocks when the layer sees a
    share."""
    assert not _judged([64, 102, 0], [10, 0, 0], lead=9).honour[0]
    assert _judged([64, 103, 0], [10, 0, 0], lead=9).honour[0]
    assert not _judged([200, 64, 0], [31, 0, 0], lead=9).honour[0]       # 9.9 expected, 31 seen
    assert _judged([200, 64, 0], [32, 0, 0], lead=9).honour[0]
    assert not _judged([64, 103, 0], [10, 9, 0], lead=9).honour[0]     # 9 / 103 > 0.5 x 0.156
    assert not _judged([64, 103, 0], [10, 0, 0], lead=7).honour[0]     # the lead is short
    scaled = _judged([64, 103, 0], [10, 0, 0], lead=1.5, share=0.125)   # 8 x 0.125 = 1 block
    assert scaled.min_lead == 1.0 and scaled.honour[0]
    assert _judged([64, 103, 0], [10, 0, 0], lead=0, share=0.5).min_lead == 4.0


def test_under_a_hit_point_layer_informative_demotions_are_tried_and_kept_while_not_worse():
    """Told a share (a hit-point layer outside), the layer does not wait for its demoting
    shadow to lead: informative hints start a trial at once (uninformative ones never). After
    one shadow capacity (125 sampled blocks) the trial is kept while the pool hit at least
    95 % of the plain shadow's hits less MIN_LEAD's share (1 block): 94 of 100 keeps, 93 stops
    for COOLDOWN_CAPACITIES (8) capacities, in which only a demoting shadow's lead restarts."""
    from hybridkv.core.eviction.hint_layer import COOLDOWN_CAPACITIES
    assert not _judged([64, 103, 0], [10, 9, 0], lead=0, share=0.125).honour[0]
    layer = _judged([64, 103, 0], [10, 0, 0], lead=-5, share=0.125)
    assert layer.honour[0] and layer.shadows[0].cap == 125
    plain, demoting, _ = layer.shadows
    layer.win = [124.0, 0.0, 0.0]
    layer._test([], 0.0)
    assert layer.honour[0] and layer.win == [124.0, 0.0, 0.0]     # the trial goes on
    layer.win = [125.0, 94.0, 100.0]
    layer._test([], 0.0)
    assert layer.honour[0] and layer.win == [0.0, 0.0, 0.0]       # kept; a new window
    layer.win = [125.0, 93.0, 100.0]
    layer._test([], 0.0)
    assert not layer.honour[0] and layer.cool == pytest.approx(COOLDOWN_CAPACITIES * 125)
    layer._test([], 0.0)
    assert not layer.honour[0]
    demoting.hits = plain.hits * 1.05 + 1.5                       # the demoting shadow leads
    layer._test([], 0.0)
    assert layer.honour[0]


def test_under_a_hit_point_layer_the_plain_shadow_is_fitted_to_the_pool():
    """Not honouring, every eighth of a shadow capacity of sampled blocks freed the shadows'
    capacity moves (by at most 1.25x) towards the one at which the plain shadow hits as often
    as the pool: the pool hit 199 sampled releases, the shadow 99 -> 1.25x (125 -> 156 keys);
    then 49 against 99 -> back to 125. Honouring, scale_capacity leaves the shadows as they are."""
    layer = _judged([0, 0, 0], [0, 0, 0], lead=0, share=0.125)
    plain = layer.shadows[0]
    assert not layer.honour[0] and plain.cap == 125
    plain.hits, layer.real = 99.0, 199.0
    layer._fit(15)
    assert plain.cap == 125                                       # 15 x 8 < 125
    layer._fit(1)
    assert layer.fit == pytest.approx(1.25) and plain.cap == 156
    plain.hits, layer.real = 99.0, 49.0
    layer._fit(20)
    assert layer.fit == pytest.approx(1.0) and plain.cap == 125
    layer.honour[0] = True
    layer.scale_capacity(0.25)
    assert plain.cap == 125 and layer.share == 0.25


def test_the_pool_hits_counted_for_the_fit_are_sampled_releases_of_blocks_hit():
    """A block hit while free, then released: one pool hit if its hash is sampled (the
    layer sees every block when the pool is small: mask 0); a block released without a hit:
    none. Only a layer told a share counts."""
    from hybridkv.core.policy_pool import PolicyBlockPool
    layer = HintLayer(LRUPolicy(), Clock())
    pool = PolicyBlockPool(16, 1, layer)
    layer.scale_capacity(0.5)
    blocks = pool.allocate(3)
    for b in blocks:
        pool.insert(0, bytes([b]) * 16, b)
    pool.free(blocks)
    assert layer.real == 0.0
    pool.touch([blocks[0], blocks[1]])
    pool.free([blocks[0], blocks[1]])
    assert layer.real == pytest.approx(2.0) and not layer.touched


def test_when_demotions_start_to_be_honoured_the_free_blocks_hinted_dead_go_first():
    """Blocks a session's end hinted dead while the test did not honour demotions sit in the
    policy's order; the moment it does, the free ones among them move to the evict-first region
    (in the policy's order), and a later victim comes from there."""
    from hybridkv.core.policy_pool import PolicyBlockPool
    from hybridkv.core.retention_config import RetentionMark
    layer = HintLayer(LRUPolicy(), Clock())
    pool = PolicyBlockPool(16, 1, layer)
    blocks = pool.allocate(4)
    for b in blocks:
        pool.insert(0, bytes([b]) * 16, b)
    pool.hint([blocks[2], blocks[3]], [0, 1], [RetentionMark(2, 0, None)], ("session", "s"))
    pool.hint([blocks[0], blocks[1]], [0, 1], (), ("session", "t"))
    pool.free(blocks)
    assert not layer.honour[0] and list(layer.inner) == blocks and not layer.demoted
    plain, demoting, _ = layer.shadows
    plain.ins, plain.reused, plain.hits = [64, 103, 0], [10, 0, 0], 100.0
    demoting.hits = 114.0
    layer._test([], 0.0)
    assert layer.honour[0] and list(layer.demoted) == [blocks[2], blocks[3]]
    assert list(layer.inner) == [blocks[0], blocks[1]]
    pool.check()
    pool.allocate(pool.queue.num_free)
    assert pool.allocate(1) == [blocks[2]]


def test_forced_hints_are_followed_untested_coin_flips_included(monkeypatch):
    """``hints="force"``: the layer follows every hint from the first release and runs no
    shadow; a coin flip is followed too. Its hits equal, exactly, a tested layer made to
    honour both kinds from the start."""
    runs = {}
    for acc in (1.0, 0.5):
        kv = KVCacheManager(policy_config(100), CacheOptions(hints="force"), clock=Clock())
        _conversations(kv, acc, 1)
        runs[acc] = (kv.stats().hits, kv.hint_stats())
    for acc, (hits, st_) in runs.items():
        assert st_.forced and st_.honour_demotions and st_.honour_pins
        assert st_.ignored_demotions == 0 and st_.demoted > 0
        assert st_.shadow_plain_hits == st_.shadow_demoting_hits == st_.shadow_pinning_hits == 0
    _honour_always(monkeypatch)
    for acc in (1.0, 0.5):
        kv = KVCacheManager(policy_config(100), CacheOptions(hints=True), clock=Clock())
        _conversations(kv, acc, 1)
        assert kv.stats().hits == runs[acc][0], acc
        assert not kv.hint_stats().forced
    with pytest.raises(ValueError, match="hints must be True, False or 'force', got 'always'"):
        KVCacheManager(policy_config(100), CacheOptions(hints="always"))
    with pytest.raises(ValueError, match="force must be True or False, got 1"):
        HintLayer(LRUPolicy(), Clock(), force=1)


def test_blocks_a_session_moved_past_go_first(monkeypatch):
    """A session's next turn re-reads its prompt but not the blocks of its answer: those are
    its own alone, so they are demoted and go before an older request's blocks (without the
    session, LRU takes the older blocks)."""
    _honour_always(monkeypatch)

    def run(session) -> tuple[int, int]:
        kv = KVCacheManager(policy_config(15), CacheOptions(hints=True), clock=Clock())
        other = list(range(900, 909))
        _serve(kv, "o", other)                                     # 2 cached blocks, oldest
        p1 = list(range(100, 108))
        _serve(kv, "t1", p1, Hint(session=session), out=8)         # prompt 2 + answer 2 blocks
        _serve(kv, "t2", p1 + list(range(300, 309)), Hint(session=session))  # not the answer
        i = 0
        while kv.stats().evictions < 2:                            # one-off prompts
            _serve(kv, f"y{i}", list(range(600 + 20 * i, 609 + 20 * i)))
            i += 1
        return kv.hint_stats().demoted, _serve(kv, "o2", other)
    (demoted, kept), (demoted0, kept0) = run("S"), run(None)
    assert (demoted, demoted0) == (2, 0)
    assert kept > kept0 == 0
