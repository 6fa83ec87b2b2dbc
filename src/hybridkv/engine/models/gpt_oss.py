"""gpt-oss: alternating sliding-window / full attention with attention sinks and a top-k MoE.

The semantics are those of OpenAI's published reference implementation (the ``gpt_oss.torch``
model of the openai/gpt-oss repository); what differs from Llama:

* every attention head has a learned *sink* logit that joins its softmax (then dropped);
* even layers are sliding (window ``W``: keys ``[t - W + 1, t]``), odd layers full, unless
  ``layer_types`` says otherwise;
* q/k/v/o projections carry biases; RoPE is half-split YaRN without rounding the ramp's ends
  (``truncate: false``: the reference's "NTK by parts" with ``ntk_alpha`` 1, ``ntk_beta`` 32)
  and cos/sin scaled by ``0.1 ln(factor) + 1``;
* RMSNorm scales in fp32 and casts last;
* the MLP is a mixture of experts: a linear router (with bias) picks the top-k experts per
  token, their logits are softmaxed over the k picks only, and each expert applies a clamped
  SwiGLU to its interleaved ``gate_up_proj`` output, adds its down bias, and is weighted::

      gate, up = h[..., 0::2], h[..., 1::2]
      gate = min(gate, limit); up = clamp(up, -limit, limit)
      out  = down((up + 1) * gate * sigmoid(alpha * gate))

  ``limit`` is ``config.json``'s ``swiglu_limit`` (7.0 in the published checkpoints), as in the
  reference; ``alpha`` is ``swiglu_alpha`` when given, else 1.702 (the reference's constant).
  transformers before 5.19 hard-codes 7.0 and 1.702 in its experts, so on a checkpoint whose
  ``swiglu_limit`` is not 7.0 it disagrees with the reference and with this engine
  (tests/engine/test_gpt_oss.py pins both behaviours).

Expert weights keep transformers' layout: ``gate_up_proj [E, hidden, 2I]``, ``down_proj
[E, I, hidden]`` (inputs multiply from the left), each with a bias.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..model_config import (AttentionOptions, ExpertsConfig, ModelConfig, check_window, common_fields,
                            layer_kinds_or_pattern)
from .base import MODELS, DecoderLayer, RMSNorm
from .llama import GQAAttention, LlamaForCausalLM


class TopKRouter(nn.Module):
    """Router logits ``x W^T + b``; returns the top-k expert ids and their softmaxed weights."""

    def __init__(self, hidden: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        self.bias = nn.Parameter(torch.zeros(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = nn.functional.linear(x, self.weight, self.bias)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return ids, torch.softmax(top, dim=-1, dtype=top.dtype)


class Experts(nn.Module):
    """Per-expert clamped SwiGLU MLPs with transformers' parameter names and layout."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        ex = config.experts
        assert ex is not None
        e, h, i = ex.num_local_experts, config.hidden_size, config.intermediate_size
        self.num_experts = e
        self.alpha = ex.swiglu_alpha
        self.limit = ex.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.zeros(e, h, 2 * i))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(e, 2 * i))
        self.down_proj = nn.Parameter(torch.zeros(e, i, h))
        self.down_proj_bias = nn.Parameter(torch.zeros(e, h))

    def _glu(self, h: torch.Tensor) -> torch.Tensor:
        gate = h[..., 0::2].clamp(max=self.limit)
        up = h[..., 1::2].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            tok, slot = torch.where(ids == e)
            h = x[tok] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
            y = self._glu(h) @ self.down_proj[e] + self.down_proj_bias[e]
            out.index_add_(0, tok, (y * weights[tok, slot, None]).to(x.dtype))
        return out


class MoEMLP(nn.Module):
    """``router`` + ``experts``: each token is the weighted sum of its top-k experts."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        ex = config.experts
        assert ex is not None
        self.router = TopKRouter(config.hidden_size, ex.num_local_experts, ex.num_experts_per_tok)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.router(x)
        return self.experts(x, ids, weights)


def gpt_oss_norm(size: int, eps: float) -> RMSNorm:
    """gpt-oss's RMSNorm: scaled in fp32, cast last."""
    return RMSNorm(size, eps, scale_in_fp32=True)


@MODELS.register("gpt_oss")
class GptOssForCausalLM(LlamaForCausalLM):
    """gpt-oss (``model_type`` ``gpt_oss``)."""

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        common = common_fields(raw, raw.get("hidden_act", "silu"))
        head_dim = int(raw.get("head_dim") or common["hidden_size"] // common["num_attention_heads"])
        kinds = layer_kinds_or_pattern(raw, common["num_hidden_layers"], 2)
        bias = bool(raw.get("attention_bias", True))
        return ModelConfig(
            **common,
            head_dim=head_dim,
            layer_kinds=kinds,
            sliding_window=check_window(kinds, raw.get("sliding_window")),
            attention=AttentionOptions(qkv_bias=bias, o_bias=bias, sinks=True),
            experts=ExpertsConfig(
                num_local_experts=int(raw.get("num_local_experts") or raw.get("num_experts")),
                num_experts_per_tok=int(raw.get("num_experts_per_tok", 4)),
                swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
                swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
            ),
        )

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model.norm = gpt_oss_norm(config.hidden_size, config.rms_norm_eps)

    def make_layer(self, layer_index: int) -> nn.Module:
        return DecoderLayer(self.config, GQAAttention(self.config, layer_index), MoEMLP(self.config),
                            norm=gpt_oss_norm)
