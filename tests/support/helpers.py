"""Small builders shared by the core tests (and the scheduler's).

* specs and configs: :func:`FA`, :func:`SWA`, :func:`config`, :func:`manager`; the state specs
  :data:`STATE4`, :data:`ST_K2`, :data:`QWEN3_NEXT`, :data:`NEMOTRON_H` and
  :func:`state_hybrid`; :data:`EAGLE_DROP`;
* driving a manager: :func:`run_prompt`, :func:`serve`, :func:`admit`, :func:`prompt`;
* reading and editing the cache: :func:`cached_positions`, :func:`hash_cached`, :func:`evict`;
* the pool level: :func:`serve_chain`, :func:`content_key`;
* :func:`raises`: ``pytest.raises(ValueError, match=...)``.
"""

from __future__ import annotations

import pytest

from hybridkv import (CacheHit, FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager,
                      Request, SlidingWindow, SpecDecode)
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams
from hybridkv.core.specs import StateSpec

C3 = [0] * 16 + [1] * 16 + [2] * 16

#: EAGLE in vLLM's legacy drop mode (no lookahead hashing: a hit needs its proof block)
EAGLE_DROP = SpecDecode("eagle", 1, hash_lookahead=False)

#: small recurrent states: 16 + 16 B per layer (one block id next to 16-byte pages) and
#: 16 + 128 = 144 B (extents of 2 block ids over 64-byte pages)
STATE4 = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                   state_dtype="float32")
ST_K2 = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(4, 8),
                  state_dtype="float32")

#: the recurrent layers of Qwen3-Next (gated delta net) and Nemotron-H (Mamba2)
QWEN3_NEXT = StateSpec(16, conv_shape=(3, 2 * 16 * 128 + 32 * 128), conv_dtype="bfloat16",
                       state_shape=(32, 128, 128), state_dtype="float32")
NEMOTRON_H = StateSpec(16, conv_shape=(3, 128 * 64 + 2 * 8 * 128), conv_dtype="bfloat16",
                       state_shape=(128, 64, 128), state_dtype="float32")


def state_hybrid(state: StateSpec, num_blocks: int = 4000, attn_bs: int = 16) -> KVCacheConfig:
    """Full attention (2 heads of 256, bs ``attn_bs``) in group "attn" plus ``state`` in "gdn"."""
    return KVCacheConfig((KVCacheGroup("attn", FullAttention(attn_bs, num_kv_heads=2, head_dim=256), ("a",)),
                          KVCacheGroup("gdn", state, ("s",))), num_blocks=num_blocks)


def raises(match: str):
    """``pytest.raises(ValueError, match=match)``."""
    return pytest.raises(ValueError, match=match)


def content_key(t: int) -> bytes:
    """The block hash the pool-level tests store content ``t`` under (8 bytes, little endian)."""
    return t.to_bytes(8, "little")


def prompt(base: int, n: int) -> list[int]:
    """``n`` distinct tokens ``base .. base+n-1`` (prompts with different bases share none)."""
    return list(range(base, base + n))


def FA(bs: int, **kw) -> FullAttention:
    return FullAttention(block_size=bs, num_kv_heads=1, head_dim=8, **kw)


def SWA(bs: int, w: int, **kw) -> SlidingWindow:
    return SlidingWindow(block_size=bs, num_kv_heads=1, head_dim=8, window=w, **kw)


def config(*specs, num_blocks: int, drafts: tuple[int, ...] = ()) -> KVCacheConfig:
    groups = [KVCacheGroup(f"g{i}", s, (f"layer{i}",), is_draft=i in drafts)
              for i, s in enumerate(specs)]
    return KVCacheConfig(tuple(groups), num_blocks=num_blocks)


def manager(*specs, num_blocks: int, drafts: tuple[int, ...] = (), compat: bool = True,
            retention=None, **kw) -> KVCacheManager:
    return KVCacheManager(config(*specs, num_blocks=num_blocks, drafts=drafts),
                          CacheOptions(vllm_compat=compat, retention_interval=retention, **kw))


def run_prompt(kv: KVCacheManager, rid, tokens, chunk: int | None = None, **req_kw):
    """Look up, allocate and 'compute' a whole prompt (optionally in chunks); returns (req, hit)."""
    req = Request(rid, tokens, RequestCacheParams(**req_kw))
    hit = kv.lookup(req)
    total = len(tokens) - hit.num_tokens
    first = total if chunk is None else min(chunk, total)
    assert kv.allocate(req, first, hit) is not None
    req.num_computed_tokens = hit.num_tokens + first
    while req.num_computed_tokens < len(tokens):
        n = min(chunk, len(tokens) - req.num_computed_tokens)
        assert kv.allocate(req, n) is not None
        req.num_computed_tokens += n
    return req, hit


def admit(kv: KVCacheManager, req: Request, n: int, expect_hit: int = 0,
          **allocate_kw) -> CacheHit:
    """Admit the new request ``req``: look it up, assert the hit is ``expect_hit`` tokens,
    allocate ``n`` new tokens with that hit (``allocate_kw``, e.g. ``num_lookahead_tokens``,
    passed on), assert they fit, and mark them computed (``num_computed_tokens = hit + n``).
    Returns the hit. Exactly ``kv.lookup(req)`` then ``kv.allocate(req, n, hit,
    **allocate_kw)``: no other call to the manager."""
    hit = kv.lookup(req)
    assert hit.num_tokens == expect_hit, (hit.num_tokens, expect_hit)
    assert kv.allocate(req, n, hit, **allocate_kw) is not None
    req.num_computed_tokens = hit.num_tokens + n
    return hit


def serve_chain(pool, keys: list[bytes], group: int = 0) -> int:
    """One request at the pool level (no manager): take the cached leading blocks of the hash
    chain ``keys`` in ``group`` (a hit), allocate and insert the rest (computed), free all of it
    tail first, and check the pool. Returns the number of leading hits."""
    held = []
    for h in keys:
        b = pool.cached_block(group, h)
        if b is None:
            break
        held.append(b)
    pool.touch(held)
    new = pool.allocate(len(keys) - len(held))
    for b, h in zip(new, keys[len(held):]):
        pool.insert(group, h, b)
    pool.free((held + new)[::-1])
    pool.check()
    return len(held)


def serve(kv: KVCacheManager, rid, tokens, chunk: int | None = None, free: bool = True,
          **req_kw) -> Request:
    """:func:`run_prompt`, then free the request unless ``free`` is False; returns it."""
    req, _ = run_prompt(kv, rid, tokens, chunk, **req_kw)
    if free:
        kv.free(req)
    return req


def cached_positions(kv: KVCacheManager, req: Request, group: int) -> set[int]:
    """Table positions of ``req``'s group whose block is cached under the request's hash."""
    pool = kv.pool
    scale = kv.config.groups[group].spec.block_size // kv.config.hash_block_size
    out = set()
    for j, b in enumerate(kv.block_ids(req)[group]):
        k = (j + 1) * scale - 1
        if b and k < len(req.block_hashes) and pool.block_hash[b] == req.block_hashes[k]:
            out.add(j)
    return out


def hash_cached(kv: KVCacheManager, req: Request, group: int, j: int) -> bool:
    scale = kv.config.groups[group].spec.block_size // kv.config.hash_block_size
    return kv.pool.cached_block(group, req.block_hashes[(j + 1) * scale - 1]) is not None


def evict(kv: KVCacheManager, req: Request, group: int, j: int) -> None:
    """Drop the cached block holding ``req``'s group-``group`` hash j (test helper)."""
    scale = kv.config.groups[group].spec.block_size // kv.config.hash_block_size
    b = kv.pool.cached_block(group, req.block_hashes[(j + 1) * scale - 1])
    assert b is not None
    kv.pool.drop_hash(b)
