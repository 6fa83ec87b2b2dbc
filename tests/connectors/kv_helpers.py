"""Tiny KV-cache configs and tensors for the connector tests.

Block contents are compared through ordinary tensor indexing (``t[:, b]`` for a K/V-first GQA
layer, ``t[b]`` for block-first and MLA layers), never through the byte machinery under test.
"""

from __future__ import annotations

import torch

from hybridkv.core.blockref import BlockRef
from hybridkv.core.specs import MLA, FullAttention, KVCacheConfig, KVCacheGroup, SlidingWindow
from hybridkv.engine import PagedKVCache

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def gqa_spec(block_size: int = 16, heads: int = 2, dim: int = 8,
             dtype: str = "bfloat16") -> FullAttention:
    return FullAttention(block_size=block_size, num_kv_heads=heads, head_dim=dim, dtype=dtype)


def mla_spec(block_size: int = 32, rank: int = 16, rope: int = 8, dtype: str = "bfloat16") -> MLA:
    return MLA(block_size=block_size, kv_lora_rank=rank, qk_rope_head_dim=rope, dtype=dtype)


def gqa_config(num_blocks: int = 8) -> KVCacheConfig:
    """A hybrid GQA model: two full-attention layers and one sliding-window layer."""
    return KVCacheConfig((
        KVCacheGroup("full", gqa_spec(), ("f0", "f1")),
        KVCacheGroup("swa", SlidingWindow(block_size=16, num_kv_heads=2, head_dim=8,
                                          dtype="bfloat16", window=32), ("s0",)),
    ), num_blocks=num_blocks)


def mla_config(num_blocks: int = 8) -> KVCacheConfig:
    return KVCacheConfig(KVCacheGroup("mla", mla_spec(), ("m0", "m1")), num_blocks=num_blocks)


def mixed_config(num_blocks: int = 10, draft_block: int = 16) -> KVCacheConfig:
    """DeepSeek-like: three MLA layers plus an EAGLE draft head (one GQA layer, is_draft)."""
    return KVCacheConfig((
        KVCacheGroup("mla", mla_spec(), ("m0", "m1", "m2")),
        KVCacheGroup("draft", gqa_spec(block_size=draft_block, heads=2, dim=8), ("eagle.0",),
                     is_draft=True),
    ), num_blocks=num_blocks)


def random_(t: torch.Tensor, seed: int) -> torch.Tensor:
    """Fill a contiguous tensor with random bytes (any dtype; NaN bit patterns included)."""
    g = torch.Generator().manual_seed(seed)
    flat = t.view(torch.uint8)
    flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g))
    return t


def alloc(config: KVCacheConfig, kind: str = "kv_first", kernel: dict[str, int] | None = None,
          seed: int = 0) -> dict[str, torch.Tensor]:
    """One independent contiguous tensor per layer, filled with random bytes.

    kind: "kv_first" [2, nb, bs, H, D] | "block_first" [nb, 2, bs, H, D] | "hnd" [2, nb, H, bs, D];
    MLA layers are always [nb, bs, latent]. ``kernel`` pages a group in smaller kernel blocks.
    """
    out = {}
    for g in config.groups:
        s = g.spec
        bs = (kernel or {}).get(g.name, s.block_size)
        nb = config.num_blocks * (s.block_size // bs)  # type: ignore[operator]
        dt = TORCH[s.dtype]
        for i, name in enumerate(g.layer_names):
            if isinstance(s, MLA):
                shape: tuple[int, ...] = (nb, bs, s.latent_dim)
            elif kind == "kv_first":
                shape = (2, nb, bs, s.num_kv_heads, s.head_dim)
            elif kind == "block_first":
                shape = (nb, 2, bs, s.num_kv_heads, s.head_dim)
            else:
                shape = (2, nb, s.num_kv_heads, bs, s.head_dim)
            out[name] = random_(torch.empty(shape, dtype=dt), seed * 1000 + i + 17 * len(out))
    return out


def raw(x: torch.Tensor) -> bytes:
    """The bytes of a tensor's elements in logical order."""
    return x.contiguous().view(torch.uint8).numpy().tobytes()


def block_bytes(t: torch.Tensor, b: int, kind: str = "kv_first", mla: bool = False) -> bytes:
    """Logical contents of block ``b`` of one layer (K then V for GQA)."""
    if mla or kind == "block_first":
        return raw(t[b])
    return raw(t[:, b])


def snapshot(kv: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in kv.items()}


def h(i: int) -> bytes:
    """A 16-byte block hash."""
    return i.to_bytes(16, "big")


def engine_cache(config: KVCacheConfig,
                 seed: int = 0) -> tuple[PagedKVCache, dict[str, torch.Tensor]]:
    """The engine's PagedKVCache (layer slots shared by groups), filled with random bytes."""
    cache = PagedKVCache(config)
    g = torch.Generator().manual_seed(seed)
    for slot in cache._slots:
        slot.copy_(torch.randint(0, 256, slot.shape, dtype=torch.uint8, generator=g))
    return cache, {n: cache.layer(n) for n in cache.layer_names}


def engine(config: KVCacheConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """The layer tensors of a random-filled engine cache."""
    return engine_cache(config, seed)[1]


def scramble(kv: dict[str, torch.Tensor], seed: int) -> None:
    """Overwrite every layer with other random bytes (the blocks are 'evicted' from the GPU)."""
    g = torch.Generator().manual_seed(seed)
    for t in kv.values():
        t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=g).view(torch.int8)
                .to(torch.int16).to(t.dtype))


def same_block(kv, ref, layers, dst: int, src: int, kind: str = "kv_first",
               mla: bool = False) -> bool:
    """Block ``dst`` of ``kv`` holds what block ``src`` of ``ref`` held, in every layer."""
    return all(block_bytes(kv[n], dst, kind, mla) == block_bytes(ref[n], src, kind, mla)
               for n in layers)


def refs(transfer, group: str, pairs) -> list[BlockRef]:
    """``[(block_hash, block_id), ...]`` of the group named ``group`` as BlockRefs."""
    gi = [g.name for g in transfer.layout.config.groups].index(group)
    return [BlockRef(gi, block_id, block_hash) for block_hash, block_id in pairs]
