"""Deterministic regression tests for bugs that once left the whole suite green.

Each test here was checked against a deliberate bug (TESTING.md, "Deliberate bugs"): it
fails with the bug and passes without it. They use only the public API (manager, requests,
events, external lookup) and compute their expectations by hand or with the independent
oracle of ``tests/support/oracle.py``, never with the implementation's own rules.
"""

from __future__ import annotations

import itertools

import pytest

from hybridkv import BlockStored, KVCacheManager, MultiModalItem, Request, SpecDecode
from tests.support.helpers import FA, SWA, config, serve
from tests.support.oracle import CacheMirror, oracle_hit



def stored_positions(events, req: Request, group: int, bs: int, hbs: int) -> set[int]:
    """Positions j of ``req``'s blocks in ``group`` that a BlockStored event reported."""
    scale = bs // hbs
    pos = {req.block_hashes[(j + 1) * scale - 1]: j for j in range((len(req.block_hashes)) // scale)}
    out = set()
    for ev in events:
        if isinstance(ev, BlockStored) and ev.group_idx == group:
            out.update(pos[h] for h in ev.block_hashes if h in pos)
    return out


# ---- 1. the multi-group fixed point needs more than one pass ------------------------------------
# Two sliding groups with block 4: W=8 needs blocks [e-2, e) for a hit at 4e, W=4 needs [e-1, e).

def test_fixed_point_needs_a_second_pass_local_cache() -> None:
    """W=8 and W=4 sliding groups, LRU evictions leave holes: W=8 lacks block 3, W=4 lacks
    blocks 0, 3 and 5 of the query. By hand: e=6 fails (W=4 lacks 5), e=5 fails (W=8 lacks 3),
    e=4 fails (W=4 lacks 3), e=3 works (W=8 has 1, 2; W=4 has 2): 12 tokens. One pass of the
    fixed point (W=8 then W=4) stops at 20, whose W=8 window needs block 3, which is not cached."""
    kv = KVCacheManager(config(SWA(4, 8), SWA(4, 4), num_blocks=15), retention_interval=0,
                        enable_events=True)
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
    kv = KVCacheManager(config(*(SWA(4, w) for w in order), num_blocks=40), hash_seed="x")
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


# ---- 2. the decode fast path must not skip the step that completes a block ---------------------

@pytest.mark.parametrize("compat", [True, False])
def test_decode_step_completing_a_block_caches_it(compat: bool) -> None:
    """A 5-token prompt and 3 decode steps: the third step computes token 8, which completes
    block 1 (tokens 4..7), so a resend of those 8 tokens hits 8 (vLLM caches up to
    ``min(computed + new, num_tokens)`` at every ``allocate_slots``)."""
    kv = KVCacheManager(config(FA(4), num_blocks=10), vllm_compat=compat, retention_interval=None)
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
    kv = KVCacheManager(config(FA(4), SWA(4, 4), num_blocks=30), retention_interval=None,
                        vllm_compat=True)
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


# ---- 3. multimodal keys cover the lookahead token ------------------------------------------------

@pytest.mark.parametrize("offset", [4, 8])
def test_lookahead_hash_covers_an_image_starting_at_the_next_block(offset: int) -> None:
    """EAGLE lookahead hashing: block i's hash covers the token after it. When two requests
    have the same placeholder tokens but different images starting exactly at a block
    boundary, the block before the image must not match: the drafter's KV at its last
    position was computed from the image's first embedding (vLLM's request block hasher keeps
    the images overlapping the lookahead tokens in the extra keys)."""
    kv = KVCacheManager(config(FA(4), num_blocks=20), spec_decode=SpecDecode("eagle", 1))
    prompt = list(range(1, offset + 1)) + [0] * 4 + [50, 51]
    a = serve(kv, "a", prompt, mm_items=[MultiModalItem("image-a", offset, 4)])
    b = Request("b", prompt, mm_items=[MultiModalItem("image-b", offset, 4)])
    hit = kv.lookup(b)
    # blocks before the one ending at the image start are shared; that one is not
    assert hit.num_tokens == offset - 4
    assert a.block_hashes[offset // 4 - 1] != b.block_hashes[offset // 4 - 1]
    assert a.block_hashes[: offset // 4 - 1] == b.block_hashes[: offset // 4 - 1]
    # the same image does hit through the block (and one more)
    same = Request("c", prompt, mm_items=[MultiModalItem("image-a", offset, 4)])
    assert kv.lookup(same).num_tokens == offset + 4


def test_without_lookahead_an_image_at_the_next_block_does_not_enter_the_hash() -> None:
    """Control: with no lookahead (no EAGLE), the image at the next block is outside block
    i's key, so both requests share block i (and only it)."""
    kv = KVCacheManager(config(FA(4), num_blocks=20))
    prompt = [1, 2, 3, 4] + [0] * 4 + [50, 51]
    serve(kv, "a", prompt, mm_items=[MultiModalItem("image-a", 4, 4)])
    b = Request("b", prompt, mm_items=[MultiModalItem("image-b", 4, 4)])
    assert kv.lookup(b).num_tokens == 4


# ---- 4. retention N: exactly the promised ends, by hand ----------------------------------------

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
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=80), retention_interval=interval,
                        enable_events=True)
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
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=80), retention_interval=16,
                        enable_events=True)
    tokens = [2000 + i for i in range(33)]
    req = serve(kv, "r", tokens)
    assert stored_positions(kv.take_events(), req, 1, 4, 4) == {2, 3, 5, 6, 7}
    hits = {t: kv.lookup(Request(f"p{t}", tokens[:t] + [5])).num_tokens for t in (17, 21, 25, 29, 33)}
    assert hits == {17: 16, 21: 16, 25: 16, 29: 28, 33: 32}


def test_retention_interval_survives_a_second_request() -> None:
    """A shorter request sharing the prefix adds its own ends; the first one's stay."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=80), retention_interval=16,
                        enable_events=True)
    tokens = [3000 + i for i in range(33)]
    a = serve(kv, "a", tokens)
    serve(kv, "b", tokens[:22] + [9])          # hits 16, adds ends 20 (replay) and 16 (below)
    events = kv.take_events()
    assert stored_positions(events, a, 1, 4, 4) == {2, 3, 4, 5, 6, 7}
    assert kv.lookup(Request("p", tokens[:21] + [5])).num_tokens == 20


# ---- 5. identical sibling groups share the draft's proof mask ------------------------------------

def _drop() -> SpecDecode:
    return SpecDecode("eagle", 1, hash_lookahead=False)


@pytest.mark.parametrize("retention", [None, 0, 8])
@pytest.mark.parametrize("prompt_len", [21, 30, 37])
def test_sibling_of_a_draft_group_caches_the_same_blocks(retention, prompt_len) -> None:
    """FA(4) + SWA(4, W=8) "main" + SWA(4, W=8) "mtp" (draft), EAGLE drop mode. The two
    sliding groups are identical siblings: they are looked up together, so they must cache
    the same positions, including the proof block after each promised end (vLLM #44082:
    identical siblings are looked up together and share one cache mask). Every cached sliding run is a window plus its proof block."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), SWA(4, 8), num_blocks=90, drafts=(2,)),
                        spec_decode=_drop(), retention_interval=retention, enable_events=True)
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
    kv = KVCacheManager(config(FA(4), SWA(4, 8), SWA(4, 8), num_blocks=90, drafts=(2,)),
                        spec_decode=_drop(), retention_interval=0, enable_events=True)
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
    kv = KVCacheManager(config(FA(4), SWA(4, 8), SWA(4, 4), num_blocks=90, drafts=(1,)),
                        spec_decode=_drop(), retention_interval=None, enable_events=True)
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
    kv = KVCacheManager(config(FA(4), num_blocks=30), spec_decode=_drop(), retention_interval=None)
    tokens = [7000 + i for i in range(17)]
    serve(kv, "r", tokens)
    assert kv.lookup(Request("again", tokens)).num_tokens == 12
    assert kv.lookup(Request("longer", tokens + [1, 2, 3, 4])).num_tokens == 12


# ---- 6. a state-group pool announces frees of cached blocks to the admission memo ---------------
# Found at stop 22 while reading pool.py's mutants: ExtentBlockPool's free and allocate did not
# bump ``free_version``, so the coordinator's per-request memo of "hit blocks nobody holds"
# (``_evictable_counts``) outlived a free, and a waiting request's plan undercounted the free
# blocks its own hit would take: allocate raised "cannot pop" instead of returning None.

def test_waiting_request_replanned_after_a_free_with_a_state_group() -> None:
    from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup
    from hybridkv.core.specs import StateSpec

    fa = FullAttention(block_size=4, num_kv_heads=1, head_dim=4)
    state = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                      state_dtype="float32")
    kv = KVCacheManager(KVCacheConfig((KVCacheGroup("a", fa, ("a",)),
                                       KVCacheGroup("s", state, ("s",))), num_blocks=10))
    shared = list(range(16))
    a = Request("a", shared + [100])
    assert kv.allocate(a, 17, kv.lookup(a)) is not None
    a.num_computed_tokens = 17
    b = Request("b", shared + list(range(200, 209)))
    hit = kv.lookup(b)                     # 16 tokens, on a's blocks (held by a)
    assert hit.num_tokens == 16
    assert kv.allocate(b, 9, hit) is None  # does not fit while a runs: b waits
    kv.free(a)                             # a's blocks become free cached blocks
    # b is planned again with the same hit (as a scheduler does every step); taking the hit's
    # blocks out of the free queue leaves too few for b's new ones: still no fit, no error
    assert kv.allocate(b, 9, hit) is None
    fresh = Request("b2", list(b.token_ids))
    assert kv.allocate(fresh, 9, kv.lookup(fresh)) is None   # the same answer, unmemoized
    kv.check_integrity()


# ---- 7. allocating past max_model_len (found at stop 22 by the max_model_len property extension) ----

@pytest.mark.parametrize("num_tokens", [9, 12])
def test_allocating_past_max_model_len_is_refused_and_changes_nothing(num_tokens) -> None:
    """FA(4), max_model_len 8, a new request of ``num_tokens`` > 8 tokens allocated at once.

    The manager caps a step's slots at max_model_len, so tokens past it would have no slot;
    ``allocate``'s contract is a ValueError for bad counts with nothing changed. Before the
    fix, 9 tokens were accepted with 2 blocks (8 slots: token 8 had none, a silent wrong
    answer) and 12 tokens raised IndexError from the write path (``_insert_span``) after the
    request took 2 blocks, which it kept. Now: a ValueError naming max_model_len=8, the pool,
    the events and the tables as before, and a following request served as if the bad one
    never came."""
    kv = KVCacheManager(config(FA(4), num_blocks=32), max_model_len=8, enable_events=True)
    bad = Request("bad", list(range(100, 100 + num_tokens)))
    with pytest.raises(ValueError, match=r"max_model_len=8"):
        kv.allocate(bad, num_tokens, kv.lookup(bad))
    kv.check_integrity()
    assert kv.num_free_blocks == 31 and kv.take_events() == []
    with pytest.raises(KeyError):
        kv.block_ids(bad)
    serve(kv, "ok", list(range(100, 108)))               # at the limit: served, 2 blocks cached
    kv.check_integrity()
    assert kv.num_free_blocks == 31
    assert kv.lookup(Request("again", list(range(100, 108)))).num_tokens == 4   # capped at 7


def test_a_decode_step_past_max_model_len_is_refused_on_the_fast_path() -> None:
    """A running request at max_model_len (6, inside its second block): one more token would
    have no slot. The decode fast path (a step needing no new block and caching nothing: the
    next block end, 8, is not reached) must not accept it silently: ValueError naming the
    limit, nothing changed."""
    kv = KVCacheManager(config(FA(4), num_blocks=32), max_model_len=6)
    r = serve(kv, "r", list(range(100, 105)), free=False)          # 5 tokens, 2 blocks
    r.append_tokens([5])
    assert kv.allocate(r, 1) is not None                            # token 6: at the limit
    r.num_computed_tokens = 6
    r.append_tokens([6])
    free = kv.num_free_blocks
    with pytest.raises(ValueError, match=r"^request 'r' would hold 7 tokens \(num_computed_tokens 6 \+ hit 0 "
                                         r"\+ num_new_tokens 1\), past max_model_len=6$"):
        kv.allocate(r, 1)
    assert kv.num_free_blocks == free and r.num_computed_tokens == 6
    kv.check_integrity()


def test_a_prompt_past_max_model_len_is_refused_with_its_hit_counted() -> None:
    """The limit counts the hit too: a cached 4-token prefix and 6 new tokens are 10 tokens,
    past max_model_len 8 (the hit alone would fit). The message names every part."""
    kv = KVCacheManager(config(FA(4), num_blocks=32), max_model_len=8)
    serve(kv, "a", list(range(100, 105)))                 # caches the block of tokens 0..3
    r = Request("r", list(range(100, 104)) + list(range(200, 206)))
    hit = kv.lookup(r)
    assert hit.num_tokens == 4
    free = kv.num_free_blocks
    with pytest.raises(ValueError, match=r"^request 'r' would hold 10 tokens \(num_computed_tokens 0 "
                                         r"\+ hit 4 \+ num_new_tokens 6\), past max_model_len=8$"):
        kv.allocate(r, 6, hit)
    assert kv.num_free_blocks == free
    kv.check_integrity()
