"""Misuse of the manager's API raises a clear error and changes nothing (issue 16)."""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request, SpecDecode

from tests.support.helpers import FA, SWA, config


def snapshot(kv: KVCacheManager, *reqs: Request) -> tuple:
    kv.check_integrity()
    tables = []
    for r in reqs:
        try:
            tables.append(kv.block_ids(r))
        except KeyError:
            tables.append(None)
    return kv.num_free_blocks, kv.stats(), tables, sorted(map(str, kv.coordinator.reqs))


def hybrid(num_blocks: int = 64, **kw) -> KVCacheManager:
    return KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks), **kw)


def computed(kv: KVCacheManager, rid: str, tokens: list[int]) -> Request:
    r = Request(rid, tokens)
    assert kv.allocate(r, len(tokens), kv.lookup(r)) is not None
    r.num_computed_tokens = len(tokens)
    return r


def test_hit_of_another_request_is_refused() -> None:
    kv = hybrid()
    done = computed(kv, "done", list(range(30)))
    kv.free(done)
    a = Request("a", list(range(30)) + [1])
    b = Request("b", [9] * 31)
    hit = kv.lookup(a)
    assert hit.num_tokens == 28 and hit.request_id == "a"
    before = snapshot(kv, a, b)
    with pytest.raises(ValueError, match="the hit was looked up for request 'a', not 'b'"):
        kv.allocate(b, 3, hit)
    # even with identical tokens: the hit belongs to the request it was looked up for
    twin = Request("twin", list(range(30)) + [1])
    with pytest.raises(ValueError, match="looked up for request 'a', not 'twin'"):
        kv.allocate(twin, 3, hit)
    assert snapshot(kv, a, b) == before
    assert kv.allocate(a, 3, hit) is not None          # the right request still can


def test_stale_hit_is_refused() -> None:
    """A hit whose evictable blocks were reused by another allocation in between."""
    kv = hybrid(num_blocks=12)
    kv.free(computed(kv, "old", list(range(20))))
    a = Request("a", list(range(20)) + [5])
    hit = kv.lookup(a)
    assert hit.num_tokens == 20
    hog = computed(kv, "hog", [7] * 20)                 # pops 10 of the 11 free blocks
    before = snapshot(kv, a, hog)
    with pytest.raises(ValueError, match="no longer holds request 'a'.s tokens: the hit is stale"):
        kv.allocate(a, 1, hit)
    assert snapshot(kv, a, hog) == before


def test_second_request_object_with_a_held_id_is_refused() -> None:
    kv = hybrid()
    r = computed(kv, "r", list(range(13)))
    imposter = Request("r", [3] * 40)
    before = snapshot(kv, r)
    for call in (lambda: kv.allocate(imposter, 1), lambda: kv.allocate(imposter, 40, kv.lookup(imposter)),
                 lambda: kv.free(imposter)):
        with pytest.raises(ValueError, match="request id 'r' already holds blocks for a different "
                                             "Request object"):
            call()
        assert snapshot(kv, r) == before
    r.append_tokens([1])
    assert kv.allocate(r, 1) is not None                 # the holder goes on
    kv.free(r)
    assert kv.allocate(imposter, 40, kv.lookup(imposter)) is not None   # after free: a new request
    kv.check_integrity()


def test_impossible_lookahead_is_rejected_at_construction() -> None:
    cfg = config(FA(4), SWA(4, 8), num_blocks=21)       # 20 usable; 1 + la slots in both groups
    with pytest.raises(ValueError, match=r"SpecDecode\('eagle', 1000000\) needs 1000000 lookahead "
                                         r"slots per request, more than the pool's 20 usable blocks "
                                         r"allow \(39\); valid num_speculative_tokens: 1\.\.39"):
        KVCacheManager(cfg, spec_decode=SpecDecode("eagle", 10**6))
    KVCacheManager(cfg, spec_decode=SpecDecode("eagle", 39))          # the largest that fits
    with pytest.raises(ValueError, match=r"valid num_speculative_tokens: 1\.\.38"):
        KVCacheManager(cfg, spec_decode=SpecDecode("dflash", 39))     # k + 1 slots
    with pytest.raises(ValueError, match=r"more than max_model_len=16 allow \(15\); valid "
                                         r"num_speculative_tokens: 1\.\.15"):
        KVCacheManager(config(FA(4), num_blocks=100), spec_decode=SpecDecode("mtp", 16), max_model_len=16)
    KVCacheManager(config(FA(4), num_blocks=100), spec_decode=SpecDecode("mtp", 15), max_model_len=16)
    with pytest.raises(ValueError, match="no speculative decoding fits"):
        KVCacheManager(config(FA(4), num_blocks=100), spec_decode=SpecDecode("dflash", 1), max_model_len=2)
    KVCacheManager(cfg, spec_decode=SpecDecode("ngram", 10**6))       # n-gram reserves no slots


def test_hit_checked_block_by_block_once_the_state_moved() -> None:
    kv = hybrid()
    kv.free(computed(kv, "old", list(range(30))))
    other = computed(kv, "other", [9] * 30)
    a = Request("a", list(range(30)) + [1])
    hit = kv.lookup(a)
    kv.free(computed(kv, "unrelated", [4] * 12))        # the state moved, a's blocks did not
    assert hit.epoch != kv.coordinator.epoch
    assert kv.allocate(a, 3, hit) is not None             # verified block by block, still valid
    kv.free(a)
    # a hand-made hit (no request id, no epoch) naming blocks of other content is refused
    from hybridkv.core.coordinator import CacheHit
    forged = CacheHit(28, tuple(tuple(ids[:7]) for ids in kv.block_ids(other)))
    b = Request("b", list(range(30)) + [1])
    kv.lookup(b)
    before = snapshot(kv, b, other)
    with pytest.raises(ValueError, match="the hit's block .* no longer holds request 'b'.s tokens"):
        kv.allocate(b, 3, forged)
    assert snapshot(kv, b, other) == before
