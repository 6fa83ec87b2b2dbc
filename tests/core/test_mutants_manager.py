"""Tests that kill the mutants mutmut found surviving in ``src/hybridkv/core/manager.py``
(TESTING.md, "Mutation testing"; the survivors left: docs/mutation-survivors.md).

Each test names the mutant(s) it guards (``function N — the change``). Public API only
(``KVCacheManager``, ``Request``, specs/config, ``SpecDecode``, ``LoRA``, ``MultiModalItem``,
``RetentionConfig``, ``lookup`` / ``allocate`` / ``free`` / ``stats`` / ``take_events`` /
``add_cached_listener`` / ``lookup_external`` / ``commit_external`` / ``reset_prefix_cache``);
expected values are derived by hand in the docstrings.
"""

from __future__ import annotations

import pytest

from hybridkv import (BlockRemoved, BlockStored, KVCacheManager, LoRA, MultiModalItem,
                      Request, RetentionConfig, SpecDecode, TokenRange)
from tests.support.helpers import FA, SWA, config, prompt, serve


# ---- blocks_for_request / _check_fits -------------------------------------------------------

def test_blocks_for_request_adds_the_alignment_unit_only_in_default_mode() -> None:
    """blocks_for_request 2–8, 10, 12, 14 — the hold (one alignment unit for local groups in
    default mode with retention on) dropped, forced, or the condition changed; ``/`` for ``*``.

    Full (bs 4) + sliding (bs 4, W 8), alignment 4, length 40. Full: ceil(40/4) = 10.
    Sliding: min(10, ceil((8 + hold)/4) + 2): hold 4 → 5, hold 0 → 4. So default mode
    (retention 0) needs 15, compat or retention None 14; the result is an int."""
    cfg = config(FA(4), SWA(4, 8), num_blocks=64)
    n = KVCacheManager.blocks_for_request(cfg, 40)
    assert n == 15 and type(n) is int
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=0) == 15
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=4) == 15
    assert KVCacheManager.blocks_for_request(cfg, 40, vllm_compat=True) == 14
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=None) == 14
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=0, vllm_compat=True) == 14


def test_max_model_len_must_fit_the_pool_exactly() -> None:
    """_check_fits 4, 5, 8–12, 16, 17 — the manager's retention / compat not passed on, the
    ``need > usable`` boundary moved, the advice changed.

    Same groups, max_model_len 40: default mode needs 15 blocks (16 with the null block),
    compat or retention None need 14 (15 with the null block)."""
    KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=16), max_model_len=40)
    with pytest.raises(ValueError, match=r"the pool has 14 usable blocks but one request of "
                       r"max_model_len=40 tokens needs 15 across the groups; give more blocks "
                       r"or a smaller max_model_len$"):
        KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=15), max_model_len=40)
    KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=15), max_model_len=40, vllm_compat=True)
    KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=15), max_model_len=40,
                   retention_interval=None)
    with pytest.raises(ValueError, match="needs 14 across"):
        KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=14), max_model_len=40,
                       vllm_compat=True)


# ---- _check_lookahead -----------------------------------------------------------------------

def test_lookahead_limit_rounds_each_groups_blocks_up() -> None:
    """_check_lookahead 3 — ``/`` for ``//`` in a group's first-step blocks (no rounding up).

    Two full groups (bs 4), 3 usable blocks: a first step of 1 + la tokens takes
    2 * ceil((1 + la)/4) blocks <= 3, so la <= 3. k = 3 fits; k = 4 is refused (without the
    rounding 2 * 5/4 = 2.5 <= 3 would pass), naming 1..3."""
    KVCacheManager(config(FA(4), FA(4), num_blocks=4), spec_decode=SpecDecode("eagle", 3))
    with pytest.raises(ValueError, match=r"needs 4 lookahead slots per request, more than the "
                       r"pool's 3 usable blocks allow \(3\); valid num_speculative_tokens: 1\.\.3"):
        KVCacheManager(config(FA(4), FA(4), num_blocks=4), spec_decode=SpecDecode("eagle", 4))


def test_no_lookahead_fits_a_pool_of_one_token_steps() -> None:
    """_check_lookahead 12 — the search starts at limit 1 instead of 0.

    Two full groups of bs 1, 3 usable blocks: a first step takes 2 * (1 + la) <= 3 blocks,
    so la = 0 is the limit and even k = 1 must be refused."""
    with pytest.raises(ValueError, match="allow 0: no speculative decoding fits"):
        KVCacheManager(config(FA(1), FA(1), num_blocks=4), spec_decode=SpecDecode("eagle", 1))


def test_lookahead_limit_of_a_two_block_pool() -> None:
    """_check_lookahead 24, 28 — the fit test made strict; the search's upper end lowered by
    two after a miss (skipping the answer).

    One full group (bs 4), 2 usable blocks: ceil((1 + la)/4) <= 2 gives la <= 7, so k = 7
    fits (a strict test would stop at 3). Two full groups (bs 4), 2 usable blocks:
    2 * ceil((1 + la)/4) <= 2 gives la <= 3, so k = 3 fits (the search misses at 6, then must
    still try 3)."""
    KVCacheManager(config(FA(4), num_blocks=3), spec_decode=SpecDecode("eagle", 7))
    KVCacheManager(config(FA(4), FA(4), num_blocks=3), spec_decode=SpecDecode("eagle", 3))


def test_lookahead_limit_below_max_model_len() -> None:
    """_check_lookahead 32–37 — the ``max_model_len - 1`` cap: its condition moved by one
    either way, its value changed or removed; the reason named in the message.

    One full group (bs 4), 2 usable blocks: the pool allows la <= 7. max_model_len 7 caps it
    at 6 (k = 6 fits, k = 7 is refused naming max_model_len=7); max_model_len 8 does not cap
    it (7 = 7: k = 7 fits, k = 8 is refused naming the pool)."""
    cfg = config(FA(4), num_blocks=3)
    KVCacheManager(cfg, max_model_len=7, spec_decode=SpecDecode("eagle", 6))
    with pytest.raises(ValueError, match=r"needs 7 lookahead slots per request, more than "
                       r"max_model_len=7 allow \(6\); valid num_speculative_tokens: 1\.\.6$"):
        KVCacheManager(cfg, max_model_len=7, spec_decode=SpecDecode("eagle", 7))
    KVCacheManager(cfg, max_model_len=8, spec_decode=SpecDecode("eagle", 7))
    with pytest.raises(ValueError, match=r"more than the pool's 2 usable blocks allow \(7\); "
                       r"valid num_speculative_tokens: 1\.\.7$"):
        KVCacheManager(cfg, max_model_len=8, spec_decode=SpecDecode("eagle", 8))


def test_lookahead_messages_at_the_edge() -> None:
    """_check_lookahead 46–49 — the "valid 1..limit" message kept down to limit 1; the advice
    of the "nothing fits" message.

    max_model_len 2 caps the lookahead at 1: k = 2 is refused with "valid 1..1";
    max_model_len 1 caps it at 0: nothing fits."""
    cfg = config(FA(4), num_blocks=8)
    with pytest.raises(ValueError, match=r"allow \(1\); valid num_speculative_tokens: 1\.\.1$"):
        KVCacheManager(cfg, max_model_len=2, spec_decode=SpecDecode("eagle", 2))
    with pytest.raises(ValueError, match=r"max_model_len=1 allow 0: no speculative decoding fits; "
                       r"give more blocks or a larger max_model_len$"):
        KVCacheManager(cfg, max_model_len=1, spec_decode=SpecDecode("eagle", 1))


def test_dflash_lookahead_message_counts_its_extra_slot() -> None:
    """_check_lookahead 44, 45 — DFlash's extra slot added instead of subtracted in the
    valid range, or in the test that picks the message.

    DFlash takes k + 1 slots. max_model_len 3 caps the lookahead at 2: k = 2 (3 slots) is
    refused with "valid 1..1" (2 - 1); max_model_len 2 caps it at 1: 1 - 1 = 0, nothing fits."""
    cfg = config(FA(4), num_blocks=8)
    with pytest.raises(ValueError, match=r"needs 3 lookahead slots .*allow \(2\); valid "
                       r"num_speculative_tokens: 1\.\.1$"):
        KVCacheManager(cfg, max_model_len=3, spec_decode=SpecDecode("dflash", 2, drafter_window=8))
    with pytest.raises(ValueError, match=r"allow 1: no speculative decoding fits"):
        KVCacheManager(cfg, max_model_len=2, spec_decode=SpecDecode("dflash", 1, drafter_window=8))


# ---- lookup_external / commit_external ------------------------------------------------------

def _everything(group: int, h: bytes) -> bool:
    return True


def test_lookup_external_is_none_when_the_request_skips_the_cache() -> None:
    """lookup_external 2, 4 — the non-CacheHit message; ``or`` → ``and`` (a request that
    skips the prefix cache, or a manager without caching, still gets an external hit).

    A tier that holds every block would give a 12-token hit to a 16-token request; with
    skip_prefix_cache or enable_caching=False the answer is None."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    r = Request("r", prompt(0, 16))
    ext = kv.lookup_external(r, kv.lookup(r), _everything)
    assert ext is not None and ext.num_tokens == 12
    s = Request("s", prompt(0, 16), skip_prefix_cache=True)
    assert kv.lookup_external(s, kv.lookup(s), _everything) is None
    off = KVCacheManager(config(FA(4), num_blocks=16), enable_caching=False)
    t = Request("t", prompt(0, 16))
    assert off.lookup_external(t, off.lookup(t), _everything) is None
    with pytest.raises(ValueError, match=r"lookup_external needs the request's CacheHit, got 3"):
        kv.lookup_external(r, 3, _everything)


@pytest.mark.parametrize("max_model_len, expected", [(8, 4), (9, 8)])
def test_lookup_external_is_capped_below_max_model_len(max_model_len, expected) -> None:
    """lookup_external 10–16 — the ``max_model_len - 1`` cap removed, broken or moved by one.

    bs 4, a 16-token request, a tier holding every block: the hit is the largest multiple of
    4 <= min(15, max_model_len - 1): 7 → 4 (a cap of 9 would give 8), 8 → 8 (a cap of 7 would
    give 4)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), max_model_len=max_model_len)
    r = Request("r", prompt(0, 16))
    hit = kv.lookup(r)
    assert hit.num_tokens == 0
    ext = kv.lookup_external(r, hit, _everything)
    assert ext is not None and ext.num_tokens == expected


def test_commit_external_errors_name_the_request_and_the_counts() -> None:
    """commit_external 3, 5 — the two error messages replaced by None.

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


# ---- _check_retention / block_ids -----------------------------------------------------------

def test_retention_errors_name_the_request_and_the_fix() -> None:
    """_check_retention 3, 4, 6, 8 — the messages (the policy advice, the type error, the
    request label of a range outside the prompt) changed or dropped."""
    pin = RetentionConfig((TokenRange(0, 8, 100, ttl_s=60.0),))
    lru = KVCacheManager(config(FA(4), num_blocks=16))
    with pytest.raises(ValueError, match=r"use eviction_policy='priority' \(the only policy that "
                       r"reads retention configs\) or drop the config$"):
        lru.allocate(Request("a", prompt(0, 9), retention=pin), 9)
    kv = KVCacheManager(config(FA(4), num_blocks=16), eviction_policy="priority")
    bad = Request("b", prompt(0, 9))
    bad.retention = "pin"
    with pytest.raises(ValueError, match=r"request 'b': retention must be a RetentionConfig or "
                       r"None, got 'pin'"):
        kv.allocate(bad, 9)
    late = Request("c", prompt(0, 9))    # the constructor checks too: attach it afterwards
    late.retention = RetentionConfig((TokenRange(0, 20, 100, ttl_s=60.0),))
    with pytest.raises(ValueError, match=r"^request 'c': retention range \[0, 20\) lies outside"):
        kv.allocate(late, 9)


def test_block_ids_of_an_unknown_request_names_it() -> None:
    """block_ids 7 — the KeyError's message replaced by None."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    with pytest.raises(KeyError, match="request 'ghost' holds no blocks"):
        kv.block_ids("ghost")


# ---- reset_prefix_cache / stats -------------------------------------------------------------

def test_a_hit_made_before_a_prefix_cache_reset_is_refused() -> None:
    """reset_prefix_cache 6, 7 — ``epoch += 1`` → ``epoch = 1`` / ``epoch -= 1``: the state
    version comes back to the epoch a hit was made at, so the stale hit is adopted unverified.

    bs 4. "a" (9 tokens) is allocated (epoch 0 → 1) and caches blocks 0–1; q looks up its
    8-token hit at epoch 1; a is freed (→ 2); the reset drops every hash (→ 3; the mutants
    give 1). Adopting q's hit must raise: its blocks no longer hold q's prefix."""
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


def test_stats_count_preempted_requests_apart() -> None:
    """stats 5, 6, 7 — the three preempted counters replaced by None.

    "a" caches 8 tokens (2 blocks of 4). A preempted 9-token request with the same prefix
    hits 8: preempted_requests 1, preempted_queries 9, preempted_hits 8; the normal counters
    hold only "a" (1 request, 9 queries, 0 hits)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    serve(kv, "a", prompt(0, 9))
    p = Request("p", prompt(0, 9))
    p.num_preemptions = 1
    hit = kv.lookup(p)
    assert hit.num_tokens == 8
    assert kv.allocate(p, 1, hit) is not None
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (1, 9, 0)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 9, 8)


# ---- events and cached listeners ------------------------------------------------------------

def _stored(kv: KVCacheManager) -> list[BlockStored]:
    return [ev for ev in kv.take_events() if isinstance(ev, BlockStored)]


def test_stored_events_of_a_chunked_prefill_with_an_image_and_a_lora() -> None:
    """_record_stored 12–14, 16, 17, 20, 22–24, 27–29, 46, 48–50, 52, 61, 73, 74, 77, 79, 81,
    82; _on_stored 12, 17 — the fields of ``BlockStored`` and the listener's arguments for a
    run that does not start at block 0.

    bs 4, a 16-token prompt computed in two chunks of 8: runs of blocks 0–1 then 2–3. An image
    at tokens [6, 10): block 1 ([4, 8)) sees it at offset 6 - 4 = 2, block 2 ([8, 12)) at
    6 - 8 = -2, blocks 0 and 3 not at all. With LoRA "ad" every block's keys start with "ad".
    The second run's parent is block 1's hash. The plain request has no extra keys and no
    lookahead (both None)."""
    P = prompt(0, 16)
    for lora in (None, LoRA("ad", "/p")):
        kv = KVCacheManager(config(FA(4), num_blocks=16), enable_events=True)
        seen = []
        kv.add_cached_listener(lambda g, hs, bs: seen.append((g, hs, bs)))
        r = serve(kv, "r", P, chunk=8, free=False, lora=lora,
                  mm_items=[MultiModalItem("img", 6, 4)])
        ids = kv.block_ids(r)[0]
        h = r.block_hashes
        first, second = _stored(kv)
        assert seen == [(0, [h[0], h[1]], ids[0:2]), (0, [h[2], h[3]], ids[2:4])]
        pre = ("ad",) if lora else ()
        assert first == BlockStored(block_hashes=[h[0], h[1]], parent_block_hash=None,
                                    token_ids=P[0:8], block_size=4,
                                    lora_name="ad" if lora else None, medium="GPU", group_idx=0,
                                    extra_keys=[pre or None, pre + (("img", 2),)],
                                    lookahead_token_ids=None)
        assert second == BlockStored(block_hashes=[h[2], h[3]], parent_block_hash=h[1],
                                     token_ids=P[8:16], block_size=4,
                                     lora_name="ad" if lora else None, medium="GPU", group_idx=0,
                                     extra_keys=[pre + (("img", -2),), pre or None],
                                     lookahead_token_ids=None)
    plain = KVCacheManager(config(FA(4), num_blocks=16), enable_events=True)
    serve(plain, "q", P)
    (ev,) = _stored(plain)
    assert ev.extra_keys is None and ev.lookahead_token_ids is None and ev.lora_name is None


def test_stored_events_with_hash_lookahead_cover_the_next_token() -> None:
    """_record_stored 21, 41 — the extra keys' range ends ``la`` tokens early; the lookahead
    list restarts at block 0 for a run that does not start there.

    EAGLE k=1 proves one token past each block (L = 1). bs 4, a 13-token prompt in chunks of
    8 and 5: a block is cached once its tokens are computed and its next token is known (the
    prompt's), so the first run is blocks 0–1 and the second block 2 (block 3 would need token
    16, past the prompt). Block j carries
    token 4(j + 1) as its lookahead; an image at [4, 6) is in block 0's keys at offset 4
    (block 0's range with L is [0, 5)) and in block 1's at offset 0."""
    P = prompt(0, 13)
    kv = KVCacheManager(config(FA(4), num_blocks=16), enable_events=True,
                        spec_decode=SpecDecode("eagle", 1))
    r = serve(kv, "r", P, chunk=8, free=False, mm_items=[MultiModalItem("img", 4, 2)])
    evs = _stored(kv)
    firsts = [ev.token_ids[0] // 4 for ev in evs]
    blocks = [f + i for ev, f in zip(evs, firsts) for i in range(len(ev.block_hashes))]
    assert firsts == [0, 2] and blocks == [0, 1, 2]
    look = [x for ev in evs for x in ev.lookahead_token_ids]
    assert look == [[4], [8], [12]]
    keys = [x for ev in evs for x in ev.extra_keys]
    assert keys == [(("img", 4),), (("img", 0),), None]
    assert [x for ev in evs for x in ev.block_hashes] == r.block_hashes[:3]


def test_removed_events_name_the_gpu_medium() -> None:
    """_on_evict 3, 8, 9 — ``BlockRemoved``'s medium changed from "GPU".

    3 usable blocks, bs 4: "a" caches 1 block (5 tokens), "z" (9 tokens) evicts it."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), enable_events=True)
    a = serve(kv, "a", prompt(100, 5))
    serve(kv, "z", prompt(300, 9))
    removed = [ev for ev in kv.take_events() if isinstance(ev, BlockRemoved)]
    assert removed == [BlockRemoved([a.block_hashes[0]], "GPU", 0)]
