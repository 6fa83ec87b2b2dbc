"""Tests that kill the mutants mutmut found surviving in ``src/hybridkv/core`` (TESTING.md,
"Mutation testing").

Each test names the mutant(s) it guards (``module: function — the change``). They use only
the public API (``KVCacheManager``, ``Request``, the specs/config, ``SpecDecode``, ``CacheHit``,
``lookup`` / ``allocate`` / ``free`` / ``block_ids`` / ``stats`` / ``take_events`` /
``check_integrity``, ``lookup_external`` / ``commit_external``), so refactors of the pool,
coordinator and manager cannot break them; expectations are derived by hand in the docstrings.
"""

from __future__ import annotations

import pytest

from hybridkv import BlockRemoved, BlockStored, KVCacheManager, Request
from tests.support.helpers import FA, SWA, config, prompt, serve


# ---- core/pool.py ---------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo", "cost"])
def test_evictions_are_counted_and_reported_with_every_policy(policy) -> None:
    """pool: PolicyBlockPool.__init__ — on_evict not passed to BlockPool (no BlockRemoved
    events); PolicyBlockPool.allocate — ``evicted``/``num_evictions`` miscounted.

    6 usable blocks, bs 4. Two 9-token prompts cache 2 blocks each (4 cached, all free). A
    unique 24-token request needs all 6 blocks: the 2 uncached ones go first, then the 4 cached
    ones are evicted, whatever the order: 1 eviction after its first 12 tokens, 4 in all, 4 BlockRemoved events naming exactly the 4 cached hashes."""
    kv = KVCacheManager(config(FA(4), num_blocks=7), enable_events=True, eviction_policy=policy)
    a = serve(kv, "a", prompt(100, 9))
    b = serve(kv, "b", prompt(200, 9))
    stored = {h for ev in kv.take_events() if isinstance(ev, BlockStored) for h in ev.block_hashes}
    assert stored == set(a.block_hashes[:2]) | set(b.block_hashes[:2])
    assert kv.stats().evictions == 0
    z = Request("z", prompt(500, 24))                 # in two chunks: 2 scratch + 1, then 3
    assert kv.allocate(z, 12, kv.lookup(z)) is not None
    assert kv.stats().evictions == 1
    z.num_computed_tokens = 12
    assert kv.allocate(z, 12) is not None
    kv.check_integrity()
    assert kv.stats().evictions == 4
    removed = [h for ev in kv.take_events() if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    assert sorted(removed) == sorted(stored)


def test_lfu_counts_a_hit_on_a_block_another_request_holds() -> None:
    """pool: PolicyBlockPool.touch — ``elif bh[b] is not None: pol.on_hit(b, False)`` (a hit on
    a cached block that is in use) dropped, inverted or given the wrong block.

    LFU, bs 4. Chain A (2 blocks) gets one hit, chain B gets two hits, the second while the
    first holder still runs (the held-block hit). B's holders free first, then A's, so B's
    blocks are older: with B's held hit counted, priorities are A = 2, B = 3 and A goes first;
    without it both are 2 and the older B goes first. A request that evicts exactly 2 cached
    blocks must leave B cached."""
    kv = KVCacheManager(config(FA(4), num_blocks=12), eviction_policy="lfu")
    A, B = prompt(100, 8), prompt(200, 8)
    serve(kv, "a", A + [1])
    serve(kv, "b", B + [1])
    y = serve(kv, "y", A + [2], free=False)
    x1 = serve(kv, "x1", B + [3], free=False)
    x2 = serve(kv, "x2", B + [4], free=False)
    assert [kv.lookup(Request(f"q{i}", p + [9])).num_tokens for i, p in enumerate((A, B))] == [8, 8]
    kv.free(x1)
    kv.free(x2)
    kv.free(y)
    kv.check_integrity()
    cached = 4
    n = kv.num_free_blocks - cached + 2          # every uncached free block, then 2 cached ones
    z = Request("z", prompt(900, 4 * n))
    assert kv.allocate(z, 4 * n, kv.lookup(z)) is not None
    kv.check_integrity()
    assert kv.stats().evictions == 2
    assert kv.lookup(Request("qa", A + [9])).num_tokens == 0
    assert kv.lookup(Request("qb", B + [9])).num_tokens == 8


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


# ---- core/coordinator.py --------------------------------------------------------------------

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


def test_allocating_a_hit_promises_its_junction_and_the_unit_below() -> None:
    """coordinator: _boundaries / commit — the junction (``shared_prefix_boundary``) dropped,
    or its end one alignment unit below (default mode, #57610) dropped or moved up.

    Full (bs 4) + sliding (bs 4, W 8), default mode, retention 0. "a" (33 tokens) caches its
    replay boundaries only (ends near 32) in the sliding group, so "b", which shares a's
    first 20 tokens, hits 0 with junction 20 (the full group serves 20). Allocating b's hit
    promises 20 and 16: then a 21-token prefix of a hits 20, and a 20-token one (cap 19)
    hits 16."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=64))
    P = prompt(100, 40)
    serve(kv, "a", P[:33])
    b = Request("b", P[:20] + prompt(1, 9))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 20)
    serve(kv, "b", b.token_ids)
    kv.check_integrity()
    assert kv.lookup(Request("c21", P[:21])).num_tokens == 20
    assert kv.lookup(Request("c20", P[:20])).num_tokens == 16


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


def test_a_window_releases_several_blocks_in_one_step() -> None:
    """coordinator: _released — ``j -= 1`` → ``j = 1``: releasing more than one block in one
    step (a long prefill chunk) walks the table back to front; the mutant loops for ever.

    Compat mode (no held unit), sliding W=4, bs 4, 19 usable blocks. Chunks of 4 and 16
    tokens hold blocks 0..4; at 20 computed tokens, tokens below 17 left the window: the next
    step releases blocks 0..3 at once (4 freed, 1 new: 14 + 4 - 1 = 17 free)."""
    kv = KVCacheManager(config(SWA(4, 4), num_blocks=20), vllm_compat=True,
                        retention_interval=None)
    r = Request("r", prompt(0, 24))
    for n in (4, 16, 4):
        assert kv.allocate(r, n) is not None
        r.num_computed_tokens += n
    table = kv.block_ids(r)[0]
    assert table[:4] == [0, 0, 0, 0] and 0 not in table[4:] and len(table) == 6
    assert kv.num_free_blocks == 17
    kv.check_integrity()


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
