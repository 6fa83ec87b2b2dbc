"""Calls the manager refuses, with a clear error that changes nothing.

* A hit must be this request's, from this manager's lookup, and still valid: a hit made
  before an eviction, a reset, a load or a failed step that released blocks is refused as
  stale (or verified block by block once the state moved).
* A second Request object under a held id is refused by name; a running request is counted
  once.
* Bad arguments to ``allocate`` / ``lookup`` name the value; an unknown id names it.
"""

from __future__ import annotations

import re

import pytest

from hybridkv import CacheHit, KVCacheManager, Request
from hybridkv.core.blockref import BlockRef, TableRef
from tests.support.helpers import FA, SWA, admit, config, manager, prompt, run_prompt, serve
from hybridkv.core.cache_options import CacheOptions


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
    return KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=num_blocks), CacheOptions(**kw))


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


def test_another_request_object_with_a_held_id_is_refused() -> None:
    """coordinator: holds / plan / step_is_quiet / allocate — ``state.owner is not request``
    inverted or the state looked up under the wrong id: a different Request object reusing
    the id of a running request must get a ValueError (fast path and slow path alike), and
    nothing may change. "a" (6 tokens, 2 blocks) runs one decode step, so a second step of
    one token is quiet (no block, nothing cached) for the owner: the twin must still be refused."""
    kv = KVCacheManager(config(FA(4), num_blocks=12))
    a = serve(kv, "a", prompt(100, 6), free=False)
    a.append_tokens([7])
    assert kv.allocate(a, 1) == [[]]
    before = kv.block_ids(a)
    twin = Request("a", prompt(100, 6))
    twin.num_computed_tokens = 6
    for n in (1, 5):                       # 1: a quiet decode step; 5: needs a new block
        with pytest.raises(ValueError, match="'a'"):
            kv.allocate(twin, n)
    assert kv.block_ids(a) == before
    kv.check_integrity()


def test_a_hit_made_before_an_eviction_is_refused() -> None:
    """coordinator: free / commit — ``self.epoch += 1`` → ``self.epoch = 1``: the state
    version comes back to the epoch a hit was made at, so a stale hit is adopted unverified.

    3 usable blocks, bs 4. "a" caches a0 (5 tokens); q looks up a 4-token hit. "z" (9 tokens)
    evicts a0 and is freed. Adopting q's old hit must raise ValueError (its block holds z's
    tokens now), and nothing may change. Also pins the message's advice (``_verify_hit`` 22, 23)."""
    kv = KVCacheManager(config(FA(4), num_blocks=4))
    serve(kv, "a", prompt(100, 5))
    q = Request("q", prompt(100, 5))
    hit = kv.lookup(q)
    assert hit.num_tokens == 4
    serve(kv, "z", prompt(300, 9))
    assert kv.stats().evictions == 1
    with pytest.raises(ValueError, match="no longer holds .*look up again$"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()
    assert kv.lookup(q).num_tokens == 0


def test_a_stale_sliding_hit_is_verified_past_its_null_blocks() -> None:
    """coordinator: _verify_hit — ``continue`` → ``break`` at a null entry: a sliding
    group's hit starts with nulls (below the window), so verification would stop there and a
    stale hit would be adopted.

    Sliding W=4, bs 4, 4 usable blocks. q's hit is 8 tokens, blocks (null, b). "z" (16
    tokens) evicts everything cached; adopting q's old hit must raise."""
    kv = KVCacheManager(config(SWA(4, 4), num_blocks=5))
    serve(kv, "a", prompt(100, 9))
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8 and hit.block_ids[0][0] == 0
    serve(kv, "z", prompt(300, 16))
    assert kv.stats().evictions == 2
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_table_ref_resolves_to_the_block_at_its_position() -> None:
    """blockref: TableRef.resolve — each field of the BlockRef: the group, the block id at the
    table position, the hash."""
    ref = TableRef(1, 2, b"h").resolve([[0, 0, 0], [5, 6, 7]])
    assert ref == BlockRef(1, 7, b"h") and (ref.group, ref.block_id, ref.block_hash) == (1, 7, b"h")


def test_a_hit_made_before_an_external_load_is_still_verified() -> None:
    """coordinator: commit_external — ``self.epoch += 1`` → ``= 1``: the state version comes
    back to the epoch of an old hit, which is then adopted unverified.

    3 usable blocks, bs 4. "a" (9 tokens) is allocated (epoch 1) and caches 2 blocks; q's
    lookup (a's prompt) hits 8 at epoch 1. a is freed, "z" (9 other tokens) evicts a's blocks,
    "e" loads 8 tokens from an external tier (a tier holding every block; 5 commits so far).
    q's old hit must be refused: its blocks hold other tokens now."""
    kv = KVCacheManager(config(FA(4), num_blocks=4))
    a = Request("a", prompt(100, 9))
    assert kv.allocate(a, 9, kv.lookup(a)) is not None
    a.num_computed_tokens = 9
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8
    kv.free(a)
    z = Request("z", prompt(300, 9))
    assert kv.allocate(z, 9, kv.lookup(z)) is not None
    z.num_computed_tokens = 9
    kv.free(z)
    assert kv.stats().evictions == 2
    e = Request("e", prompt(500, 9))
    local = kv.lookup(e)
    ext = kv.lookup_external(e, local, lambda g, h: True)
    assert ext is not None and ext.num_tokens == 8
    assert kv.allocate(e, 0, local, external=ext) is not None
    assert kv.commit_external(e, ext, True) == 8
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_a_hit_made_just_before_an_external_load_that_evicts_it_is_refused() -> None:
    """coordinator: commit_external — ``self.epoch += 1`` → ``-= 1``: the version returns to
    the one before the load's allocation, when q looked up its (now stale) hit.

    3 usable blocks, bs 4. "a" (9 tokens) caches 2 blocks and is freed; q (a's prompt) hits 8.
    "e" reserves 2 blocks for an 8-token external load, evicting one of a's blocks (3 free:
    the scratch block, then a's tail first). q's hit must be refused."""
    kv = KVCacheManager(config(FA(4), num_blocks=4))
    a = Request("a", prompt(100, 9))
    assert kv.allocate(a, 9, kv.lookup(a)) is not None
    a.num_computed_tokens = 9
    kv.free(a)
    q = Request("q", prompt(100, 9))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8
    e = Request("e", prompt(500, 9))
    local = kv.lookup(e)
    ext = kv.lookup_external(e, local, lambda g, h: True)
    assert kv.allocate(e, 0, local, external=ext) is not None
    assert kv.stats().evictions == 1
    assert kv.commit_external(e, ext, True) == 8
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_a_hit_made_before_cache_only_steps_and_an_eviction_is_refused() -> None:
    """coordinator: allocate — the cache-only fast path (a step that completes a block the
    table already holds) bumps the epoch (``+= 1``; ``= 1`` or ``-= 1`` brings it back to
    the epoch of an old hit, which is then adopted unverified).

    Full (bs 4), 4 usable blocks. "a" (5 tokens) caches block 0; q's lookup (a's prompt)
    hits 4 then (1 commit so far). a is freed; r (16 tokens) is admitted with 4 tokens and 12
    lookahead slots (4 blocks: a's block 0 is evicted), steps 1 token (slow path), then 3, 4
    and 4 tokens, each completing a block its table already holds (cache-only steps). q's
    old hit must be refused: its block holds r's tokens now."""
    kv = KVCacheManager(config(FA(4), num_blocks=5))
    a = Request("a", prompt(100, 5))
    admit(kv, a, 5)
    q = Request("q", prompt(100, 5))
    hit = kv.lookup(q)
    assert hit.num_tokens == 4
    kv.free(a)
    r = Request("r", prompt(300, 16))
    admit(kv, r, 4, num_lookahead_tokens=12)
    assert kv.stats().evictions == 1
    for n in (1, 3, 4, 4):
        assert kv.allocate(r, n, num_lookahead_tokens=0) == [[]]
        r.num_computed_tokens += n
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_a_hit_made_before_a_failed_compat_step_that_releases_is_refused() -> None:
    """coordinator: allocate — a failed compat allocation that still frees the blocks that
    left the window (vLLM frees them before its capacity check) bumps the epoch (``+= 1``;
    ``= 1`` or ``-= 1`` brings it back to the epoch of an old hit, adopted unverified).

    Compat, one sliding group (bs 4, W 5), 3 usable blocks. "a" (5 tokens) caches block 0;
    q1 looks it up (hit 4) before a is freed, q2 after. r (20 tokens) is admitted with 12
    tokens (3 blocks: a's block 0 is evicted); its next 4 tokens with the full-sequence
    reservation fail (vLLM's count: cdiv(20, 4) - 3 = 2 > 0 free) but release blocks 0 and 1
    (the window skips 12 - 5 + 1 = 8 tokens). Both old hits must be refused."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=4), CacheOptions(vllm_compat=True))
    a = Request("a", prompt(100, 5))
    admit(kv, a, 5)
    q1 = Request("q1", prompt(100, 5))
    hit1 = kv.lookup(q1)
    kv.free(a)
    q2 = Request("q2", prompt(100, 5))
    hit2 = kv.lookup(q2)
    assert hit1.num_tokens == hit2.num_tokens == 4
    r = Request("r", prompt(300, 20))
    admit(kv, r, 12)
    assert kv.stats().evictions == 1
    assert kv.allocate(r, 4, full_sequence_must_fit=True) is None
    assert kv.block_ids(r)[0][:2] == [0, 0]
    for q, hit in ((q1, hit1), (q2, hit2)):
        with pytest.raises(ValueError, match="no longer holds"):
            kv.allocate(q, 1, hit)
    kv.check_integrity()


def test_a_different_request_object_with_a_held_id_is_refused_by_name() -> None:
    """coordinator: holds / _state — the owner check inverted or skipped, or its message lost:
    a second Request object reusing a running request's id must get the documented error
    (allocate with or without a hit, free), and freeing an id nobody holds, or freeing twice,
    is refused by name (issue #44: it used to pass silently).

    Default mode, full (bs 4). "x" (12 tokens) runs; another object "x" with the same tokens
    looks up a hit of 8 (x's cached blocks)."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    x, _ = run_prompt(kv, "x", prompt(100, 12))
    other = Request("x", prompt(100, 12))
    hit = kv.lookup(other)
    assert hit.num_tokens == 8
    msg = re.escape("request id 'x' already holds blocks for a different Request object; "
                    "free that request first or use a unique id")
    with pytest.raises(ValueError, match=msg):
        kv.allocate(other, 4, hit)
    with pytest.raises(ValueError, match=msg):
        kv.allocate(other, 4)
    with pytest.raises(ValueError, match=msg):
        kv.free(other)
    with pytest.raises(ValueError) as info:
        kv.free(Request("nobody", [1, 2, 3]))
    assert str(info.value) == ("free('nobody'): the request holds no blocks (never allocated, or "
                               "already freed)")
    kv.free(x)
    assert kv.num_free_blocks == 39
    with pytest.raises(ValueError) as info:
        kv.free(x)
    assert str(info.value) == "free('x'): the request holds no blocks (never allocated, or already freed)"
    assert kv.num_free_blocks == 39
    kv.check_integrity()


def test_vllm_compat_free_of_an_unknown_request_is_a_no_op_as_in_vllm() -> None:
    """vLLM's scheduler frees aborted requests that were never allocated; compat mode keeps
    that a no-op (the default mode refuses it: above)."""
    kv = manager(FA(4), num_blocks=40, compat=True)
    kv.free(Request("nobody", [1, 2, 3]))
    x, _ = run_prompt(kv, "x", prompt(100, 12))
    kv.free(x)
    kv.free(x)
    assert kv.num_free_blocks == 39
    kv.check_integrity()


def test_a_running_request_is_counted_once_and_may_schedule_zero_tokens() -> None:
    """coordinator: holds — the request's state not found (looked up as None or under id
    None): a running request taken for a new one (counted again in the stats; refused a
    0-token step as a new request without a hit).

    Default mode, full (bs 4). r (12 tokens) runs in chunks 4, 4, 4, then a 0-token step
    (allowed for a running request: no new block). The stats count one request of 12 query
    tokens."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    r = Request("r", prompt(100, 12))
    hit = kv.lookup(r)
    for i in range(3):
        assert kv.allocate(r, 4, hit if i == 0 else None) is not None
        r.num_computed_tokens += 4
    assert kv.allocate(r, 0) == [[]]
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (1, 12, 0)


def _running(kv: KVCacheManager, rid: str = "r") -> Request:
    """A request with a 5-token prompt and one decode step computed: 6 tokens in 2 blocks of
    4 (room for 2 more). The first decode step after a prefill takes the slow path; from then
    on a step that needs no block, caches nothing and slides no window takes the fast path
    (``allocate``'s decode fast path), so the next 1-token step is such a step."""
    r = Request(rid, prompt(0, 5))
    assert kv.allocate(r, 5) is not None
    r.num_computed_tokens = 5
    r.append_tokens([7])
    assert kv.allocate(r, 1) == [[] for _ in kv.config.groups]
    r.num_computed_tokens = 6
    r.append_tokens([8])
    return r


def test_bad_allocate_and_lookup_calls_are_refused_naming_the_value() -> None:
    """allocate — the Request type check; num_new_tokens and num_lookahead_tokens that are bool,
    float or negative (the fast path must not answer for them either: a running request's quiet
    step); the messages. lookup: the same Request type check; a request hashed by another
    manager is refused with the advice."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(vllm_compat=True))
    with pytest.raises(ValueError, match=r"^allocate needs a Request, got str$"):
        kv.allocate("r", 1)
    with pytest.raises(ValueError, match=r"^lookup needs a Request, got int$"):
        kv.lookup(5)
    new = Request("n", prompt(0, 5))
    r = _running(kv)
    for req in (new, r):
        for bad in (True, 1.0, -1):
            with pytest.raises(ValueError, match=rf"^num_new_tokens must be a non-negative "
                               rf"integer, got {bad!r}$"):
                kv.allocate(req, bad)
            with pytest.raises(ValueError, match=rf"^num_lookahead_tokens must be a non-negative "
                               rf"integer, got {bad!r}$"):
                kv.allocate(req, 1, num_lookahead_tokens=bad)
    other = KVCacheManager(config(FA(4), num_blocks=16))
    with pytest.raises(ValueError, match=r"^request 'r' was hashed by another manager's hasher; "
                       r"\bcreate a new Request for each manager$"):
        other.lookup(r)
    kv.check_integrity()


def test_hits_that_do_not_belong_to_the_request_are_refused() -> None:
    """allocate — a hit for a running request (its message's advice), a hit that is not a
    CacheHit of this manager (wrong type, wrong number of groups), looked up for another
    request, longer than the request, or whose blocks do not cover its tokens; each message
    names the values.

    "a" caches 12 tokens (3 blocks of bs 4). A 13-token request with that prefix hits 12."""
    kv = KVCacheManager(config(FA(4), num_blocks=32), CacheOptions(vllm_compat=True))
    serve(kv, "a", prompt(0, 12))
    b = Request("b", prompt(0, 12) + [99])
    hit = kv.lookup(b)
    assert hit.num_tokens == 12
    for bad in (("x",), CacheHit(0, ((), ()))):
        with pytest.raises(ValueError, match=r"^hit must be a CacheHit from this manager's lookup, got "):
            kv.allocate(b, 1, bad)
    with pytest.raises(ValueError, match=r"^the hit was looked up for request 'b', not 'c'; call "
                       r"lookup\(request\) for the request you allocate$"):
        kv.allocate(Request("c", prompt(0, 12) + [99]), 1, hit)
    with pytest.raises(ValueError, match=r"^hit blocks of group 0 do not cover 8 tokens$"):
        kv.allocate(b, 5, CacheHit(8, ((hit.block_ids[0][0],),), 0, "b"))
    late = Request("b", prompt(0, 12) + [99])
    late.num_computed_tokens = 4
    with pytest.raises(ValueError, match=r"^hit of 12 tokens exceeds request 'b''s 13 tokens$"):
        kv.allocate(late, 1, hit)
    kv.check_integrity()
    # a hit of every token is not more than the request (12 + 0 = 12)
    whole = Request("b", prompt(0, 12))
    assert kv.allocate(whole, 0, hit) == [[]]
    assert kv.block_ids(whole) == (list(hit.block_ids[0]),)
    kv.check_integrity()
    r2 = Request("q", prompt(0, 12) + [5])
    h2 = kv.lookup(r2)
    assert kv.allocate(r2, 1, h2) is not None
    with pytest.raises(ValueError, match=r"^request 'q' already holds blocks; a hit can only be "
                       r"adopted by its first allocate$"):
        kv.allocate(r2, 1, h2)


def test_lookahead_given_per_step_is_allocated() -> None:
    """allocate — an explicit num_lookahead_tokens answered by the fast path with the manager's
    default (0 here): the step's lookahead slots not allocated.

    A running request with 6 computed tokens (2 blocks of 4): one new token and 4 lookahead
    slots reach token 11, a third block (without them the step is quiet)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(vllm_compat=True))
    r = _running(kv)
    new = kv.allocate(r, 1, num_lookahead_tokens=4)
    assert [len(x) for x in new] == [1] and len(kv.block_ids(r)[0]) == 3


def test_block_ids_of_an_unknown_request_names_it() -> None:
    """block_ids — the KeyError's message replaced by None."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    with pytest.raises(KeyError, match="request 'ghost' holds no blocks"):
        kv.block_ids("ghost")


def test_a_hit_made_before_a_prefix_cache_reset_is_refused() -> None:
    """reset_prefix_cache — ``epoch += 1`` → ``epoch = 1`` / ``epoch -= 1``: the state version
    comes back to the epoch a hit was made at, so the stale hit is adopted unverified.

    bs 4. "a" (9 tokens) is allocated (epoch 0 → 1) and caches blocks 0–1; q looks up its
    8-token hit at epoch 1; a is freed (→ 2); the reset drops every hash (→ 3; the broken
    counters give 1). Adopting q's hit must raise: its blocks no longer hold q's prefix."""
    kv = KVCacheManager(config(FA(4), num_blocks=8))
    a = Request("a", prompt(0, 9))
    assert kv.allocate(a, 9, kv.lookup(a)) is not None
    a.num_computed_tokens = 9
    q = Request("q", prompt(0, 9))
    hit = kv.lookup(q)
    assert hit.num_tokens == 8
    kv.free(a)
    assert kv.reset_prefix_cache()
    with pytest.raises(ValueError, match="no longer holds"):
        kv.allocate(q, 1, hit)
    kv.check_integrity()
    assert kv.lookup(q).num_tokens == 0


def test_bad_calls():
    kv = manager(FA(4), num_blocks=10)
    r = Request("r", list(range(9)))
    with pytest.raises(ValueError, match="num_new_tokens must be a non-negative integer, got -1"):
        kv.allocate(r, -1)
    with pytest.raises(ValueError, match="needs num_new_tokens > 0 or a hit"):
        kv.allocate(r, 0)
    kv.allocate(r, 9)
    hit = kv.lookup(Request("q", list(range(9))))
    assert hit.num_tokens == 8                     # r's two full blocks are cached
    with pytest.raises(ValueError, match="already holds blocks"):
        kv.allocate(r, 1, hit)
    other = manager(FA(4), num_blocks=10)
    with pytest.raises(ValueError, match="another manager's hasher"):
        other.lookup(r)
