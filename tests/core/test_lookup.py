"""Lookup (``core/coordinator/lookup.py``): the longest prefix hit every group serves.

* The multi-group fixed point: scenarios that need two and three passes, every pattern of up
  to 3 missing blocks against a brute force, one-token candidates, identical sibling groups
  probed together (sliding and full), EAGLE drop mode's proof block, a hash cached twice.
* A hit names its request, its junction and its epoch; the lookup is capped below
  ``max_model_len`` and empty when caching is off or the request skips it.
* The per-request memo: a repeated lookup equals a fresh one, and is redone after any index
  change (insert, eviction, reset), for another Request object or a longer request.
Expectations are derived by hand or from the independent oracle
(:mod:`tests.support.oracle`), never from the implementation's rules.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv import CacheHit, ChunkedLocal, KVCacheManager, Request, SlidingWindow
from tests.support.helpers import (EAGLE_DROP, FA, SWA, cached_positions, config, evict, manager,
                                   prompt, run_prompt, serve)
from tests.support.oracle import CacheMirror, oracle_hit
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def test_a_hit_of_one_token_is_returned() -> None:
    """coordinator: _find_longest_hit — a hit of exactly one token taken for "no hit" (``t ==
    1`` for ``t == 0``; only alignment 1 has such hits).

    Full (bs 1) + MLA-free simplest case: two full groups of block size 1. "a" = [5, 6, 7] is
    served; "b" = [5, 9, 9] shares one token: its hit is 1 token, one block per group."""
    kv = KVCacheManager(config(FA(1), FA(1, dtype="float16"), num_blocks=20))
    a, _ = run_prompt(kv, "a", [5, 6, 7])
    hit = kv.lookup(Request("b", [5, 9, 9]))
    assert hit.num_tokens == 1
    assert hit.block_ids == (tuple(kv.block_ids(a)[0][:1]), tuple(kv.block_ids(a)[1][:1]))


def test_lookup_checks_every_group_at_a_one_token_candidate() -> None:
    """coordinator: _fixed_point — the unit loop stops at a candidate of 1 token (``t <= 0``
    → ``t <= 1``) without asking the later groups: a 1-token hit the window group cannot serve
    (then its missing block is read: KeyError).

    Compat mode, retention 0, full (bs 1) + SWA (bs 1, W 3: need 2). "a" (10 tokens) leaves the
    SWA group only the window of its replay end 9: blocks 7, 8. "b" shares a's first token:
    the full group answers 1, the SWA group needs block 0 for it: no hit."""
    kv = manager(FA(1), SWA(1, 3), num_blocks=40, retention=0)
    a, _ = run_prompt(kv, "a", prompt(100, 10))
    assert cached_positions(kv, a, 1) == {7, 8}
    hit = kv.lookup(Request("b", [100, 7, 7, 7]))
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 1)


def _sliding_b(window: int) -> SlidingWindow:
    """A sliding spec unequal to ``SWA(1, window)`` (another head_dim): its own lookup unit."""
    return SlidingWindow(block_size=1, num_kv_heads=1, head_dim=4, window=window)


def test_lookup_repeats_the_pass_that_ends_at_one_token() -> None:
    """coordinator: _fixed_point — the fixed point stopped after a pass that lowered the
    candidate to 1 (``t <= 0`` → ``t <= 1`` at the end of a pass, or at the start of a unit):
    a group that served the pass's larger candidate is not asked about 1 token.

    Compat mode, retention 0, full (bs 1) + two unequal SWA groups A and B (bs 1, W 2: need 1).
    "x" = [1, 2, 3] caches full 0..2 and (replay end 2) the window block 1 in A and B; "y" =
    [1, 4] caches block 0 in A and B. Then A's block 0 and B's block 1 are evicted. "q" = [1,
    2, 9, 9]: the full group answers 2; A serves 2 (its block 1); B does not serve 2 (block 1
    gone) but serves 1 (block 0). Next pass: A does not serve 1 (block 0 gone): no hit."""
    kv = manager(_sliding_b(2), SWA(1, 2), FA(1), num_blocks=40, retention=0)
    x, _ = run_prompt(kv, "x", [1, 2, 3])
    y, _ = run_prompt(kv, "y", [1, 4])
    assert cached_positions(kv, x, 0) == cached_positions(kv, x, 1) == {1}
    assert cached_positions(kv, y, 0) == cached_positions(kv, y, 1) == {0}
    kv.free(x)
    kv.free(y)
    evict(kv, y, 0, 0)        # A's block 0
    evict(kv, x, 1, 1)        # B's block 1
    hit = kv.lookup(Request("q", [1, 2, 9, 9]))
    assert hit.num_tokens == 0
    kv.check_integrity()


def test_a_hit_names_the_request_it_was_looked_up_for() -> None:
    """coordinator: _find_longest_hit / find_longest_hit — the junction set to the hit's own
    end (``longest > t`` → ``>=`` / ``or True``); the hit's ``request_id`` lost
    (None: any request could adopt it) for a zero hit, a non-zero hit, or a memoized hit
    refreshed after the state changed.

    Default mode, full (bs 4). "a" (12 tokens) is served: "b" (its 12 tokens + 1) hits 12,
    "c" (other tokens) hits 0. Each hit names its request, and another request adopting it is
    refused (CacheHit docstring: only that request can adopt it). After an unrelated
    allocation (the epoch moves; b's hashes untouched) b's lookup is answered from the memo:
    the same hit, still b's. A hit every group serves in full has no junction
    (``shared_prefix_boundary`` 0, not the hit's own end)."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    run_prompt(kv, "a", prompt(100, 12))
    b = Request("b", prompt(100, 13))
    c = Request("c", prompt(500, 13))
    hits = {"b": kv.lookup(b), "c": kv.lookup(c)}
    assert (hits["b"].num_tokens, hits["c"].num_tokens) == (12, 0)
    # one group: nothing longer is cached anywhere, so no junction (not even the hit's end)
    assert (hits["b"].shared_prefix_boundary, hits["c"].shared_prefix_boundary) == (0, 0)
    run_prompt(kv, "z", prompt(900, 9))
    hits["b2"] = kv.lookup(b)
    assert hits["b2"].num_tokens == 12 and hits["b2"].block_ids == hits["b"].block_ids
    for name, hit in hits.items():
        assert hit.request_id == name[0]
        with pytest.raises(ValueError, match=f"looked up for request '{name[0]}'"):
            kv.allocate(Request("other", prompt(100, 13)), 1, hit)
    assert kv.allocate(b, 1, hits["b2"]) is not None
    kv.check_integrity()


def test_identical_sibling_groups_serve_a_block_only_together() -> None:
    """coordinator: _find_longest_hit — a unit of identical sibling groups probed with the
    first group's answers only (``groups[1:]`` → ``groups[2:]``): a block one sibling lost
    counted as cached (its id is then read from that sibling's index: KeyError).

    Default mode, dense retention, full (bs 4) + two identical SWA groups (bs 4, W 8: need 2),
    one lookup unit. "a" (24 tokens) is served and freed; the second sibling's block 4 is
    evicted. A resend of a's 24 tokens (candidate 20, run [3, 5)) falls back to 16 (run
    [2, 4)), served by both siblings."""
    kv = manager(FA(4), SWA(4, 8), SWA(4, 8), num_blocks=60, compat=False, retention=None)
    a, _ = run_prompt(kv, "a", prompt(100, 24))
    ids = kv.block_ids(a)
    kv.free(a)
    evict(kv, a, 2, 4)
    hit = kv.lookup(Request("b", prompt(100, 24)))
    assert hit.num_tokens == 16
    assert hit.block_ids == (tuple(ids[0][:4]), (0, 0) + tuple(ids[1][2:4]),
                             (0, 0) + tuple(ids[2][2:4]))
    kv.check_integrity()


@pytest.mark.parametrize("lost", [0, 1])
def test_identical_full_attention_siblings_hit_only_the_prefix_both_hold(lost) -> None:
    """Two identical full-attention groups (one lookup unit, downward closed): a block that
    either sibling lost ends the hit, whichever sibling it was.

    Default mode, two full groups (bs 4). "a" (24 tokens) is served and freed; sibling
    ``lost`` loses its block 2. A resend of a's 24 tokens hits blocks 0 and 1: 8 tokens."""
    kv = manager(FA(4), FA(4), num_blocks=40, compat=False)
    a, _ = run_prompt(kv, "a", prompt(100, 24))
    ids = kv.block_ids(a)
    kv.free(a)
    evict(kv, a, lost, 2)
    hit = kv.lookup(Request("b", prompt(100, 24)))
    assert hit.num_tokens == 8
    assert hit.block_ids == (tuple(ids[0][:2]), tuple(ids[1][:2]))
    kv.check_integrity()


def test_a_hash_cached_twice_is_served_by_its_first_block() -> None:
    """coordinator: _find_longest_hit — a duplicated hash (two requests computed the same
    block) read as ``None`` instead of its first block id.

    Default mode, full (bs 4). "a" and "b" (the same 9 tokens) are both looked up before
    either is allocated (no hit), then both run: each caches its own blocks 0 and 1 under the
    same hashes. "c" (the same 9 tokens) hits 8 with a's blocks, the first cached."""
    kv = manager(FA(4), num_blocks=40, compat=False)
    a, b = Request("a", prompt(100, 9)), Request("b", prompt(100, 9))
    ha, hb = kv.lookup(a), kv.lookup(b)
    for r, h in ((a, ha), (b, hb)):
        assert h.num_tokens == 0 and kv.allocate(r, 9, h) is not None
        r.num_computed_tokens = 9
    assert kv.block_ids(a)[0][:2] != kv.block_ids(b)[0][:2]
    hit = kv.lookup(Request("c", prompt(100, 9)))
    assert hit.num_tokens == 8 and hit.block_ids == (tuple(kv.block_ids(a)[0][:2]),)
    kv.check_integrity()


@pytest.mark.parametrize("compat", [False, True])
def test_drop_mode_hit_needs_the_proof_block_hash(compat) -> None:
    """coordinator: _fixed_point — the largest end ``n_fine // scale - proof`` (``+ proof``:
    a hit whose proof block has no hash), and the single-group cap of compat mode (``and``
    → ``or``: applied in default mode or to a compat hybrid).

    EAGLE drop mode, every group a drafter (proof block). "a" (20 tokens) is served. A
    request of a's first 16 tokens: its candidate is 12 (15 aligned down), whose proof block
    3 has a hash (4 hashed blocks) and is cached by a: the hit is 12 — in default mode with
    one full group (bs 4) and in compat mode with two (vLLM's hybrid coordinator keeps the
    proof margin; only its single-group coordinator caps the proof block below max_tokens).
    A request of a's first 13 tokens has 3 hashed blocks: 12 would need block 3's hash, so 8."""
    specs = (FA(4), FA(4, dtype="float16")) if compat else (FA(4),)
    kv = manager(*specs, num_blocks=60, compat=compat, spec_decode=EAGLE_DROP)
    run_prompt(kv, "a", prompt(100, 20))
    assert kv.lookup(Request("b", prompt(100, 16))).num_tokens == 12
    assert kv.lookup(Request("c", prompt(100, 13))).num_tokens == 8


def test_lookup_after_reset_does_not_reuse_a_stale_answer() -> None:
    """pool: BlockPool.reset_hashes — ``index_version += 1`` → ``= 1`` / ``-= 1``: the index
    version goes back to a value an earlier lookup was memoized at, so a lookup after the reset
    (and one new cached block) returns the old hit, whose blocks no longer hold the prefix.

    Serving "a" caches 2 blocks (version 2); q's lookup hits 8 at version 2. The reset must move
    the version past every earlier one; "b" caches one block of other tokens. q then hits 0."""
    kv = KVCacheManager(config(FA(4), num_blocks=12))
    serve(kv, "a", prompt(100, 9))
    q = Request("q", prompt(100, 9))
    assert kv.lookup(q).num_tokens == 8
    assert kv.reset_prefix_cache()
    serve(kv, "b", prompt(300, 5))
    assert kv.lookup(q).num_tokens == 0
    assert kv.lookup(Request("q2", prompt(100, 9))).num_tokens == 0


def test_lookup_after_an_eviction_does_not_reuse_a_stale_answer() -> None:
    """pool: BlockPool._drop — ``index_version += 1`` → ``= 1`` / ``-= 1``: after an eviction
    the version can come back to the one q's last lookup was memoized at.

    3 usable blocks, bs 4. "a" (9 tokens) caches a0, a1 (version 2); q hits 8. "z" (5 tokens)
    pops the scratch block and a1 (LRU: a's tail first), evicting a1, and caches one block.
    q's next lookup must see a1 gone: 4 tokens (a0 only)."""
    kv = KVCacheManager(config(FA(4), num_blocks=4))
    serve(kv, "a", prompt(100, 9))
    q = Request("q", prompt(100, 9))
    assert kv.lookup(q).num_tokens == 8
    z = serve(kv, "z", prompt(300, 5), free=False)
    assert kv.stats().evictions == 1
    kv.check_integrity()
    hit = kv.lookup(q)
    assert hit.num_tokens == 4
    assert hit.block_ids[0][0] not in kv.block_ids(z)[0]


def test_lookup_memo_is_per_request_object() -> None:
    """coordinator: find_longest_hit — the memo check ``memo[0] is request`` inverted: a new
    Request object reusing a looked-up id (same length, other tokens) would get the other
    object's hit. "a" caches 2 blocks; q (a's prefix) hits 8; a new "q" with other tokens hits 0."""
    kv = KVCacheManager(config(FA(4), num_blocks=12))
    serve(kv, "a", prompt(100, 9))
    assert kv.lookup(Request("q", prompt(100, 9))).num_tokens == 8
    assert kv.lookup(Request("q", prompt(500, 9))).num_tokens == 0


def test_lookup_memo_sees_a_longer_request() -> None:
    """coordinator: find_longest_hit — the memo key's ``memo[3] == max_tokens`` inverted: a
    request that grew by one token inside the same block (same hash count, larger cap) would
    get its old, shorter hit. "a" caches 2 blocks; q = a's first 8 tokens hits 4 (cap 7);
    after one more token of a, q hits 8."""
    kv = KVCacheManager(config(FA(4), num_blocks=12))
    P = prompt(100, 9)
    serve(kv, "a", P)
    q = Request("q", P[:8])
    assert kv.lookup(q).num_tokens == 4
    q.append_tokens([P[8]])
    assert kv.lookup(q).num_tokens == 8


def test_an_empty_cache_reports_no_junction_whatever_the_group_order() -> None:
    """coordinator: __init__ — lookup units are ordered full attention first (``sorted`` by
    ``not downward_closed``): a chunked group alone answers a chunk boundary from an empty
    cache (it needs no block before a boundary), which must not become a junction.

    Chunked local (bs 4, chunk 12) listed before full attention (bs 4), nothing cached: a
    30-token request hits 0 with no shared-prefix boundary (nothing is cached anywhere)."""
    chunked = ChunkedLocal(block_size=4, num_kv_heads=1, head_dim=8, chunk_size=12)
    kv = KVCacheManager(config(chunked, FA(4), num_blocks=40))
    hit = kv.lookup(Request("r", prompt(100, 30)))
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 0)


def test_lookup_of_a_request_longer_than_max_model_len_is_capped() -> None:
    """lookup — the hit is capped at ``max_model_len - 1`` (rounded down to whole blocks), not
    at max_model_len + 1 or max_model_len - 2.

    max_model_len 9: "a" (9 tokens) caches 2 blocks (8 tokens); a 12-token request with that
    prefix may hit at most 8 tokens: 8. max_model_len 8: at most 7 tokens: 4."""
    for mml, expected in ((9, 8), (8, 4)):
        kv = KVCacheManager(config(FA(4), num_blocks=32), CacheOptions(vllm_compat=True, max_model_len=mml))
        serve(kv, "a", prompt(0, mml))
        assert kv.lookup(Request("b", prompt(0, 12))).num_tokens == expected


def test_a_lookup_without_caching_is_an_empty_hit_for_this_request() -> None:
    """lookup — caching off or a request that skips the cache: a hit of 0 tokens, one empty
    tuple per group, no junction (0), named after the request (so another request cannot adopt
    it), even when the prefix is cached."""
    for caching, skip in ((False, False), (True, True)):
        kv = KVCacheManager(config(FA(4), FA(4), num_blocks=32), CacheOptions(enable_caching=caching))
        serve(kv, "a", prompt(0, 12))
        r = Request("b", prompt(0, 12), RequestCacheParams(skip_prefix_cache=skip))
        hit = kv.lookup(r)
        assert isinstance(hit, CacheHit)
        assert (hit.num_tokens, hit.block_ids, hit.shared_prefix_boundary, hit.request_id) == \
            (0, ((), ()), 0, "b")
        with pytest.raises(ValueError, match="looked up for request 'b', not 'c'"):
            kv.allocate(Request("c", prompt(0, 12)), 12, hit)
        assert kv.allocate(r, 12, hit) is not None
        kv.check_integrity()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([(FA(4),), (FA(4), SWA(4, 8)), (FA(4), SWA(8, 12))]),
       st.sampled_from([(True, "lru"), (False, "lru"), (False, "lfu")]),
       st.integers(12, 60), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)),
                                     min_size=1, max_size=40))
def test_memoized_lookup_equals_a_fresh_one(specs, mode, num_blocks, ops) -> None:
    """Waiting requests are looked up (and their admission planned) again and again while
    others run, cache and evict: every answer equals one made from scratch (the hit, and the
    count of its blocks in the free queue), and adopting it keeps the pool sound."""
    compat, policy = mode
    kv = manager(*specs, num_blocks=num_blocks, compat=compat, eviction_policy=policy,
                 retention=0 if len(specs) > 1 else None)
    coord = kv.coordinator
    base = [7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 7, 8, 7, 9]
    waiting = [Request(f"w{i}", base[: 8 + 4 * i] + [i] * (3 + i)) for i in range(3)]
    running: list[Request] = []
    n = 0
    for op, x in ops:
        if op == 0:                                     # a new request runs its prompt
            req = Request(f"r{n}", base[: x % 17] + [x % 3] * (1 + x % 9))
            n += 1
            hit = kv.lookup(req)
            if kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None:
                req.num_computed_tokens = req.num_tokens
                running.append(req)
        elif op == 1 and running:                       # a decode step
            req = running[x % len(running)]
            req.append_tokens([x % 4])
            if kv.allocate(req, 1) is None:
                kv.free(running.pop(running.index(req)))
            else:
                req.num_computed_tokens += 1
        elif op == 2 and running:
            kv.free(running.pop(x % len(running)))
        for w in waiting:
            hit = kv.lookup(w)
            fresh = coord._find_longest_hit(w, w.num_tokens - 1)
            assert (hit.num_tokens, hit.block_ids, hit.shared_prefix_boundary) == \
                (fresh.num_tokens, fresh.block_ids, fresh.shared_prefix_boundary)
            assert hit.epoch == coord.epoch
            plan = coord.plan(w, w.num_tokens - hit.num_tokens, hit, 0, reserve_tokens=w.num_tokens)
            assert [gp.touched for gp in plan.groups] == \
                [coord._num_evictable(ids) for ids in hit.block_ids]
        if op == 3:                                      # admit one waiting request now
            w = waiting[x % len(waiting)]
            hit = kv.lookup(w)
            if kv.allocate(w, w.num_tokens - hit.num_tokens, hit) is not None:
                kv.free(w)
        kv.check_integrity()


@pytest.mark.parametrize("compat", [False, True])
def test_lookup_memo_follows_the_index(compat: bool) -> None:
    """A repeated lookup of a waiting request is served from a memo while the pool's index
    is unchanged; any insert or eviction makes it look again, and the hit it returns is
    always adoptable (stamped with the current epoch)."""
    kv = KVCacheManager(config(FA(16), SWA(16, 32), num_blocks=40), CacheOptions(
        retention_interval=None, vllm_compat=compat))
    a = Request("a", list(range(100)))
    w = Request("w", list(range(100)) + [7] * 30)
    assert kv.lookup(w).num_tokens == 0
    assert kv.allocate(a, 100, kv.lookup(a)) is not None     # caches a's blocks
    first = kv.lookup(w)
    assert first.num_tokens > 0
    other = Request("o", [5] * 20)
    assert kv.allocate(other, 20, kv.lookup(other)) is not None  # epoch moves, index too
    again = kv.lookup(w)
    assert (again.num_tokens, again.block_ids) == (first.num_tokens, first.block_ids)
    assert again.epoch == kv.coordinator.epoch
    kv.free(a)
    hog = Request("hog", [9] * 16 * 15)                        # evicts some of a's blocks
    assert kv.allocate(hog, len(hog.token_ids), kv.lookup(hog)) is not None
    fresh = kv.coordinator._find_longest_hit(w, 129)           # no memo
    got = kv.lookup(w)
    assert (got.num_tokens, got.block_ids) == (fresh.num_tokens, fresh.block_ids)
    assert got.num_tokens < first.num_tokens
    kv.free(hog)
    got = kv.lookup(w)
    assert kv.allocate(w, 130 - got.num_tokens, got) is not None
    kv.check_integrity()


# Two sliding groups with block 4: W=8 needs blocks [e-2, e) for a hit at 4e, W=4 needs [e-1, e).
def test_fixed_point_needs_a_second_pass_local_cache() -> None:
    """W=8 and W=4 sliding groups, LRU evictions leave holes: W=8 lacks block 3, W=4 lacks
    blocks 0, 3 and 5 of the query. By hand: e=6 fails (W=4 lacks 5), e=5 fails (W=8 lacks 3),
    e=4 fails (W=4 lacks 3), e=3 works (W=8 has 1, 2; W=4 has 2): 12 tokens. One pass of the
    fixed point (W=8 then W=4) stops at 20, whose W=8 window needs block 3, which is not cached."""
    kv = KVCacheManager(config(SWA(4, 8), SWA(4, 4), num_blocks=15), CacheOptions(
        retention_interval=0, enable_events=True))
    base = list(range(100, 140))
    mirror = CacheMirror()
    serve(kv, "a", base[:37] + [7], chunk=16)
    serve(kv, "b", base[:20] + [7])
    serve(kv, "c", base[:32] + [7], chunk=8)
    serve(kv, "d", base[:12] + [7], chunk=12)
    mirror.feed(kv.take_events())
    query = Request("q", base[:25])
    hit = kv.lookup(query)
    kv.check_integrity()
    held = [{j for j in range(6) if (g, query.block_hashes[j]) in mirror} for g in (0, 1)]
    assert held == [{0, 1, 2, 4, 5}, {1, 2, 4}], "the scenario no longer leaves the two-pass holes"
    assert hit.num_tokens == 12
    assert oracle_hit(kv.config, None, False, query, mirror) == 12
    # the hit's blocks are the window before 12 (null below it)
    assert [len(ids) for ids in hit.block_ids] == [3, 3]
    assert hit.block_ids[0][0] == 0 and hit.block_ids[1][:2] == (0, 0)


ALL_BLOCKS = [(g, j) for g in (0, 1) for j in range(6)]


@pytest.mark.parametrize("order", [(8, 4), (4, 8)], ids=["w8-first", "w4-first"])
def test_fixed_point_external_matches_brute_force_for_every_hole_pattern(order) -> None:
    """Every pattern of up to 3 missing blocks among the first 6 of both groups, through the
    external lookup (whose tier contents the test controls): the hit equals the oracle's.
    Some patterns need three passes whatever order the groups are visited in."""
    kv = KVCacheManager(config(*(SWA(4, w) for w in order), num_blocks=40), CacheOptions(hash_seed="x"))
    req = Request("q", list(range(200, 225)))
    local = kv.lookup(req)
    assert local.num_tokens == 0
    for n in range(4):
        for missing in itertools.combinations(ALL_BLOCKS, n):
            present = {(g, req.block_hashes[j]) for g, j in ALL_BLOCKS if (g, j) not in missing}
            ext = kv.lookup_external(req, local, lambda g, h: (g, h) in present)
            want = oracle_hit(kv.config, None, False, req, present)
            assert (ext.num_tokens if ext else 0) == want, f"missing {missing}"
            if want and ext is not None:
                assert sorted({j for g, j, _ in ext.loads if g == 0}) == \
                    list(range(max(0, (want - order[0] + 1) // 4), want // 4))


def test_fixed_point_pattern_that_needs_three_passes_in_either_order() -> None:
    """Missing: W=4 blocks 2 and 5, W=8 block 3. By hand the answer is 8 tokens: e=6 (W=4
    lacks 5), e=5 and e=4 (W=8 lacks 3), e=3 (W=4 lacks 2), e=2 works. A single pass gives 12
    visiting W=4 first and 20 visiting W=8 first."""
    for order in ((4, 8), (8, 4)):
        kv = KVCacheManager(config(*(SWA(4, w) for w in order), num_blocks=40))
        req = Request("q", list(range(300, 325)))
        local = kv.lookup(req)
        w4, w8 = order.index(4), order.index(8)
        missing = {(w4, 2), (w4, 5), (w8, 3)}
        present = {(g, req.block_hashes[j]) for g, j in ALL_BLOCKS if (g, j) not in missing}
        ext = kv.lookup_external(req, local, lambda g, h: (g, h) in present)
        assert ext is not None and ext.num_tokens == 8, order
