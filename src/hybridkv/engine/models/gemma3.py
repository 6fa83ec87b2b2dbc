"""Gemma 3 text decoder: interleaved sliding-window and full layers with per-kind RoPE.

What differs from Llama (transformers ``Gemma3ForCausalLM`` semantics):

* RMSNorm scales by ``1 + weight`` and multiplies in fp32 before casting back;
* four norms per layer, the attention and MLP outputs are normed before each residual add::

      x = x + post_attention_layernorm(attn(input_layernorm(x)))
      x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))

* per-head q/k norms, softmax scale ``query_pre_attn_scalar ** -0.5``, GeGLU (tanh GELU) MLP;
* embeddings multiplied by ``sqrt(hidden_size)`` (rounded to the weight dtype);
* sliding layers use their own RoPE base (``rope_parameters["sliding_attention"]``);
* optional final logit soft-capping ``cap * tanh(logits / cap)``;
* layer kinds: ``layer_types`` if given, else every ``sliding_window_pattern``-th layer (default
  6th) ``full`` and the others ``sliding``.

``attn_logit_softcapping`` is ignored, as transformers' Gemma 3 ignores it (Gemma 3 checkpoints
set it to null; it was Gemma 2's).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..metadata import GroupMetadata
from ..model_config import (AttentionOptions, ModelConfig, RopeConfig, check_window, common_fields,
                            layer_kinds_or_pattern, parse_rope)
from ..rope import Rotary
from .base import MODELS, GatedMLP, LayerRope
from .llama import GQAAttention, LlamaForCausalLM

#: Activations of Gemma 3's gated MLP, by their transformers names.
GEMMA_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


class GemmaRMSNorm(nn.Module):
    """``norm(x) * (1 + weight)``, computed in fp32 and cast back to the input dtype."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class Gemma3DecoderLayer(nn.Module):
    """Sandwich-norm block: each sub-layer's output is normed before the residual add."""

    def __init__(self, config: ModelConfig, attn: GQAAttention) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.self_attn = attn
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.mlp = GatedMLP(h, config.intermediate_size, False, config.hidden_act)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: torch.Tensor, meta: GroupMetadata) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, cache, meta))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


def parse_gemma_rope(raw: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """Gemma 3's (full, sliding) RoPE: ``rope_parameters`` keyed by layer type (transformers 5)
    or ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling`` (4.x, scaling on full layers)."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        full.setdefault("rope_theta", 1_000_000.0)
        local.setdefault("rope_theta", 10_000.0)
    else:
        full = dict(raw.get("rope_scaling") or params or {})
        full.setdefault("rope_theta", raw.get("rope_theta", 1_000_000.0))
        local = {"rope_theta": raw.get("rope_local_base_freq", 10_000.0)}
    return parse_rope({"rope_parameters": full}), parse_rope({"rope_parameters": local})


@MODELS.register("gemma3_text")
class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 (``model_type`` ``gemma3_text``)."""

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        if raw.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=True is not supported (causal decoding only)")
        act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        full_rope, local_rope = parse_gemma_rope(raw)
        common = common_fields(raw, act, GEMMA_ACTIVATIONS, rope=full_rope)
        common["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", True))
        head_dim = int(raw.get("head_dim") or 256)
        kinds = layer_kinds_or_pattern(raw, common["num_hidden_layers"], int(
            raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6))
        softcap = raw.get("final_logit_softcapping")
        bias = bool(raw.get("attention_bias", False))
        return ModelConfig(
            **common,
            head_dim=head_dim,
            layer_kinds=kinds,
            sliding_window=check_window(kinds, raw.get("sliding_window")),
            attention=AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=True,
                                       scale=float(raw.get("query_pre_attn_scalar", head_dim)) ** -0.5),
            local_rope=local_rope,
            final_logit_softcapping=None if softcap is None else float(softcap),
        )

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        local = config.local_rope or config.rope
        self.local_rotary = Rotary(dataclasses.replace(config, rope=local), config.head_dim)
        self.embed_scale = config.hidden_size ** 0.5

    def make_layer(self, layer_index: int) -> nn.Module:
        return Gemma3DecoderLayer(self.config, GQAAttention(self.config, layer_index, norm=GemmaRMSNorm))

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> LayerRope:
        tables = {"full": self.rotary(positions, dtype)}
        if "sliding" in self.config.layer_kinds:
            tables["sliding"] = self.local_rotary(positions, dtype)
        return tables

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight
        return self.model.embed_tokens(token_ids) * torch.tensor(self.embed_scale, dtype=weight.dtype,
                                                                 device=weight.device)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
