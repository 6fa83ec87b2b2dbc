"""Property-based tests: random hybrid configs and random operation sequences.

After every step:
* ``check_integrity()`` (pool, free queue, index, ref counts, cached hashes of held blocks);
* every hit block holds exactly the request's tokens for its position, according to a shadow
  record of what each block was last written with (independent of hashing);
* the hit length equals a brute-force search over all aligned ends, written here from the
  attention definitions, over what the index holds.
Principle 1: after a request is freed, every block it cached is read by some hit that a
replay of its own tokens gets (the write path keeps only what the read path can use).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import (ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager,
                      Request, SlidingWindow, SpecDecode)


@st.composite
def configs(draw):
    n = draw(st.integers(1, 3))
    specs = []
    for _ in range(n):
        kind = draw(st.sampled_from(["full", "swa", "swa", "chunked"]))
        bs = draw(st.sampled_from([2, 4, 8]))
        if kind == "full":
            specs.append(FullAttention(block_size=bs, num_kv_heads=1, head_dim=4))
        elif kind == "swa":
            specs.append(SlidingWindow(block_size=bs, num_kv_heads=1, head_dim=4,
                                       window=draw(st.integers(1, 24))))
        else:
            specs.append(ChunkedLocal(block_size=bs, num_kv_heads=1, head_dim=4,
                                      chunk_size=bs * draw(st.integers(1, 4))))
    drafts = draw(st.sets(st.integers(0, n - 1), max_size=1))
    groups = tuple(KVCacheGroup(f"g{i}", s, (f"l{i}",), is_draft=i in drafts)
                   for i, s in enumerate(specs))
    cfg = KVCacheConfig(groups, num_blocks=draw(st.integers(12, 60)))
    has_local = any(s.rule != "full" for s in specs)
    retention = draw(st.sampled_from([None, 0] + ([cfg.alignment, 2 * cfg.alignment] if has_local else [])))
    spec = draw(st.sampled_from([None, SpecDecode("eagle", 2), SpecDecode("eagle", 1, hash_lookahead=False),
                                 SpecDecode("dflash", 2), SpecDecode("ngram", 3)]))
    compat = draw(st.booleans())
    return cfg, retention, spec, compat


def brute_force_hit(kv: KVCacheManager, req: Request) -> int:
    """Largest aligned t <= num_tokens - 1 such that every group has the blocks its attention
    needs for a query at t (plus the block after t for draft groups in drop mode)."""
    cfg = kv.config
    hashes = req.block_hashes
    a = cfg.alignment
    coord = kv.coordinator
    for t in range((req.num_tokens - 1) // a * a, 0, -a):
        ok = True
        for g, group in enumerate(cfg.groups):
            spec = group.spec
            bs = spec.block_size
            scale = bs // cfg.hash_block_size
            e = t // bs
            if spec.rule == "full":
                lo = 0
            elif spec.rule == "sliding":
                lo = max(0, (t - spec.window + 1) // bs)
            else:
                lo = t // spec.chunk_size * spec.chunk_size // bs
            hi = e + (1 if coord.proof[g] else 0)
            if kv.vllm_compat and len(cfg.groups) == 1 and hi > (req.num_tokens - 1) // bs:
                ok = False
                break
            for j in range(lo, hi):
                k = (j + 1) * scale - 1
                if k >= len(hashes) or kv.pool.cached_block(g, hashes[k]) is None:
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return t
    return 0


class Model:
    """Drives a manager and keeps the shadow record of block contents."""

    def __init__(self, kv: KVCacheManager):
        self.kv = kv
        self.running: dict[str, Request] = {}
        self.written: dict[tuple[int, int], tuple] = {}   # (group, block) -> (salt, tokens)
        self.prompts: list[list[int]] = []
        self.counter = 0

    def record_written(self, req: Request) -> None:
        cfg = self.kv.config
        tables = self.kv.block_ids(req)
        for g, table in enumerate(tables):
            bs = cfg.groups[g].spec.block_size
            for j, b in enumerate(table):
                if b and (j + 1) * bs <= req.num_computed_tokens:
                    self.written[(g, b)] = (req.cache_salt, tuple(req.token_ids[j * bs:(j + 1) * bs]))

    def forget(self, new_blocks) -> None:
        for g, ids in enumerate(new_blocks):
            for b in ids:
                for gg in range(len(self.kv.config.groups)):
                    self.written.pop((gg, b), None)

    def check_hit(self, req: Request, hit) -> None:
        cfg = self.kv.config
        assert hit.num_tokens % cfg.alignment == 0 and hit.num_tokens <= req.num_tokens - 1
        for g, ids in enumerate(hit.block_ids):
            bs = cfg.groups[g].spec.block_size
            assert len(ids) * bs == hit.num_tokens
            for j, b in enumerate(ids):
                if b:
                    want = (req.cache_salt, tuple(req.token_ids[j * bs:(j + 1) * bs]))
                    assert self.written.get((g, b)) == want, f"hit block {b} holds other tokens"
        if not req.skip_prefix_cache:
            assert hit.num_tokens == brute_force_hit(self.kv, req)

    def admit(self, tokens, salt, chunk) -> None:
        rid = f"r{self.counter}"
        self.counter += 1
        req = Request(rid, tokens, cache_salt=salt)
        hit = self.kv.lookup(req)
        self.check_hit(req, hit)
        n = min(chunk, req.num_tokens - hit.num_tokens)
        new = self.kv.allocate(req, n, hit)
        if new is None:
            return
        self.forget(new)
        req.num_computed_tokens = hit.num_tokens + n
        self.record_written(req)
        self.running[rid] = req
        self.prompts.append(list(tokens))

    def step(self, rid: str, token: int) -> None:
        req = self.running[rid]
        if req.num_computed_tokens < req.num_tokens:      # continue the prefill
            n = min(7, req.num_tokens - req.num_computed_tokens)
        else:                                            # decode: the new token is computed next
            req.append_tokens([token])
            n = 1
        new = self.kv.allocate(req, n)
        if new is None:
            self.preempt(rid)
            return
        self.forget(new)
        req.num_computed_tokens += n
        self.record_written(req)

    def preempt(self, rid: str) -> None:
        req = self.running.pop(rid)
        self.kv.free(req)

    def finish(self, rid: str) -> None:
        req = self.running.pop(rid)
        self.kv.free(req)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), min_size=1, max_size=40))
def test_random_operations_keep_invariants(cfg_args, ops):
    cfg, retention, spec, compat = cfg_args
    kv = KVCacheManager(cfg, retention_interval=retention, spec_decode=spec, vllm_compat=compat)
    m = Model(kv)
    for op, x in ops:
        if op <= 1 or not m.running:
            base = m.prompts[x % len(m.prompts)] if m.prompts and x % 3 else []
            keep = base[: (x // 7) % (len(base) + 1)]
            tokens = keep + [(x >> k) % 5 for k in range(1 + x % 13)]
            salt = "s" if x % 11 == 0 else None
            m.admit(tokens, salt, chunk=1 + x % 40)
        elif op == 2 or op == 3:
            rid = sorted(m.running)[x % len(m.running)]
            m.step(rid, x % 5)
        elif op == 4:
            m.finish(sorted(m.running)[x % len(m.running)])
        else:
            if not m.running:
                assert kv.reset_prefix_cache()
            else:
                assert not kv.reset_prefix_cache()
        kv.check_integrity()
    for rid in list(m.running):
        m.finish(rid)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1


@settings(max_examples=200, deadline=None)
@given(configs(), st.lists(st.integers(0, 3), min_size=4, max_size=60), st.integers(1, 30))
def test_write_path_keeps_only_what_read_path_uses(cfg_args, tokens, chunk):
    """Principle 1: every block a request caches is read by some hit a replay of it gets."""
    cfg, retention, spec, compat = cfg_args
    kv = KVCacheManager(cfg.__class__(cfg.groups, num_blocks=400), retention_interval=retention,
                        spec_decode=spec, vllm_compat=compat)
    req = Request("r", tokens)
    kv.lookup(req)
    done = 0
    while done < len(tokens):
        n = min(chunk, len(tokens) - done)
        assert kv.allocate(req, n) is not None
        done += n
        req.num_computed_tokens = done
    kv.free(req)
    cached = {b for b, h in enumerate(kv.pool.block_hash) if h is not None}
    read: set[int] = set()
    a = cfg.alignment
    for t in range(a, len(tokens) + 1, a):
        # a replay that asks for a hit of exactly t tokens, knowing what the original knew
        # past t: the lookahead token, or the proof block in drop mode
        extra = max(kv.coordinator.hold, kv.hasher.lookahead, 1)
        probe_tokens = tokens[:t + extra]
        if len(probe_tokens) <= t:
            probe_tokens = probe_tokens + [99]
        probe = Request(f"p{t}", probe_tokens)
        hit = kv.lookup(probe)
        read.update(b for ids in hit.block_ids for b in ids if b)
        if hit.num_tokens:  # drop mode: draft groups also read the proof block after the hit
            for g, group in enumerate(cfg.groups):
                if kv.coordinator.proof[g]:
                    bs = group.spec.block_size
                    k = (hit.num_tokens // bs + 1) * (bs // cfg.hash_block_size) - 1
                    read.add(kv.pool.cached_block(g, probe.block_hashes[k]))
    if compat:
        # vLLM keeps some blocks no aligned hit reads (full groups cache every block, the
        # eagle +1 tail); only require that what is read is cached.
        assert read <= cached
    else:
        assert cached == read, f"cached but never read: {sorted(cached - read)}"
