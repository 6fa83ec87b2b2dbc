"""PagedKVCache layout: shapes, byte accounting, memory shared between groups, null block."""

from __future__ import annotations

import pytest
import torch

from hybridkv.core.specs import MLA, FullAttention, KVCacheConfig, KVCacheGroup, SlidingWindow
from hybridkv.engine import PagedKVCache


def hybrid_config(num_blocks: int = 10) -> KVCacheConfig:
    full = FullAttention(block_size=16, num_kv_heads=2, head_dim=8, dtype="float32")
    swa = SlidingWindow(block_size=8, num_kv_heads=2, head_dim=8, dtype="float32", window=12)
    return KVCacheConfig((
        KVCacheGroup("full", full, ("l0", "l3")),
        KVCacheGroup("swa", swa, ("l1", "l2")),
    ), num_blocks=num_blocks)


def test_gqa_shapes_and_bytes() -> None:
    cache = PagedKVCache(hybrid_config())
    assert cache.layer("l0").shape == (2, 10, 16, 2, 8)
    assert cache.layer("l1").shape == (2, 10, 8, 2, 8)
    assert cache.layer("l0").dtype == torch.float32
    assert cache.nbytes == 10 * cache.config.block_bytes
    assert cache.group_index("l2") == 1 and cache.group("l3").name == "full"
    with pytest.raises(KeyError, match="no KV cache for layer"):
        cache.layer("nope")


def test_mla_latent_shape() -> None:
    spec = MLA(block_size=8, kv_lora_rank=32, qk_rope_head_dim=8, dtype="bfloat16")
    cache = PagedKVCache(KVCacheConfig(KVCacheGroup("mla", spec, ("a", "b")), num_blocks=5))
    assert cache.layer("a").shape == (5, 8, 40) and cache.layer("a").dtype == torch.bfloat16
    assert cache.nbytes == 5 * cache.config.block_bytes


def test_layout_comes_from_the_spec_not_its_type() -> None:
    """Storage asks the spec (K/V halves or one latent, compression), never its class: a
    chunked-local group is laid out like any K/V group; compressed MLA is refused by name."""
    from hybridkv.core.specs import ChunkedLocal
    chunked = ChunkedLocal(block_size=4, num_kv_heads=2, head_dim=8, dtype="float32", chunk_size=8)
    cache = PagedKVCache(KVCacheConfig(KVCacheGroup("c", chunked, ("a",)), num_blocks=6))
    assert cache.layer("a").shape == (2, 6, 4, 2, 8)
    mla = MLA(block_size=8, kv_lora_rank=32, qk_rope_head_dim=8, compress_ratio=4)
    with pytest.raises(ValueError, match="MLA compress_ratio=4 is not supported by the reference engine"):
        PagedKVCache(KVCacheConfig(KVCacheGroup("m", mla, ("a",)), num_blocks=6))


def test_groups_share_layer_slots() -> None:
    """Layer j of every group lives in slot j: one block id is one page in each slot, so
    block 3 of l0 (full) and block 3 of l1 (sliding) are the same bytes."""
    cache = PagedKVCache(hybrid_config())
    cache.layer("l1")[0, 3] = 1.0
    assert cache.layer("l0")[0, 3].abs().sum() > 0
    assert cache.layer("l0")[0, 4].abs().sum() == 0
    assert cache.layer("l3")[0, 3].abs().sum() == 0  # slot 1: untouched


def test_k_and_v_pages_are_separate() -> None:
    cache = PagedKVCache(hybrid_config())
    cache.layer("l0")[0, 2] = 1.0
    assert cache.layer("l0")[1, 2].abs().sum() == 0


def test_fill_blocks() -> None:
    cache = PagedKVCache(hybrid_config())
    cache.fill_blocks([0], float("nan"))
    for name in cache.layer_names:
        t = cache.layer(name)
        assert torch.isnan(t[:, 0]).all() and not torch.isnan(t[:, 1:]).any()


def test_unsupported_dtype() -> None:
    spec = FullAttention(block_size=4, num_kv_heads=1, head_dim=8, dtype="fp4")
    with pytest.raises(ValueError, match="no torch storage type"):
        PagedKVCache(KVCacheConfig(KVCacheGroup("g", spec, ("l",)), num_blocks=3))
