"""A deterministic random-operation trace of the manager, for the compiled-vs-pure test.

``run(case, seed)`` drives one :class:`KVCacheManager` through arrivals, admissions (half of
them with the full-sequence reservation), prefill chunks, decode steps (1-3 accepted tokens),
preemptions of the newest running request when an allocation fails, and finishes, with
``check_integrity`` after every operation. It returns every observable as JSON-ready lists:
each lookup's hit length, each allocation's new block ids (or None), the free-block count,
the eviction count, the events and the prefix-cache stats after every operation, and the
final block tables. The ``pool_*`` cases drive a bare pool instead (:func:`run_pool`: random
allocate / free / touch / insert / insert_run / drop / reset sequences). ``python -m
tests.support.compiled_trace CASE SEED`` prints that record as JSON (with
``hybridkv.core.COMPILED``), so a subprocess can run it in the other mode.
"""

from __future__ import annotations

import json
import random
import sys

from hybridkv import KVCacheManager, Request, SpecDecode
from hybridkv.core import COMPILED
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.eviction import make_policy
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import BlockPool

from .helpers import FA, SWA, config


def _case(name: str) -> KVCacheManager:
    kw: dict = {"enable_events": True, "hash_seed": "compiled-vs-pure"}

    def manager(cfg, **more) -> KVCacheManager:
        return KVCacheManager(cfg, CacheOptions(**kw, **more))

    if name == "full":
        return manager(config(FA(16), num_blocks=96), retention_interval=None)
    if name == "full_swa":
        return manager(config(FA(16), SWA(16, 64), num_blocks=160))
    if name == "eagle":
        return manager(config(FA(16), SWA(16, 48), num_blocks=160, drafts=(0,)),
                       spec_decode=SpecDecode("eagle", 3))
    if name == "compat":
        return manager(config(FA(16), SWA(16, 64), num_blocks=160), vllm_compat=True,
                       retention_interval=128)
    if name == "compat_eagle_small":
        return manager(config(FA(16), SWA(16, 32), num_blocks=40, drafts=(0, 1)),
                       vllm_compat=True, spec_decode=SpecDecode("eagle", 2))
    if name == "small_pool":
        return manager(config(FA(16), SWA(16, 32), num_blocks=36))
    if name == "retention":
        return manager(config(FA(16), SWA(16, 32), num_blocks=120),
                       retention_interval=64)
    if name in ("s3fifo", "arc", "eva"):
        return manager(config(FA(16), SWA(16, 48), num_blocks=64), eviction_policy=name)
    raise ValueError(f"unknown case {name!r}")


CASES = ("full", "full_swa", "eagle", "compat", "compat_eagle_small", "small_pool", "retention",
         "s3fifo", "arc", "eva", "pool_lru", "pool_s3fifo", "pool_arc")


def run_pool(case: str, seed: int, ops: int = 600) -> list:
    """A bare pool (``pool_lru``: BlockPool, two groups; ``pool_<policy>``: PolicyBlockPool,
    one group) through random operations; after each: what it returned, the free and
    eviction counts, the evictions reported (``on_evict``), the free queue in pop order and
    the index (``check`` after every operation)."""
    rng = random.Random(seed)
    evicted: list = []
    policy = case[len("pool_"):]
    n, groups = rng.randrange(8, 48), 2 if policy == "lru" else 1
    if policy == "lru":
        pool = BlockPool(n, groups, on_evict=lambda g, h: evicted.append([g, h.hex()]))
    else:
        ticks = iter(range(10 ** 9))
        pool = PolicyBlockPool(n, groups, make_policy(policy, clock=lambda: next(ticks)),
                               on_evict=lambda g, h: evicted.append([g, h.hex()]))
    held: list[int] = []
    out: list = []
    for _ in range(ops):
        op = rng.choice(("alloc", "alloc", "free", "touch", "insert", "insert_run", "drop",
                         "reset" if rng.random() < 0.05 else "alloc"))
        got: object = None
        if op == "alloc":
            got = pool.allocate(rng.randrange(min(pool.num_free, 6) + 1))
            held += got
        elif op == "free" and held:
            rng.shuffle(held)
            k = rng.randrange(len(held) + 1)
            got, held = held[:k], held[k:]
            pool.free(got)
        elif op == "touch":
            cached = [b for b in range(1, min(pool.next_fresh, n))
                      if pool.block_hash[b] is not None]
            got = rng.sample(cached, min(len(cached), rng.randrange(4)))
            pool.touch(got)
            held += got
        elif op in ("insert", "insert_run") and held:
            blocks = list({b: None for b in held if pool.block_hash[b] is None})[:4]
            hashes = [bytes([rng.randrange(6)]) * 16 for _ in blocks]   # few: repeats happen
            g = rng.randrange(groups)
            if op == "insert" and blocks:
                pool.insert(g, hashes[0], blocks[0])
            else:
                pool.insert_run(g, hashes, blocks)
            got = [blocks, [h.hex() for h in hashes]]
        elif op == "drop" and held:
            got = rng.choice(held)
            pool.drop_hash(got)
        elif op == "reset" and not held:
            pool.reset_hashes()
        pool.check()
        index = [sorted((h.hex(), v if isinstance(v, int) else list(v)) for h, v in idx.items())
                 for idx in pool.index]
        out.append([op, got, pool.num_free, pool.num_evictions, evicted[:], list(pool.queue),
                    index])
        evicted.clear()
    return json.loads(json.dumps(out))


def run(case: str, seed: int, ops: int = 400) -> list:
    if case.startswith("pool_"):
        return run_pool(case, seed)
    rng = random.Random(seed)
    kv = _case(case)
    prefixes = [[rng.randrange(40) for _ in range(rng.randrange(1, 90))] for _ in range(4)]
    waiting: list[Request] = []
    running: list[Request] = []
    out: list = []
    next_id = 0
    for _ in range(ops):
        r = rng.random()
        if r < 0.2 or not (running or waiting):
            tail = [rng.randrange(40) for _ in range(rng.randrange(1, 70))]
            waiting.append(Request(f"r{next_id}", rng.choice(prefixes) + tail))
            next_id += 1
            continue
        if r < 0.45 and waiting:
            req = waiting[0]
            hit = kv.lookup(req)
            n = min(req.num_tokens - hit.num_tokens, rng.randrange(1, 80))
            ids = kv.allocate(req, n, hit, full_sequence_must_fit=rng.random() < 0.5)
            out.append(["admit", req.request_id, hit.num_tokens, n, ids])
            if ids is not None:
                waiting.pop(0)
                req.num_computed_tokens = hit.num_tokens + n
                running.append(req)
        elif running:
            req = rng.choice(running)
            if req.num_computed_tokens < req.num_tokens:        # a prefill chunk
                n = min(req.num_tokens - req.num_computed_tokens, rng.randrange(1, 80))
            else:                                               # a decode step
                req.append_tokens([rng.randrange(40) for _ in range(rng.randrange(1, 4))])
                n = req.num_tokens - req.num_computed_tokens
            ids = kv.allocate(req, n)
            out.append(["alloc", req.request_id, n, ids])
            if ids is None:                                     # preempt the newest
                victim = running.pop()
                kv.free(victim)
                victim.num_computed_tokens = 0
                waiting.insert(0, victim)
                out.append(["preempt", victim.request_id])
            else:
                req.num_computed_tokens += n
                if rng.random() < 0.1:
                    running.remove(req)
                    kv.free(req)
                    out.append(["finish", req.request_id])
        kv.check_integrity()
        out.append(["state", kv.num_free_blocks, kv.pool.num_evictions,
                    [repr(e) for e in kv.take_events()], repr(kv.stats())])
    out.append(["tables", [[r.request_id, kv.block_ids(r)] for r in running]])
    return json.loads(json.dumps(out))


if __name__ == "__main__":
    print(json.dumps({"compiled": COMPILED, "trace": run(sys.argv[1], int(sys.argv[2]))}))
