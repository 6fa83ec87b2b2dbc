"""State groups (recurrent layers: gated delta net, Mamba2) through the manager
(``core/coordinator/states.py``): live extents, checkpoints, exports and restores.

* the scenarios of docs/state-groups.md (the 200-token system prompt, the shared-prefix
  junction, a divergence inside a request's own tokens);
* export positions predict every allocation; ``state_blocks`` reports the restore and the
  exports until they are computed; checkpoints leave the table once below the hold;
* the plan counts a new request's live extent and exports and a running request's released
  checkpoints; free keeps the live state as a checkpoint only at an aligned length;
* a fake engine that follows ``state_blocks`` literally always restores the state of the hit
  prefix (property test); sibling checkpoints are evicted together;
* a state group needs the LRU policy.
Spec bytes and errors: ``test_specs_config.py``; the state rule: ``test_rules.py``; the extent
pool: ``test_extent_pool.py``; state requests' reservations: ``test_admission.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hybridkv import (BlockRemoved, BlockStored, FullAttention, KVCacheConfig, KVCacheGroup,
                      KVCacheManager, Request, SpecDecode, StateSpec)
from tests.support.helpers import (FA, QWEN3_NEXT, STATE4, ST_K2, SWA, admit, config, prompt, serve,
                                   state_hybrid)
from hybridkv.core.cache_options import CacheOptions


def test_non_lru_eviction_with_a_state_group_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="does not support state groups.*valid with a StateSpec group: 'lru'"):
        KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(eviction_policy="s3fifo"))


SHARED = list(range(1000, 1200))       # a 200-token system prompt


def serve_state(kv: KVCacheManager, rid: str, tokens: list[int], chunk: int | None = None):
    """Admit, prefill (in chunks), free; returns (hit tokens, exported positions)."""
    r = Request(rid, tokens)
    hit = kv.lookup(r)
    exported = []
    first = True
    while r.num_computed_tokens < r.num_tokens or first:
        n = r.num_tokens - max(r.num_computed_tokens, hit.num_tokens if first else 0)
        n = min(n, chunk or n)
        assert kv.allocate(r, n, hit if first else None) is not None
        kv.check_integrity()
        (sb,) = kv.state_blocks(r)
        if first:
            assert len(sb.live) == kv.config.extent_blocks(1)
            assert (sb.restore_position, bool(sb.restore_from)) == (hit.num_tokens, hit.num_tokens > 0)
            r.num_computed_tokens = hit.num_tokens
        exported += [e.position for e in sb.exports]
        assert all(len(e.blocks) == kv.config.extent_blocks(1) for e in sb.exports)
        r.num_computed_tokens += n
        first = False
    kv.free(r)
    kv.check_integrity()
    return hit.num_tokens, exported


@pytest.mark.parametrize("chunk", [None, 48])
def test_200_token_prompt_hits_192_on_the_2nd_request_with_n_64(chunk) -> None:
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(retention_interval=64))
    hit1, exp1 = serve_state(kv, "r1", SHARED + [1] * 50, chunk)
    assert hit1 == 0 and {64, 128, 192} <= set(exp1)
    assert serve_state(kv, "r2", SHARED + [2] * 50, chunk)[0] == 192
    assert kv.num_free_blocks == kv.config.num_blocks - 1


def test_200_token_prompt_with_n_0_hits_on_the_3rd_request() -> None:
    """Semantic checkpoints only: the 2nd request finds the junction (attention hits 192,
    the state nothing) and writes a checkpoint there; the 3rd hits 192 (vLLM 0.33 align
    mode: also the 3rd occurrence, but at 1056-token granularity, so 0 here)."""
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(retention_interval=0))
    assert serve_state(kv, "r1", SHARED + [1] * 50)[0] == 0
    r2 = Request("probe", SHARED + [2] * 50)
    probe = kv.lookup(r2)
    assert probe.num_tokens == 0 and probe.shared_prefix_boundary == 192
    hit2, exp2 = serve_state(kv, "r2", SHARED + [2] * 50)
    assert hit2 == 0 and 192 in exp2
    assert serve_state(kv, "r3", SHARED + [3] * 50)[0] == 192


def test_divergence_inside_request_unique_tokens_still_hits_the_junction() -> None:
    """vLLM #45238: the aligned checkpoints of request 1 (its replay boundaries 224/240) lie
    in its own unique tokens; a request diverging at 205 still reaches the junction 192."""
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(retention_interval=0))
    _, exp1 = serve_state(kv, "r1", SHARED + list(range(50)))
    assert max(exp1) > 200                                  # checkpoints in unique tokens
    assert serve_state(kv, "r2", SHARED + [0, 1, 2, 3, 4] + [9] * 45)[0] == 0   # junction found
    assert serve_state(kv, "r3", SHARED + [7] * 50)[0] == 192


def test_resend_hits_the_replay_checkpoint_and_the_final_length() -> None:
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(retention_interval=0))
    prompt = SHARED + [5] * 56                              # 256 tokens
    serve_state(kv, "r1", prompt)
    assert serve_state(kv, "r2", prompt)[0] == 240                # (P - 1) aligned down
    # the final length 256 is aligned: the live state becomes that checkpoint at free
    assert serve_state(kv, "r3", prompt + [6] * 10)[0] == 256


def test_checkpoints_are_evicted_whole_and_hits_fall_back() -> None:
    """A pool with room for few checkpoints: evicting one leaves the attention blocks cached
    (SGLang's tombstone for free) and the hit falls back to the next lower checkpoint."""
    cfg = state_hybrid(QWEN3_NEXT, num_blocks=66 * 6 + 40)
    kv = KVCacheManager(cfg, CacheOptions(retention_interval=64))
    serve_state(kv, "r1", SHARED + [1] * 50, chunk=48)
    assert serve_state(kv, "r2", SHARED + [2] * 50, chunk=48)[0] == 192
    for i in range(3, 8):                                   # unrelated traffic evicts
        serve_state(kv, f"x{i}", [i * 7919 + j for j in range(200)], chunk=48)
    hit = serve_state(kv, "r9", SHARED + [9] * 50, chunk=48)[0]
    assert hit in (0, 64, 128, 192) and kv.stats().evictions > 0
    kv.check_integrity()


def test_speculative_lookahead_never_exports_a_draft_position() -> None:
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(
        retention_interval=16, spec_decode=SpecDecode("ngram", 3)))
    r = Request("r", list(range(30)))
    assert kv.allocate(r, 30, kv.lookup(r)) is not None
    r.num_computed_tokens = 30
    for step in range(12):
        r.append_tokens([step])
        # a verify step schedules 1 + 3 positions; drafts are not request tokens
        want = [t for t in (r.num_tokens,) if t % 16 == 0]
        assert kv.export_positions(r, 4) == want
        assert kv.allocate(r, 4) is not None
        assert [e.position for e in kv.state_blocks(r)[0].exports] == want
        kv.check_integrity()
        for sb in kv.state_blocks(r):
            assert all(e.position <= r.num_tokens for e in sb.exports)
        r.num_computed_tokens = r.num_tokens          # every draft rejected
    kv.free(r)
    kv.check_integrity()
    assert kv.num_free_blocks == kv.config.num_blocks - 1


def test_export_positions_predict_the_allocation() -> None:
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(retention_interval=64))
    r = Request("r", SHARED + [1] * 50)
    hit = kv.lookup(r)
    assert kv.export_positions(r, 100, hit) == [64]
    kv.allocate(r, 100, hit)
    assert [e.position for e in kv.state_blocks(r)[0].exports] == [64]
    r.num_computed_tokens = 100
    want = kv.export_positions(r, 150)
    assert want == [128, 192, 224, 240]
    kv.allocate(r, 150)
    assert [e.position for e in kv.state_blocks(r)[0].exports] == want
    kv.free(r)
    kv.check_integrity()


def test_preemption_and_no_caching_free_everything() -> None:
    for caching in (True, False):
        kv = KVCacheManager(state_hybrid(QWEN3_NEXT), CacheOptions(
            retention_interval=64, enable_caching=caching))
        r = Request("r", SHARED)
        kv.allocate(r, 100, kv.lookup(r))
        r.num_computed_tokens = 100
        if not caching:
            assert kv.state_blocks(r)[0].exports == ()
        kv.free(r)                                          # preempted mid-prefill
        kv.check_integrity()
        assert kv.num_free_blocks == kv.config.num_blocks - 1


RESTORES: list[int] = []


class FakeEngine:
    """Follows the API of ``KVCacheManager.state_blocks`` literally. A state is the tuple of
    tokens it summarizes, written into every block id of its extent, so a checkpoint that
    was partially reused, restored from the wrong place or exported at a draft position shows
    up as wrong content. Speculative steps verify 1 + k positions and accept a random prefix;
    the live state then holds the accepted tokens only (docs/state-groups.md §2.7, choice (b))."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.content: dict[int, tuple] = {}

    def write(self, blocks, state) -> None:
        for b in blocks:
            self.content[b] = state

    def read(self, blocks) -> tuple:
        states = {self.content.get(b) for b in blocks}
        assert len(states) == 1, f"extent {blocks} holds mixed states: a partial eviction"
        return states.pop()

    def step(self, r: Request, n: int, hit=None, drafts: int = 0, accepted: int = 0) -> bool:
        """Allocate and run n real tokens (+ drafts); returns False if refused."""
        if self.kv.allocate(r, n + drafts, hit) is None:
            return False
        self.kv.check_integrity()
        if hit is not None:
            r.num_computed_tokens = hit.num_tokens
        start = r.num_computed_tokens
        for sb in self.kv.state_blocks(r):
            if sb.restore_from:
                got = self.read(sb.restore_from)
                assert got == tuple(r.token_ids[:sb.restore_position]), "restored a wrong state"
                RESTORES.append(sb.restore_position)
                self.write(sb.live, got)
            elif start == 0:
                self.write(sb.live, ())
            assert self.read(sb.live) == tuple(r.token_ids[:start])
            for e in sb.exports:
                assert start < e.position <= r.num_tokens, "export outside the accepted tokens"
                self.write(e.blocks, tuple(r.token_ids[:e.position]))
            self.write(sb.live, tuple(r.token_ids[:start + n]))
        r.num_computed_tokens = start + n
        return True


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)), min_size=5, max_size=40),
       st.sampled_from([0, 8, 16, None]), st.sampled_from([(4, 20), (8, 40), (1, 9)]),
       st.sampled_from([0, 2]))
def test_fake_engine_always_restores_the_state_of_the_hit_prefix(ops, interval, sizes, k):
    """Random requests sharing prefixes, chunked prefill, decode with speculative verify
    steps (random acceptance), preemption and eviction: every restored checkpoint holds the
    state of exactly the hit's tokens; exports are at accepted positions only."""
    attn_bs, pool = sizes
    state = StateSpec(4 if attn_bs != 1 else 1, conv_shape=(1, 4), state_shape=(4, 4))
    cfg = KVCacheConfig((KVCacheGroup("a", FullAttention(attn_bs, num_kv_heads=1, head_dim=4), ("a",)),
                         KVCacheGroup("s", state, ("s",)), KVCacheGroup("t", state, ("t",))),
                        num_blocks=pool * 6)       # two sibling state groups
    kv = KVCacheManager(cfg, CacheOptions(
        retention_interval=interval, spec_decode=SpecDecode("ngram", k) if k else None))
    eng = FakeEngine(kv)
    running: dict[str, Request] = {}
    prompts = [[7] * 12]
    for i, (op, x) in enumerate(ops):
        if op == 0 or not running:
            base = prompts[x % len(prompts)]
            tokens = base[: x % (len(base) + 1)] + [(x >> s) % 3 for s in range(1 + x % 11)]
            r = Request(f"r{i}", tokens)
            hit = kv.lookup(r)
            if eng.step(r, min(1 + x % 17, r.num_tokens - hit.num_tokens), hit):
                running[r.request_id] = r
                prompts.append(tokens)
        elif op == 1:
            r = running[sorted(running)[x % len(running)]]
            if r.num_computed_tokens < r.num_tokens:
                ok = eng.step(r, min(1 + x % 9, r.num_tokens - r.num_computed_tokens))
            else:                                   # decode / verify: 1 real + k drafts
                r.append_tokens([x % 3])
                ok = eng.step(r, 1, drafts=k)
                acc = x % (k + 1)                   # accepted drafts become real tokens,
                if ok and acc:                      # computed in the same verify step
                    r.append_tokens([(x >> 3) % 3] * acc)
                    r.num_computed_tokens += acc
                    for sb in kv.state_blocks(r):   # the state at the accepted length
                        eng.write(sb.live, tuple(r.token_ids[:r.num_computed_tokens]))
            if not ok:
                kv.free(running.pop(r.request_id))  # preempted
        else:
            kv.free(running.pop(sorted(running)[x % len(running)]))
        kv.check_integrity()
    for r in running.values():
        kv.free(r)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1


def test_fake_engine_run_restores_checkpoints() -> None:
    """The property test above exercises restores (not only cold starts)."""
    RESTORES.clear()
    test_fake_engine_always_restores_the_state_of_the_hit_prefix()
    assert len(RESTORES) > 20 and max(RESTORES) >= 8


def test_sibling_checkpoints_are_evicted_together() -> None:
    """Three sibling state groups (one model's recurrent layers): evicting one group's
    checkpoint evicts the free copies in the others, so no dead third stays cached."""
    full = FullAttention(16, num_kv_heads=2, head_dim=256)
    small = StateSpec(16, conv_shape=(1, 4), state_shape=(64, 128))        # 2 pages per state
    groups = (KVCacheGroup("attn", full, ("a",)),
              *(KVCacheGroup(f"s{i}", small, (f"s{i}",)) for i in range(3)))
    kv = KVCacheManager(KVCacheConfig(groups, num_blocks=120), CacheOptions(
        retention_interval=64, enable_events=True))
    assert kv.pool.siblings == {1: (2, 3), 2: (1, 3), 3: (1, 2)}
    for i in range(12):                      # distinct prompts: checkpoints churn
        r = Request(f"r{i}", [i * 1000 + j for j in range(200)])
        assert kv.allocate(r, 200, kv.lookup(r)) is not None
        r.num_computed_tokens = 200
        kv.free(r)
        kv.check_integrity()
        cached = [set(kv.pool.index[g]) for g in (1, 2, 3)]
        assert cached[0] == cached[1] == cached[2], "a checkpoint survives in only some siblings"
    assert kv.stats().evictions > 0
    compat = KVCacheManager(KVCacheConfig(groups, num_blocks=120), CacheOptions(vllm_compat=True))
    assert compat.pool.siblings == {}        # vLLM evicts block by block


def _state_manager_with_a_served() -> tuple[KVCacheManager, list[int]]:
    """Full (bs 4) + state (bs 4), retention N = 8: "a" (22 tokens, chunks 5, 5, 5, 7)
    leaves checkpoints at 8 and 16 (multiples of N) and 20 (its replay boundary (22-1)//4*4)."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=200), CacheOptions(retention_interval=8))
    A = prompt(100, 22)
    a = Request("a", A)
    hit = kv.lookup(a)
    want = [[], [8], [], [16, 20]]
    for n, w in zip((5, 5, 5, 7), want):
        first = hit if a.num_computed_tokens == 0 else None
        assert kv.export_positions(a, n, first) == w
        assert kv.allocate(a, n, first) is not None
        assert [e.position for e in kv.state_blocks(a)[0].exports] == w
        a.num_computed_tokens += n
    kv.free(a)
    return kv, A


@pytest.mark.parametrize("chunks, want", [((5, 8, 8), ([12], [16, 20], [24])),
                                          ((3, 5, 8), ([], [12, 16], [20, 24]))])
def test_export_positions_predict_every_allocation_after_a_junction_hit(chunks, want) -> None:
    """coordinator: export_positions — the hit's tokens not added to (or subtracted from) the
    computed count, the hit not passed on, or a running request's state ignored (its
    promised junction forgotten): the prediction must equal the exports the allocation asks.

    "b" shares a's first 14 tokens (24 tokens): the full group serves 12, the state group
    only 8 (its checkpoints are 8, 16, 20), so the hit is 8 with junction 12. b's promised
    ends: multiples of 8, the junction 12 (and 12 - 4 = 8), its replay boundary 20 (and 16).
    Chunks 5, 8, 8 from 8: (8, 13] → 12, (13, 21] → 16, 20, (21, 29] ∩ ≤ 24 → 24. Chunks 3, 5,
    8: (8, 11] → none, (11, 16] → 12, 16 (the junction in a running request's step), then 20, 24."""
    kv, A = _state_manager_with_a_served()
    b = Request("b", A[:14] + prompt(500, 10))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (8, 12)
    b.num_computed_tokens = 0
    for i, (n, w) in enumerate(zip(chunks, want)):
        first = hit if i == 0 else None
        assert kv.export_positions(b, n, first) == w
        assert kv.allocate(b, n, first) is not None
        assert [e.position for e in kv.state_blocks(b)[0].exports] == w
        b.num_computed_tokens = (hit.num_tokens if i == 0 else b.num_computed_tokens) + n
        kv.check_integrity()


def test_state_blocks_forget_the_restore_and_the_exports_once_computed() -> None:
    """coordinator: state_blocks — ``restore_position`` reported after the request moved past
    its hit (``st.restore_at if restore`` → always), an export at exactly the computed count
    still listed (``t > computed`` → ``>=``), the unknown-request error without its id.

    After a's checkpoints (8, 16, 20), "b" (a's first 17 tokens + 7) hits 16. Its first
    allocation of 4 tokens (16..20) restores from the checkpoint at 16 and exports 20. Before
    the step: restore at 16, export 20 pending. After computing to 20: no restore (position 0,
    no blocks) and no pending export (20 is not > 20)."""
    kv, A = _state_manager_with_a_served()
    b = Request("b", A[:17] + prompt(500, 7))
    hit = kv.lookup(b)
    assert hit.num_tokens == 16
    assert kv.allocate(b, 4, hit) is not None
    b.num_computed_tokens = 16
    (sb,) = kv.state_blocks(b)
    assert (sb.restore_position, [e.position for e in sb.exports]) == (16, [20])
    assert sb.restore_from and sb.restore_from != sb.live
    b.num_computed_tokens = 20
    (sb,) = kv.state_blocks(b)
    assert (sb.restore_position, sb.restore_from, sb.exports) == (0, (), ())
    with pytest.raises(KeyError, match="'nobody' holds no blocks"):
        kv.state_blocks(Request("nobody", [1, 2, 3]))


def test_export_positions_of_a_new_request_start_at_token_one() -> None:
    """coordinator: _export_ends — a new request without a hit starts from ``done = 1``
    instead of 0: with block size 1 (alignment 1) and retention N = 1 every token is a
    promised end, so the first 3 tokens export 1, 2, 3 (as the allocation does)."""
    st1 = StateSpec(block_size=1, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                    state_dtype="float32")
    kv = KVCacheManager(config(FA(1), st1, num_blocks=400), CacheOptions(retention_interval=1))
    r = Request("r", prompt(10, 6))
    assert kv.export_positions(r, 3) == [1, 2, 3]
    assert kv.allocate(r, 3, None) is not None
    assert [e.position for e in kv.state_blocks(r)[0].exports] == [1, 2, 3]


def test_a_running_state_request_releases_each_checkpoint_once_it_is_below_the_hold() -> None:
    """coordinator: _plan_states — which held checkpoints leave the table (``j < nskip`` with
    ``nskip = skipped_tokens(computed, hold) // a``: the held list ignored, ``<`` → ``<=``, ``//``
    → ``/``, the hold or the computed count dropped, the null test inverted) and how many
    block ids they free (``* k``).

    Full (bs 4) + state (a = 4; a 144-byte state over 64-byte pages: extents of k = 2 block
    ids), retention N = 8, default mode (hold 4). r (40 tokens), steps of 8, 8, 2, 6, 8:
    1. 2 full blocks + the live extent + checkpoint 8: 6 ids; 2. 2 + checkpoint 16: 4;
    3. at 16 computed, tokens below 16 - 4 = 12 are skipped (3 entries): checkpoint 8 (entry
       1) leaves (+2), 1 full block (-1); 4. at 18: 14 // 4 = 3 again, nothing leaves; 1 full
       block + checkpoint 24 (-3); 5. at 24: 20 // 4 = 5: checkpoint 16 (entry 3) leaves (+2),
       2 full blocks + checkpoint 32 (-4)."""
    st = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(4, 8),
                   state_dtype="float32")
    cfg = config(FA(4), st, num_blocks=200)
    assert cfg.extent_blocks(1) == 2
    kv = KVCacheManager(cfg, CacheOptions(retention_interval=8))
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    free = kv.num_free_blocks
    expect = [(6, [0, 1]), (4, [0, 1, 0, 1]), (1 - 2, [0, 0, 0, 1, 0]),
              (3, [0, 0, 0, 1, 0, 1]), (4 - 2, [0, 0, 0, 0, 0, 1, 0, 1])]
    for i, (n, (taken, held)) in enumerate(zip((8, 8, 2, 6, 8), expect)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
        assert [1 if b else 0 for b in kv.block_ids(r)[1]] == held
        assert free - kv.num_free_blocks == taken
        free = kv.num_free_blocks
        kv.check_integrity()


def test_a_state_step_that_fits_only_with_its_released_checkpoint() -> None:
    """coordinator: _plan_states — the released checkpoints' ids counted as available
    (``freed = count * k`` → ``/ k``, or the ``ref == 1`` test inverted).

    The steps 8, 8 of the test above use all 10 usable ids (6 + 4): the third step (2 tokens)
    needs 1 full block with 0 free, and fits only because checkpoint 8 leaves (2 ids)."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=11), CacheOptions(retention_interval=8))
    r = Request("r", prompt(100, 40))
    hit = kv.lookup(r)
    for i, n in enumerate((8, 8)):
        assert kv.allocate(r, n, hit if i == 0 else None) is not None
        r.num_computed_tokens += n
    assert kv.num_free_blocks == 0
    assert kv.allocate(r, 2) is not None
    assert kv.num_free_blocks == 1
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(7, True), (6, False)])
def test_a_new_state_request_needs_its_live_extent_and_its_exports(num_blocks, fits) -> None:
    """coordinator: _plan_states — a new request's ids ``(1 + exports) * k`` (``1`` → ``2``).
    r's first 8 tokens: 2 full blocks, the live extent (2 ids) and checkpoint 8 (2 ids): 6."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=num_blocks), CacheOptions(retention_interval=8))
    r = Request("r", prompt(100, 40))
    assert (kv.allocate(r, 8, kv.lookup(r)) is not None) == fits
    kv.check_integrity()


def test_a_new_state_request_touching_its_hit_counts_each_block_once() -> None:
    """coordinator: _plan_states — the paged estimate of a new request's state group removed
    as ``needed -= new - touched`` (the touched hit blocks counted twice more).

    14 usable ids. "a" (17 tokens) caches full blocks 0..3 and checkpoints 8, 12, 16 and is
    freed; a filler (4 tokens: 1 full block + its live extent) takes 3 uncached ids: 11 free.
    q (a's first 16 tokens + 8) hits 16 (4 full blocks + checkpoint 16, all free). Its first 4
    tokens need 1 full block + 4 touched, the touched checkpoint (2), the live extent (2) and
    checkpoint 20 (its replay boundary; 2): exactly 11."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=15), CacheOptions(retention_interval=8))
    P = prompt(100, 17)
    a = Request("a", P)
    assert kv.allocate(a, 17, kv.lookup(a)) is not None
    a.num_computed_tokens = 17
    kv.free(a)
    f = Request("f", prompt(700, 4))
    assert kv.allocate(f, 4, kv.lookup(f)) is not None
    q = Request("q", P[:16] + prompt(500, 8))
    hit = kv.lookup(q)
    assert hit.num_tokens == 16 and kv.num_free_blocks == 11
    assert kv.allocate(q, 4, hit) is not None
    assert kv.num_free_blocks == 0
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, filler, fits", [(11, 1, True), (12, 5, False)])
def test_a_state_step_counts_the_junction_checkpoint(num_blocks, filler, fits) -> None:
    """coordinator: _plan_states — a running request's export count taken from a stateless
    view (``_export_ends(request, None, ...)``): its promised junction is missed, the plan
    counts one extent too few and the commit overdraws the pool.

    As in the export-positions test (state extents of k = 1 here): b hits 8 with junction 12
    and runs 3 tokens; a filler request holds some blocks. b's next 5 tokens (11 → 16) need
    1 full block and checkpoints 12 (the junction) and 16: 3 ids. With 3 free they fit; with
    2 free the allocation is refused (None), nothing is popped."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=num_blocks), CacheOptions(retention_interval=8))
    A = prompt(100, 22)
    a = Request("a", A)
    hit = kv.lookup(a)
    for n in (5, 5, 5, 7):
        assert kv.allocate(a, n, hit if a.num_computed_tokens == 0 else None) is not None
        a.num_computed_tokens += n
    kv.free(a)
    b = Request("b", A[:14] + prompt(500, 10))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (8, 12)
    assert kv.allocate(b, 3, hit) is not None
    b.num_computed_tokens = 11
    f = Request("f", prompt(900, filler))
    assert kv.allocate(f, filler, kv.lookup(f)) is not None
    assert kv.num_free_blocks == (3 if fits else 2)
    assert kv.export_positions(b, 5) == [12, 16]
    assert (kv.allocate(b, 5) is not None) == fits
    kv.check_integrity()


@pytest.mark.parametrize("final, hit_after, swa_final_run", [(12, 12, True), (14, 8, False)])
def test_free_keeps_the_live_state_only_at_an_aligned_final_length(final, hit_after,
                                                                   swa_final_run) -> None:
    """coordinator: _free_states — the live state becomes the final-length checkpoint only
    when the computed count is aligned (``and`` → ``or`` in its test: a live state after 14
    tokens filed as the checkpoint at 12), and the final length is promised to the other
    groups only if every state group holds that checkpoint (``servable``: test inverted or
    forced true).

    Full (bs 4) + sliding (bs 4, W 8) + state (k = 1), default mode, retention 0. r (10-token
    prompt: boundaries 8 and 4) decodes to ``final`` tokens and is freed. At 12 the live state
    is the checkpoint at 12, the final length 12 is promised, the sliding group caches its
    window run for 12 (positions 1, 2; 1 was cached for the boundary 8, so block 2, tokens
    8..11, is stored at free): the same tokens + 1 then hit 12. At 14 the aligned end
    12 has no checkpoint: nothing is promised at free (no sliding run stored) and the hit is 8."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), STATE4, num_blocks=100), CacheOptions(enable_events=True))
    r = Request("r", prompt(100, 10))
    assert kv.allocate(r, 10, kv.lookup(r)) is not None
    r.num_computed_tokens = 10
    while r.num_tokens < final:
        r.append_tokens([7])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
    kv.take_events()
    kv.free(r)
    stored = [(ev.group_idx, ev.token_ids) for ev in kv.take_events() if isinstance(ev, BlockStored)]
    assert ((1, list(r.token_ids[8:12])) in stored) == swa_final_run
    q = Request("q", list(r.token_ids) + [9])
    assert kv.lookup(q).num_tokens == hit_after
    kv.check_integrity()


STATE1 = StateSpec(block_size=1, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                   state_dtype="float32")


@pytest.mark.parametrize("computed, hit_after", [(1, 1), (2, 2), (3, 3)])
def test_a_state_request_freed_after_its_first_tokens_serves_them(computed, hit_after) -> None:
    """coordinator: _free_states — at free the live state is re-tagged as the checkpoint at
    the final aligned length whenever that length is > 0 (``computed > 0``) and the length is
    then promised to the other groups (``servable = end > 0``); with ``> 1`` a request freed
    after exactly one token would drop its state and serve nothing.

    Full (bs 1) + state (bs 1): alignment 1. Retention N = 8 and a 20-token prompt (replay
    boundaries 19, 18): no promised end below 8, so no checkpoint is exported during the
    first ``computed`` tokens. Freed then, the final length ``computed`` is promised: the
    full group caches its blocks, the state group keeps its live state there, so a new
    request with the same first tokens hits ``computed``."""
    kv = KVCacheManager(config(FA(1), STATE1, num_blocks=100), CacheOptions(retention_interval=8))
    P = prompt(100, 20)
    r = Request("r", P)
    assert kv.allocate(r, computed, kv.lookup(r)) is not None
    assert kv.state_blocks(r)[0].exports == ()
    r.num_computed_tokens = computed
    kv.free(r)
    kv.check_integrity()
    q = Request("q", P[:computed] + prompt(500, 5))
    assert kv.lookup(q).num_tokens == hit_after


def test_a_new_state_request_gets_its_live_extent_and_checkpoint_heads() -> None:
    """coordinator: _commit_states — the new extents' heads are returned per state group (the
    live extent's head, then one per export; ``None`` instead of a head).

    Full (bs 4) + state (a = 4, extents of 2 ids), retention N = 8. r's first 8 tokens: 2
    full blocks, and for the state group its live extent and the checkpoint at 8: the
    allocation returns their heads, the ones ``state_blocks`` reports."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=100), CacheOptions(retention_interval=8))
    r = Request("r", prompt(100, 40))
    got = kv.allocate(r, 8, kv.lookup(r))
    assert got is not None and len(got[0]) == 2
    (sb,) = kv.state_blocks(r)
    assert [e.position for e in sb.exports] == [8]
    assert got[1] == [sb.live[0], sb.exports[0].blocks[0]]
    kv.check_integrity()


def test_the_hit_checkpoint_leaves_the_table_once_below_the_hold() -> None:
    """coordinator: _commit_states — the adopted hit's checkpoint is held at table entry
    ``e - 1`` (e = hit // a), so it is released like the request's own checkpoints once the
    request has moved a hold past it (``e + 1`` / ``e - 2``: it would stay until free).

    Full (bs 4) + state (a = 4, k = 2), retention N = 8, default mode (hold 4). "a" (40
    tokens, computed in steps of 8) leaves checkpoints at 8, 16, 24, 32. "b" shares a's first
    17 tokens: hit 16 (checkpoint 16, entry 3). b computes 4 tokens (16..20), then at 20
    computed 20 - 4 = 16 tokens are skipped: entry 3 leaves the table in b's next step."""
    kv = KVCacheManager(config(FA(4), ST_K2, num_blocks=200), CacheOptions(retention_interval=8))
    A = prompt(100, 40)
    a = Request("a", A)
    hit = kv.lookup(a)
    for i in range(5):
        assert kv.allocate(a, 8, hit if i == 0 else None) is not None
        a.num_computed_tokens += 8
    kv.free(a)
    b = Request("b", A[:17] + prompt(500, 15))
    admit(kv, b, 4, expect_hit=16)
    assert kv.block_ids(b)[1][3] != 0
    assert kv.allocate(b, 4) is not None
    b.num_computed_tokens = 24
    assert kv.block_ids(b)[1][3] == 0
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks, fits", [(12, True), (11, False)])
def test_a_new_state_request_counts_the_checkpoint_at_its_junction(num_blocks, fits) -> None:
    """coordinator: _plan_states — a new request's exports are counted with its hit (its
    junction is one of its promised ends; without the hit the plan misses that checkpoint
    and the commit overdraws the pool).

    Full (bs 4) + state (bs 4, extents of 1 id), retention N = 8. "a" (22 tokens, chunks 5,
    5, 5, 7) leaves checkpoints at 8, 16 and 20 (its replay boundary), 10 ids in all, then
    is freed; f (4 tokens: 1 full block + its live extent) takes 2 of the free ids. "b"
    shares a's first 14 tokens: the full group serves 12, the state group 8, so the hit is
    8 with junction 12. b's first 9 tokens (8..17) need 5 - 2 = 3 full blocks, the 3 free
    hit blocks (touched), and for the state group the live extent and checkpoints 12 and 16:
    9 ids. Free: num_blocks - 1 - 2, so 9 fit with 12 blocks, 8 do not."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=num_blocks), CacheOptions(retention_interval=8))
    A = prompt(100, 22)
    a = Request("a", A)
    hit = kv.lookup(a)
    for n in (5, 5, 5, 7):
        assert kv.allocate(a, n, hit if a.num_computed_tokens == 0 else None) is not None
        a.num_computed_tokens += n
    kv.free(a)
    f = Request("f", prompt(900, 4))
    assert kv.allocate(f, 4, kv.lookup(f)) is not None
    b = Request("b", A[:14] + prompt(500, 10))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (8, 12)
    assert kv.num_free_blocks == num_blocks - 3
    assert kv.export_positions(b, 9, hit) == [12, 16]
    assert (kv.allocate(b, 9, hit) is not None) == fits
    kv.check_integrity()


def test_the_first_step_after_admission_releases_the_hit_checkpoint() -> None:
    """coordinator: commit — only a running request's commit sets its window threshold
    (``slide_until``); a new request keeps 0, so its next step is planned (with the
    threshold set at admission, a quiet step would keep the adopted checkpoint).

    Full (bs 4) + state (bs 4, extents of 1 id), dense retention (no hold): a state group
    keeps only the checkpoint its live state starts from. "a" (21 tokens, steps 8, 8, 5) is
    freed; "b" shares a's first 17 tokens: hit 16 (checkpoint 16, entry 3). b computes 1
    token (to 17); its next token needs no block and caches nothing, but at 17 computed the
    checkpoint at 16 is no longer needed: that step releases it (table entry 3 null, one
    more free block)."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=60), CacheOptions(retention_interval=None))
    A = prompt(100, 21)
    a = Request("a", A)
    hit = kv.lookup(a)
    for i, n in enumerate((8, 8, 5)):
        assert kv.allocate(a, n, hit if i == 0 else None) is not None
        a.num_computed_tokens += n
    kv.free(a)
    b = Request("b", A[:17] + prompt(500, 10))
    admit(kv, b, 1, expect_hit=16)
    assert kv.block_ids(b)[1][3] != 0
    free = kv.num_free_blocks
    assert kv.allocate(b, 1) == [[], []]
    assert kv.block_ids(b)[1][3] == 0 and kv.num_free_blocks == free + 1
    kv.check_integrity()


def test_a_quiet_step_never_reaches_the_next_checkpoint() -> None:
    """coordinator: commit — with state groups the fast path's slot bound is lowered to one
    token below the next checkpoint (``slots = nxt - 1`` when ``nxt - 1 < slots``): the step
    that reaches a checkpoint position is planned, so its extent is allocated and exported.

    Full (bs 4) + state (bs 4, extents of 1 id), retention N = 8, EAGLE without hash
    lookahead (drop mode: an end is cached 4 tokens after it, so the cache pass alone would
    let the step to 8 be quiet). r (20 tokens) is admitted with 5 tokens + 3 lookahead slots
    (tables cover 8), then steps one token at a time without lookahead: the step 7 → 8
    allocates the checkpoint extent for 8 and exports it."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=60), CacheOptions(
        retention_interval=8, spec_decode=SpecDecode("eagle", 1, hash_lookahead=False)))
    r = Request("r", prompt(100, 20))
    admit(kv, r, 5, num_lookahead_tokens=3)
    for t in (5, 6):
        assert kv.allocate(r, 1, num_lookahead_tokens=0) == [[], []]
        r.num_computed_tokens += 1
    got = kv.allocate(r, 1, num_lookahead_tokens=0)
    assert got is not None and got[0] == [] and len(got[1]) == 1
    assert [e.position for e in kv.state_blocks(r)[0].exports] == [8]
    kv.check_integrity()


def test_state_groups_refuse_other_eviction_policies_naming_the_valid_one() -> None:
    """__init__ — the message's valid value ('lru') and the StateSpec name."""
    cfg = KVCacheConfig((KVCacheGroup("a", FA(4), ("a",)),
                         KVCacheGroup("s", StateSpec(4, conv_shape=(1, 8), state_shape=(1, 8)), ("s",))),
                        num_blocks=16)
    with pytest.raises(ValueError, match=r"^eviction_policy 'lfu' does not support state groups "
                       r"\(recurrent layers\) yet; valid with a \bStateSpec\b group: 'lru'$"):
        KVCacheManager(cfg, CacheOptions(eviction_policy="lfu"))


def _state_config(num_blocks: int):
    """Full attention (bs 4) and two state groups with the same spec (one lookup unit:
    siblings), each state taking one block id (48 B of state, 128 B pages)."""
    st = StateSpec(4, conv_shape=(1, 8), state_shape=(1, 8))
    return KVCacheConfig((KVCacheGroup("a", FA(4), ("a",)), KVCacheGroup("s1", st, ("s1",)),
                          KVCacheGroup("s2", st, ("s2",))), num_blocks=num_blocks)


def test_evictions_of_a_state_config_are_reported() -> None:
    """__init__ — the extent pool built without the eviction callback: no BlockRemoved event for
    any eviction of a config with a state group.

    9 usable blocks; two different 9-token prompts: the second evicts cached blocks of the
    first, and every eviction is reported."""
    kv = KVCacheManager(_state_config(10), CacheOptions(enable_events=True))
    serve(kv, "a", prompt(0, 9))
    serve(kv, "b", prompt(100, 9))
    removed = [e for e in kv.take_events() if isinstance(e, BlockRemoved)]
    assert kv.stats().evictions > 0
    assert sum(len(e.block_hashes) for e in removed) == kv.stats().evictions


def test_sibling_state_checkpoints_are_evicted_together() -> None:
    """__init__ — the siblings of a two-group unit not wired (``> 2``): evicting one state
    group's checkpoint left its sibling's copy cached (dead: the unit's hit needs both).

    9 usable blocks; an 8-token prompt caches checkpoints in both state groups; a 5-token
    prompt then evicts some: each state checkpoint hash removed from one group is removed
    from the other in the same step."""
    kv = KVCacheManager(_state_config(10), CacheOptions(enable_events=True))
    serve(kv, "a", prompt(0, 8))
    kv.take_events()
    serve(kv, "b", prompt(100, 5))
    removed = {1: set(), 2: set()}
    for e in kv.take_events():
        if isinstance(e, BlockRemoved) and e.group_idx in removed:
            removed[e.group_idx].update(e.block_hashes)
    assert removed[1] and removed[1] == removed[2]
