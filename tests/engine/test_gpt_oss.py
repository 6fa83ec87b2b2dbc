"""gpt-oss follows its published reference implementation, and says where transformers differs.

The reference (OpenAI's ``gpt_oss.torch`` model) reads the SwiGLU clamp ``swiglu_limit`` from
its config and fixes ``alpha`` at 1.702; transformers' ``GptOssExperts`` hard-coded
``limit = 7.0`` and ``alpha = 1.702`` until 5.18 and reads ``config.swiglu_limit`` /
``config.swiglu_alpha`` from 5.19 on. Published checkpoints say ``swiglu_limit: 7.0``, so every
version agrees on them; a checkpoint with another limit is computed by the engine as the
reference computes it, which transformers < 5.19 does not. The equivalence suite's gpt-oss
model therefore uses the published limit (with weights large enough that the clamp cuts, counted
below), and the other limit is pinned here against each transformers version.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hybridkv.engine.models.base import RMSNorm
from hybridkv.engine.models.gpt_oss import MoEMLP, gpt_oss_norm
from tests.engine.helpers import ARCHS, TOL, Built, TableOwner, build, max_diff, new_cache, random_tokens

#: The first transformers release whose gpt-oss experts read ``swiglu_limit`` from the config.
CONFIG_LIMIT_SINCE = (5, 19)


def _transformers_version() -> tuple[int, ...]:
    import transformers

    return tuple(int(p) for p in transformers.__version__.split(".")[:2])


def _engine_logits(built: Built, tokens: list[int]) -> torch.Tensor:
    cache, alloc = new_cache(built)
    owner = TableOwner(alloc, tokens)
    return built.model([owner.step(len(tokens))], cache, logits="all")[0]


def test_suite_model_exercises_the_clamp(built_models: dict[str, Built], monkeypatch: pytest.MonkeyPatch) -> None:
    """The equivalence suite's gpt-oss model clamps a good share of its expert activations at the
    published limit, and a limit 0.5 lower changes the logits beyond the tolerance: the suite
    pins the clamp, not just the code path around it."""
    built = built_models["gpt_oss"]
    assert built.model.config.experts.swiglu_limit == 7.0
    cut: list[tuple[float, float]] = []
    experts = [layer.mlp.experts for layer in built.model.model.layers]
    for ex in experts:
        def glu(h: torch.Tensor, ex=ex, inner=ex._glu) -> torch.Tensor:
            cut.append((float((h[..., 0::2] > ex.limit).float().mean()),
                        float((h[..., 1::2].abs() > ex.limit).float().mean())))
            return inner(h)
        monkeypatch.setattr(ex, "_glu", glu)
    tokens = random_tokens(37, seed=1)
    assert max_diff(_engine_logits(built, tokens), built.oracle(tokens)) <= TOL
    gate, up = (sum(c[i] for c in cut) / len(cut) for i in (0, 1))
    assert gate > 0.05 and up > 0.1, (gate, up)
    for ex in experts:
        monkeypatch.setattr(ex, "limit", 6.5)
    assert max_diff(_engine_logits(built, tokens), built.oracle(tokens)) > 1e-3


@pytest.fixture(scope="module")
def low_limit(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The suite's gpt-oss model with ``swiglu_limit`` 0.5 in its config.json."""
    arch = ARCHS["gpt_oss"]
    arch = dataclasses.replace(arch, name="gpt_oss_limit", kwargs=dict(arch.kwargs, swiglu_limit=0.5), scale={})
    return build(arch, tmp_path_factory.mktemp("gpt_oss_limit"))


def test_swiglu_limit_comes_from_the_config(low_limit: Built) -> None:
    """transformers >= 5.19: equal. transformers < 5.19: the documented divergence (its experts
    clamp at a hard-coded 7.0) is asserted, and setting its experts' limit to the config's 0.5
    makes it equal, so nothing else differs."""
    tokens = random_tokens(37, seed=1)
    assert low_limit.model.config.experts.swiglu_limit == 0.5
    got = _engine_logits(low_limit, tokens)
    if _transformers_version() >= CONFIG_LIMIT_SINCE:
        assert max_diff(got, low_limit.oracle(tokens)) <= TOL
        return
    hf_experts = [layer.mlp.experts for layer in low_limit.hf.model.layers]
    assert all(ex.limit == 7.0 for ex in hf_experts)
    assert max_diff(got, low_limit.oracle(tokens)) > 1e-2
    for ex in hf_experts:
        ex.limit = 0.5
    with torch.no_grad():
        patched = low_limit.hf(torch.tensor([tokens])).logits[0].float()
    assert max_diff(got, patched) <= TOL


def _reference_moe(mlp: MoEMLP, x: torch.Tensor, limit: float) -> torch.Tensor:
    """The reference's MLP block without its norm and residual, one token at a time: top-k of
    the gate's logits (sorted), softmax over those k, per expert ``x W1 + b1``, the clamped
    SwiGLU, ``W2 + b2``, weighted sum. Weights are taken in transformers' layout."""
    ex, router = mlp.experts, mlp.router
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        g = x[t] @ router.weight.T + router.bias
        top = torch.topk(g, k=router.top_k, sorted=True)
        w = torch.softmax(top.values, dim=0)
        for e, we in zip(top.indices.tolist(), w):
            h = x[t] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]
            x_glu, x_lin = h[0::2].clamp(max=limit), h[1::2].clamp(min=-limit, max=limit)
            y = (x_glu * torch.sigmoid(1.702 * x_glu)) * (x_lin + 1)
            out[t] += we * (y @ ex.down_proj[e] + ex.down_proj_bias[e])
    return out


@pytest.mark.parametrize("limit", [0.5, 7.0])
def test_experts_equal_the_reference_formula(built_models: dict[str, Built], limit: float) -> None:
    """Independent of transformers: the engine's MoE block equals the reference's formula at the
    config's limit (large inputs, so the clamp cuts)."""
    mlp = built_models["gpt_oss"].model.model.layers[0].mlp
    x = 3.0 * torch.randn(23, mlp.router.weight.shape[1], generator=torch.Generator().manual_seed(4))
    saved = mlp.experts.limit
    mlp.experts.limit = limit
    try:
        with torch.no_grad():
            got, want = mlp(x), _reference_moe(mlp, x, limit)
    finally:
        mlp.experts.limit = saved
    assert max_diff(got, want) <= 1e-4


def test_norm_scales_in_fp32_like_transformers() -> None:
    """In bf16 the engine's gpt-oss norm is bit-equal to transformers' ``GptOssRMSNorm`` (scale in
    fp32, cast last), and Llama's order (cast, then scale) is not."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g).to(torch.bfloat16)
    weight = 1.0 + 0.3 * torch.randn(96, generator=g)
    ours, llama, hf = gpt_oss_norm(96, 1e-5), RMSNorm(96, 1e-5), GptOssRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        for norm in (ours, llama, hf):
            norm.weight.copy_(weight)
        want = hf(x)
        assert want.dtype == torch.bfloat16
        assert torch.equal(ours(x), want)
        assert not torch.equal(llama(x).to(torch.bfloat16), want)


def test_checkpoint_with_other_limit_loads_it(low_limit: Built) -> None:
    """The engine takes the limit from config.json, whatever transformers would do with it."""
    assert Path(low_limit.path, "config.json").read_text().count('"swiglu_limit": 0.5') == 1
    assert all(layer.mlp.experts.limit == 0.5 for layer in low_limit.model.model.layers)
