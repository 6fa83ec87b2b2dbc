"""The external-tier path: ``lookup_external`` and ``commit_external``.

* External hits follow the same rules as local hits; expectations come from the independent
  oracle (:mod:`tests.support.oracle`) over the keys the tier holds, not from the producer's
  own lookup (which would run the same fixed point).
* A failed load recomputes and caches nothing wrong; a load commits without an event listener
  and its blocks are reported stored when there is one.
* A tier that adds nothing gives None; the hit is capped below ``max_model_len``; requests that
  skip the cache get none; ``commit_external`` refuses a load that is not this request's.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv import BlockStored, CacheHit, ExternalHit, KVCacheManager, Request, SpecDecode
from tests.hypothesis_budget import budgeted, examples, note
from tests.support.helpers import FA, SWA, config, prompt, serve
from tests.support.oracle import CacheMirror, oracle_hit
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def _serve(kv: KVCacheManager, rid: str, tokens: list[int]) -> Request:
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    assert kv.allocate(req, len(tokens) - hit.num_tokens, hit) is not None
    req.num_computed_tokens = len(tokens)
    kv.free(req)
    return req


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid=st.booleans(), bs=st.sampled_from([2, 4]), window=st.sampled_from([3, 8]),
       retention=st.sampled_from([None, 0, "N"]), spec=st.sampled_from([None, "eagle", "eagle-drop"]),
       n_a=st.integers(1, 40), n_b=st.integers(0, 20), keep=st.integers(0, 40))
@budgeted(0.15)
def test_external_hits_follow_the_same_rules_as_local_hits(hybrid, bs, window, retention, spec, n_a, n_b, keep):
    specs = [FA(bs)] + ([SWA(bs, window)] if hybrid else [])
    if retention == "N":
        retention = 2 * bs if hybrid else 0
    sd = None if spec is None else SpecDecode("eagle", 2, hash_lookahead=spec == "eagle")
    kw = dict(spec_decode=sd, retention_interval=retention, hash_seed="shared")
    producer = KVCacheManager(config(*specs, num_blocks=200), CacheOptions(**kw))
    tier: set[tuple[int, bytes]] = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    a = list(range(1, n_a + 1))
    _serve(producer, "a", a)
    b = a[:keep] + [1000 + i for i in range(n_b)] if keep < n_a else a + [1000 + i for i in range(n_b)]
    if not b:
        b = [7]
    consumer = KVCacheManager(config(*specs, num_blocks=200), CacheOptions(enable_events=True, **kw))
    req = Request("b", b)
    hit = consumer.lookup(req)
    assert hit.num_tokens == 0
    ext = consumer.lookup_external(req, hit, lambda g, h: (g, h) in tier)
    # the longest hit the per-type rules allow over what the tier holds (brute force)
    expected = oracle_hit(consumer.config, sd, False, req, tier)
    assert (ext.num_tokens if ext else 0) == expected
    note("external lookups")
    if ext is None:
        return
    note("external lookups with a non-zero hit")
    for g, j, h in ext.loads:
        assert (g, h) in tier
    assert consumer.allocate(req, 0, hit, external=ext) is not None
    assert req.num_computed_tokens == 0
    consumer.check_integrity()
    assert consumer.commit_external(req, ext, ok=True) == ext.num_tokens
    consumer.check_integrity()
    # a consumer-side index learns the adopted blocks from the KV events, and only them
    mirror = CacheMirror()
    mirror.feed(consumer.take_events())
    assert mirror.cached() == {(g, h) for g, j, h in ext.loads}
    rest = len(b) - req.num_computed_tokens
    assert consumer.allocate(req, rest) is not None
    req.num_computed_tokens = len(b)
    consumer.check_integrity()
    consumer.free(req)
    # the loaded blocks are now local: the same prefix hits without the tier (in EAGLE drop
    # mode the proof block is cached only where the consumer's own write path promises t)
    if spec != "eagle-drop" or retention is None:
        assert consumer.lookup(Request("again", b)).num_tokens >= ext.num_tokens


def test_a_failed_load_recomputes_and_caches_nothing_wrong() -> None:
    producer = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=100), CacheOptions(hash_seed="s"))
    tier: set[tuple[int, bytes]] = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    tokens = list(range(1, 42))
    _serve(producer, "a", tokens)
    consumer = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=100), CacheOptions(hash_seed="s"))
    req = Request("b", tokens)
    hit = consumer.lookup(req)
    ext = consumer.lookup_external(req, hit, lambda g, h: (g, h) in tier)
    assert ext is not None and ext.num_tokens == 40
    # full group: every block; sliding group: only the window before 40
    assert sorted(j for g, j, _ in ext.loads if g == 0) == list(range(10))
    assert sorted(j for g, j, _ in ext.loads if g == 1) == [8, 9]
    consumer.allocate(req, 0, hit, external=ext)
    assert consumer.commit_external(req, ext, ok=False) == 0
    assert consumer.lookup(Request("probe", tokens)).num_tokens == 0  # nothing cached yet
    consumer.allocate(req, len(tokens))
    req.num_computed_tokens = len(tokens)
    consumer.check_integrity()


def test_external_lookup_that_adds_nothing_is_none() -> None:
    """coordinator: find_external_hit — ``t <= held`` → ``t < held``: a tier that adds no
    token must give None (documented), not an ExternalHit with nothing to load.

    "a" caches 2 blocks; q (9 tokens) hits 8 locally, the cap (num_tokens - 1 = 8): a tier that
    holds everything cannot extend it."""
    kv = KVCacheManager(config(FA(4), num_blocks=12))
    serve(kv, "a", prompt(100, 9))
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8
    assert kv.lookup_external(q, hit, lambda g, h: True) is None


def test_an_external_load_commits_without_an_event_listener() -> None:
    """coordinator: __init__ — ``on_adopted`` is None until the manager enables events (a
    placeholder other than None would be called when a load is committed and crash).

    Full (bs 4), events disabled. A tier holds every block hash; q (9 tokens, nothing local)
    loads 8 tokens (2 blocks) and commits the load: the loaded blocks are cached, so another
    request with the same prompt then hits 8 locally."""
    kv = KVCacheManager(config(FA(4), num_blocks=20))
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    ext = kv.lookup_external(q, hit, lambda g, h: True)
    assert ext is not None and ext.num_tokens == 8
    assert kv.allocate(q, 0, hit, external=ext) is not None
    kv.commit_external(q, ext, True)
    assert kv.lookup(Request("p", prompt(100, 9))).num_tokens == 8
    kv.check_integrity()


def _tier_and_consumer(**consumer_kw) -> tuple[KVCacheManager, Request, CacheHit,
                                                ExternalHit | None]:
    """A producer (full attention, bs 4, hash seed "s") serves "a" (17 tokens) while a tier
    records every (group, hash) it caches; a consumer with the same config and seed (plus
    ``consumer_kw``) looks up "b" (a's 17 tokens), then looks it up in the tier. Returns
    ``(consumer, b, hit, ext)``."""
    producer = KVCacheManager(config(FA(4), num_blocks=32), CacheOptions(hash_seed="s"))
    tier = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    serve(producer, "a", prompt(0, 17))
    kv = KVCacheManager(config(FA(4), num_blocks=32), CacheOptions(hash_seed="s", **consumer_kw))
    b = Request("b", prompt(0, 17))
    hit = kv.lookup(b)
    ext = kv.lookup_external(b, hit, lambda g, h: (g, h) in tier)
    return kv, b, hit, ext


def test_external_must_come_with_its_own_hit() -> None:
    """allocate — the ``external`` checks: not an ExternalHit, no hit, a hit of another length,
    a running request; the message names the request and the value. A matching external reserves
    every block up to its end (allocate: the external not passed on)."""
    kv, b, hit, ext = _tier_and_consumer()
    assert hit.num_tokens == 0 and ext is not None and ext.num_tokens == 16
    msg = r"^external must be lookup_external's result for new request 'b' and its hit, got "
    with pytest.raises(ValueError, match=msg + "'x'$"):
        kv.allocate(b, 0, hit, external="x")
    with pytest.raises(ValueError, match=msg):
        kv.allocate(b, 0, None, external=ext)
    with pytest.raises(ValueError, match=msg):
        kv.allocate(b, 0, hit, external=ExternalHit(16, 4, ext.loads))
    new = kv.allocate(b, 0, hit, external=ext)
    assert [len(x) for x in new] == [4] and len(kv.block_ids(b)[0]) == 4
    with pytest.raises(ValueError, match=msg):
        kv.allocate(b, 1, None, external=ext)
    assert kv.commit_external(b, ext, ok=True) == 16
    kv.check_integrity()


def test_blocks_loaded_from_an_external_tier_are_reported_stored() -> None:
    """__init__ — the adopted-blocks callback not installed with events: blocks loaded by
    commit_external produced no BlockStored event.

    A producer caches a 16-token prefix (4 blocks); a consumer with events loads all 4 from
    the tier: its BlockStored events name exactly the loaded hashes."""
    kv, b, hit, ext = _tier_and_consumer(enable_events=True)
    assert kv.allocate(b, 0, hit, external=ext) is not None
    assert kv.take_events() == []
    assert kv.commit_external(b, ext, ok=True) == 16
    stored = [h for e in kv.take_events() if isinstance(e, BlockStored) for h in e.block_hashes]
    assert sorted(stored) == sorted(h for g, j, h in ext.loads) and len(stored) == 4


def _everything(group: int, h: bytes) -> bool:
    return True


def test_lookup_external_is_none_when_the_request_skips_the_cache() -> None:
    """lookup_external — the non-CacheHit message; ``or`` → ``and`` (a request that skips the
    prefix cache, or a manager without caching, still gets an external hit).

    A tier that holds every block would give a 12-token hit to a 16-token request; with
    skip_prefix_cache or enable_caching=False the answer is None."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    r = Request("r", prompt(0, 16))
    ext = kv.lookup_external(r, kv.lookup(r), _everything)
    assert ext is not None and ext.num_tokens == 12
    s = Request("s", prompt(0, 16), RequestCacheParams(skip_prefix_cache=True))
    assert kv.lookup_external(s, kv.lookup(s), _everything) is None
    off = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(enable_caching=False))
    t = Request("t", prompt(0, 16))
    assert off.lookup_external(t, off.lookup(t), _everything) is None
    with pytest.raises(ValueError, match=r"lookup_external needs the request's CacheHit, got 3"):
        kv.lookup_external(r, 3, _everything)


@pytest.mark.parametrize("max_model_len, expected", [(8, 4), (9, 8)])
def test_lookup_external_is_capped_below_max_model_len(max_model_len, expected) -> None:
    """lookup_external — the ``max_model_len - 1`` cap removed, broken or moved by one.

    bs 4, a 16-token request, a tier holding every block: the hit is the largest multiple of
    4 <= min(15, max_model_len - 1): 7 → 4 (a cap of 9 would give 8), 8 → 8 (a cap of 7 would
    give 4)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(max_model_len=max_model_len))
    r = Request("r", prompt(0, 16))
    hit = kv.lookup(r)
    assert hit.num_tokens == 0
    ext = kv.lookup_external(r, hit, _everything)
    assert ext is not None and ext.num_tokens == expected


def test_commit_external_errors_name_the_request_and_the_counts() -> None:
    """commit_external — the two error messages replaced by None.

    An external hit for "r" committed before allocating it names the request; after
    allocating, a request whose computed count (5) is not the planned local count (0)
    names both."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    r = Request("r", prompt(0, 16))
    hit = kv.lookup(r)
    ext = kv.lookup_external(r, hit, _everything)
    with pytest.raises(ValueError, match=r"request 'r' holds no blocks; allocate it first"):
        kv.commit_external(r, ext, True)
    assert kv.allocate(r, 0, hit, external=ext) is not None
    r.num_computed_tokens = 5
    with pytest.raises(ValueError, match=r"request 'r' has 5 computed tokens; the external load "
                       r"was planned from 0"):
        kv.commit_external(r, ext, True)
