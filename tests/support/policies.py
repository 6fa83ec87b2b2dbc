"""Helpers of the eviction-policy tests (``tests/core/eviction``).

* :class:`Cache`: a :class:`~hybridkv.core.policy_pool.PolicyBlockPool` with an eviction log;
  content ``t`` is stored under :func:`~tests.support.helpers.content_key` ``(t)``.
* :func:`serve_contents`, :func:`eviction_order`: one request / a full drain at the pool level.
* :func:`policy_config`, :func:`serve_prompt`: the manager level; :data:`NON_LRU`.
* :func:`model_workload`: a mixed workload served on a policy and on its brute-force model.
* :func:`check_fails`: a policy's ``check`` must fail with exactly this message.
* :class:`Clock`: the injectable clock of the ``priority`` policy's TTLs.
"""

from __future__ import annotations

import pytest

from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request
from hybridkv.core.eviction import POLICIES
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import BlockPool
from tests.support.helpers import content_key, serve_chain


class Cache:
    """A policy pool with an eviction log (contents, first victim first)."""

    def __init__(self, policy, num_blocks: int, num_groups: int = 1) -> None:
        self.policy = policy
        self.evicted: list[int] = []
        self.pool = PolicyBlockPool(num_blocks, num_groups, policy,
                                    on_evict=lambda g, h: self.evicted.append(int.from_bytes(h, "little")))

    def block(self, t: int, group: int = 0) -> int | None:
        return self.pool.cached_block(group, content_key(t))

    def serve(self, chain: list[int], group: int = 0) -> int:
        """One request: hit the cached leading blocks of ``chain``, compute the rest, free it all
        tail first (:func:`tests.support.helpers.serve_chain`). Returns the leading hits."""
        return serve_chain(self.pool, [content_key(t) for t in chain], group)

    def drain(self) -> list[int]:
        """Allocate every free block (victims in the policy's order) and give them back
        hash-less; the contents evicted by this call."""
        n = len(self.evicted)
        blocks = self.pool.allocate(self.pool.num_free)
        self.pool.check()
        self.pool.free(blocks)
        return self.evicted[n:]


def check_fails(check, message: str) -> None:
    with pytest.raises(AssertionError) as exc:
        check()
    assert str(exc.value) == message


def model_workload(pol, model, num_blocks: int, steps: int, seed: int) -> int:
    """Conversations that come back after a think time, one-off prompts and a shared root,
    served on the policy's pool and on the model; every victim must be the model's. Returns
    the number of evictions compared."""
    import random
    rng = random.Random(seed)
    c = Cache(pol, num_blocks)
    pool = c.pool
    convs: list[list[int]] = []
    fresh = 1000
    compared = 0
    for _ in range(steps):
        r = rng.random()
        if convs and r < 0.55:
            chain = rng.choice(convs)
            chain += [fresh, fresh + 1][: rng.randint(1, 2)]
            fresh += 2
            if len(chain) > min(6, num_blocks - 4):
                convs.remove(chain)
        else:
            chain = [0] if r < 0.8 else []
            chain = chain + list(range(fresh, fresh + rng.randint(1, 3)))
            fresh += 3
            if r < 0.75:
                convs.append(chain)
        held = []
        for t in chain:
            b = c.block(t)
            if b is None:
                break
            held.append(b)
        for b in held:
            model.hit(b, b in pol)
            pool.touch([b])
        n = len(chain) - len(held)
        victims = n - (pool.num_free - len(pol))
        want = [model.content[b] for b in model.pop(max(0, victims))]
        before = len(c.evicted)
        new = pool.allocate(n)
        assert c.evicted[before:] == want
        compared += len(want)
        model.forget(new)
        for b, t in zip(new, chain[len(held):]):
            pool.insert(0, content_key(t), b)
        blocks = (held + new)[::-1]
        model.free(blocks, chain[::-1])
        pool.free(blocks)
        pool.check()
        model.compare(pol)
    return compared


NON_LRU = [p for p in POLICIES if p not in ("lru", "recommended")]


def policy_config(num_blocks: int, *specs) -> KVCacheConfig:
    specs = specs or (FullAttention(block_size=4, num_kv_heads=1, head_dim=4),)
    return KVCacheConfig(tuple(KVCacheGroup(f"g{i}", s, (f"l{i}",)) for i, s in enumerate(specs)),
                         num_blocks=num_blocks)


def serve_prompt(kv: KVCacheManager, rid: str, tokens: list[int]) -> int:
    """Run one request to completion (prefill only) and free it; the hit length in tokens."""
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
    req.num_computed_tokens = req.num_tokens
    kv.free(req)
    kv.check_integrity()
    return hit.num_tokens


def eviction_order(pool: PolicyBlockPool, evicted: list[bytes]) -> list[int]:
    """Allocate every free block; the hashes the policy gave up, first victim first."""
    evicted.clear()
    pool.allocate(pool.num_free)
    pool.check()
    return [int.from_bytes(h, "little") for h in evicted]


def serve_contents(pool: BlockPool, chain: list[int]) -> int:
    """:func:`tests.support.helpers.serve_chain` of ``chain``'s content keys."""
    return serve_chain(pool, [content_key(t) for t in chain])


class Clock:
    """The injectable clock: time moves only when a test says so."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t
