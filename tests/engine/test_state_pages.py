"""StatePages: recurrent states as flat byte buffers over an extent's pages (docs/state-groups.md §2.9).

Oracle: a plain dict of the states written. Random state shapes, dtypes, extent sizes and
layer counts: every read returns exactly what was last written to that extent (bit-exact for
fp32, the dtype's rounding otherwise), and a write or copy changes no byte outside its
extent's pages (the block ids the pool gave the state group) in any layer slot.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.core.specs import FullAttention, KVCacheConfig, KVCacheGroup, StateSpec
from hybridkv.engine.kv_cache import PagedKVCache, torch_dtype
from hybridkv.engine.state_pages import StatePages


def _config(conv, state, conv_dtype, state_dtype, layers, num_blocks):
    attn = KVCacheGroup("full", FullAttention(4, num_kv_heads=1, head_dim=4), ("a0",))
    sg = KVCacheGroup("state", StateSpec(4, conv_shape=conv, conv_dtype=conv_dtype, state_shape=state,
                                         state_dtype=state_dtype), tuple(f"s{i}" for i in range(layers)))
    return KVCacheConfig((attn, sg), num_blocks=num_blocks)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_read_returns_what_was_written(data) -> None:
    conv = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 9)))
    state = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    conv_dtype = data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    state_dtype = data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    layers = data.draw(st.integers(1, 3))
    cfg = _config(conv, state, conv_dtype, state_dtype, layers, 40)
    k = cfg.extent_blocks(1)
    cache = PagedKVCache(cfg)
    pages = StatePages(cache, {f"s{i}": 10 + i for i in range(layers)})
    ids = data.draw(st.permutations(range(1, 40)))
    extents = [tuple(ids[j * k:(j + 1) * k]) for j in range(min(4, 39 // k))]
    written = {}
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    for _ in range(data.draw(st.integers(1, 8))):
        e = extents[data.draw(st.integers(0, len(extents) - 1))]
        before = [p.clone() for p in cache.state_pages(1)]
        if written and data.draw(st.booleans()):
            src = data.draw(st.sampled_from(sorted(written)))
            pages.copy(1, src, e)
            written[e] = written[src]
        else:
            c = {10 + i: torch.randn(conv, generator=gen).to(torch_dtype(conv_dtype)) for i in range(layers)}
            s = {10 + i: torch.randn(state, generator=gen) for i in range(layers)}
            pages.write(1, e, c, s)
            written[e] = (c, {i: v.to(torch_dtype(state_dtype)).float() for i, v in s.items()})
        for b, a in zip(before, cache.state_pages(1)):    # only e's pages changed
            other = torch.ones(40, dtype=torch.bool)
            other[list(e)] = False
            assert torch.equal(b[other], a[other])
        for ext, (c, s) in written.items():
            got_c, got_s = pages.read(1, ext)
            assert set(got_c) == set(c) and set(got_s) == set(s)
            for i in c:
                assert torch.equal(got_c[i], c[i]) and got_c[i].dtype == torch_dtype(conv_dtype)
                assert torch.equal(got_s[i], s[i]) and got_s[i].dtype == torch.float32


def test_bad_extents_and_shapes_are_refused() -> None:
    cfg = _config((2, 3), (2, 2), "float32", "float32", 1, 8)
    pages = StatePages(PagedKVCache(cfg), {"s0": 0})
    with pytest.raises(ValueError, match="real block ids"):
        pages.read(1, (0,))
    with pytest.raises(ValueError, match="do not match"):
        pages.write(1, (1,), {0: torch.zeros(3, 2)}, {0: torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="not a state group"):
        PagedKVCache(cfg).state_pages(0)
