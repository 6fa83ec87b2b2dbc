"""Tests that kill the mutants mutmut found surviving in ``src/hybridkv/core/manager.py`` after
``test_mutants_manager.py`` (TESTING.md, "Mutation testing"; docs/mutation-survivors.md).

Two kinds of test live here:

* the integrity checker's verdict: :meth:`KVCacheManager.check_integrity` is public API and
  must reject a corrupted manager. The public API cannot corrupt one, so these tests break one
  thing at a time by hand (a table entry, a ref count's reference) in a manager that passed
  the check just before, and assert the check raises ``AssertionError`` naming what broke;
* the rest of the manager (``__init__``, ``allocate``, ``lookup``, ``free``, stats), public
  API only.

Each test names the mutants it guards (``function N``); expected values are derived by hand in
the docstrings from the documented contracts.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from hybridkv import (BlockRemoved, BlockStored, CacheHit, ExternalHit, KVCacheConfig,
                      KVCacheGroup, KVCacheManager, Request, SpecDecode, StateSpec)
from tests.support.helpers import FA, config, manager, prompt, run_prompt, serve


# ---- check_integrity: one corruption at a time -------------------------------------------------

def _held_prompt() -> tuple[KVCacheManager, Request]:
    """Two full-attention groups (bs 4), vLLM-compat caching (every full block is cached):
    request "a" holds 12 computed tokens, three cached blocks per group, and has three block
    hashes; request "b" ran a different prompt and was freed, so its blocks are cached and
    free. The manager passes the check."""
    kv = manager(FA(4), FA(4), num_blocks=32)
    b, _ = run_prompt(kv, "b", prompt(1000, 12))
    kv.free(b)
    a, _ = run_prompt(kv, "a", prompt(0, 12))
    assert len(a.block_hashes) == 3
    assert [len(t) for t in kv.block_ids(a)] == [3, 3]
    kv.check_integrity()
    return kv, a


def _tables(kv: KVCacheManager, req: Request) -> list[list[int]]:
    """The request's live block tables (white box: the corruption tests edit them)."""
    return kv.coordinator.reqs[req.request_id].tables


def test_integrity_rejects_a_block_at_another_requests_position() -> None:
    """check_integrity 6, 7, 24, 37, 40, 41, 42 — the hash-position check skipped (the request
    or the block's hash read as None, ``or`` → ``and``) or its message lost.

    Swapping group 0's first two entries keeps every ref count and the pool intact, but the
    block at position 0 is cached under the request's hash for position 1: the check must name
    position 0 and that block."""
    kv, a = _held_prompt()
    t = _tables(kv, a)[0]
    first = t[0]
    t[0], t[1] = t[1], t[0]
    with pytest.raises(AssertionError, match=rf"^request 'a' group 0 position 0: block {t[0]} is "
                       r"cached under a hash that is not the request's hash for that position$"):
        kv.check_integrity()
    assert first == t[1]


def test_integrity_rejects_a_cached_block_past_the_requests_hashes() -> None:
    """check_integrity 38 — ``k > len(hashes)`` for ``>=``: a cached block at the position just
    past the request's last hash read the hash list out of range (an IndexError, not the
    checker's verdict).

    Appending a cached free block (request "b"'s first) at position 3 of "a"'s 3-hash table."""
    kv, a = _held_prompt()
    pool = kv.pool
    other = next(x for x in range(1, len(pool.ref_cnt)) if pool.block_hash[x] is not None
                 and pool.ref_cnt[x] == 0 and pool.block_group[x] == 0)
    _tables(kv, a)[0].append(other)
    with pytest.raises(AssertionError, match=rf"^request 'a' group 0 position 3: block {other} is "
                       r"cached under a hash that is not the request's hash for that position$"):
        kv.check_integrity()


def test_integrity_rejects_a_block_cached_for_another_group() -> None:
    """check_integrity 30 (and 6, 7, 24) — the group check's message lost.

    Swapping the first entries of groups 0 and 1: each table now holds a block cached for the
    other group; the check names group 0's entry first."""
    kv, a = _held_prompt()
    t0, t1 = _tables(kv, a)
    b0, b1 = t0[0], t1[0]
    t0[0], t1[0] = b1, b0
    with pytest.raises(AssertionError, match=rf"^request 'a' group 0 holds block {b1} cached for "
                       r"group 1$"):
        kv.check_integrity()


def test_integrity_rejects_a_block_id_the_pool_never_handed_out() -> None:
    """check_integrity 17–20 — ``b <= len(refs)`` (the first id past the pool's ids then
    indexes the ref list out of range: an IndexError, not the verdict); the message lost.

    The first id past the pool's per-block lists is put into "a"'s group 1 table."""
    kv, a = _held_prompt()
    bad = len(kv.pool.ref_cnt)
    _tables(kv, a)[1][2] = bad
    with pytest.raises(AssertionError, match=rf"^request 'a' group 1 holds block {bad}, which the "
                       r"pool never handed out$"):
        kv.check_integrity()


def test_integrity_rejects_a_ref_count_without_its_table_reference() -> None:
    """check_integrity 47, 48, 50 — the ref-count comparison skipped, started at block 2, or
    its message lost.

    A fresh pool hands out block 1 first, so request "a" holds it (ref_cnt 1). Replacing that
    table entry with the null block leaves ref_cnt 1 with 0 table references: the check must
    name block 1 and both counts."""
    kv = manager(FA(4), FA(4), num_blocks=32)
    a, _ = run_prompt(kv, "a", prompt(0, 12))
    kv.check_integrity()
    tables = _tables(kv, a)
    (g, j), = [(g, j) for g, t in enumerate(tables) for j, b in enumerate(t) if b == 1]
    assert kv.pool.ref_cnt[1] == 1
    tables[g][j] = 0
    with pytest.raises(AssertionError, match=r"^block 1: ref_cnt 1 but 0 table references$"):
        kv.check_integrity()


# ---- __init__: bad arguments -------------------------------------------------------------------

BAD_MANAGERS = [  # (keyword arguments, key parts of the message)
    (dict(max_in_flight_tokens=0), r"\bmax_in_flight_tokens\b must be None or a positive integer, got 0$"),
    (dict(max_in_flight_tokens=True), r"\bmax_in_flight_tokens\b.*got True$"),
    (dict(max_in_flight_tokens=2.0), r"\bmax_in_flight_tokens\b.*got 2\.0$"),
    (dict(max_model_len=0), r"\bmax_model_len\b must be a positive integer, got 0$"),
    (dict(max_model_len=True), r"\bmax_model_len\b must be a positive integer, got True$"),
    (dict(max_model_len=8.0), r"\bmax_model_len\b must be a positive integer, got 8\.0$"),
    (dict(spec_decode="eagle"), r"\bspec_decode\b must be a SpecDecode or None, got 'eagle'$"),
    (dict(vllm_compat=True, eviction_policy="lfu"),
     r"\bvllm_compat\b pins vLLM's LRU order; \beviction_policy\b must be 'lru', got 'lfu'$"),
    (dict(eviction_policy="priority", clock=5),
     r"\bclock\b must be None or a callable returning seconds, got 5$"),
]


@pytest.mark.parametrize("kw,match", BAD_MANAGERS)
def test_bad_manager_arguments_are_refused_naming_the_value(kw, match) -> None:
    """__init__ 12–15, 26–30, 33, 35–37, 40, 82–91: each argument check (a bad value let
    through by an ``and``/``or`` swap, bool accepted) and its message (the argument, the bad
    value, what is valid)."""
    with pytest.raises(ValueError, match=match):
        KVCacheManager(config(FA(4), num_blocks=16), **kw)


def test_manager_needs_a_config() -> None:
    """__init__ 9–11 — the config type check and its message (the type given)."""
    with pytest.raises(ValueError, match=r"^config must be a KVCacheConfig, got dict$"):
        KVCacheManager({"num_blocks": 4})


def test_smallest_valid_manager_arguments_are_accepted() -> None:
    """__init__ 31, 32, 38, 39 — max_in_flight_tokens 1 and max_model_len 1 are positive
    integers (1 was refused, 0 accepted), and a manager with them serves a one-token request."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), max_in_flight_tokens=1, max_model_len=1)
    assert kv.max_model_len == 1
    r = Request("r", [7])
    assert kv.allocate(r, 1) is not None
    kv.check_integrity()


def test_state_groups_refuse_other_eviction_policies_naming_the_valid_one() -> None:
    """__init__ 109–112 — the message's valid value ('lru') and the StateSpec name."""
    cfg = KVCacheConfig((KVCacheGroup("a", FA(4), ("a",)),
                         KVCacheGroup("s", StateSpec(4, conv_shape=(1, 8), state_shape=(1, 8)), ("s",))),
                        num_blocks=16)
    with pytest.raises(ValueError, match=r"^eviction_policy 'lfu' does not support state groups "
                       r"\(recurrent layers\) yet; valid with a \bStateSpec\b group: 'lru'$"):
        KVCacheManager(cfg, eviction_policy="lfu")


def test_default_manager_records_no_events_and_keeps_its_spec_decode() -> None:
    """__init__ 5 (events on by default), 106 (the eviction callback installed without
    events), 42 (``spec_decode`` not kept: the scheduler and the engine read it).

    A 3-block pool (2 usable, bs 4) serves two different 8-token prompts: the second evicts
    the first's cached blocks. take_events stays empty without ``enable_events``; with it, the
    evictions are reported."""
    for events in (False, True):
        kv = KVCacheManager(config(FA(4), num_blocks=3), vllm_compat=True,
                            **({"enable_events": True} if events else {}))
        serve(kv, "a", prompt(0, 8))
        serve(kv, "b", prompt(100, 8))
        got = kv.take_events()
        assert kv.stats().evictions == 2
        assert (sum(isinstance(e, BlockRemoved) for e in got) == 2) if events else got == []
    sd = SpecDecode("eagle", 2)
    assert KVCacheManager(config(FA(4), num_blocks=16), spec_decode=sd).spec_decode is sd


# ---- the fast path's empty result ---------------------------------------------------------------

@pytest.mark.parametrize("num_groups", [1, 2, 3, 4, 5])
def test_a_step_without_new_blocks_returns_one_empty_list_per_group(num_groups) -> None:
    """_no_new_blocks 3, 5, 7, 9, 10, 12, 13 — the fast path's result for 1..5 groups: None
    ("does not fit") or a crash instead of ``num_groups`` empty lists, each a fresh list.

    Full groups (bs 4): after a 5-token prompt the second block has room for 3 more tokens,
    so the next decode step needs no block."""
    kv = KVCacheManager(config(*[FA(4)] * num_groups, num_blocks=32))
    r = Request("r", prompt(0, 5))
    assert kv.allocate(r, 5) is not None
    r.num_computed_tokens = 5
    r.append_tokens([9])
    first = kv.allocate(r, 1)
    assert first == [[] for _ in range(num_groups)]
    first[0].append(1)
    r.num_computed_tokens = 6
    r.append_tokens([9])
    assert kv.allocate(r, 1) == [[] for _ in range(num_groups)]


# ---- allocate / lookup: bad calls ---------------------------------------------------------------

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
    """allocate 2–4, 12, 24, 33–38, 93–98 — the Request type check; num_new_tokens and
    num_lookahead_tokens that are bool, float or negative (the fast path must not answer for
    them either: a running request's quiet step); the messages. lookup 1–3; _sync_hashes 4–7
    (the advice)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), vllm_compat=True)
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
    """allocate 41–66 — a hit for a running request (its message's advice), a hit that is not
    a CacheHit of this manager (wrong type, wrong number of groups), looked up for another
    request, longer than the request, or whose blocks do not cover its tokens; each message
    names the values.

    "a" caches 12 tokens (3 blocks of bs 4). A 13-token request with that prefix hits 12."""
    kv = KVCacheManager(config(FA(4), num_blocks=32), vllm_compat=True)
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


def _tier_and_consumer(**consumer_kw) -> tuple[KVCacheManager, Request, CacheHit,
                                                ExternalHit | None]:
    """A producer (full attention, bs 4, hash seed "s") serves "a" (17 tokens) while a tier
    records every (group, hash) it caches; a consumer with the same config and seed (plus
    ``consumer_kw``) looks up "b" (a's 17 tokens), then looks it up in the tier. Returns
    ``(consumer, b, hit, ext)``."""
    producer = KVCacheManager(config(FA(4), num_blocks=32), hash_seed="s")
    tier = set()
    producer.add_cached_listener(lambda g, hashes, blocks: tier.update((g, h) for h in hashes))
    serve(producer, "a", prompt(0, 17))
    kv = KVCacheManager(config(FA(4), num_blocks=32), hash_seed="s", **consumer_kw)
    b = Request("b", prompt(0, 17))
    hit = kv.lookup(b)
    ext = kv.lookup_external(b, hit, lambda g, h: (g, h) in tier)
    return kv, b, hit, ext


def test_external_must_come_with_its_own_hit() -> None:
    """allocate 67–74 — the ``external`` checks: not an ExternalHit, no hit, a hit of another
    length, a running request; the message names the request and the value. A matching
    external reserves every block up to its end (allocate 113: the external not passed on)."""
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


def test_lookahead_given_per_step_is_allocated() -> None:
    """allocate 15 — an explicit num_lookahead_tokens answered by the fast path with the
    manager's default (0 here): the step's lookahead slots not allocated.

    A running request with 6 computed tokens (2 blocks of 4): one new token and 4 lookahead
    slots reach token 11, a third block (without them the step is quiet)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), vllm_compat=True)
    r = _running(kv)
    new = kv.allocate(r, 1, num_lookahead_tokens=4)
    assert [len(x) for x in new] == [1] and len(kv.block_ids(r)[0]) == 3


def test_full_sequence_reservation_is_checked_on_a_quiet_step() -> None:
    """allocate 5–8, 11 — the fast path taken with ``full_sequence_must_fit`` (it answers
    without the reservation).

    Pool of 4 usable blocks (bs 4, compat: full blocks cached as they fill); "x" holds 2.
    "r" has a 16-token prompt (4 blocks): chunks of 1 token, then 1 (the slow path), then
    one more token stays inside its first block without filling it (a quiet step), but the
    whole sequence needs 3 more blocks and only 1 is free: refused (None), while the same
    step without the reservation succeeds with no new block."""
    kv = KVCacheManager(config(FA(4), num_blocks=5), vllm_compat=True)
    assert kv.allocate(Request("x", prompt(500, 8)), 8) is not None
    r = Request("r", prompt(0, 16))
    assert kv.allocate(r, 1) is not None
    r.num_computed_tokens = 1
    assert kv.allocate(r, 1) == [[]]
    r.num_computed_tokens = 2
    assert kv.num_free_blocks == 1
    assert kv.allocate(r, 1, full_sequence_must_fit=True) is None
    assert kv.allocate(r, 1) == [[]]


def test_lookup_of_a_request_longer_than_max_model_len_is_capped() -> None:
    """lookup 29, 30 — the hit is capped at ``max_model_len - 1`` (rounded down to whole
    blocks), not at max_model_len + 1 or max_model_len - 2.

    max_model_len 9: "a" (9 tokens) caches 2 blocks (8 tokens); a 12-token request with that
    prefix may hit at most 8 tokens: 8. max_model_len 8: at most 7 tokens: 4."""
    for mml, expected in ((9, 8), (8, 4)):
        kv = KVCacheManager(config(FA(4), num_blocks=32), vllm_compat=True, max_model_len=mml)
        serve(kv, "a", prompt(0, mml))
        assert kv.lookup(Request("b", prompt(0, 12))).num_tokens == expected


def test_a_lookup_without_caching_is_an_empty_hit_for_this_request() -> None:
    """lookup 5–19 — caching off or a request that skips the cache: a hit of 0 tokens, one
    empty tuple per group, no junction (0), named after the request (so another request
    cannot adopt it), even when the prefix is cached."""
    for caching, skip in ((False, False), (True, True)):
        kv = KVCacheManager(config(FA(4), FA(4), num_blocks=32), enable_caching=caching)
        serve(kv, "a", prompt(0, 12))
        r = Request("b", prompt(0, 12), skip_prefix_cache=skip)
        hit = kv.lookup(r)
        assert isinstance(hit, CacheHit)
        assert (hit.num_tokens, hit.block_ids, hit.shared_prefix_boundary, hit.request_id) == \
            (0, ((), ()), 0, "b")
        with pytest.raises(ValueError, match="looked up for request 'b', not 'c'"):
            kv.allocate(Request("c", prompt(0, 12)), 12, hit)
        assert kv.allocate(r, 12, hit) is not None
        kv.check_integrity()


def test_stats_count_every_admitted_request_once() -> None:
    """_record 1, 2, 4–17; allocate 121–132 — hits and queries add up over requests (the
    last one does not overwrite them), a request allocated without a hit adds no hit, a
    request that skips the cache or a manager without caching counts nothing, a failed
    allocation counts nothing, and preempted requests add up apart.

    "a" (12 tokens) caches 3 blocks; "b" (13 tokens, hit 12); "c" (5 other tokens, allocated
    without a lookup: hit None); "d" skips the cache; "e" (40 tokens) does not fit; "p1", "p2"
    are preempted requests with hits 12 and 8."""
    kv = KVCacheManager(config(FA(4), num_blocks=12), vllm_compat=True)
    serve(kv, "a", prompt(0, 12))
    serve(kv, "b", prompt(0, 13))
    c = Request("c", prompt(300, 5))
    assert kv.allocate(c, 5) is not None
    kv.free(c)
    serve(kv, "d", prompt(0, 13), skip_prefix_cache=True)
    e = Request("e", prompt(600, 48))
    assert kv.allocate(e, 48, kv.lookup(e)) is None
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (3, 12 + 13 + 5, 12)
    for rid, n in (("p1", 13), ("p2", 9)):
        p = Request(rid, prompt(0, n))
        p.num_preemptions = 1
        hit = kv.lookup(p)
        assert kv.allocate(p, n - hit.num_tokens, hit) is not None
        kv.free(p)
    s = kv.stats()
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (2, 22, 20)
    assert (s.requests, s.queries, s.hits) == (3, 30, 12)
    off = KVCacheManager(config(FA(4), num_blocks=12), enable_caching=False)
    serve(off, "a", prompt(0, 12))
    assert (off.stats().requests, off.stats().queries) == (0, 0)


def test_free_of_an_unknown_request_is_a_no_op_and_free_lets_the_request_go() -> None:
    """free 5 (an unknown id raised KeyError), 3 (the manager kept every freed Request alive:
    memory grew with every request served)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    kv.free(Request("never", prompt(0, 3)))
    r = serve(kv, "a", prompt(0, 9))
    kv.free(r)
    ref = weakref.ref(r)
    del r
    gc.collect()
    assert ref() is None
    kv.check_integrity()


# ---- __init__: what the manager passes on -------------------------------------------------------

def test_lookahead_slots_stop_at_max_model_len() -> None:
    """__init__ 147 — max_model_len not passed to the coordinator: slots past it allocated.

    FA (bs 4), EAGLE k = 3, max_model_len 8: a 7-token prompt plus 3 lookahead slots would
    reach 10 tokens (3 blocks); capped at 8 it takes 2."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), spec_decode=SpecDecode("eagle", 3),
                        max_model_len=8)
    assert [len(x) for x in kv.allocate(Request("r", prompt(0, 7)), 7)] == [2]


def test_full_sequence_reservation_counts_the_lookahead_slots() -> None:
    """allocate 107 — default mode reserves ``num_tokens + lookahead`` (not minus).

    FA (bs 4), EAGLE k = 3, 2 usable blocks. A new 8-token request computing 4 tokens takes
    ceil((4 + 3) / 4) = 2 blocks now; its whole sequence, 8 + 3 = 11 tokens, needs 3 blocks,
    more than the pool: refused with the reservation (8 - 3 = 5 tokens would need only the 2
    it takes), allowed without it."""
    kv = KVCacheManager(config(FA(4), num_blocks=3), spec_decode=SpecDecode("eagle", 3))
    r = Request("r", prompt(0, 8))
    assert kv.allocate(r, 4, full_sequence_must_fit=True) is None
    assert [len(x) for x in kv.allocate(r, 4)] == [2]


def _state_config(num_blocks: int):
    """Full attention (bs 4) and two state groups with the same spec (one lookup unit:
    siblings), each state taking one block id (48 B of state, 128 B pages)."""
    st = StateSpec(4, conv_shape=(1, 8), state_shape=(1, 8))
    return KVCacheConfig((KVCacheGroup("a", FA(4), ("a",)), KVCacheGroup("s1", st, ("s1",)),
                          KVCacheGroup("s2", st, ("s2",))), num_blocks=num_blocks)


def test_evictions_of_a_state_config_are_reported() -> None:
    """__init__ 118, 121 — the extent pool built without the eviction callback: no
    BlockRemoved event for any eviction of a config with a state group.

    9 usable blocks; two different 9-token prompts: the second evicts cached blocks of the
    first, and every eviction is reported."""
    kv = KVCacheManager(_state_config(10), enable_events=True)
    serve(kv, "a", prompt(0, 9))
    serve(kv, "b", prompt(100, 9))
    removed = [e for e in kv.take_events() if isinstance(e, BlockRemoved)]
    assert kv.stats().evictions > 0
    assert sum(len(e.block_hashes) for e in removed) == kv.stats().evictions


def test_sibling_state_checkpoints_are_evicted_together() -> None:
    """__init__ 174 — the siblings of a two-group unit not wired (``> 2``): evicting one state
    group's checkpoint left its sibling's copy cached (dead: the unit's hit needs both).

    9 usable blocks; an 8-token prompt caches checkpoints in both state groups; a 5-token
    prompt then evicts some: each state checkpoint hash removed from one group is removed
    from the other in the same step."""
    kv = KVCacheManager(_state_config(10), enable_events=True)
    serve(kv, "a", prompt(0, 8))
    kv.take_events()
    serve(kv, "b", prompt(100, 5))
    removed = {1: set(), 2: set()}
    for e in kv.take_events():
        if isinstance(e, BlockRemoved) and e.group_idx in removed:
            removed[e.group_idx].update(e.block_hashes)
    assert removed[1] and removed[1] == removed[2]


def test_blocks_loaded_from_an_external_tier_are_reported_stored() -> None:
    """__init__ 176 — the adopted-blocks callback not installed with events: blocks loaded by
    commit_external produced no BlockStored event.

    A producer caches a 16-token prefix (4 blocks); a consumer with events loads all 4 from
    the tier: its BlockStored events name exactly the loaded hashes."""
    kv, b, hit, ext = _tier_and_consumer(enable_events=True)
    assert kv.allocate(b, 0, hit, external=ext) is not None
    assert kv.take_events() == []
    assert kv.commit_external(b, ext, ok=True) == 16
    stored = [h for e in kv.take_events() if isinstance(e, BlockStored) for h in e.block_hashes]
    assert sorted(stored) == sorted(h for g, j, h in ext.loads) and len(stored) == 4
