"""The external-tier path: lookup_external follows the core's hit rules; loads commit or recompute.

Expectations come from the independent oracle (``tests/support/oracle.py``) over the keys the
tier holds, not from the producer's own lookup (which would run the same fixed point).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, Request, SpecDecode
from tests.support.helpers import FA, SWA, config
from tests.support.oracle import CacheMirror, oracle_hit
from tests.hypothesis_budget import budgeted, examples, note


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
    producer = KVCacheManager(config(*specs, num_blocks=200), **kw)
    tier: set[tuple[int, bytes]] = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    a = list(range(1, n_a + 1))
    _serve(producer, "a", a)
    b = a[:keep] + [1000 + i for i in range(n_b)] if keep < n_a else a + [1000 + i for i in range(n_b)]
    if not b:
        b = [7]
    consumer = KVCacheManager(config(*specs, num_blocks=200), enable_events=True, **kw)
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
    producer = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=100), hash_seed="s")
    tier: set[tuple[int, bytes]] = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    tokens = list(range(1, 42))
    _serve(producer, "a", tokens)
    consumer = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=100), hash_seed="s")
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
