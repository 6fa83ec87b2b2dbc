"""The vLLM parity harness: seeded traces, the case matrix, one scheduler loop, the hybridkv side.

This module never imports vLLM, so CI (``tests/parity/test_parity_replay.py``) can replay a
recorded fixture of vLLM's results against hybridkv. ``parity_vllm.py`` adds the vLLM side
and ``bench_vs_vllm.py`` runs the matrix with both.

Traces are regenerated from a seed with a pure-integer generator (splitmix64), so they are
identical on every Python and numpy version: the fixture stores seeds and parameters, never
tokens.

The scheduler loop (:func:`run_case`) mirrors what vLLM 0.33's ``Scheduler.schedule`` does
with its manager, FCFS, synchronous (no async scheduling, no connector)::

    step:  manager.new_step_starts()
           running requests in order: allocate_slots(req, n, num_lookahead_tokens=k);
               while None: preempt running[-1] (free, num_computed = 0, to the waiting
               queue's front); stop when the request preempted itself
           only if nobody was preempted: admit waiting requests in order (max_num_seqs,
               token budget, chunked prefill): get_computed_blocks, then allocate_slots(req,
               n, hit, blocks, num_lookahead_tokens=k, full_sequence_must_fit=True);
               stop at the first that does not fit
           every scheduled request advances num_computed; one that reached its last token
           "samples": appends its next answer chunk (1..k+1 tokens under EAGLE, seeded) or
           finishes (freed)

A side (vLLM or hybridkv) implements :class:`Side`; both see the identical call sequence as
long as their answers agree. The result (:class:`RunResult`) holds per request the hit tokens
of every admission (the first, then each re-admission after a preemption), and the counts of
preemptions, re-admissions and evictions.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Protocol
from hybridkv.core.cache_options import CacheOptions

VOCAB = 32_000
MASK64 = (1 << 64) - 1


# ---- deterministic randomness -------------------------------------------------------------------
def splitmix64(x: int) -> int:
    """One splitmix64 output for state x (pure integers: identical on every Python)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class Rng:
    """A tiny seeded generator (splitmix64 stream); stable across Python versions."""

    __slots__ = ("state",)

    def __init__(self, *key: int) -> None:
        s = 0x5EED
        for k in key:
            s = splitmix64(s ^ (k & MASK64))
        self.state = s

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        return splitmix64(self.state)

    def between(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi] (modulo bias is irrelevant here)."""
        return lo + self.next() % (hi - lo + 1)

    def tokens(self, n: int) -> list[int]:
        """n token ids in [1, VOCAB)."""
        return [1 + self.next() % (VOCAB - 1) for _ in range(n)]


# ---- traces -------------------------------------------------------------------------------------
@dataclass(slots=True)
class Item:
    """One request of a trace.

    ``after``: the request id that must finish before this one arrives (the previous chat
    turn, the parent of a branch), or None. ``arrival``: the earliest scheduler step.
    ``chunks``: how many answer tokens each sampling step appends (sum = len(answer)).
    """

    rid: str
    prompt: list[int]
    answer: list[int]
    after: str | None
    arrival: int
    chunks: tuple[int, ...]


def _chunks(rng: Rng, n: int, max_accept: int) -> tuple[int, ...]:
    out = []
    while n > 0:
        c = min(n, rng.between(1, max_accept)) if max_accept > 1 else 1
        out.append(c)
        n -= c
    return tuple(out)


def gen_chat(seed: int, conversations: int = 12, turns: int = 5, system: int = 1024,
             user: tuple[int, int] = (64, 512), answer: tuple[int, int] = (16, 96),
             gap: int = 6, max_accept: int = 1) -> list[Item]:
    """Multi-turn chat: one shared system prompt; turn i+1 = turn i's prompt + answer + text."""
    rng = Rng(seed, 1)
    sys_tokens = rng.tokens(system)
    items = []
    for c in range(conversations):
        ctx = list(sys_tokens)
        prev = None
        for t in range(turns):
            ctx = ctx + rng.tokens(rng.between(*user))
            ans = rng.tokens(rng.between(*answer))
            rid = f"chat{c}.{t}"
            items.append(Item(rid, list(ctx), ans, prev, c * gap, _chunks(rng, len(ans), max_accept)))
            ctx = ctx + ans
            prev = rid
    return items


def gen_system(seed: int, prompts: int = 3, requests: int = 40, system: tuple[int, int] = (600, 2200),
               user: tuple[int, int] = (32, 400), answer: tuple[int, int] = (16, 96),
               resend_every: int = 5, gap: int = 3, max_accept: int = 1) -> list[Item]:
    """Independent requests over a few shared system prompts; every ``resend_every``-th
    request resends an earlier prompt exactly (the identical-resend boundary)."""
    rng = Rng(seed, 2)
    systems = [rng.tokens(rng.between(*system)) for _ in range(prompts)]
    items: list[Item] = []
    for i in range(requests):
        if resend_every and i % resend_every == resend_every - 1 and items:
            prompt = list(items[rng.between(0, len(items) - 1)].prompt)
        else:
            prompt = systems[rng.between(0, prompts - 1)] + rng.tokens(rng.between(*user))
        ans = rng.tokens(rng.between(*answer))
        items.append(Item(f"sys{i}", prompt, ans, None, i * gap, _chunks(rng, len(ans), max_accept)))
    return items


def gen_agent(seed: int, loops: int = 8, steps: int = 6, system: int = 800,
              tool: tuple[int, int] = (32, 400), answer: tuple[int, int] = (8, 64),
              gap: int = 10, max_accept: int = 1) -> list[Item]:
    """Agent loops: each step's prompt = the previous prompt + its answer + a tool result."""
    rng = Rng(seed, 3)
    sys_tokens = rng.tokens(system)
    items = []
    for a in range(loops):
        ctx = sys_tokens + rng.tokens(rng.between(64, 256))
        prev = None
        for s in range(steps):
            ans = rng.tokens(rng.between(*answer))
            rid = f"agent{a}.{s}"
            items.append(Item(rid, list(ctx), ans, prev, a * gap, _chunks(rng, len(ans), max_accept)))
            ctx = ctx + ans + rng.tokens(rng.between(*tool))
            prev = rid
    return items


def gen_tree(seed: int, roots: int = 5, depth: int = 3, branching: int = 2, root: int = 900,
             text: tuple[int, int] = (48, 400), answer: tuple[int, int] = (16, 96),
             gap: int = 8, max_accept: int = 1) -> list[Item]:
    """Branching trees: every node's children extend its prompt + answer with their own text."""
    rng = Rng(seed, 4)
    items = []
    for r in range(roots):
        frontier = [(rng.tokens(root), None, f"tree{r}")]
        for d in range(depth):
            nxt = []
            for ctx, parent, name in frontier:
                prompt = ctx + rng.tokens(rng.between(*text))
                ans = rng.tokens(rng.between(*answer))
                items.append(Item(name, prompt, ans, parent, r * gap,
                                  _chunks(rng, len(ans), max_accept)))
                for b in range(branching if d + 1 < depth else 0):
                    nxt.append((prompt + ans, name, f"{name}.{b}"))
            frontier = nxt
    return items


WORKLOADS = {"chat": gen_chat, "system": gen_system, "agent": gen_agent, "tree": gen_tree}
# the size parameter each generator scales by (``Case.scale``) and its default
SCALE_KEY = {"chat": ("conversations", 12), "system": ("requests", 40), "agent": ("loops", 8),
             "tree": ("roots", 5)}


def trace_fingerprint(trace: list[Item]) -> str:
    """A short digest of a trace: the replay test checks that regeneration is unchanged."""
    rows = [[it.rid, len(it.prompt), sum(it.prompt), len(it.answer), sum(it.answer), it.after,
             it.arrival, list(it.chunks)] for it in trace]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


# ---- cases --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One cell of the parity matrix.

    groups: ``(kind, block_size, window)`` per KV-cache group, kind "full" or "swa".
    retention: None (dense), 0, or N tokens. eagle: None (no drop), "all", "full" or "swa"
    (which groups are EAGLE/draft groups; "all" flags none, so both vLLM and hybridkv treat
    every group as one). lookahead: slots reserved past the scheduled tokens each step.
    """

    name: str
    groups: tuple[tuple[str, int, int], ...]
    retention: int | None
    eagle: str | None
    lookahead: int
    pool: str                      # "large" or "small"
    workload: str
    seed: int
    scale: int = 1
    max_num_seqs: int = 8
    budget: int = 2048             # tokens per step (vLLM's max_in_flight_tokens too)

    @property
    def hybrid(self) -> bool:
        return any(k != "full" for k, _, _ in self.groups)

    @property
    def klass(self) -> str:
        """The speed class: plain/eagle x full/hybrid x small/large pool."""
        return (f"{'eagle' if self.eagle else 'plain'} {'hybrid' if self.hybrid else 'full'} "
                f"{self.pool}")

    def trace(self) -> list[Item]:
        kw = {"max_accept": self.lookahead + 1 if self.eagle else 1}
        if self.scale != 1:
            key, default = SCALE_KEY[self.workload]
            kw[key] = default * self.scale
        return WORKLOADS[self.workload](self.seed, **kw)

    def to_json(self) -> dict:
        d = asdict(self)
        d["groups"] = [list(g) for g in self.groups]
        return d

    @staticmethod
    def from_json(d: dict) -> "Case":
        d = dict(d)
        d["groups"] = tuple(tuple(g) for g in d["groups"])
        return Case(**d)


@dataclass(frozen=True)
class Geometry:
    """Sizes derived from a case and its trace (identical for both sides)."""

    block_sizes: tuple[int, ...]
    hash_block_size: int
    alignment: int
    max_model_len: int
    num_blocks: int


LARGE_POOL = 40_000
MAX_STEPS = 200_000


def geometry(case: Case, trace: list[Item]) -> Geometry:
    bss = tuple(bs for _, bs, _ in case.groups)
    hbs = math.gcd(*bss)
    align = math.lcm(*bss)
    longest = max(len(it.prompt) + len(it.answer) for it in trace)
    mml = -(-(longest + 64) // 256) * 256
    if case.pool == "large":
        nb = LARGE_POOL
    else:
        # Room for about 1.5 of the longest requests: small enough that 8 running requests
        # preempt, large enough that one request of max_model_len always fits.
        per = 0
        for kind, bs, w in case.groups:
            blocks = -(-mml // bs)
            if kind == "swa":
                blocks = min(blocks, -(-min(w - 1 + case.budget, mml) // bs) + 1)
            per += blocks
        nb = per + per // 2 + 8
    return Geometry(bss, hbs, align, mml, nb)


def build_matrix(scale: int = 1) -> list[Case]:
    """The parity matrix: every axis of issue 10, each config with a large and a small pool."""
    F = ("full", 16, 0)

    def S(w: int, bs: int = 16) -> tuple[str, int, int]:
        return ("swa", bs, w)

    configs = [
        # name, groups, retention, eagle, lookahead
        ("full", (F,), 0, None, 0),
        ("full la2", (F,), 0, None, 2),
        ("full eagle la1", (F,), 0, "all", 1),
        ("full eagle la4", (F,), 0, "all", 4),
        ("swa64 r0", (F, S(64)), 0, None, 0),
        ("swa256 r0", (F, S(256)), 0, None, 0),
        ("swa1024 r0", (F, S(1024)), 0, None, 0),
        ("swa1024 dense", (F, S(1024)), None, None, 0),
        ("swa1024 N512", (F, S(1024)), 512, None, 0),
        ("swa1024 N2048", (F, S(1024)), 2048, None, 0),
        ("swa256 N1024", (F, S(256)), 1024, None, 0),
        ("swa1024 r0 la1", (F, S(1024)), 0, None, 1),
        ("swa1024 r0 la4", (F, S(1024)), 0, None, 4),
        ("swa32blk r0", (F, S(1024, 32)), 0, None, 0),
        ("swa32blk dense", (F, S(1024, 32)), None, None, 0),
        ("swa32blk N1024", (F, S(1024, 32)), 1024, None, 0),
        ("siblings r0", (F, S(1024), S(1024)), 0, None, 0),
        ("siblings N2048", (F, S(1024), S(1024)), 2048, None, 0),
        ("eagle-all swa1024 r0 la3", (F, S(1024)), 0, "all", 3),
        ("eagle-all swa1024 dense la0", (F, S(1024)), None, "all", 0),
        ("eagle-all swa1024 N2048 la2", (F, S(1024)), 2048, "all", 2),
        ("eagle-full swa1024 r0 la1", (F, S(1024)), 0, "full", 1),
        ("eagle-swa swa1024 r0 la2", (F, S(1024)), 0, "swa", 2),
        ("eagle-swa swa256 N512 la4", (F, S(256)), 512, "swa", 4),
        ("eagle-all swa32blk r0 la3", (F, S(1024, 32)), 0, "all", 3),
        ("eagle-all siblings r0 la1", (F, S(1024), S(1024)), 0, "all", 1),
        ("full la4", (F,), 0, None, 4),
        ("full eagle la0", (F,), 0, "all", 0),
        ("swa128 r0", (F, S(128)), 0, None, 0),
        ("swa512 N1024", (F, S(512)), 1024, None, 0),
        ("swa1024 N1024", (F, S(1024)), 1024, None, 0),
        ("swa32blk N512", (F, S(1024, 32)), 512, None, 0),
        ("siblings dense", (F, S(1024), S(1024)), None, None, 0),
        ("pure swa32blk r0", (S(1024, 32),), 0, None, 0),
        ("pure swa32blk N2048", (S(1024, 32),), 2048, None, 0),
        ("eagle-swa siblings r0 la3", (F, S(1024), S(1024)), 0, "swa", 3),
        ("eagle-full swa256 dense la4", (F, S(256)), None, "full", 4),
        ("eagle-all swa1024 N512 la1", (F, S(1024)), 512, "all", 1),
    ]
    workloads = list(WORKLOADS)
    cases = []
    for i, (name, groups, ret, eagle, la) in enumerate(configs):
        for pool in ("large", "small"):
            wl = workloads[(i + (pool == "small")) % len(workloads)]
            cases.append(Case(f"{name} / {pool} / {wl}", groups, ret, eagle, la, pool, wl,
                              seed=1000 + i, scale=scale))
    return cases


# ---- results ------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What one side did on one case. ``hits[rid]``: hit tokens at each admission."""

    hits: dict[str, list[int]] = field(default_factory=dict)
    preemptions: int = 0
    readmissions: int = 0
    evictions: int = 0
    steps: int = 0
    deadlock: str = ""
    mgr_s: float = 0.0
    hash_s: float = 0.0

    def summary(self) -> dict:
        return {"preemptions": self.preemptions, "readmissions": self.readmissions,
                "evictions": self.evictions, "steps": self.steps, "deadlock": self.deadlock}


@dataclass
class Diff:
    """How a side's result differs from the reference (vLLM's). Empty lists: exact."""

    requests: list[tuple[str, list[int], list[int]]]   # (rid, this side's hits, vLLM's)
    counts: list[tuple[str, int, int]]                  # (what, this side, vLLM)

    @property
    def exact(self) -> bool:
        return not self.requests and not self.counts


def compare(mine: RunResult, ref_hits: dict[str, list[int]], ref_counts: dict) -> Diff:
    reqs = []
    for rid in sorted(set(mine.hits) | set(ref_hits)):
        a, b = mine.hits.get(rid, []), ref_hits.get(rid, [])
        if a != b:
            reqs.append((rid, a, b))
    counts = []
    for what in ("preemptions", "readmissions", "evictions", "steps", "deadlock"):
        a, b = getattr(mine, what), ref_counts.get(what, 0 if what != "deadlock" else "")
        if a != b:
            counts.append((what, a, b))
    return Diff(reqs, counts)


# ---- the scheduler loop -------------------------------------------------------------------------
class ReqState:
    """The loop's view of one request: tokens known, computed, answer progress."""

    __slots__ = ("item", "num_tokens", "computed", "chunk", "out", "handle", "preemptions")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.num_tokens = len(item.prompt)
        self.computed = 0
        self.chunk = 0       # next answer chunk index
        self.out = 0         # answer tokens appended
        self.handle = None
        self.preemptions = 0


class Side(Protocol):
    """One manager under test. Every method times its own manager calls and hashing."""

    mgr_s: float
    hash_s: float

    def new_step(self) -> None: ...
    def make(self, st: ReqState) -> None: ...                      # build + hash the prompt
    def append(self, st: ReqState, tokens: list[int]) -> None: ...  # outputs (+ hashing)
    def lookup(self, st: ReqState) -> int: ...                      # hit tokens (kept on st)
    def admit(self, st: ReqState, num_new: int) -> bool: ...        # adopt hit + allocate
    def allocate(self, st: ReqState, num_new: int) -> bool: ...     # a running request
    def set_computed(self, st: ReqState) -> None: ...
    def preempt(self, st: ReqState) -> None: ...                    # free, computed = 0
    def finish(self, st: ReqState) -> None: ...                     # free
    def evictions(self) -> int: ...


def run_case(case: Case, trace: list[Item], side: Side) -> RunResult:
    """Drive ``side`` through ``trace`` with the loop of the module docstring."""
    res = RunResult()
    states = {it.rid: ReqState(it) for it in trace}
    order = {it.rid: i for i, it in enumerate(trace)}
    children: dict[str | None, list[str]] = {}
    for it in trace:
        children.setdefault(it.after, []).append(it.rid)
    # (arrival step, trace position, id): a child arrives once its parent has finished
    arrivals = [(states[r].item.arrival, order[r], r) for r in children.get(None, [])]
    heapq.heapify(arrivals)
    waiting: deque[ReqState] = deque()
    running: list[ReqState] = []
    remaining = len(trace)
    step = 0
    while remaining:
        if step >= MAX_STEPS:
            res.deadlock = f"no progress after {MAX_STEPS} steps"
            break
        while arrivals and arrivals[0][0] <= step:
            st = states[heapq.heappop(arrivals)[2]]
            side.make(st)
            waiting.append(st)
        side.new_step()
        budget = case.budget
        scheduled: list[tuple[ReqState, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            st = running[i]
            n = min(st.num_tokens - st.computed, budget)
            ok = False
            while True:
                if side.allocate(st, n):
                    ok = True
                    break
                victim = running.pop()
                side.preempt(victim)
                victim.computed = 0
                victim.preemptions += 1
                res.preemptions += 1
                waiting.appendleft(victim)
                preempted = True
                if victim is st:
                    break
            if not ok:
                break
            scheduled.append((st, n))
            budget -= n
            i += 1
        if not preempted:
            while waiting and len(running) < case.max_num_seqs and budget > 0:
                st = waiting[0]
                hit = side.lookup(st)
                n = min(st.num_tokens - hit, budget)
                if not side.admit(st, n):
                    break
                waiting.popleft()
                if st.preemptions:
                    res.readmissions += 1
                res.hits.setdefault(st.item.rid, []).append(hit)
                st.computed = hit
                running.append(st)
                scheduled.append((st, n))
                budget -= n
        if not scheduled and not running and waiting:
            res.deadlock = f"step {step}: {waiting[0].item.rid} does not fit an idle pool"
            break
        finished = []
        for st, n in scheduled:
            st.computed += n
            side.set_computed(st)
            if st.computed < st.num_tokens:
                continue
            # the step sampled this request: its next answer chunk, or it is done
            it = st.item
            c = it.chunks[st.chunk]
            side.append(st, it.answer[st.out:st.out + c])
            st.chunk += 1
            st.out += c
            st.num_tokens += c
            if st.chunk == len(it.chunks):
                finished.append(st)
        for st in finished:
            side.finish(st)
            running.remove(st)
            remaining -= 1
            for r in children.get(st.item.rid, []):
                heapq.heappush(arrivals, (max(states[r].item.arrival, step + 1), order[r], r))
        step += 1
    res.steps = step
    res.evictions = side.evictions()
    res.mgr_s, res.hash_s = side.mgr_s, side.hash_s
    return res


# ---- the hybridkv side --------------------------------------------------------------------------
class HybridkvSide:
    """hybridkv's KVCacheManager through the loop.

    reserve: "api" admits with ``allocate(..., full_sequence_must_fit=True)`` (vLLM's
    admission reservation, as its scheduler does by default); "none" admits whatever
    hybridkv's allocate accepts for the first chunk.
    """

    def __init__(self, case: Case, geo: Geometry, *, compat: bool = True,
                 reserve: str = "api") -> None:
        from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager,
                              SlidingWindow, SpecDecode)
        from hybridkv import Request
        self.Request = Request
        self.case, self.geo, self.reserve = case, geo, reserve
        groups = []
        for g, (kind, bs, w) in enumerate(case.groups):
            spec = (FullAttention(block_size=bs, num_kv_heads=8, head_dim=128) if kind == "full"
                    else SlidingWindow(block_size=bs, num_kv_heads=8, head_dim=128, window=w))
            draft = case.eagle is not None and case.eagle != "all" and case.eagle == kind
            groups.append(KVCacheGroup(f"g{g}", spec, (f"l{g}",), is_draft=draft))
        if case.eagle:
            sd = SpecDecode("eagle", max(case.lookahead, 1), hash_lookahead=False)
        elif case.lookahead:
            sd = SpecDecode("draft_model", case.lookahead)
        else:
            sd = None
        self.kv = KVCacheManager(KVCacheConfig(tuple(groups), num_blocks=geo.num_blocks), CacheOptions(
            spec_decode=sd, retention_interval=case.retention, max_model_len=geo.max_model_len,
            vllm_compat=compat, max_in_flight_tokens=case.budget))
        # the manager's default lookahead is the spec-decode's; pass it only when it differs
        self.la_kw = ({} if self.kv.lookahead_slots == case.lookahead
                      else {"num_lookahead_tokens": case.lookahead})
        self.mgr_s = 0.0
        self.hash_s = 0.0
        self.hits: dict[str, object] = {}

    def new_step(self) -> None:
        pass

    def make(self, st: ReqState) -> None:
        if st.handle is not None:
            return
        req = self.Request(st.item.rid, st.item.prompt)
        t0 = time.perf_counter()
        req.hasher = self.kv.hasher
        self.kv.hasher.update(req)
        self.hash_s += time.perf_counter() - t0
        st.handle = req

    def append(self, st: ReqState, tokens: list[int]) -> None:
        t0 = time.perf_counter()
        st.handle.append_tokens(tokens)
        self.kv.hasher.update(st.handle)
        self.hash_s += time.perf_counter() - t0

    def lookup(self, st: ReqState) -> int:
        t0 = time.perf_counter()
        hit = self.kv.lookup(st.handle)
        self.mgr_s += time.perf_counter() - t0
        self.hits[st.item.rid] = hit
        return hit.num_tokens

    def admit(self, st: ReqState, num_new: int) -> bool:
        hit = self.hits.pop(st.item.rid)
        t0 = time.perf_counter()
        ok = self.kv.allocate(st.handle, num_new, hit, **self.la_kw,
                              full_sequence_must_fit=self.reserve == "api") is not None
        self.mgr_s += time.perf_counter() - t0
        return ok

    def allocate(self, st: ReqState, num_new: int) -> bool:
        t0 = time.perf_counter()
        ok = self.kv.allocate(st.handle, num_new, **self.la_kw) is not None
        self.mgr_s += time.perf_counter() - t0
        return ok

    def set_computed(self, st: ReqState) -> None:
        st.handle.num_computed_tokens = st.computed

    def preempt(self, st: ReqState) -> None:
        t0 = time.perf_counter()
        self.kv.free(st.handle)
        self.mgr_s += time.perf_counter() - t0
        st.handle.num_computed_tokens = 0
        st.handle.num_preemptions += 1

    def finish(self, st: ReqState) -> None:
        t0 = time.perf_counter()
        self.kv.free(st.handle)
        self.mgr_s += time.perf_counter() - t0

    def evictions(self) -> int:
        return self.kv.pool.num_evictions


def run_hybridkv(case: Case, *, compat: bool = True, reserve: str = "api",
                 check: bool = False) -> RunResult:
    """Generate the case's trace and run hybridkv through the loop (``check``: integrity
    check at the end)."""
    trace = case.trace()
    side = HybridkvSide(case, geometry(case, trace), compat=compat, reserve=reserve)
    res = run_case(case, trace, side)
    if check:
        side.kv.check_integrity()
    return res
