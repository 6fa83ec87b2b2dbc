"""Roofline cost model: closed forms, regime limits and monotonicity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.core.specs import ChunkedLocal, FullAttention, SlidingWindow
from hybridkv.cost.costmodel import CostModel, attention_keys, kv_span
from hybridkv.cost.presets import get_gpu, get_preset


def _model(name: str = "llama-3.1-8b", gpu: str = "h100", **kw) -> CostModel:
    return CostModel(get_preset(name), get_gpu(gpu), **kw)


SPECS = [
    FullAttention(16),
    SlidingWindow(16, window=7),
    SlidingWindow(16, window=64),
    ChunkedLocal(4, chunk_size=12),
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SPECS), st.integers(0, 60), st.integers(0, 80))
def test_closed_forms_match_direct_sums(spec, new, ctx) -> None:
    def visible(p: int) -> range:
        if isinstance(spec, SlidingWindow):
            return range(max(0, p - spec.window + 1), p + 1)
        if isinstance(spec, ChunkedLocal):
            return range(p - p % spec.chunk_size, p + 1)
        return range(0, p + 1)

    positions = range(ctx, ctx + new)
    assert attention_keys(spec, new, ctx) == sum(len(visible(p)) for p in positions)
    if new:
        assert kv_span(spec, new, ctx) == len(set().union(*(visible(p) for p in positions)))


def test_small_decode_batch_is_memory_bound() -> None:
    cost = _model().step([(1, 2000)] * 8)
    assert cost.bound == "memory"
    # Roughly the weights (16 GB) at 80% of 3.35 TB/s: about 6 ms plus overhead.
    assert 0.005 < cost.time_s < 0.012


def test_long_prefill_is_compute_bound() -> None:
    cost = _model().step([(32_768, 0)])
    assert cost.bound == "compute"
    assert cost.flops > 2 * 8.03e9 * 32_768  # attention adds to the dense part


def test_empty_step_is_free() -> None:
    assert _model().step([]).time_s == 0.0
    assert _model().step([(0, 100)]).time_s == 0.0


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["llama-3.1-8b", "gemma-3-27b", "gpt-oss-120b", "llama-4-scout", "deepseek-v4-style"]),
    st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 50_000)), min_size=1, max_size=8),
    st.integers(1, 2048),
    st.integers(1, 20_000),
)
def test_time_grows_with_work(name, work, more_new, more_ctx) -> None:
    model = _model(name, "h200")
    base = model.step(work)
    assert model.step(work + [(more_new, 0)]).time_s >= base.time_s  # another request
    (n, c), rest = work[0], work[1:]
    assert model.step([(n + more_new, c)] + rest).flops > base.flops  # more new tokens
    if name != "llama-4-scout":
        # longer context costs more -- except under chunked-local attention, where a query
        # that starts a new chunk reads less than one late in the previous chunk
        assert model.step([(n, c + more_ctx)] + rest).time_s >= base.time_s


def test_sliding_window_caps_context_cost() -> None:
    gemma = _model("gemma-3-27b")
    swa = gemma.model.groups[1].spec
    assert attention_keys(swa, 1, 10_000) == attention_keys(swa, 1, 100_000) == 1024
    assert kv_span(swa, 1, 100_000) == 1024
    # Decode cost grows with context only through the 10 full-attention layers.
    d1 = gemma.step([(1, 10_000)]).bytes
    d2 = gemma.step([(1, 20_000)]).bytes
    assert d2 - d1 == pytest.approx(10_000 * gemma.model.kv_bytes_per_token()["full"])


def test_moe_reads_active_weights_for_one_token_and_all_for_a_big_batch() -> None:
    gpt = _model("gpt-oss-120b")
    m = gpt.model
    assert gpt.weight_bytes(1) == pytest.approx(m.active_params * m.weight_bytes_per_param)
    assert gpt.weight_bytes(100_000) == pytest.approx(m.weight_bytes, rel=1e-6)
    dense = _model()
    assert dense.weight_bytes(1) == dense.weight_bytes(1000) == dense.model.weight_bytes


def test_efficiency_and_gpus_scale_time() -> None:
    work = [(1, 4000)] * 16
    slow = _model(mbu=0.4, step_overhead_s=0.0).step(work)
    fast = _model(mbu=0.8, step_overhead_s=0.0).step(work)
    assert slow.time_s == pytest.approx(2 * fast.time_s)
    two = _model(mbu=0.8, step_overhead_s=0.0, num_gpus=2).step(work)
    assert two.time_s == pytest.approx(fast.time_s / 2)
    assert _model("llama-3.1-8b", "b200").step(work).time_s < _model().step(work).time_s


@pytest.mark.parametrize("kw", [dict(mfu=0.0), dict(mbu=1.5), dict(step_overhead_s=-1), dict(num_gpus=0)])
def test_rejects_bad_settings(kw) -> None:
    with pytest.raises(ValueError):
        _model(**kw)


def test_rejects_negative_work() -> None:
    with pytest.raises(ValueError, match="new_tokens >= 0"):
        _model().step([(-1, 0)])
