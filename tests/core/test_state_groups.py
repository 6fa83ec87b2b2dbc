"""State groups (recurrent layers: gated delta net, Mamba2): spec bytes and errors, the hit
rule against a brute force, pool extents against a byte model, and the manager scenarios of
docs/state-groups.md §2.5 (the 200-token system prompt, the shared-prefix junction, #45238)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request, SpecDecode
from hybridkv.core.extent_pool import ExtentBlockPool
from hybridkv.core.rules import StateRule, make_rule
from hybridkv.core.specs import StateSpec
from tests.support.oracle import needed_blocks
from tests.support.helpers import NEMOTRON_H, QWEN3_NEXT, state_hybrid


# ---- step 1: bytes and errors -------------------------------------------------------------
def test_state_bytes_match_the_hand_computed_sizes() -> None:
    # conv 3 x 8192 bf16 = 49,152 B + state 32 x 128 x 128 fp32 = 2,097,152 B
    assert QWEN3_NEXT.page_size_bytes == 2_146_304
    # conv 3 x 10240 bf16 = 61,440 B + state 128 x 64 x 128 fp32 = 4,194,304 B
    assert NEMOTRON_H.page_size_bytes == 4_255_744
    assert QWEN3_NEXT.bytes_per_token == 0
    cfg = state_hybrid(QWEN3_NEXT)
    # attention page: 16 tokens x 2 heads x 256 x 2 (K, V) x 2 B = 32,768 B -> 66 pages
    assert cfg.max_page_bytes == 32_768
    assert cfg.extent_blocks(1) == 66 and cfg.extent_blocks(0) == 1
    # vLLM-compat-like layout: a 1056-token attention page holds one state (k = 1)
    assert state_hybrid(StateSpec(1056, conv_shape=QWEN3_NEXT.conv_shape, state_shape=QWEN3_NEXT.state_shape),
                  attn_bs=1056).extent_blocks(1) == 1


@pytest.mark.parametrize("field", ["state_dtype", "conv_dtype"])
@pytest.mark.parametrize("dtype", ["fp8", "float8_e4m3fn", "int8", "fp4", "nonsense"])
def test_unsupported_state_dtype_is_a_clear_error(field, dtype) -> None:
    with pytest.raises(ValueError, match=rf"StateSpec.{field} '{dtype}' is not supported for a "
                                         r"recurrent state; valid dtypes: bfloat16, float16, float32"):
        StateSpec(16, **{field: dtype})


@pytest.mark.parametrize("shape", [(), (0, 3), (2, -1), "ab", None])
def test_bad_state_shape_is_a_clear_error(shape) -> None:
    with pytest.raises(ValueError, match="state_shape must be a non-empty tuple of positive integers"):
        StateSpec(16, state_shape=shape)


def test_state_larger_than_the_pool_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"state group 'gdn' stores 2146304 B of state per layer, "
                                         r"66 blocks of 32768 B page each; one request needs 133 "
                                         r"blocks but the pool has 99 usable blocks; give "
                                         r"num_blocks >= 134"):
        KVCacheManager(state_hybrid(QWEN3_NEXT, num_blocks=100))
    KVCacheManager(state_hybrid(QWEN3_NEXT, num_blocks=134))       # the minimum it names works


def test_retention_interval_not_a_multiple_of_the_alignment_is_a_clear_error() -> None:
    cfg = state_hybrid(QWEN3_NEXT)
    with pytest.raises(ValueError, match=r"multiple of the scheduler block size \(16, the LCM of "
                                         r"the group block sizes\), got 50"):
        KVCacheManager(cfg, retention_interval=50)
    for n in (0, 16, 64, 1024, None):
        KVCacheManager(cfg, retention_interval=n)


def test_non_lru_eviction_with_a_state_group_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="does not support state groups.*valid with a StateSpec group: 'lru'"):
        KVCacheManager(state_hybrid(QWEN3_NEXT), eviction_policy="s3fifo")


# ---- step 2: the hit rule ------------------------------------------------------------------
def test_state_spec_is_registered_to_the_state_rule() -> None:
    rule = make_rule(QWEN3_NEXT)
    assert isinstance(rule, StateRule) and rule.kind == "state" and not rule.downward_closed
    assert [rule.lo(e) for e in (1, 2, 9)] == [0, 1, 8]
    assert rule.window is None and rule.chunk is None


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.sets(st.integers(0, 40)), st.integers(0, 41),
       st.sampled_from([1, 2, 3, 4]))
def test_longest_hit_is_the_largest_checkpoint_at_an_aligned_end(bs, checkpoints, e_max, step):
    """Brute force from the definition: the largest e <= e_max, a multiple of step, with a
    checkpoint at exactly e * bs tokens (= block e - 1), each block probed at most once."""
    spec = StateSpec(bs, conv_shape=(1, 4), state_shape=(2, 2))
    rule = make_rule(spec)
    probed: list[int] = []

    def probe(j: int) -> bool:
        probed.append(j)
        return j in checkpoints

    want = max((e for e in range(step, e_max + 1, step) if e - 1 in checkpoints), default=0)
    assert rule.longest_hit(probe, e_max, step) == want
    assert len(probed) == len(set(probed))
    # the independent oracle's statement of the rule agrees (one block: t / a - 1)
    cfg = KVCacheConfig((KVCacheGroup("s", spec, ("l",)),), num_blocks=64)
    for e in range(1, 6):
        assert list(needed_blocks(cfg, 0, e * bs, False)) == [e - 1] == list(range(*rule.span(e)))


def test_release_and_sizing() -> None:
    rule = make_rule(StateSpec(16))
    assert rule.skipped_tokens(100) == 100 and rule.skipped_tokens(100, hold=16) == 84
    # brute force: the first c' > c whose skipped block count grows
    for c in range(0, 80):
        for hold in (0, 16, 32):
            first = next(x for x in range(c + 1, c + 200)
                         if rule.skipped_tokens(x, hold) // 16 > rule.skipped_tokens(c, hold) // 16)
            assert rule.next_skip_growth(c, hold) == first
    assert rule.max_blocks(1000, hold=16) == 1 + 3     # live + (hold window + 2) checkpoints
    assert rule.recompute_cost(5) == 16                # the tokens since the previous checkpoint
    assert rule.attention_keys(10, 500) == 10          # one state update per token


# ---- step 3: extents in the pool -----------------------------------------------------------
class ExtentPoolMachine(RuleBasedStateMachine):
    """The pool against a brute-force byte model: which ids are free (bytes = count x block
    bytes), which extents exist with which tails, which are cached; check() after every step."""

    BLOCK_BYTES = 4096

    @initialize(n=st.integers(8, 30), siblings=st.booleans())
    def setup(self, n, siblings):
        self.pool = ExtentBlockPool(n, 2)
        if siblings:                                  # groups 0 and 1 serve hits together
            self.pool.siblings = {0: (1,), 1: (0,)}
        self.n = n
        self.ref: dict[int, int] = {}                 # referenced ids -> model ref count
        self.extents: dict[int, tuple[int, ...]] = {}  # head -> tails (model)
        self.cached: set[int] = set()                 # hashed ids (heads or plain blocks)
        self.hash_of: dict[int, tuple[int, bytes]] = {}  # cached id -> (group, hash)

    def free_blocks(self) -> int:
        tails = {x for t in self.extents.values() for x in t}
        held = sum(1 for h in self.ref if h not in tails)
        return self.n - 1 - held - sum(len(self.extents[h]) for h in self.ref if h in self.extents)

    def _took(self, ids):
        """ids were just handed out: every cached extent that lost a block lost all of them;
        with siblings, an evicted hash leaves no free copy in the other group."""
        for b in ids:
            assert b not in self.ref, f"block {b} handed out while referenced"
        gone = set(ids)
        bh = self.pool.block_hash
        evicted = {b for b in self.cached if b >= len(bh) or bh[b] is None}
        for b in evicted:
            assert b not in self.ref, f"referenced block {b} lost its hash"
            assert b in gone or self.pool.siblings, f"block {b} evicted without being handed out"
            g, h = self.hash_of[b]
            last = not any(self.hash_of[x] == (g, h) for x in self.cached - evicted - gone)
            if self.pool.siblings and last:            # the group's last copy went
                for b2, (g2, h2) in self.hash_of.items():
                    if g2 != g and h2 == h and b2 not in self.ref and b2 not in evicted:
                        raise AssertionError(f"free sibling copy {b2} of an evicted checkpoint stays")
        for h in list(self.extents):
            blocks = {h, *self.extents[h]}
            if h not in self.ref and (blocks & gone or h in evicted):
                assert h in gone or h in evicted, f"extent {h} partially evicted"
                del self.extents[h]
        self.cached -= gone | evicted
        for b in gone | evicted:
            self.hash_of.pop(b, None)

    @rule(n=st.integers(1, 6))
    def allocate(self, n):
        if n > self.pool.num_free:
            with pytest.raises(ValueError):
                self.pool.allocate(n)
            return
        ids = self.pool.allocate(n)
        assert len(ids) == len(set(ids)) == n
        self._took(ids)
        for b in ids:
            self.ref[b] = 1

    @rule(k=st.integers(1, 9))
    def allocate_extent(self, k):
        if k > self.pool.num_free:
            return
        head = self.pool.allocate_extent(k)
        ext = self.pool.extent(head)
        assert len(ext) == k == len(set(ext)) and ext[0] == head
        self._took(ext)
        self.ref[head] = 1
        if k > 1:
            self.extents[head] = ext[1:]

    @rule(data=st.data(), g=st.integers(0, 1), h=st.integers(0, 2))
    def hash_one(self, data, g, h):
        held = sorted(b for b in self.ref if b not in self.cached)
        if held:
            b = data.draw(st.sampled_from(held))
            self.pool.insert(g, b"h%d" % h, b)        # few hashes: siblings share them
            self.cached.add(b)
            self.hash_of[b] = (g, b"h%d" % h)

    @rule(data=st.data())
    def free_one(self, data):
        if self.ref:
            b = data.draw(st.sampled_from(sorted(self.ref)))
            self.pool.free([b])
            self.ref[b] -= 1
            if not self.ref[b]:
                del self.ref[b]
                if b not in self.cached:
                    self.extents.pop(b, None)       # an unhashed extent dissolves

    @rule(data=st.data())
    def touch_one(self, data):
        live = sorted(self.ref) + sorted(self.cached - set(self.ref))
        if live:
            b = data.draw(st.sampled_from(live))
            before = self.pool.extent(b)
            self.pool.touch([b])
            assert self.pool.extent(b) == before    # a hit keeps its checkpoint intact
            self.ref[b] = self.ref.get(b, 0) + 1

    @invariant()
    def agrees(self):
        if not hasattr(self, "pool"):
            return
        self.pool.check()
        assert self.pool.num_free == self.free_blocks()
        assert self.pool.num_free * self.BLOCK_BYTES == self.free_blocks() * self.BLOCK_BYTES
        for h, tails in self.extents.items():
            assert self.pool.extent(h) == (h, *tails)
        assert {b for b in self.cached} == {b for b in range(1, self.n)
                                             if b < len(self.pool.block_hash) and self.pool.block_hash[b]}


TestExtentPool = ExtentPoolMachine.TestCase
TestExtentPool.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


# ---- step 4: the manager ---------------------------------------------------------------------
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
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), retention_interval=64)
    hit1, exp1 = serve_state(kv, "r1", SHARED + [1] * 50, chunk)
    assert hit1 == 0 and {64, 128, 192} <= set(exp1)
    assert serve_state(kv, "r2", SHARED + [2] * 50, chunk)[0] == 192
    assert kv.num_free_blocks == kv.config.num_blocks - 1


def test_200_token_prompt_with_n_0_hits_on_the_3rd_request() -> None:
    """Semantic checkpoints only: the 2nd request finds the junction (attention hits 192,
    the state nothing) and writes a checkpoint there; the 3rd hits 192 (vLLM 0.33 align
    mode: also the 3rd occurrence, but at 1056-token granularity, so 0 here)."""
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), retention_interval=0)
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
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), retention_interval=0)
    _, exp1 = serve_state(kv, "r1", SHARED + list(range(50)))
    assert max(exp1) > 200                                  # checkpoints in unique tokens
    assert serve_state(kv, "r2", SHARED + [0, 1, 2, 3, 4] + [9] * 45)[0] == 0   # junction found
    assert serve_state(kv, "r3", SHARED + [7] * 50)[0] == 192


def test_resend_hits_the_replay_checkpoint_and_the_final_length() -> None:
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), retention_interval=0)
    prompt = SHARED + [5] * 56                              # 256 tokens
    serve_state(kv, "r1", prompt)
    assert serve_state(kv, "r2", prompt)[0] == 240                # (P - 1) aligned down
    # the final length 256 is aligned: the live state becomes that checkpoint at free
    assert serve_state(kv, "r3", prompt + [6] * 10)[0] == 256


def test_checkpoints_are_evicted_whole_and_hits_fall_back() -> None:
    """A pool with room for few checkpoints: evicting one leaves the attention blocks cached
    (SGLang's tombstone for free) and the hit falls back to the next lower checkpoint."""
    cfg = state_hybrid(QWEN3_NEXT, num_blocks=66 * 6 + 40)
    kv = KVCacheManager(cfg, retention_interval=64)
    serve_state(kv, "r1", SHARED + [1] * 50, chunk=48)
    assert serve_state(kv, "r2", SHARED + [2] * 50, chunk=48)[0] == 192
    for i in range(3, 8):                                   # unrelated traffic evicts
        serve_state(kv, f"x{i}", [i * 7919 + j for j in range(200)], chunk=48)
    hit = serve_state(kv, "r9", SHARED + [9] * 50, chunk=48)[0]
    assert hit in (0, 64, 128, 192) and kv.stats().evictions > 0
    kv.check_integrity()


def test_speculative_lookahead_never_exports_a_draft_position() -> None:
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), retention_interval=16,
                        spec_decode=SpecDecode("ngram", 3))
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
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT), retention_interval=64)
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
        kv = KVCacheManager(state_hybrid(QWEN3_NEXT), retention_interval=64, enable_caching=caching)
        r = Request("r", SHARED)
        kv.allocate(r, 100, kv.lookup(r))
        r.num_computed_tokens = 100
        if not caching:
            assert kv.state_blocks(r)[0].exports == ()
        kv.free(r)                                          # preempted mid-prefill
        kv.check_integrity()
        assert kv.num_free_blocks == kv.config.num_blocks - 1


# ---- the engine contract, end to end: a fake engine whose "state" is the tokens it has seen --
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
    kv = KVCacheManager(cfg, retention_interval=interval, spec_decode=SpecDecode("ngram", k) if k else None)
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
    kv = KVCacheManager(KVCacheConfig(groups, num_blocks=120), retention_interval=64,
                        enable_events=True)
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
    compat = KVCacheManager(KVCacheConfig(groups, num_blocks=120), vllm_compat=True)
    assert compat.pool.siblings == {}        # vLLM evicts block by block
