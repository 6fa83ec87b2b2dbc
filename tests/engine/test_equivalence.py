"""Paged engine logits equal transformers' full-forward logits (fp32, max abs diff <= 1e-4).

Every test runs with block 0 and every freed block filled with NaN, so reading a page the
sequence does not own would make the logits NaN and fail the comparison.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.engine.helpers import (
    TOL,
    Allocator,
    Built,
    TableOwner,
    max_diff,
    new_cache,
    null_block_is_nan,
    random_tokens,
)
from hybridkv.core.specs import KVCacheConfig, KVCacheGroup, SlidingWindow
from hybridkv.engine import PagedKVCache, load_model, make_kv_cache_config


def run_chunks(built: Built, owner: TableOwner, chunks: list[int], cache) -> torch.Tensor:
    outs = []
    for n in chunks:
        outs.append(built.model([owner.step(n)], cache, logits="all")[0])
        owner.done(n)
    return torch.cat(outs)


def test_cold_prefill(built: Built) -> None:
    """One sequence, whole prompt in one step, all logits."""
    tokens = random_tokens(37, seed=1)
    cache, alloc = new_cache(built)
    owner = TableOwner(alloc, tokens)
    logits = built.model([owner.step(len(tokens))], cache, logits="all")[0]
    assert max_diff(logits, built.oracle(tokens)) <= TOL
    assert null_block_is_nan(cache)


def test_last_logits_only(built: Built) -> None:
    """``logits="last"`` returns the final row; ``"none"`` returns nothing but still fills the cache."""
    tokens = random_tokens(21, seed=2)
    cache, alloc = new_cache(built)
    owner = TableOwner(alloc, tokens)
    assert built.model([owner.step(20)], cache, logits="none") == []
    owner.done(20)
    last = built.model([owner.step(1)], cache, logits="last")[0]
    assert last.shape == (1, built.model.config.vocab_size)
    assert max_diff(last, built.oracle(tokens)[-1:]) <= TOL


def test_chunked_prefill_across_block_boundaries(built: Built) -> None:
    """Prefill split into uneven chunks that start and end inside blocks."""
    tokens = random_tokens(45, seed=3)
    cache, alloc = new_cache(built)
    owner = TableOwner(alloc, tokens)
    logits = run_chunks(built, owner, [5, 11, 1, 16, 12], cache)
    assert max_diff(logits, built.oracle(tokens)) <= TOL


def test_decode_steps_batched(built: Built) -> None:
    """Three sequences of different lengths prefilled together, then decoded one token per step
    in the same batch."""
    cache, alloc = new_cache(built)
    prompts = [random_tokens(n, seed=10 + n) for n in (9, 24, 17)]
    decode = 10
    owners = [TableOwner(alloc, p + random_tokens(decode, seed=20 + i)) for i, p in enumerate(prompts)]
    inputs = [o.step(len(p)) for o, p in zip(owners, prompts)]
    firsts = built.model(inputs, cache, logits="last")
    for o, p in zip(owners, prompts):
        o.done(len(p))
    got = [[f] for f in firsts]
    for _ in range(decode):
        outs = built.model([o.step(1) for o in owners], cache, logits="last")
        for o, g, out in zip(owners, got, outs):
            o.done(1)
            g.append(out)
    for o, p, g in zip(owners, prompts, got):
        ref = built.oracle(o.tokens)[len(p) - 1:]
        assert max_diff(torch.cat(g), ref) <= TOL


def test_prefix_cache_hit(built: Built) -> None:
    """B shares A's first 32 tokens: its tables reuse A's block ids (sliding groups only the
    blocks still in B's window, the rest null) and only B's suffix is computed, batched with
    a decode step of A."""
    cache, alloc = new_cache(built)
    a_tokens = random_tokens(48, seed=4) + [7]
    b_tokens = a_tokens[:32] + random_tokens(19, seed=5)
    a = TableOwner(alloc, a_tokens)
    built.model([a.step(48)], cache, logits="none")
    a.done(48)
    a_tables = [list(t) for t in a.tables]
    b = TableOwner(alloc, b_tokens)
    b.share_prefix(a, 32)
    out_a, out_b = built.model([a.step(1), b.step(19)], cache, logits="all")
    assert max_diff(out_a, built.oracle(a_tokens)[-1:]) <= TOL
    assert max_diff(out_b, built.oracle(b_tokens)[32:]) <= TOL
    # The shared pages really are shared, not copies.
    for gi, group in enumerate(cache.config.groups):
        bs = group.spec.block_size
        shared = [x for x in b.tables[gi][: 32 // bs] if x]
        assert shared and all(x in a_tables[gi] for x in shared)


def test_sliding_window_never_reads_null_or_freed_blocks(built_sliding: Built) -> None:
    """A sequence far longer than the window: sliding tables hold 0 for out-of-window blocks,
    those blocks are freed, NaN-poisoned and reused, and the logits still match."""
    built = built_sliding
    tokens = random_tokens(75, seed=6)
    cache, alloc = new_cache(built, num_blocks=40)
    owner = TableOwner(alloc, tokens)
    logits = run_chunks(built, owner, [20, 7, 1, 1, 13, 30, 1, 1, 1], cache)
    assert max_diff(logits, built.oracle(tokens)) <= TOL
    sliding = [gi for gi, g in enumerate(cache.config.groups) if isinstance(g.spec, SlidingWindow)]
    assert sliding
    for gi in sliding:  # every block wholly before the last query's window was nulled
        spec = cache.config.groups[gi].spec
        out_of_window = (len(tokens) - spec.window) // spec.block_size
        assert out_of_window > 0
        assert owner.tables[gi][:out_of_window] == [0] * out_of_window
    assert null_block_is_nan(cache)


def test_window_off_by_one_is_detected(built_models: dict[str, Built]) -> None:
    """Negative control: a window of W + 1 instead of W changes the logits far beyond the
    tolerance, so the equivalence tests do pin the window semantics."""
    built = built_models["qwen2_swa"]
    tokens = random_tokens(40, seed=7)
    base = built.kv_config()
    groups = tuple(
        KVCacheGroup(g.name, dataclasses.replace(g.spec, window=g.spec.window + 1), g.layer_names)
        if isinstance(g.spec, SlidingWindow) else g for g in base.groups
    )
    wrong = PagedKVCache(KVCacheConfig(groups, num_blocks=base.num_blocks))
    layers = [layer.self_attn for layer in built.model.model.layers if layer.self_attn.window]
    saved = [attn.window for attn in layers]
    try:
        for attn in layers:
            attn.window += 1
        owner = TableOwner(Allocator(wrong), tokens)
        logits = built.model([owner.step(40)], wrong, logits="all")[0]
    finally:
        for attn, w in zip(layers, saved):
            attn.window = w
    assert max_diff(logits, built.oracle(tokens)) > 1e-3


@pytest.mark.parametrize("sizes", [{"full": 4, "sliding": 16}, {"full": 8, "sliding": 8}])
def test_other_block_sizes(built_models: dict[str, Built], sizes: dict[str, int]) -> None:
    """Block sizes per group are free: sliding blocks larger than full ones, or equal."""
    built = built_models["qwen2_swa"]
    cache = PagedKVCache(make_kv_cache_config(built.model, sizes, num_blocks=64))
    cache.fill_blocks([0], float("nan"))
    tokens = random_tokens(50, seed=8)
    owner = TableOwner(Allocator(cache), tokens)
    logits = run_chunks(built, owner, [13, 19, 1, 17], cache)
    assert max_diff(logits, built.oracle(tokens)) <= TOL


def test_one_layer_per_group(built_models: dict[str, Built]) -> None:
    """Four single-layer groups share one layer slot, so every block id lives in exactly one
    group; the logits stay exact (groups never overwrite each other's pages)."""
    built = built_models["qwen2_swa"]
    config = make_kv_cache_config(built.model, {"full": 16, "sliding": 8}, num_blocks=64, layers_per_group=1)
    assert len(config.groups) == 4 and config.layer_slots == 1
    cache = PagedKVCache(config)
    cache.fill_blocks([0], float("nan"))
    tokens = random_tokens(44, seed=9)
    owner = TableOwner(Allocator(cache), tokens)
    logits = run_chunks(built, owner, [30, 14], cache)
    assert max_diff(logits, built.oracle(tokens)) <= TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_oracle(built_models: dict[str, Built]) -> None:
    """The same paged forward on a CUDA device (model and cache) matches the CPU oracle."""
    for name in ("qwen2_swa", "gpt_oss", "deepseek"):
        built = built_models[name]
        model = load_model(built.path, device="cuda")
        cache = PagedKVCache(built.kv_config(), device="cuda")
        cache.fill_blocks([0], float("nan"))
        tokens = random_tokens(40, seed=11)
        owner = TableOwner(Allocator(cache), tokens)
        outs = []
        for n in (17, 23):
            outs.append(model([owner.step(n)], cache, logits="all")[0].cpu())
            owner.done(n)
        assert max_diff(torch.cat(outs), built.oracle(tokens)) <= TOL
