"""Allocation as a pure plan plus a commit, and the coordinator's decode fast path.

* a plan changes nothing, and its counts are exactly what the commit then does to the pool;
* the fast paths are exact: a manager that never takes them (every step planned and
  committed, every cache pass walked; no cache-only shortcut) behaves identically, step by step, whether the lookahead is implicit or passed explicitly;
* in EAGLE drop mode decode steps now take the fast path between block boundaries.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, Request, SpecDecode
from hybridkv.core.coordinator import AllocationPlan, GroupPlan

from tests.support.helpers import FA, SWA, config
from tests.support.random_ops import configs


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
        self.kv = KVCacheManager(cfg, retention_interval=retention, spec_decode=spec,
                                 vllm_compat=compat)
        if not fast:
            # the reference: every step planned and committed, every cache pass walked
            coord = self.kv.coordinator
            coord.step_is_quiet = lambda *a: False

            def planned(request, n, hit, lookahead, external=None, reserve_tokens=0):
                plan = coord.plan(request, n, hit, lookahead, external, reserve_tokens)
                if not plan.fits and coord.compat and not plan.new_request \
                        and any(gp.released for gp in plan.groups):
                    coord.epoch += 1            # vLLM: a failed step still frees its window
                    coord._release(request, coord.reqs[request.request_id], plan)
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
    """With and without the fast path, every observable result is identical after every step
    (explicit lookahead included: any non-negative value is safe, not only the configured one)."""
    cfg, retention, spec, compat = cfg_args
    fast = Driver(cfg, retention, spec, compat, fast=True, explicit=explicit)
    slow = Driver(cfg, retention, spec, compat, fast=False, explicit=explicit)
    for op, x in ops:
        fast.op(op, x)
        slow.op(op, x)
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
    kv = KVCacheManager(config(FA(4), num_blocks=20), retention_interval=None)
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


def test_reserve_tokens_counts_the_peak_without_allocating_it() -> None:
    """The admission seam: the same plan plus the blocks a longer sequence would peak at."""
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=40), retention_interval=None)
    r = Request("r", list(range(20)))
    kv.lookup(r)
    now = kv.coordinator.plan(r, 20, None, 0)
    whole = kv.coordinator.plan(r, 20, None, 0, reserve_tokens=60)
    assert [g.new_blocks for g in now.groups] == [5, 5] and now.num_reserved == 0
    assert [g.new_blocks for g in whole.groups] == [5, 5]
    # full: 15 blocks for 60 tokens; sliding: its window (2 blocks) + 2 in flight = 4 <= 5 held
    assert whole.num_reserved == 10 and whole.fits
    assert not kv.coordinator.plan(r, 20, None, 0, reserve_tokens=140).fits   # 35 + 5 > 39
    assert kv.num_free_blocks == 39


@pytest.mark.parametrize("retention", [None, 0])
def test_full_sequence_must_fit(retention) -> None:
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=21), retention_interval=retention)
    long = Request("long", list(range(72)))             # full group alone needs 18 blocks
    hit = kv.lookup(long)
    before = (kv.num_free_blocks, kv.stats())
    assert kv.allocate(long, 16, hit, full_sequence_must_fit=True) is None
    assert (kv.num_free_blocks, kv.stats()) == before and "long" not in kv.coordinator.reqs
    assert kv.coordinator.plan(long, 16, hit, 0).fits    # without the reservation it fits
    short = Request("short", list(range(40)))           # 10 full blocks + a few sliding ones
    new = kv.allocate(short, 16, kv.lookup(short), full_sequence_must_fit=True)
    assert new is not None and [len(ids) for ids in new] == [4, 4]   # only this chunk's blocks
    short.num_computed_tokens = 16
    assert kv.allocate(short, 16, full_sequence_must_fit=True) is not None
    kv.check_integrity()


def test_drop_mode_decode_takes_the_fast_path() -> None:
    """EAGLE drop mode: a decode step between block boundaries commits nothing (it used to
    plan and cache every step: the proof block delayed each promised end by one block)."""
    for compat in (True, False):
        kv = KVCacheManager(config(FA(16), SWA(16, 64), num_blocks=200, drafts=(0,)),
                            spec_decode=SpecDecode("eagle", 3, hash_lookahead=False),
                            retention_interval=None, vllm_compat=compat)
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


def test_the_coordinator_is_its_seams_joined_flat():
    """KVCacheCoordinator holds every method of its seams in one class namespace (no seam
    overrides another, the hot path searches one class), and joining two seams that define the
    same name is refused rather than resolved silently by an MRO."""
    import hybridkv.core.coordinator as co
    from hybridkv.core.coordinator.allocate import Allocation
    from hybridkv.core.coordinator.base import CoordinatorBase
    from hybridkv.core.coordinator.lookup import Lookup
    from hybridkv.core.coordinator.release import Release
    from hybridkv.core.coordinator.states import StateGroups
    from hybridkv.core.coordinator.write import WritePath

    cls = co.KVCacheCoordinator
    assert cls.__mro__ == (cls, object) and cls.__module__ == "hybridkv.core.coordinator"
    seams = (CoordinatorBase, Lookup, Allocation, WritePath, Release, StateGroups)
    for seam in seams:
        for name, value in vars(seam).items():
            if not name.startswith("__") or name == "__init__":
                assert vars(cls)[name] is value, (seam.__name__, name)
    with pytest.raises(TypeError, match="Release and another seam both define 'cache'"):
        co._join("Twice", "", WritePath, type("Release", (), {"cache": lambda self: None}))
