"""The write path (``core/coordinator/write.py``): which blocks a request caches, and when.

* Promised ends: the replay boundaries, the junction of a hit and the unit below it, the
  final length at free, the retention interval's multiples (by hand, exactly the promised
  windows); default mode caches more than vLLM where a resend or the next turn can use it.
* Decode steps and prefill chunks cache a block as soon as it is complete (its proof block
  computed in EAGLE drop mode; its next token known with lookahead hashing).
* Compat mode: vLLM 0.33's per-block write mask (``reachable_block_mask``, written here from
  its definition) and its hybrid coordinator's cacheable prefix; identical sibling groups share
  a draft group's proof mask.
* Runs of blocks are inserted under their own hashes (bulk inserts, coarse groups, runs that
  start past a window) and reported as such in the KV events.
Expectations are derived by hand or from the independent oracle (:mod:`tests.support.oracle`).
"""

from __future__ import annotations

import pytest

from hybridkv import BlockRemoved, BlockStored, KVCacheManager, Request, SpecDecode, StateSpec
from tests.support.helpers import (EAGLE_DROP, FA, SWA, admit, cached_positions, config, manager,
                                   prompt, run_prompt, serve)
from tests.support.oracle import CacheMirror, oracle_hit
from hybridkv.core.cache_options import CacheOptions


def stored_positions(events, req: Request, group: int, bs: int, hbs: int) -> set[int]:
    """Positions j of ``req``'s blocks in ``group`` that a BlockStored event reported."""
    scale = bs // hbs
    pos = {req.block_hashes[(j + 1) * scale - 1]: j for j in range((len(req.block_hashes)) // scale)}
    out = set()
    for ev in events:
        if isinstance(ev, BlockStored) and ev.group_idx == group:
            out.update(pos[h] for h in ev.block_hashes if h in pos)
    return out


@pytest.mark.parametrize("compat", [True, False])
def test_decode_step_completing_a_block_caches_it(compat: bool) -> None:
    """A 5-token prompt and 3 decode steps: the third step computes token 8, which completes
    block 1 (tokens 4..7), so a resend of those 8 tokens hits 8 (vLLM caches up to
    ``min(computed + new, num_tokens)`` at every ``allocate_slots``)."""
    kv = KVCacheManager(config(FA(4), num_blocks=10), CacheOptions(
        vllm_compat=compat, retention_interval=None))
    req = Request("r", [1, 2, 3, 4, 5])
    assert kv.allocate(req, 5, kv.lookup(req)) is not None
    req.num_computed_tokens = 5
    for tok in (6, 7, 8):
        req.append_tokens([tok])
        assert kv.allocate(req, 1) == [[]]          # no new block: 8 tokens fit in 2
        req.num_computed_tokens += 1
    assert kv.lookup(Request("again", [1, 2, 3, 4, 5, 6, 7, 8, 9])).num_tokens == 8
    kv.check_integrity()
    kv.free(req)
    assert kv.lookup(Request("after", [1, 2, 3, 4, 5, 6, 7, 8, 9])).num_tokens == 8


def test_decode_steps_cache_every_completed_block_sliding() -> None:
    """Same on a hybrid config with dense retention: each decode step that completes an
    aligned block makes the prefix up to it hittable at once, in both groups."""
    kv = KVCacheManager(config(FA(4), SWA(4, 4), num_blocks=30), CacheOptions(
        retention_interval=None, vllm_compat=True))
    toks = [11, 12, 13]
    req = Request("r", toks)
    assert kv.allocate(req, 3, kv.lookup(req)) is not None
    req.num_computed_tokens = 3
    for step in range(1, 14):
        req.append_tokens([20 + step])
        assert kv.allocate(req, 1) is not None
        req.num_computed_tokens += 1
        n = req.num_computed_tokens
        probe = Request(f"p{step}", list(req.token_ids) + [999])
        assert kv.lookup(probe).num_tokens == n // 4 * 4, n
    kv.check_integrity()


def _swa_needs(e: int, need: int, proof: int = 0) -> set[int]:
    return set(range(max(0, e - need), e + proof))


@pytest.mark.parametrize("interval", [8, 16, 24])
@pytest.mark.parametrize("prompt_len", [33, 38, 45])
def test_retention_interval_keeps_exactly_the_promised_windows(interval: int, prompt_len: int) -> None:
    """FA(4) + SWA(4, W=8) (a hit at 4e needs SWA blocks e-2, e-1), default mode, retention N.
    Promised ends (ARCHITECTURE "Retention", retention.py): every multiple of N, the replay
    boundary P-1 rounded down to the alignment, one alignment unit below it (#57610), and the
    final length at free rounded down. The SWA group caches exactly the union of their windows;
    the full group every complete block. Then every replay hits the largest end whose window
    is held, computed here by brute force over the hand-built cache."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=80), CacheOptions(
        retention_interval=interval, enable_events=True))
    tokens = [1000 + i for i in range(prompt_len)]
    req = serve(kv, "r", tokens)
    events = kv.take_events()
    replay = (prompt_len - 1) // 4 * 4
    ends = set(range(interval, prompt_len + 1, interval)) | {replay, replay - 4, prompt_len // 4 * 4}
    want_swa = set().union(*(_swa_needs(e // 4, 2) for e in ends))
    assert stored_positions(events, req, 1, 4, 4) == want_swa
    assert stored_positions(events, req, 0, 4, 4) == set(range(prompt_len // 4))
    mirror = CacheMirror()
    mirror.feed(events)
    cached = {(0, req.block_hashes[j]) for j in range(prompt_len // 4)} | \
             {(1, req.block_hashes[j]) for j in want_swa}
    assert mirror.cached() == cached
    for t in range(1, prompt_len + 1):
        probe = Request(f"p{t}", tokens[:t] + [5])
        expect = max((e for e in range(4, t + 1, 4) if _swa_needs(e // 4, 2) <= want_swa), default=0)
        assert kv.lookup(probe).num_tokens == expect == oracle_hit(kv.config, None, False, probe, cached), t


def test_retention_interval_pinned_example() -> None:
    """The same rule on one case, fully by hand: P = 33, N = 16. Ends 16, 32 (multiples),
    32 (replay: 32 // 4 * 4), 28 (one unit below), 32 (final length). SWA windows: 16 -> {2, 3},
    28 -> {5, 6}, 32 -> {6, 7}. Replays of 20 and 24 tokens fall back to 16; 28 hits 28."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=80), CacheOptions(
        retention_interval=16, enable_events=True))
    tokens = [2000 + i for i in range(33)]
    req = serve(kv, "r", tokens)
    assert stored_positions(kv.take_events(), req, 1, 4, 4) == {2, 3, 5, 6, 7}
    hits = {t: kv.lookup(Request(f"p{t}", tokens[:t] + [5])).num_tokens for t in (17, 21, 25, 29, 33)}
    assert hits == {17: 16, 21: 16, 25: 16, 29: 28, 33: 32}


def test_retention_interval_survives_a_second_request() -> None:
    """A shorter request sharing the prefix adds its own ends; the first one's stay."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=80), CacheOptions(
        retention_interval=16, enable_events=True))
    tokens = [3000 + i for i in range(33)]
    a = serve(kv, "a", tokens)
    serve(kv, "b", tokens[:22] + [9])          # hits 16, adds ends 20 (replay) and 16 (below)
    events = kv.take_events()
    assert stored_positions(events, a, 1, 4, 4) == {2, 3, 4, 5, 6, 7}
    assert kv.lookup(Request("p", tokens[:21] + [5])).num_tokens == 20


def _drop() -> SpecDecode:
    return SpecDecode("eagle", 1, hash_lookahead=False)


@pytest.mark.parametrize("retention", [None, 0, 8])
@pytest.mark.parametrize("prompt_len", [21, 30, 37])
def test_sibling_of_a_draft_group_caches_the_same_blocks(retention, prompt_len) -> None:
    """FA(4) + SWA(4, W=8) "main" + SWA(4, W=8) "mtp" (draft), EAGLE drop mode. The two
    sliding groups are identical siblings: they are looked up together, so they must cache
    the same positions, including the proof block after each promised end (vLLM #44082:
    identical siblings are looked up together and share one cache mask). Every cached sliding run is a window plus its proof block."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), SWA(4, 8), num_blocks=90, drafts=(2,)), CacheOptions(
        spec_decode=_drop(), retention_interval=retention, enable_events=True))
    tokens = [4000 + i for i in range(prompt_len)]
    req = serve(kv, "r", tokens, chunk=7)
    events = kv.take_events()
    main, mtp = (stored_positions(events, req, g, 4, 4) for g in (1, 2))
    assert main == mtp and main
    # each cached position belongs to some promised window [e-2, e+1) fully cached
    ends = [e for e in range(1, prompt_len // 4) if _swa_needs(e, 2, proof=1) <= main]
    assert main == set().union(*(_swa_needs(e, 2, proof=1) for e in ends))
    mirror = CacheMirror()
    mirror.feed(events)
    resend = Request("again", tokens)
    hit = kv.lookup(resend).num_tokens
    assert hit == oracle_hit(kv.config, _drop(), False, resend, mirror) > 0


def test_sibling_proof_mask_pinned_example() -> None:
    """By hand, P = 30, retention 0, drop mode. Replay boundaries in drop mode (vLLM's pair):
    resend 28 and extension 28, each minus one unit -> 24; one unit below -> 20; final length
    at free -> 28. A sliding end e needs blocks [e-2, e+1) (window + proof); end 28 needs
    block 7 (tokens 28..31), which never completes, so it is not cached. Cached: ends 20 and
    24 -> {3, 4, 5, 6} in both siblings; the full group caches the blocks below 24 (an end is
    promised to every group at once). Resend -> 24."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), SWA(4, 8), num_blocks=90, drafts=(2,)), CacheOptions(
        spec_decode=_drop(), retention_interval=0, enable_events=True))
    tokens = [5000 + i for i in range(30)]
    req = serve(kv, "r", tokens)
    events = kv.take_events()
    assert stored_positions(events, req, 1, 4, 4) == {3, 4, 5, 6}
    assert stored_positions(events, req, 2, 4, 4) == {3, 4, 5, 6}
    assert stored_positions(events, req, 0, 4, 4) == set(range(6))
    assert kv.lookup(Request("again", tokens)).num_tokens == 24


def test_non_identical_sliding_group_does_not_carry_the_proof() -> None:
    """A sliding group with another window is no sibling of the draft group: it keeps only
    its window, the draft group its window plus the proof block (dense retention, P = 17:
    ends 4, 8, 12, 16; end 16's proof block 4 never completes)."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), SWA(4, 4), num_blocks=90, drafts=(1,)), CacheOptions(
        spec_decode=_drop(), retention_interval=None, enable_events=True))
    tokens = [6000 + i for i in range(17)]
    req = serve(kv, "r", tokens)
    events = kv.take_events()
    assert stored_positions(events, req, 1, 4, 4) == {0, 1, 2, 3}      # W=8 + proof, ends 4..12
    assert stored_positions(events, req, 2, 4, 4) == {0, 1, 2}         # W=4, ends 4..12
    assert kv.lookup(Request("again", tokens)).num_tokens == 12


def test_no_draft_group_means_every_group_carries_the_proof() -> None:
    """vLLM's fallback (``is_eagle_group``): with no group marked draft, drop mode applies to all.
    FA(4) alone, P = 17, dense: a hit at 4e needs blocks [0, e+1); the resend caps at 16,
    and the proof block of 16 (block 4) is never complete -> 12."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), CacheOptions(
        spec_decode=_drop(), retention_interval=None))
    tokens = [7000 + i for i in range(17)]
    serve(kv, "r", tokens)
    assert kv.lookup(Request("again", tokens)).num_tokens == 12
    assert kv.lookup(Request("longer", tokens + [1, 2, 3, 4])).num_tokens == 12


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


def test_compat_eagle_request_caches_its_copy_of_the_dropped_hit_block_once_full() -> None:
    """coordinator: commit — in compat mode a new request adopting a hit starts its write path
    at ``hit - cache_delay`` (``done_t``): EAGLE dropped the hit's last matched block, so the
    request's own copy of it is cached, as in vLLM, in the step that fills it (``hit +
    delay`` or ``hit`` would wait for one more block).

    Compat, one full group (bs 4), EAGLE-3 without hash lookahead (a proof group: delay 4).
    "a" (13 tokens) caches blocks 0-2. "b" shares a's first 8 tokens (10 tokens): the match
    is 8, EAGLE drops its last block, the hit is 4. b computes tokens 4..9: its block 1
    (tokens 4..7) is full, so vLLM caches it now (2 full blocks of 10 tokens): one
    BlockStored with a's tokens 4..7."""
    kv = KVCacheManager(config(FA(4), num_blocks=20), CacheOptions(
        vllm_compat=True, enable_events=True, spec_decode=SpecDecode("eagle3", 3, hash_lookahead=False)))
    A = prompt(100, 13)
    a = Request("a", A)
    admit(kv, a, 13)
    kv.take_events()
    b = Request("b", A[:8] + [500, 501])
    hit = kv.lookup(b)
    assert hit.num_tokens == 4
    assert kv.allocate(b, 6, hit) is not None
    stored = [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)]
    assert stored == [A[4:8]]
    kv.check_integrity()


def test_a_step_caches_its_pending_block_before_it_pops_and_evicts() -> None:
    """coordinator: _release — a running request's commit first caches the ends its last step
    left pending (``n >= quiet_until``: exactly at the threshold too), then pops the new
    blocks (the commit's documented order; vLLM's ``update_from_output`` likewise caches a
    spec-decode request's finished blocks before the next step allocates).

    Full (bs 4), MTP (hash lookahead: a block's hash needs the token after it), 3 usable
    blocks. "a" (5 tokens) is freed with block 0 cached. r (8 tokens, no lookahead slots)
    takes the 2 other blocks; its block 1 cannot be hashed yet (token 8 unknown). With
    token 8 appended, r's next token needs a third block: the commit stores block 1 (tokens
    304..307), then the pop evicts a's cached block: events Stored, then Removed."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), CacheOptions(
        spec_decode=SpecDecode("mtp", 1), enable_events=True))
    a = Request("a", prompt(100, 5))
    admit(kv, a, 5, num_lookahead_tokens=0)
    kv.free(a)
    r = Request("r", prompt(300, 8))
    admit(kv, r, 8, num_lookahead_tokens=0)
    assert kv.num_free_blocks == 1
    kv.take_events()
    r.append_tokens([400])
    assert kv.allocate(r, 1, num_lookahead_tokens=0) is not None
    events = kv.take_events()
    assert [type(e) for e in events] == [BlockStored, BlockRemoved]
    assert list(events[0].token_ids) == prompt(304, 4)
    kv.check_integrity()


def test_a_default_mode_eagle_hit_end_is_not_cached_again() -> None:
    """coordinator: commit — in default mode a new request adopting a hit of h tokens starts
    its write path at ``done_t = h`` (the hit's end was processed by the request that cached
    it); ``h - cache_delay`` or ``h - 1`` would cache the hit's end again, storing the
    request's copy of its proof block one end early.

    Default mode, one full group (bs 4), EAGLE-3 without hash lookahead (drop mode: an end t
    is cached with the proof block after it, once t + 4 tokens are computed). "a" (17
    tokens) caches 4 blocks. "b" shares a's first 13 tokens: the match is 12 and the hit 8
    (its proof block 2 is cached). b's step to 12 stores nothing; its step to 16 reaches end
    12 and stores blocks 2 and 3 (tokens 108..111 and 112, 500..502)."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), CacheOptions(
        enable_events=True, spec_decode=SpecDecode("eagle3", 3, hash_lookahead=False)))
    A = prompt(100, 17)
    a = Request("a", A)
    admit(kv, a, 17, num_lookahead_tokens=0)
    b = Request("b", A[:13] + prompt(500, 7))
    hit = kv.lookup(b)
    assert hit.num_tokens == 8
    kv.take_events()
    assert kv.allocate(b, 4, hit, num_lookahead_tokens=0) is not None
    b.num_computed_tokens = 12
    assert kv.take_events() == []
    assert kv.allocate(b, 4, num_lookahead_tokens=0) is not None
    b.num_computed_tokens = 16
    stored = [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)]
    assert stored == [A[8:13] + prompt(500, 3)]
    kv.check_integrity()


def test_a_full_group_caches_every_block_whatever_the_window_retention() -> None:
    """coordinator: __init__ — a downward-closed (full-attention) group uses the dense write
    path (every aligned end) even with sparse retention (``retention.dense or
    downward_closed``; ``and`` would cache only the promised ends).

    Full (bs 4), retention 0 (promised ends: the replay boundaries 12 and 8 of a 13-token
    prompt, and the final length at free). "a" decodes to 20 tokens, still running: its
    blocks 3 and 4 (ends 16, 20) are cached, so a request sharing a's first 17 tokens hits
    16."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), CacheOptions(retention_interval=0))
    a = Request("a", prompt(100, 13))
    admit(kv, a, 13)
    for t in range(7):
        a.append_tokens([500 + t])
        assert kv.allocate(a, 1) is not None
        a.num_computed_tokens += 1
    probe = Request("b", list(a.token_ids)[:17] + [1, 2])
    assert kv.lookup(probe).num_tokens == 16
    kv.check_integrity()


def test_compat_sliding_group_caches_each_reachable_block_when_it_fills() -> None:
    """coordinator: __init__ — in compat mode with sparse retention a window group writes
    vLLM's per-block mask (``masked``: compat, not dense, a window), so each block a
    promised end will read is cached in the step that fills it, not when the end is reached.

    Compat, one sliding group (bs 4, W 8), retention 0: r (13 tokens) has the replay
    boundary 12, whose window run is blocks 1 and 2 (cdiv(7, 4) = 2 blocks before 12). Its
    first 8 tokens fill blocks 0 and 1: vLLM's mask caches block 1 now (tokens 104..107);
    the next 4 fill block 2 (tokens 108..111)."""
    kv = KVCacheManager(config(SWA(4, 8), num_blocks=30), CacheOptions(
        vllm_compat=True, retention_interval=0, enable_events=True))
    r = Request("r", prompt(100, 13))
    want = [[prompt(104, 4)], [prompt(108, 4)]]
    for i, n in enumerate((8, 4)):
        assert kv.allocate(r, n, kv.lookup(r) if i == 0 else None) is not None
        r.num_computed_tokens += n
        stored = [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)]
        assert stored == want[i]
    kv.check_integrity()


def test_compat_hybrid_caches_each_group_up_to_the_aligned_prefix() -> None:
    """coordinator: __init__ — compat mode with two or more groups uses vLLM's hybrid
    coordinator limit (``get_num_cacheable_tokens``: a group caches only up to align(n),
    the alignment being the groups' LCM block size); one group alone caches all n.

    Compat, full (bs 4) + sliding (bs 8, W 16): alignment 8. r's first 12 tokens: align(12)
    = 8, so each group stores its blocks for tokens 0..7 only (the full group's block 2,
    tokens 8..11, waits for the next aligned prefix)."""
    kv = KVCacheManager(config(FA(4), SWA(8, 16), num_blocks=30), CacheOptions(
        vllm_compat=True, enable_events=True))
    r = Request("r", prompt(100, 20))
    assert kv.allocate(r, 12, kv.lookup(r)) is not None
    stored = [(e.group_idx, list(e.token_ids)) for e in kv.take_events()
              if isinstance(e, BlockStored)]
    assert stored == [(0, prompt(100, 8)), (1, prompt(100, 8))]
    kv.check_integrity()


def test_compat_eagle_groups_are_not_clamped_to_the_aligned_prefix() -> None:
    """coordinator: __init__ — in compat mode vLLM's hybrid limit clamps only the groups
    without proof to align(n); an EAGLE group caches up to min(n, align(n) + block_size)
    (``aligned_limit = hybrid and not proof``; clamping the EAGLE groups too would make the
    decode fast path wait for the next aligned prefix).

    Compat, full (bs 4) + full (bs 8), EAGLE-3 without hash lookahead (both groups carry
    the proof: an end is cached with the block after it). Alignment 8. r (5-token prompt)
    decodes one token at a time to 16. Group 0 caches up to min(n, align(n) + 4) tokens:
    at 8 its blocks 0-1 (end 4 and its proof block), at 12 block 2, at 16 block 3; group 1
    (bs 8) caches blocks 0-1 at 16."""
    kv = KVCacheManager(config(FA(4), FA(8), num_blocks=40), CacheOptions(
        vllm_compat=True, enable_events=True, spec_decode=SpecDecode("eagle3", 3, hash_lookahead=False)))
    r = Request("r", prompt(100, 5))
    admit(kv, r, 5, num_lookahead_tokens=0)
    stored = {}
    for t in range(5, 16):
        r.append_tokens([200 + t])
        assert kv.allocate(r, 1, num_lookahead_tokens=0) is not None
        r.num_computed_tokens += 1
        ev = [(e.group_idx, len(e.token_ids)) for e in kv.take_events()
              if isinstance(e, BlockStored)]
        if ev:
            stored[r.num_computed_tokens] = ev
    assert stored == {8: [(0, 8)], 12: [(0, 4)], 16: [(0, 4), (1, 16)]}
    kv.check_integrity()


def test_default_mode_caches_every_group_at_aligned_ends() -> None:
    """coordinator: __init__ — in default mode the dense write path steps by the alignment
    for every group (only compat full groups end on any block boundary), so an end is
    cached for all groups at once, at a multiple of the alignment.

    Default mode, dense retention, full (bs 4) + sliding (bs 6, W 12): alignment 12. At 9
    computed tokens the groups' common limit is 6 (the sliding group's full blocks): no
    aligned end is reached, nothing is stored (a block-size step would store the full
    group's block 0 and the sliding group's run for 6). At 13 the aligned end 12 is
    stored for both groups."""
    kv = KVCacheManager(config(FA(4), SWA(6, 12), num_blocks=30), CacheOptions(
        retention_interval=None, enable_events=True))
    r = Request("r", prompt(100, 30))
    want = [[], [(0, prompt(100, 12)), (1, prompt(100, 12))]]
    for i, n in enumerate((9, 4)):
        assert kv.allocate(r, n, kv.lookup(r) if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert [(e.group_idx, list(e.token_ids)) for e in kv.take_events()
                if isinstance(e, BlockStored)] == want[i]
    kv.check_integrity()


def _vllm_mask(p: int, a: int, bs: int, window: int, proof: int, drop: bool,
               junction: int = 0) -> set[int]:
    """vLLM 0.33's SWA write mask for retention 0 (``SlidingWindowManager
    .reachable_block_mask``), written from vLLM's definition, not from hybridkv: the reachable
    boundaries are the replay boundaries (``P - 1``; EAGLE drop mode: ``max((P-1)//A*A - A, 0)``
    and ``max(P//A*A - A, 0)``), the junction and (EAGLE groups) ``junction - block_size``; each
    aligned down to A keeps the ``need = cdiv(W - 1, bs)`` blocks before it, plus the block
    after it in an EAGLE group (the proof block), never below block 0."""
    need = -(-(window - 1) // bs)
    ends = [max((p - 1) // a * a - a, 0), max(p // a * a - a, 0)] if drop else [p - 1]
    if junction:
        ends.append(junction)
        if proof:
            ends.append(junction - bs)
    out: set[int] = set()
    for b in ends:
        if b < 0:
            continue
        e = b // a * a // bs
        out |= set(range(max(e - need, 0), e + proof))
    return out


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("p", [5, 8, 9, 12, 13, 16, 17, 20, 23, 24, 25])
def test_compat_mask_of_one_sliding_group_keeps_the_replay_windows(drop, p) -> None:
    """coordinator: _mask_ends / _write_mask — vLLM's replay boundaries (``p - 1``; EAGLE
    drop mode's ``{resend - A, extension - A}`` pair, 0 kept) moved by one token or one
    unit, ``max(.., 0)`` → ``max(.., 1)``, end 0 dropped: other blocks cached.

    Compat mode, retention 0, one SWA group (bs 4, W 8: need 2; A 4), drop mode with the
    group as the drafter (proof block). A one-shot prefill of p tokens: the unitary coordinator
    caches up to p // 4 blocks (all hashed), exactly the masked ones (:func:`_vllm_mask`)."""
    spec = EAGLE_DROP if drop else None
    kv = manager(SWA(4, 8), num_blocks=40, retention=0, spec_decode=spec,
                 drafts=(0,) if drop else ())
    r, _ = run_prompt(kv, "r", prompt(100, p))
    want = {j for j in _vllm_mask(p, 4, 4, 8, int(drop), drop) if j < p // 4}
    assert cached_positions(kv, r, 0) == want
    kv.check_integrity()


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("p", [6, 9, 16, 17, 20, 24, 25, 31, 32, 33, 40])
def test_compat_mask_of_a_hybrid_aligns_the_replay_windows(drop, p) -> None:
    """coordinator: _mask_ends / _compat_limits — the boundaries aligned down to A = 8 in the
    group's 4-token blocks; the hybrid coordinator's cacheable prefix (``align(n)``; an EAGLE
    group ``min(n, align(n) + bs)``).

    Compat mode, retention 0, full (bs 8) + SWA (bs 4, W 8: need 2); drop mode with the SWA
    group as the only drafter. After a one-shot prefill of p tokens the SWA group has cached
    the masked blocks below its cacheable prefix: ``align8(p) // 4`` blocks, or with the proof
    block ``min(p, align8(p) + 4) // 4`` — but nothing while ``align8(p)`` is 0 (p = 6: the
    EAGLE pair is {0, 0}, block 0 is masked, and still not cached)."""
    spec = EAGLE_DROP if drop else None
    kv = manager(FA(8), SWA(4, 8), num_blocks=60, retention=0, spec_decode=spec,
                 drafts=(1,) if drop else ())
    r, _ = run_prompt(kv, "r", prompt(100, p))
    aligned = p // 8 * 8
    limit = min(p, aligned + 4) // 4 if drop and aligned else aligned // 4
    want = {j for j in _vllm_mask(p, 8, 4, 8, int(drop), drop) if j < limit}
    assert cached_positions(kv, r, 1) == want
    assert cached_positions(kv, r, 0) == set(range(aligned // 8))   # full: every block
    kv.check_integrity()


def test_compat_mask_without_a_hit_pins_no_junction() -> None:
    """coordinator: _mask_ends — a new request allocated with ``hit=None`` given junction 1
    instead of 0 (its end 0 then masks block 0 of an EAGLE group).

    Compat mode, retention 0, drop mode, SWA (bs 4, W 8) drafter; 40 tokens allocated without
    a lookup: the replay ends are 32 and 36 (blocks 8 and 9), masked [6, 9) ∪ [7, 10) = 6..9;
    block 0 is not among them."""
    kv = manager(SWA(4, 8), num_blocks=40, retention=0, spec_decode=EAGLE_DROP, drafts=(0,))
    r = Request("r", prompt(100, 40))
    assert kv.allocate(r, 40, None) is not None
    r.num_computed_tokens = 40
    assert cached_positions(kv, r, 0) == {6, 7, 8, 9}


def test_compat_mask_of_a_one_token_prompt_in_drop_mode() -> None:
    """coordinator: _mask_ends — ``max(.., 0)`` → ``max(.., 1)`` for either end of the EAGLE
    pair (visible only with alignment 1).

    Compat mode, retention 0, drop mode, SWA (bs 1, W 9: need 8) drafter, A = 1. A one-token
    prompt's pair is ``{max(0 - 1, 0), max(1 - 1, 0)} = {0}``: only span(0) = [0, 1) is
    masked. Three decode steps later (4 tokens computed and hashed, nothing out of the window
    yet) block 0 is still the only cached block; an end 1 would have masked block 1 too."""
    kv = manager(SWA(1, 9), num_blocks=40, retention=0, spec_decode=EAGLE_DROP, drafts=(0,))
    r, _ = run_prompt(kv, "r", [7])
    for tok in (8, 9, 10):
        r.append_tokens([tok])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
    assert 0 not in kv.block_ids(r)[0]
    assert cached_positions(kv, r, 0) == {0}


@pytest.mark.parametrize("drop", [False, True])
def test_compat_mask_pins_the_junction_and_in_eagle_groups_the_block_below(drop) -> None:
    """coordinator: _mask_ends — ``junction - block_size`` added for every group (``and`` →
    ``or``), not only EAGLE groups; the junction itself lost.

    Compat mode, retention 0, full (bs 16) + SWA (bs 16, W 32: need 2), as vLLM's
    ``test_swa_shared_prefix_reuse_under_zero_retention``.
    r0 (64 shared + 20 tokens) leaves the SWA group only the window of its replay end, so r1
    (the same 64 + 20 others) gets a hit of 0 with junction 64 (the full group's answer).
    r1's SWA mask: its replay ends, the junction 64 (blocks [2, 4)) and, in an EAGLE group
    only, 64 - 16 = 48 (blocks [1, 3) + its proof block)."""
    spec = EAGLE_DROP if drop else None
    kv = manager(FA(16), SWA(16, 32), num_blocks=80, retention=0, spec_decode=spec,
                 drafts=(1,) if drop else ())
    shared = prompt(1000, 64)
    run_prompt(kv, "r0", shared + [100] * 20)
    r1 = Request("r1", shared + [200] * 20)
    hit = kv.lookup(r1)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 64)
    assert kv.allocate(r1, 84, hit) is not None
    r1.num_computed_tokens = 84
    limit = min(84, 80 + 16) // 16 if drop else 80 // 16
    want = {j for j in _vllm_mask(84, 16, 16, 32, int(drop), drop, junction=64) if j < limit}
    assert cached_positions(kv, r1, 1) == want
    assert (1 in want) == drop


@pytest.mark.parametrize("drop", [False, True])
def test_compat_mask_of_a_chunked_prefill_waits_for_the_cacheable_prefix(drop) -> None:
    """coordinator: _compat_limits — an EAGLE group's cacheable prefix ``min(n, align(n) +
    bs)`` taken as ``align(n) + bs`` (a block not yet computed cached) or as ``n`` (uncapped).

    Compat mode, retention 0, full (bs 8) + SWA (bs 2, W 8: need 4), a 40-token prompt in
    chunks 5, 9, 7, 11, 8 (computed 5, 14, 21, 32, 40). The SWA group's stored blocks after
    each chunk are the masked ones below its cacheable prefix, in blocks: ``align8(n) // 2``,
    with the proof block (EAGLE drafter) ``min(n, align8(n) + 2) // 2`` (0 while align8(n) is
    0): with the proof block 5 → 0, 14 → 5 (uncapped: 7), 21 → 9 (uncapped: 10), 32 → 16,
    40 → 20. Read from the KV events."""
    spec = EAGLE_DROP if drop else None
    kv = manager(FA(8), SWA(2, 8), num_blocks=80, retention=0, spec_decode=spec,
                 drafts=(1,) if drop else (), enable_events=True)
    r = Request("r", prompt(100, 40))
    mask = _vllm_mask(40, 8, 2, 8, int(drop), drop)
    hit = kv.lookup(r)
    stored: set[int] = set()
    for i, n in enumerate((5, 9, 7, 11, 8)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        c = r.num_computed_tokens
        stored |= {r.block_hashes.index(h) for e in kv.take_events()
                   if isinstance(e, BlockStored) and e.group_idx == 1 for h in e.block_hashes}
        aligned = c // 8 * 8
        limit = (min(c, aligned + 2) if drop and aligned else aligned) // 2
        assert stored == {j for j in mask if j < limit}, c
    kv.check_integrity()


def test_a_new_request_without_a_hit_promises_only_its_replay_boundaries() -> None:
    """coordinator: _boundaries — a new request allocated with ``hit=None`` read as a hit
    (``hit.shared_prefix_boundary`` of None) or given junction 1 (an end at token 1, whose run
    in an EAGLE group is block 0).

    Default mode, retention 0, drop mode, SWA (bs 4, W 8: need 2) drafter; 40 tokens in one
    step. Promised ends (ARCHITECTURE, replay boundaries with the unit below): the EAGLE pair
    {36 - 4, 40 - 4} and one unit below each: 28, 32, 36 (blocks 7, 8, 9); their runs with
    the proof block: [5, 8), [6, 9), [7, 10). The same with the lookup's zero hit."""
    for use_hit in (False, True):
        kv = manager(SWA(4, 8), num_blocks=40, compat=False, retention=0, spec_decode=EAGLE_DROP,
                     drafts=(0,))
        r = Request("r", prompt(100, 40))
        hit = kv.lookup(r) if use_hit else None
        assert kv.allocate(r, 40, hit) is not None
        r.num_computed_tokens = 40
        assert cached_positions(kv, r, 0) == {5, 6, 7, 8, 9}
        kv.check_integrity()


@pytest.mark.parametrize("second", ["full", "sliding"])
def test_a_long_run_of_a_larger_block_group_is_cached_under_its_own_hashes(second) -> None:
    """coordinator: _insert_span — a run of 12 or more blocks (one bulk insert) given the
    hashes one hash block too early (``(j + 1) * scale - 2``: with scale 2 the slice has the
    right length and the wrong hashes).

    Default mode, full (bs 4) + a second group of bs 8 (scale 2 over the hash block 4): full,
    or SWA with W 100 (need 13 blocks). "a" = 100 tokens in one step: the bs-8 group caches
    its 12 full blocks in one run (the SWA group: the run of its replay end 96 = blocks
    [0, 12)). A resend hits 96 (99 aligned down to 8) with a's blocks in both groups."""
    spec = FA(8) if second == "full" else SWA(8, 100)
    kv = manager(FA(4), spec, num_blocks=80, compat=False)
    a, _ = run_prompt(kv, "a", prompt(100, 100))
    assert cached_positions(kv, a, 1) == set(range(12))
    kv.check_integrity()
    hit = kv.lookup(Request("b", prompt(100, 100)))
    assert hit.num_tokens == 96
    assert hit.block_ids == (tuple(kv.block_ids(a)[0][:24]), tuple(kv.block_ids(a)[1][:12]))


def test_a_run_whose_first_block_left_the_window_caches_only_the_rest() -> None:
    """coordinator: _insert_span — the per-block path's null check made ``or`` (the null
    block 0 inserted under the hash of a position that left the window).

    Compat mode, dense retention, drop mode, one SWA group (bs 8, W 3: need 1) as the
    drafter: end t's run is [t/8 - 1, t/8 + 1), cached once the proof block t/8 is computed.
    A 40-token prompt in chunks of 10: at 20 computed, end 8's run is [0, 2), but block 0 left
    the window at 10 (skipped 10 - 3 + 1 = 8 tokens) and is null: only block 1 is cached. No
    stored event names a hash twice, and a resend hits 24 (the unitary coordinator's cap: the
    proof block below 39 tokens, so e <= 3) with a real block at position 2 (run [2, 4))."""
    kv = manager(SWA(8, 3), num_blocks=40, retention=None, spec_decode=EAGLE_DROP, drafts=(0,),
                 enable_events=True)
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    for i in range(4):
        assert kv.allocate(r, 10, hit if i == 0 else None) is not None
        r.num_computed_tokens += 10
        kv.check_integrity()
        if i == 1:
            assert kv.block_ids(r)[0][0] == 0 and cached_positions(kv, r, 0) == {1}
    stored = [b for e in kv.take_events() if isinstance(e, BlockStored) for b in e.block_hashes]
    assert len(stored) == len(set(stored))
    kv.free(r)
    hit = kv.lookup(Request("s", prompt(100, 40)))
    assert hit.num_tokens == 24 and hit.block_ids[0][:2] == (0, 0) and hit.block_ids[0][2] != 0
    kv.check_integrity()


def test_allocating_a_junction_hit_promises_the_junction_and_the_unit_below() -> None:
    """coordinator: _boundaries — the junction lost (None / never read), ``junction - a``
    not promised in default mode (``or`` → ``and``, ``not compat`` dropped) or moved to
    ``junction + a``.

    Default mode, retention 0, full (bs 4) + SWA (bs 4, W 5: need 1). r0 = 12 shared + 12
    other tokens caches the SWA windows of its ends 20, 16 (replay 23 → 20 and the unit
    below): blocks 3, 4. r1 = the 12 shared + 12 others: the full group serves 12; the SWA
    group would need block 2 for 12, block 1 for 8, block 0 for 4, none cached: hit 0,
    junction 12. r1's promised ends: 20, 16 (its replay pair), 12 (junction),
    8 (the unit below): SWA runs [4, 5), [3, 4), [2, 3), [1, 2)."""
    kv = manager(FA(4), SWA(4, 5), num_blocks=60, compat=False, retention=0)
    shared = prompt(1000, 12)
    r0, _ = run_prompt(kv, "r0", shared + prompt(100, 12))
    assert cached_positions(kv, r0, 1) == {3, 4}
    r1 = Request("r1", shared + prompt(200, 12))
    hit = kv.lookup(r1)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 12)
    assert kv.allocate(r1, 24, hit) is not None
    r1.num_computed_tokens = 24
    assert cached_positions(kv, r1, 1) == {1, 2, 3, 4}
    kv.check_integrity()


def test_compat_state_group_exports_the_junction_without_the_unit_below() -> None:
    """coordinator: _boundaries — compat mode without drop mode given ``junction - a`` too
    (``and`` → ``or``): vLLM pins only the junction (and ``junction - block_size`` under EAGLE).

    Compat mode, retention 0, full (bs 4) + a state group (bs 4). r0 = 12 shared + 12 other
    tokens; r1 = the 12 shared + 12 others: the full group serves 12, the state group has no
    checkpoint at 12: hit 0, junction 12. r1's promised ends (compat: no unit below): its
    replay boundary 20 and the junction 12 — the checkpoints its 24-token step exports."""
    state = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                      state_dtype="float32")
    kv = KVCacheManager(config(FA(4), state, num_blocks=200), CacheOptions(vllm_compat=True))
    shared = prompt(1000, 12)
    run_prompt(kv, "r0", shared + prompt(100, 12))
    r1 = Request("r1", shared + prompt(200, 12))
    hit = kv.lookup(r1)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (0, 12)
    assert kv.export_positions(r1, 24, hit) == [12, 20]
    assert kv.allocate(r1, 24, hit) is not None
    assert [e.position for e in kv.state_blocks(r1)[0].exports] == [12, 20]


def test_the_final_length_is_promised_at_free() -> None:
    """coordinator: cache — the final length not promised at free in default mode (``not
    compat`` inverted), its end made None or a float, or the free's cache pass skipped below
    ``quiet_until`` (``not final`` → ``final``).

    Default mode, retention 0, full (bs 4) + SWA (bs 4, W 8: need 2). r's prompt (10 tokens)
    promises 8 and 4; r decodes to 21 tokens and is freed: the final length 21 → 20 is
    promised, its SWA run [3, 5) cached. The same 21 tokens + 1 then hit 20 (else 8)."""
    kv = manager(FA(4), SWA(4, 8), num_blocks=60, compat=False, retention=0)
    r, _ = run_prompt(kv, "r", prompt(100, 10))
    while r.num_tokens < 21:
        r.append_tokens([7])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
    kv.free(r)
    assert kv.lookup(Request("q", list(r.token_ids) + [9])).num_tokens == 20
    kv.check_integrity()


def test_drop_mode_caches_an_end_once_its_proof_block_is_computed() -> None:
    """coordinator: cache / _cache_prefix — the limit ``(blocks - proof) * bs`` given ``+
    proof`` (ends whose proof block is not computed yet), an end's run cached without its
    proof block (``+ proof`` → ``- proof``).

    Default mode, drop mode, one full group (bs 4, the drafter). A 30-token prompt in chunks
    12, 8, 10: an end t is cached with its proof block once t + 4 tokens are computed, so the
    cached blocks are [0, 3), [0, 5), [0, 7) (at 30: 7 hashed blocks, end 24 + block 6)."""
    kv = manager(FA(4), num_blocks=40, compat=False, spec_decode=EAGLE_DROP)
    r = Request("r", prompt(100, 30))
    hit = kv.lookup(r)
    for i, (n, want) in enumerate(((12, 3), (8, 5), (10, 7))):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert cached_positions(kv, r, 0) == set(range(want))


def test_a_step_that_completes_a_proof_block_caches_at_once() -> None:
    """coordinator: cache — ``quiet_until`` (the fewest tokens at which cache() has work
    again) rounded up to the alignment for every group (``and`` → ``or``: only the compat
    hybrid's groups without a proof block cache up to align(n)), or a step that reaches it
    exactly skipped (``<`` → ``<=``).

    Default mode, drop mode, full bs 4 (the drafter) + full bs 8: A = 8, the delay is the
    drafter's block (4). Chunks 12, 8: at 12 the end 8 is cached (bs-4 blocks [0, 3)); the
    next end 16 is due at 16 + 4 = 20, reached exactly by the second chunk: [0, 5)."""
    kv = manager(FA(4), FA(8), num_blocks=60, compat=False, spec_decode=EAGLE_DROP, drafts=(0,))
    r = Request("r", prompt(100, 30))
    hit = kv.lookup(r)
    for i, (n, want) in enumerate(((12, 3), (8, 5))):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert cached_positions(kv, r, 0) == set(range(want))
        assert cached_positions(kv, r, 1) == set(range(want // 2))


def test_compat_mask_with_retention_caches_each_masked_block_when_it_fills() -> None:
    """coordinator: cache — the masked groups' ``quiet_until`` one block late (``+ 1`` →
    ``+ 2``: a masked block cached a block after it filled).

    Compat mode, retention 16, one SWA group (bs 4, W 8: need 2). A 5-token prompt, then one
    token per step to 40. The mask: the replay end 4 (block 1: [0, 1)) and every multiple of
    16 tokens (blocks [4k - 2, 4k)): 0, 2, 3, 6, 7. vLLM caches a masked block as soon as it is
    full (blocks are registered when scheduled): after c tokens, the masked j with
    (j + 1) * 4 <= c. Read from the KV events (the window frees the blocks)."""
    kv = manager(SWA(4, 8), num_blocks=40, retention=16, enable_events=True)
    r, _ = run_prompt(kv, "r", prompt(100, 5))
    stored: set[int] = set()
    while r.num_tokens < 40:
        r.append_tokens([7])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
        stored |= {r.block_hashes.index(h) for e in kv.take_events()
                   if isinstance(e, BlockStored) for h in e.block_hashes}
        c = r.num_computed_tokens
        assert stored == {j for j in (0, 2, 3, 6, 7) if (j + 1) * 4 <= c}, c


def test_compat_hit_writes_its_own_copy_of_the_proof_block() -> None:
    """coordinator: cache — the first end after an adopted hit computed with ``/`` (``done //
    step`` → ``done / step``: the next end overshoots when ``done`` is not a multiple).

    Compat mode, dense retention, full (bs 8) + SWA (bs 4, W 8: need 2) as the drafter. "a"
    (32 tokens) is served; "b" (a's first 28 + 2 others) hits 24 (SWA run [4, 7) with its
    proof block 6, tokens 24..27, shared). In compat mode the hit's proof block was dropped: b's end 24 stays open
    (done 24 - 4 = 20) and b's own block 6 is cached as soon as it is full (b computes 30:
    the EAGLE group's cacheable prefix min(30, 24 + 4) = 28 tokens, 7 blocks)."""
    kv = manager(FA(8), SWA(4, 8), num_blocks=60, retention=None, spec_decode=EAGLE_DROP,
                 drafts=(1,))
    run_prompt(kv, "a", prompt(100, 32))
    b = Request("b", prompt(100, 28) + prompt(500, 2))
    admit(kv, b, 6, expect_hit=24)
    assert 6 in cached_positions(kv, b, 1)


def test_lookahead_hashing_caches_a_block_once_the_next_token_exists() -> None:
    """coordinator: cache — the hashed-block count divided with ``/`` (a float limit: the
    single-block write then indexes the hashes with a float).

    Default mode, EAGLE with hash lookahead, full (bs 4). An 8-token prompt: block 1's hash
    needs token 8, so only block 0 is cached; one more token caches block 1."""
    kv = manager(FA(4), num_blocks=40, compat=False, spec_decode=SpecDecode("eagle", 1))
    r, _ = run_prompt(kv, "r", prompt(100, 8))
    assert cached_positions(kv, r, 0) == {0}
    r.append_tokens([7])
    assert kv.allocate(r, 1) is not None
    r.num_computed_tokens += 1
    assert cached_positions(kv, r, 0) == {0, 1}


def test_events_of_a_long_run_not_starting_at_block_zero() -> None:
    """coordinator: _insert_span — a bulk insert (12+ blocks) reporting positions from 0
    (``range(j, hi)`` → ``range(hi)``) or only below j (``range(j)``).

    Default mode, full (bs 4), events on. Chunks 8 then 56: the second step caches blocks
    [2, 16) in one run; its stored event names exactly their hashes and tokens."""
    kv = manager(FA(4), num_blocks=40, compat=False, enable_events=True)
    r = Request("r", prompt(100, 64))
    admit(kv, r, 8)
    kv.take_events()
    assert kv.allocate(r, 56) is not None
    stored = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == r.block_hashes[2:16]
    assert [t for e in stored for t in e.token_ids] == prompt(108, 56)


def test_diverging_inside_last_aligned_block_still_hits():  # vLLM #57610
    prompt = list(range(4100))
    edited = prompt[:4090] + [7] * 30   # same turn, edited near its end
    for compat, expected in [(True, 0), (False, 4064)]:
        kv = manager(FA(32), SWA(16, 1024), num_blocks=2000, compat=compat, retention=0)
        run_prompt(kv, "turn", prompt)
        assert kv.lookup(Request("edit", edited)).num_tokens == expected


def test_next_chat_turn_hits_the_answer():
    prompt = list(range(300))
    kv = manager(FA(16), SWA(16, 64), num_blocks=200, compat=False, retention=0)
    req, _ = run_prompt(kv, "t1", prompt)
    for tok in range(50):                 # decode 50 tokens
        req.append_tokens([1000 + tok])
        assert kv.allocate(req, 1) is not None
        req.num_computed_tokens += 1
    kv.free(req)
    turn2 = list(req.token_ids) + [5] * 40
    assert kv.lookup(Request("t2", turn2)).num_tokens == (len(req.token_ids) - 1) // 16 * 16
    vllm = manager(FA(16), SWA(16, 64), num_blocks=200, compat=True, retention=0)
    req, _ = run_prompt(vllm, "t1", prompt)
    for tok in range(50):
        req.append_tokens([1000 + tok])
        vllm.allocate(req, 1)
        req.num_computed_tokens += 1
    vllm.free(req)
    assert vllm.lookup(Request("t2", turn2)).num_tokens == 288  # only the prompt's boundary
