"""Allocation (``core/coordinator/allocate.py``): a pure plan plus a commit, and the decode fast
path.

* a plan changes nothing, and its counts are exactly what the commit then does to the pool; a
  stale or foreign plan is refused;
* the fast paths are exact: a manager that never takes them (every step planned and
  committed, every cache pass walked; no cache-only shortcut) behaves identically, step by
  step, whether the lookahead is implicit or passed explicitly; where the fast path must stop
  (a window release, a lookahead slot that needs a block, EAGLE drop mode's block boundary);
* a step's slots (lookahead included) are capped at ``max_model_len``, and a step past it is
  refused changing nothing; a failed allocation changes nothing in default mode and releases
  the out-of-window blocks first in compat mode, as vLLM;
* waiting requests plan as if nothing were memoized.
The admission reservation (``full_sequence_must_fit``): ``test_admission.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridkv import ChunkedLocal, KVCacheManager, Request, SpecDecode
from hybridkv.core.coordinator import AllocationPlan, GroupPlan
from hybridkv.core.coordinator.allocate import _PLAN
from tests.support.helpers import FA, SWA, admit, config, manager, prompt, serve
from tests.support.random_ops import configs
from hybridkv.core.cache_options import CacheOptions


def observable(kv: KVCacheManager, running: dict, prompts: list) -> tuple:
    """Everything a caller can observe: tables, free count, counters, and every hit."""
    tables = {rid: kv.block_ids(r) for rid, r in sorted(running.items())}
    hits = []
    for i, p in enumerate(prompts + [list(r.token_ids) for _, r in sorted(running.items())]):
        h = kv.lookup(Request(f"probe{i}", p))
        hits.append((h.num_tokens, h.block_ids))
    return tables, kv.num_free_blocks, kv.stats(), hits


class Driver:
    """Runs one random operation sequence on a manager (optionally with the fast path off)."""

    def __init__(self, cfg, retention, spec, compat, fast: bool, explicit: bool) -> None:
        self.kv = KVCacheManager(cfg, CacheOptions(
            retention_interval=retention, spec_decode=spec, vllm_compat=compat,
            enable_events=True, hash_seed="fast-vs-planned"))
        if not fast:
            # the reference: every step planned and committed, every cache pass walked
            coord = self.kv.coordinator
            coord.steps_quiet = lambda reqs, nums, la: [False] * min(len(reqs), len(nums))
            coord.step = lambda *a: _PLAN       # the manager validates, plans and commits

            def planned(request, n, hit, lookahead, external=None, reserve_tokens=0):
                plan = coord.plan(request, n, hit, lookahead, external, reserve_tokens)
                if not plan.fits and coord.compat and not plan.new_request \
                        and any(gp.released for gp in plan.groups):
                    coord.epoch += 1            # vLLM: a failed step still frees its window
                    coord._release(request, coord.reqs[request.request_id], plan.num_computed,
                                   [gp.released for gp in plan.groups])
                    coord.reqs[request.request_id].slide_until = 0
                return coord.commit(request, plan) if plan.fits else None

            coord.allocate = planned
            cache = coord.cache

            def walk(request, num_tokens, final=False):
                state = coord.reqs[request.request_id]
                state.quiet_until = 0
                cache(request, num_tokens, final)
                state.quiet_until = 0       # commit's own skip below it never fires either

            coord.cache = walk
        self.explicit = explicit
        self.running: dict[str, Request] = {}
        self.prompts: list[list[int]] = []
        self.n = 0

    def op(self, op: int, x: int) -> None:
        kv = self.kv
        if op <= 1 or not self.running:
            base = self.prompts[x % len(self.prompts)] if self.prompts and x % 3 else []
            tokens = base[: (x // 7) % (len(base) + 1)] + [(x >> k) % 5 for k in range(1 + x % 13)]
            req = Request(f"r{self.n}", tokens)
            self.n += 1
            hit = kv.lookup(req)
            n = min(1 + x % 40, req.num_tokens - hit.num_tokens)
            if kv.allocate(req, n, hit) is not None:
                req.num_computed_tokens = hit.num_tokens + n
                self.running[req.request_id] = req
                self.prompts.append(tokens)
        elif op <= 4:
            req = self.running[sorted(self.running)[x % len(self.running)]]
            if req.num_computed_tokens < req.num_tokens:
                n = min(5, req.num_tokens - req.num_computed_tokens)
            else:
                req.append_tokens([x % 5])
                n = 1
            la = None
            if self.explicit and x % 2:
                la = kv.lookahead_slots if x % 4 == 1 else x % 3
            if kv.allocate(req, n, None, la) is None:
                kv.free(self.running.pop(req.request_id))
            else:
                req.num_computed_tokens += n
        else:
            kv.free(self.running.pop(sorted(self.running)[x % len(self.running)]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), min_size=1, max_size=50),
       st.booleans())
def test_fast_path_is_exact(cfg_args, ops, explicit) -> None:
    """With and without the fast paths (the quiet step, and a running request's step applied
    without a plan record), every observable result is identical after every step, the KV
    events (stored and removed blocks, in order) included (explicit lookahead included: any
    non-negative value is safe, not only the configured one)."""
    cfg, retention, spec, compat = cfg_args
    fast = Driver(cfg, retention, spec, compat, fast=True, explicit=explicit)
    slow = Driver(cfg, retention, spec, compat, fast=False, explicit=explicit)
    for op, x in ops:
        fast.op(op, x)
        slow.op(op, x)
        assert fast.kv.take_events() == slow.kv.take_events()
        assert observable(fast.kv, fast.running, fast.prompts) == \
            observable(slow.kv, slow.running, slow.prompts)
        fast.kv.check_integrity()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), min_size=1, max_size=40))
def test_plan_is_pure_and_counts_what_commit_does(cfg_args, ops) -> None:
    cfg, retention, spec, compat = cfg_args
    d = Driver(cfg, retention, spec, compat, fast=True, explicit=False)
    kv, coord = d.kv, d.kv.coordinator
    for op, x in ops:
        d.op(op, x)
        for rid, req in sorted(d.running.items()):
            la = x % 3
            before = observable(kv, d.running, d.prompts)
            plan = coord.plan(req, 1 + x % 9, None, la)
            assert isinstance(plan, AllocationPlan) and all(isinstance(g, GroupPlan) for g in plan.groups)
            # records are built positionally (tuple.__new__): every field must be there
            assert len(plan) == len(AllocationPlan._fields)
            assert all(len(g) == len(GroupPlan._fields) for g in plan.groups)
            assert observable(kv, d.running, d.prompts) == before        # planning changes nothing
            assert plan.num_available == kv.num_free_blocks + sum(g.freed for g in plan.groups)
            if plan.fits and req.num_computed_tokens + 1 + x % 9 <= req.num_tokens:
                free = kv.num_free_blocks
                new = coord.commit(req, plan)
                assert [len(ids) for ids in new] == [g.new_blocks for g in plan.groups]
                assert kv.num_free_blocks == free - plan.num_needed + sum(g.freed for g in plan.groups)
                req.num_computed_tokens += 1 + x % 9
                kv.check_integrity()
            break


def test_stale_or_foreign_plan_is_refused() -> None:
    kv = KVCacheManager(config(FA(4), num_blocks=20), CacheOptions(retention_interval=None))
    a, b = Request("a", list(range(10))), Request("b", list(range(10)))
    kv.lookup(a)
    kv.lookup(b)
    plan_a = kv.coordinator.plan(a, 10, None, 0)
    plan_b = kv.coordinator.plan(b, 10, None, 0)
    with pytest.raises(ValueError, match="stale allocation plan for request 'b'"):
        kv.coordinator.commit(b, plan_a)
    kv.coordinator.commit(a, plan_a)
    with pytest.raises(ValueError, match="stale allocation plan"):
        kv.coordinator.commit(b, plan_b)                 # planned before a's commit
    big = kv.coordinator.plan(b, 100, None, 0)
    assert not big.fits and big.num_needed == 25 and big.num_available == 16
    with pytest.raises(ValueError, match=r"needs 25 blocks \(\+0 reserved\) but 16 are available"):
        kv.coordinator.commit(b, big)
    kv.check_integrity()


def test_a_step_past_a_c_integer_does_not_fit_in_either_build() -> None:
    """allocate: a running request's step of 2**62 or 2**64 new tokens or lookahead slots (the
    compiled fast-path test reads counts as C integers: one past them is "not quiet", never
    an OverflowError) is planned like any step: it does not fit (None) and nothing changes
    (3 blocks of 16 per group hold the 40-token prompt); the next steps fit: 41 tokens in
    the 48 slots (no block), then 50 (one block per group)."""
    kv = manager(FA(16), SWA(16, 64), num_blocks=20)
    r = Request("r", prompt(0, 40))
    assert kv.allocate(r, 40, kv.lookup(r)) is not None
    r.num_computed_tokens = 40
    free = kv.pool.num_free
    for n in (2**62, 2**64):
        assert kv.coordinator.step_is_quiet(r, n, 0) is False
        assert kv.coordinator.step_is_quiet(r, 1, n) is False
        assert kv.allocate(r, n, None) is None
        assert kv.allocate(r, 1, None, n) is None
        assert kv.pool.num_free == free
        assert [len(t) for t in kv.coordinator.reqs["r"].tables] == [3, 3]
    assert kv.allocate(r, 1, None) == [[], []]
    r.num_computed_tokens = 41
    assert [len(b) for b in kv.allocate(r, 9, None)] == [1, 1]
    assert kv.pool.num_free == free - 2
    kv.check_integrity()


def test_drop_mode_decode_takes_the_fast_path() -> None:
    """EAGLE drop mode: a decode step between block boundaries commits nothing (it used to
    plan and cache every step: the proof block delayed each promised end by one block)."""
    for compat in (True, False):
        kv = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=200, drafts=(0,)), CacheOptions(
            spec_decode=SpecDecode("eagle", 3, hash_lookahead=False), retention_interval=None,
            vllm_compat=compat))
        commits = 0
        commit = kv.coordinator.commit

        def counting(*a, **k):
            nonlocal commits
            commits += 1
            return commit(*a, **k)

        kv.coordinator.commit = counting
        r = Request("r", list(range(100)))
        assert kv.allocate(r, 100, kv.lookup(r)) is not None
        r.num_computed_tokens = 100
        for i in range(320):
            r.append_tokens([i % 7])
            assert kv.allocate(r, 1, None, 3 if i % 2 else None) is not None
            r.num_computed_tokens += 1
        kv.check_integrity()
        # one new block per 16 tokens in each group, and the cache/slide points in between
        assert commits <= 1 + 3 * 320 // 16, commits


def _has_state(cfg_args) -> bool:
    from hybridkv.core.specs import StateSpec
    return any(isinstance(g.spec, StateSpec) for g in cfg_args[0].groups)


@pytest.mark.parametrize("cfgs", [configs(), configs().filter(_has_state)], ids=["any", "state"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), min_size=1,
                                    max_size=40))
def test_waiting_requests_plan_as_if_nothing_were_memoized(cfgs, data, ops) -> None:
    """A scheduler looks a waiting request up once and plans its admission with that hit every
    step; the coordinator memoizes per request what it counted of the hit's blocks
    (``_evictable_counts``, valid while ``free_version`` holds). After any sequence of
    admissions, steps and frees, a waiting request's plan must equal the plan of a twin
    request with the same tokens and a copy of the hit (counted afresh), for every pool class
    (state groups use ExtentBlockPool)."""
    import dataclasses

    cfg, retention, spec, compat = data.draw(cfgs, label="config")
    d = Driver(cfg, retention, spec, compat, fast=True, explicit=False)
    kv, coord = d.kv, d.kv.coordinator
    waiting: list = []
    fields = [f for f in AllocationPlan._fields if f not in ("request_id", "hit")]
    for i, (op, x) in enumerate(ops):
        d.op(op, x)
        if d.prompts and x % 3 == 0 and len(waiting) < 4:
            req = Request(f"w{i}", d.prompts[x % len(d.prompts)] + [x % 5])
            waiting.append((req, kv.lookup(req)))
        for req, hit in waiting:
            n = req.num_tokens - hit.num_tokens
            twin = Request(f"{req.request_id}-twin", list(req.token_ids))
            kv.lookup(twin)                      # gives the twin its block hashes
            copy = dataclasses.replace(hit, block_ids=tuple([*hit.block_ids]),
                                       request_id=twin.request_id)
            try:
                memo = coord.plan(req, n, hit, 0)
            except ValueError as exc:            # a stale hit is refused: so is its copy
                with pytest.raises(ValueError):
                    coord.plan(twin, n, copy, 0)
                assert "stale" in str(exc)
                continue
            fresh = coord.plan(twin, n, copy, 0)
            assert [getattr(memo, f) for f in fields] == [getattr(fresh, f) for f in fields]


def test_a_running_request_given_its_empty_hit_again_grows_as_without_it() -> None:
    """coordinator: plan — the hit's tokens are added to the computed count
    (``computed += hit.num_tokens``; ``=`` would restart a running request at 0 tokens).

    A running request may be passed an empty hit (the manager refuses only a non-empty one).
    Full (bs 4), nothing cached: r's lookup hits 0. Allocated 8 tokens (2 blocks) and
    computed, its next 4 tokens with that empty hit need a third block, exactly as without
    it (slots 12 → 3 blocks)."""
    kv = KVCacheManager(config(FA(4), num_blocks=10))
    r = Request("r", prompt(100, 12))
    hit = admit(kv, r, 8)
    got = kv.allocate(r, 4, hit)
    assert got is not None and len(got[0]) == 1
    assert len(kv.block_ids(r)[0]) == 3
    kv.check_integrity()


def test_the_slots_of_a_step_are_capped_at_max_model_len() -> None:
    """coordinator: plan — ``slots`` (scheduled tokens + lookahead slots) capped at
    max_model_len (``slots = len_cap``; ``None`` crashes): the table never covers a position
    past the model's length.

    Full (bs 4), EAGLE with 2 speculative tokens (2 lookahead slots), max_model_len 20. A
    20-token prompt allocated at once: min(20 + 2, 20) = 20 slots, 5 blocks (not 6)."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), CacheOptions(
        spec_decode=SpecDecode("eagle", 2), max_model_len=20))
    r = Request("r", prompt(100, 20))
    got = kv.allocate(r, 20, kv.lookup(r))
    assert got is not None and len(got[0]) == 5
    kv.check_integrity()


def test_a_new_request_allocated_without_a_lookup() -> None:
    """coordinator: allocate / commit / plan — a new request with no hit and no lookup before
    (no memo entry to drop, no hit to verify, no fast path): 3 blocks for 9 tokens, the full
    blocks cached (a later lookup of the same prompt hits 8)."""
    kv = KVCacheManager(config(FA(4), num_blocks=10))
    r = Request("r", prompt(100, 9))
    got = kv.allocate(r, 9)
    assert got is not None and len(got[0]) == 3
    r.num_computed_tokens = 9
    assert kv.lookup(Request("q", prompt(100, 9))).num_tokens == 8
    kv.check_integrity()


def test_a_failed_default_mode_step_changes_nothing_even_when_the_window_slides() -> None:
    """coordinator: allocate — only compat mode frees the blocks that left the window when an
    allocation fails (vLLM's order); in default mode a failed allocation changes nothing
    (``and`` → ``or`` would release them in default mode too).

    One sliding group (bs 4, W 5), dense retention (no hold), 3 usable blocks. r (16 tokens)
    holds 2 blocks after 8 tokens (1 free). Its next 4 tokens with the full-sequence
    reservation: block 0 leaves the window, 1 new block, and the peak is min(cdiv(16, 4),
    cdiv(5, 4) + 2) = 4 blocks, 2 held after the step: 1 + 2 reserved > 1 free + 1 released.
    Refused, r keeps block 0 and the free count is unchanged."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=4), CacheOptions(retention_interval=None))
    r = Request("r", prompt(100, 16))
    admit(kv, r, 8)
    before = kv.block_ids(r)
    assert kv.num_free_blocks == 1 and before[0][0] != 0
    assert kv.allocate(r, 4, full_sequence_must_fit=True) is None
    assert kv.block_ids(r) == before and kv.num_free_blocks == 1
    kv.check_integrity()


def test_a_compat_step_after_a_failed_one_that_released_blocks() -> None:
    """coordinator: allocate — after a failed compat allocation that released the blocks
    that left the window, the request's window threshold is reset (``slide_until = 0``:
    the next step is planned, never answered from stale thresholds).

    Compat, one sliding group (bs 4, W 5), 3 usable blocks. r (20 tokens) is admitted with
    8 tokens + 4 lookahead slots (3 blocks). At 8 computed its next 4 tokens fit the table,
    but the full sequence does not (vLLM's count cdiv(20, 4) - 3 = 2 > 0 free): refused,
    block 0 (skipped 8 - 5 + 1 = 4 tokens) is released. The same step without the
    reservation then succeeds with no new block."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=4), CacheOptions(vllm_compat=True))
    r = Request("r", prompt(100, 20))
    admit(kv, r, 8, num_lookahead_tokens=4)
    assert kv.num_free_blocks == 0
    assert kv.allocate(r, 4, num_lookahead_tokens=0, full_sequence_must_fit=True) is None
    assert kv.block_ids(r)[0][0] == 0 and kv.num_free_blocks == 1
    assert kv.allocate(r, 4, num_lookahead_tokens=0) == [[]]
    kv.check_integrity()


def test_the_decode_fast_path_stops_at_the_nearest_window_release() -> None:
    """coordinator: _slide_until — the threshold below which no block leaves a window is the
    smallest over all window groups (the first group's alone lets a quiet step skip the
    second group's release).

    Sliding (bs 4, W 16) + sliding (bs 4, W 7), dense retention (no hold). r (20 tokens) is
    admitted with 9 tokens (3 blocks per group), steps to 10. At 10 computed the W 7 window
    skips 10 - 7 + 1 = 4 tokens (its block 0 leaves) while the W 16 one skips none: the step
    10 → 11 needs no block and caches nothing, but it must release group 1's block 0."""
    kv = KVCacheManager(config(SWA(4, 16), SWA(4, 7), num_blocks=20), CacheOptions(retention_interval=None))
    r = Request("r", prompt(100, 20))
    admit(kv, r, 9)
    assert kv.allocate(r, 1) is not None
    r.num_computed_tokens = 10
    assert [t[0] != 0 for t in kv.block_ids(r)] == [True, True]
    free = kv.num_free_blocks
    assert kv.allocate(r, 1) == [[], []]
    assert [t[0] != 0 for t in kv.block_ids(r)] == [True, False]
    assert kv.num_free_blocks == free + 1
    kv.check_integrity()


CHUNKED8 = ChunkedLocal(block_size=4, num_kv_heads=1, head_dim=8, chunk_size=8)


@pytest.mark.parametrize("specs", [(FA(4), CHUNKED8), (FA(4), CHUNKED8, SWA(4, 32))],
                         ids=["chunked", "chunked+sliding"])
def test_the_decode_fast_path_threshold_counts_the_hold(specs) -> None:
    """coordinator: _slide_until — each window's next release is computed with the hold (the
    alignment unit a default-mode window keeps for the final-length promise); without it a
    chunked window's threshold comes out too late and a quiet step skips the release (with
    one window group or with several).

    Full (bs 4) + chunked local (bs 4, chunk 8) [+ sliding (bs 4, W 32), which releases
    nothing here],
    default mode, retention 0: hold 4. r (30 tokens: promised ends 24 and 28 only) is
    admitted with 10 tokens + 6 lookahead slots (4 blocks), then steps one token at a time.
    The chunk [0, 8) leaves once 8 tokens lie below computed - hold, i.e. at 12 computed:
    the step 12 → 13 must release blocks 0 and 1 (with the hold dropped, the next release
    would be computed as 16)."""
    kv = KVCacheManager(config(*specs, num_blocks=40))
    r = Request("r", prompt(100, 30))
    admit(kv, r, 10, num_lookahead_tokens=6)
    for computed, kept in ((10, True), (11, True), (12, False)):
        assert kv.allocate(r, 1, num_lookahead_tokens=0) == [[]] * len(specs)
        r.num_computed_tokens = computed + 1
        assert (kv.block_ids(r)[1][:2] != [0, 0]) == kept
    kv.check_integrity()


def test_a_decode_step_at_max_model_len_with_lookahead_slots() -> None:
    """coordinator: allocate — the cache-only fast path caps the step's slots at
    max_model_len too (``slots = len_cap``; ``None`` crashes the comparison).

    Full (bs 4), EAGLE with 2 speculative tokens (2 lookahead slots), max_model_len 20. r
    (18-token prompt) takes 5 blocks (min(18 + 2, 20) = 20 slots) and caches 16 tokens; its
    next end (20) makes cache() wait until 20 tokens. The decode step to 19 is quiet; the
    step to 20 reaches that threshold, so it goes through the coordinator's cache-only path:
    no new block (20 + 2 slots capped at 20)."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), CacheOptions(
        spec_decode=SpecDecode("eagle", 2), max_model_len=20))
    r = Request("r", prompt(100, 18))
    got = kv.allocate(r, 18, kv.lookup(r))
    assert got is not None and len(got[0]) == 5
    r.num_computed_tokens = 18
    for t in (18, 19):
        r.append_tokens([500 + t])
        assert kv.allocate(r, 1) == [[]]
        r.num_computed_tokens += 1
    assert len(kv.block_ids(r)[0]) == 5
    kv.check_integrity()


def test_a_decode_step_whose_lookahead_slots_need_a_block_is_not_quiet() -> None:
    """coordinator: step_is_quiet — the fast path's slot count includes the lookahead slots
    (``computed + new + lookahead``): a step whose draft slots cross into a block the table
    lacks must allocate it.

    Full (bs 4), EAGLE with 2 speculative tokens (2 lookahead slots). r (5-token prompt)
    takes 2 blocks (7 slots) and steps to 6 (no new block). The step 6 → 7 needs 7 + 2 = 9
    slots: a third block."""
    kv = KVCacheManager(config(FA(4), num_blocks=20), CacheOptions(spec_decode=SpecDecode("eagle", 2)))
    r = Request("r", prompt(100, 5))
    admit(kv, r, 5)
    r.append_tokens([7])
    assert kv.allocate(r, 1) == [[]]
    r.num_computed_tokens = 6
    r.append_tokens([8])
    got = kv.allocate(r, 1)
    assert got is not None and len(got[0]) == 1
    assert len(kv.block_ids(r)[0]) == 3
    kv.check_integrity()


@pytest.mark.parametrize("num_groups", [1, 2, 3, 4, 5])
def test_a_step_without_new_blocks_returns_one_empty_list_per_group(num_groups) -> None:
    """coordinator: _empty_lists — the fast path's result for 1..5 groups: None ("does not fit") or a crash
    instead of ``num_groups`` empty lists, each a fresh list.

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


def test_lookahead_slots_stop_at_max_model_len() -> None:
    """__init__ — max_model_len not passed to the coordinator: slots past it allocated.

    FA (bs 4), EAGLE k = 3, max_model_len 8: a 7-token prompt plus 3 lookahead slots would
    reach 10 tokens (3 blocks); capped at 8 it takes 2."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(
        spec_decode=SpecDecode("eagle", 3), max_model_len=8))
    assert [len(x) for x in kv.allocate(Request("r", prompt(0, 7)), 7)] == [2]


def _running_swa(compat: bool) -> tuple[KVCacheManager, Request, Request]:
    """A running request whose next step releases out-of-window blocks, in a pool too full
    for that step's new block."""
    kv = KVCacheManager(config(SWA(16, 32), num_blocks=13), CacheOptions(
        retention_interval=0, vllm_compat=compat))
    r = Request("r", list(range(160)))
    assert kv.allocate(r, 160, kv.lookup(r)) is not None
    r.num_computed_tokens = 160
    hog = Request("hog", list(range(1000, 1032)))
    assert kv.allocate(hog, 32, kv.lookup(hog)) is not None
    r.append_tokens([5] * 200)
    return kv, r, hog


@pytest.mark.parametrize("compat", [False, True])
def test_failed_allocation(compat: bool) -> None:
    """Default mode: a failed allocation changes nothing a caller can see. Compat mode: as
    vLLM (remove_skipped_blocks runs before the capacity check), the blocks that left the
    window are freed even though the allocation fails."""
    kv, r, _ = _running_swa(compat)
    before = (kv.block_ids(r), kv.num_free_blocks, kv.stats())
    plan = kv.coordinator.plan(r, 200, None, 0)
    released = sum(len(g.released) for g in plan.groups)
    assert released > 0 and not plan.fits
    assert kv.allocate(r, 200) is None
    if compat:
        assert kv.num_free_blocks == before[1] + released
        assert sum(1 for b in kv.block_ids(r)[0] if b == 0) == released
    else:
        assert (kv.block_ids(r), kv.num_free_blocks, kv.stats()) == before
    kv.check_integrity()


def test_waiting_request_replanned_after_a_free_with_a_state_group() -> None:
    """A state group's pool (``ExtentBlockPool``) bumps ``free_version`` on free and allocate:
    otherwise the coordinator's per-request memo of "hit blocks nobody holds"
    (``_evictable_counts``) outlives a free, and a waiting request's plan undercounts the free
    blocks its own hit would take (allocate raised "cannot pop" instead of returning None)."""
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
    kv = KVCacheManager(config(FA(4), num_blocks=32), CacheOptions(max_model_len=8, enable_events=True))
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
    kv = KVCacheManager(config(FA(4), num_blocks=32), CacheOptions(max_model_len=6))
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
    kv = KVCacheManager(config(FA(4), num_blocks=32), CacheOptions(max_model_len=8))
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


def test_dflash_reserves_k_plus_one_slots_on_first_prefill():
    kv = manager(FA(4), num_blocks=20, spec_decode=SpecDecode("dflash", 3))
    assert kv.lookahead_slots == 4
    new = kv.allocate(Request("r", list(range(8))), 8)
    assert len(new[0]) == 3          # 8 tokens + 4 slots = 12 -> 3 blocks
    eagle = manager(FA(4), num_blocks=20, spec_decode=SpecDecode("eagle", 3))
    assert len(eagle.allocate(Request("r", list(range(8))), 8)[0]) == 3  # 8 + 3 = 11
    assert len(eagle.allocate(Request("s", list(range(9))), 9)[0]) == 3  # 9 + 3 = 12
