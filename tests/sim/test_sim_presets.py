"""Model and GPU presets: layer layouts and KV sizes match the published configs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybridkv.core.specs import (MLA, ChunkedLocal, CompressorState, FullAttention, KVCacheConfig,
                                 SlidingWindow, SparseMLA)
from hybridkv.cost.presets import GPU_PRESETS, MODEL_PRESETS, get_gpu, get_preset


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_every_preset_is_consistent(name: str) -> None:
    p = get_preset(name)
    layers = [layer for g in p.target_groups for layer in g.layer_names]
    assert len(layers) == len(set(layers))
    # a decoder layer's caches may sit in several groups (layers.<i>.<part>): count layers
    assert len({".".join(n.split(".")[:2]) for n in layers}) == p.num_layers
    assert isinstance(p.kv_config(num_blocks=100), KVCacheConfig)
    kv = p.kv_bytes_per_token()
    assert kv["total"] == sum(v for k, v in kv.items() if k != "total") > 0
    assert 0 < p.active_params <= p.num_params


@pytest.mark.parametrize(
    "name,layout,bytes_per_token",
    [
        # 32 layers * 2 (K, V) * 8 heads * 128 dims * 2 bytes
        ("llama-3.1-8b", {"full": (FullAttention, 32)}, {"full": 131_072}),
        ("gemma-3-27b", {"full": (FullAttention, 10), "swa": (SlidingWindow, 52)},
         {"full": 10 * 2 * 16 * 128 * 2, "swa": 52 * 2 * 16 * 128 * 2}),
        ("gpt-oss-120b", {"full": (FullAttention, 18), "swa": (SlidingWindow, 18)},
         {"full": 18 * 2 * 8 * 64 * 2, "swa": 18 * 2 * 8 * 64 * 2}),
        ("llama-4-scout", {"full": (FullAttention, 12), "chunked": (ChunkedLocal, 36)},
         {"full": 12 * 2 * 8 * 128 * 2, "chunked": 36 * 2 * 8 * 128 * 2}),
        # 61 layers * (512 + 64) latent values * 2 bytes
        ("deepseek-v3", {"mla": (MLA, 61)}, {"mla": 61 * 576 * 2}),
    ],
)
def test_published_layouts(name, layout, bytes_per_token) -> None:
    p = get_preset(name)
    assert {g.name: (type(g.spec), len(g.layer_names)) for g in p.groups} == layout
    kv = p.kv_bytes_per_token()
    assert {k: v for k, v in kv.items() if k != "total"} == bytes_per_token


def test_window_and_chunk_values() -> None:
    assert get_preset("gemma-3-27b").groups[1].spec.window == 1024
    gpt = get_preset("gpt-oss-120b")
    assert gpt.groups[1].spec.window == 128
    assert [int(n.split(".")[1]) % 2 for n in gpt.groups[1].layer_names] == [0] * 18  # even = sliding
    scout = get_preset("llama-4-scout")
    assert scout.groups[1].spec.chunk_size == 8192
    assert all(int(n.split(".")[1]) % 4 == 3 for n in scout.groups[0].layer_names)


def test_v4_style_is_hybrid_with_draft_group() -> None:
    p = get_preset("deepseek-v4-style")
    assert p.spec_decode == ("mtp", 1)
    assert [g.spec.block_size for g in p.groups] == [256, 64, 8, 256]
    assert [g.is_draft for g in p.groups] == [False, False, False, True]
    assert {g.spec.window for g in p.groups if isinstance(g.spec, SlidingWindow)} == {512, 128}
    assert "not an official" in p.source
    cfg = p.kv_config(num_blocks=64)
    assert (cfg.hash_block_size, cfg.alignment) == (8, 256)
    assert get_preset("llama-3.1-8b").spec_decode is None


def test_v4_flash_has_vllms_five_groups_and_block_sizes() -> None:
    """deepseek-v4-flash — five groups with block sizes {256, 64, 64, 4, 8} and windows
    128, 128, 8, 128 (vllm#42948, vllm#51163, unified-cache-management#1322); the MTP layer
    is the 44th sliding-window layer (swa_b, the draft group); 21 CSA + 20 HCA layers
    compressed; a 32K prefix needs 128 + 512 + 512 + 8,192 + 4,096 = 13,440 blocks, vllm#42948's
    number; hashes at 4 tokens, hits aligned to 256."""
    p = get_preset("deepseek-v4-flash")
    assert [(g.name, type(g.spec), g.spec.block_size, g.spec.window_tokens, len(g.layer_names))
            for g in p.groups] == [
        ("compressed", SparseMLA, 256, None, 41), ("swa_a", SlidingWindow, 64, 128, 22),
        ("swa_b", SlidingWindow, 64, 128, 22), ("c4_state", CompressorState, 4, 8, 21),
        ("c128_state", CompressorState, 8, 128, 20)]
    assert [g.is_draft for g in p.groups] == [False, False, True, False, False]
    assert p.groups[2].layer_names[-1] == "mtp.0.swa" and p.spec_decode == ("mtp", 1)
    assert (p.groups[3].spec.compress_ratio, p.groups[4].spec.compress_ratio) == (4, 128)
    assert sum(-(-32768 // g.spec.block_size) for g in p.groups) == 13_440
    cfg = p.kv_config(num_blocks=64)
    assert (cfg.hash_block_size, cfg.alignment, cfg.layer_slots) == (4, 256, 41)
    assert p.context_len == 1_048_576 and "DeepSeek-V4-Flash" in p.source


def test_with_block_size() -> None:
    p = get_preset("gemma-3-27b").with_block_size(64)
    assert [g.spec.block_size for g in p.groups] == [64, 64]
    assert p.groups[1].spec.window == 1024  # other fields kept
    v4 = get_preset("deepseek-v4-style").with_block_size(64)
    assert [g.spec.block_size for g in v4.groups] == [64, 16, 2, 64]  # ratios kept
    assert get_preset("deepseek-v4-style").block_size == 256  # original untouched
    with pytest.raises(ValueError, match="multiple of 32"):
        get_preset("deepseek-v4-style").with_block_size(48)
    with pytest.raises(ValueError, match="chunk_size"):
        get_preset("llama-4-scout").with_block_size(3000)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        get_preset("llama-3.1-8b").with_block_size(0)


def test_lookup_errors_list_valid_names() -> None:
    with pytest.raises(ValueError, match="llama-3.1-8b.*deepseek-v4-style"):
        get_preset("gpt-5")
    with pytest.raises(ValueError, match="h100, h800, h200, b200"):
        get_gpu("tpu")


def test_gpu_presets() -> None:
    h100, h200, b200 = (GPU_PRESETS[n] for n in ("h100", "h200", "b200"))
    assert (h100.memory_bytes, h100.mem_bw, h100.flops) == (int(79.18 * 2**30), 3.35e12, 989e12)
    assert (h200.memory_bytes, h200.mem_bw, h200.flops) == (141e9, 4.8e12, 989e12)
    assert (b200.memory_bytes, b200.mem_bw, b200.flops) == (192e9, 8e12, 2250e12)
    assert get_gpu("h200") is h200


def test_eagle3_drafter_group_is_added_for_eagle3_only():
    """Issue #44: the EAGLE-3 drafter's KV was not counted. Llama-3.1-8B's drafter is one
    decoder layer with 8 KV heads of 128: 1 x 8 x 128 x 2 (K, V) x 2 bytes = 4,096 B per
    token beside the target's 32 layers' 131,072."""
    llama = get_preset("llama-3.1-8b")
    assert llama.kv_bytes_per_token() == {"full": 131_072, "total": 131_072}
    with_drafter = llama.with_drafter("eagle3")
    assert with_drafter.kv_bytes_per_token() == {"full": 131_072, "eagle3": 4_096, "total": 135_168}
    draft = with_drafter.groups[-1]
    assert draft.is_draft and draft.layer_names == ("eagle3.0",) and draft.spec.block_size == 16
    assert with_drafter.target_groups == llama.groups
    assert llama.with_drafter("eagle") is llama and llama.with_drafter(None) is llama
    assert with_drafter.with_drafter("eagle3") is with_drafter          # once
    assert llama.with_block_size(64).with_drafter("eagle3").groups[-1].spec.block_size == 64
    deepseek = get_preset("deepseek-v4-style")                         # has its own MTP group
    assert deepseek.eagle3_drafter is None and deepseek.with_drafter("eagle3") is deepseek


def test_cli_counts_the_eagle3_drafters_kv(tmp_path):
    from hybridkv.cli import main
    from hybridkv.core.spec_decode import SpecDecode
    from hybridkv.sim import SimConfig, Simulator, items_from_trace
    from hybridkv.sim.traffic.workloads import get_workload
    js = tmp_path / "e.json"
    assert main(["simulate", "--workload", "chat", "--limit", "10", "--preset", "llama-3.1-8b",
                 "--gpus", "1", "--spec", "eagle3:3", "--num-blocks", "3000", "--no-progress",
                 "--no-optimum", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert set(d["retained_blocks"]) == {"full", "eagle3"}
    preset = get_preset("llama-3.1-8b").with_drafter("eagle3")
    lib = Simulator(SimConfig(preset=preset, gpu=get_gpu("h100"), num_blocks=3000,
                              spec=SpecDecode("eagle3", 3), optimum=False)).run(
        items_from_trace(get_workload("chat", seed=0))[:10])
    assert d["hit_tokens"] == lib.hit_tokens and d["retained_blocks"] == lib.retained_blocks


def test_a_shared_drafter_group_halves_the_pool_cost_of_eagle3() -> None:
    """with_drafter(shared=) — llama-3.1-8b's EAGLE-3 layer (the target's spec) in a group of
    its own: every block id spans 32 layer slots of 65,536 B (2,097,152 B), and a 16,000-token
    request takes 1,000 blocks in each group (2,000); 40 GiB hold 20,480 blocks, 10 such
    requests. Shared with the 32 target layers: 33 slots (2,162,688 B per block id), 1,000
    blocks per request, 19,859 blocks, 19 requests (vllm#50169's regrouping: 415k -> 871k).
    A preset whose groups lack the drafter's spec is refused by name."""
    from hybridkv.core.manager import KVCacheManager
    out = []
    for shared in (False, True):
        p = get_preset("llama-3.1-8b").with_drafter("eagle3", shared=shared)
        c = p.kv_config(memory_bytes=40 * 2**30)
        per = KVCacheManager.blocks_for_request(c, 16_000)
        out.append(([(g.name, len(g.layer_names), g.is_draft) for g in p.groups], c.block_bytes,
                    c.num_blocks, per, (c.num_blocks - 1) // per))
    assert out == [([("full", 32, False), ("eagle3", 1, True)], 2_097_152, 20_480, 2_000, 10),
                   ([("full", 33, True)], 2_162_688, 19_859, 1_000, 19)]
    shared = get_preset("llama-3.1-8b").with_drafter("eagle3", shared=True)
    assert shared.groups[0].layer_names[-1] == "eagle3.0"
    assert get_preset("llama-3.1-8b").with_drafter("mtp", shared=True).groups == get_preset("llama-3.1-8b").groups
    odd = dataclasses.replace(get_preset("llama-3.1-8b"), eagle3_drafter=dataclasses.replace(
        get_preset("llama-3.1-8b").eagle3_drafter, spec=FullAttention(16, num_kv_heads=4, head_dim=128)))
    with pytest.raises(ValueError, match=r"llama-3\.1-8b: no target group has the drafter's spec "
                                         r"FullAttention\(block_size=16, num_kv_heads=4.*groups: full FullAttention$"):
        odd.with_drafter("eagle3", shared=True)
