"""gpt-oss: alternating sliding-window / full attention with attention sinks and a top-k MoE.

What differs from Llama (transformers ``GptOssForCausalLM`` semantics):

* every attention head has a learned *sink* logit that joins its softmax (then dropped);
* q/k/v/o projections carry biases; RoPE is YaRN (``truncate: false``);
* the MLP is a mixture of experts: a linear router (with bias) picks the top-k experts per
  token, their logits are softmaxed over the k picks, and each expert applies a clamped
  SwiGLU to its interleaved ``gate_up_proj`` output::

      gate, up = h[..., 0::2], h[..., 1::2]
      gate = min(gate, limit); up = clamp(up, -limit, limit)
      out  = down((up + 1) * gate * sigmoid(alpha * gate))

Expert weights keep transformers' layout: ``gate_up_proj [E, hidden, 2I]``, ``down_proj
[E, I, hidden]`` (inputs multiply from the left), each with a bias.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from .base import DecoderLayer
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
        assert config.num_local_experts is not None
        e, h, i = config.num_local_experts, config.hidden_size, config.intermediate_size
        self.num_experts = e
        self.alpha = config.swiglu_alpha
        self.limit = config.swiglu_limit
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
        assert config.num_local_experts is not None and config.num_experts_per_tok is not None
        self.router = TopKRouter(config.hidden_size, config.num_local_experts, config.num_experts_per_tok)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.router(x)
        return self.experts(x, ids, weights)


class GptOssForCausalLM(LlamaForCausalLM):
    """gpt-oss (``model_type`` ``gpt_oss``)."""

    def make_layer(self, layer_index: int) -> nn.Module:
        return DecoderLayer(self.config, GQAAttention(self.config, layer_index), MoEMLP(self.config))
