"""Llama-family decoders: Llama, Qwen2 (q/k/v biases, interleaved sliding layers), Qwen3
(per-head q/k RMSNorm), Mistral (every layer sliding).

Attention is GQA with half-split RoPE. Each layer is "full" or "sliding" (``ModelConfig.layer_kinds``);
a sliding layer with window ``W`` lets the query at ``t`` read ``[t - W + 1, t]``. Layer kinds:

==============  ==============================================================================
model_type      layer kinds
==============  ==============================================================================
llama           every layer ``full``
qwen2, qwen3    ``layer_types`` if given; else ``sliding`` for layers ``i >= max_window_layers``
                when ``use_sliding_window`` is true, otherwise ``full``
mistral         every layer ``sliding`` when ``sliding_window`` is set, else ``full``
==============  ==============================================================================
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.core.rules import rule_class
from hybridkv.core.specs import AttentionSpec, FullAttention, SlidingWindow

from ..attention import paged_attention, write_kv
from ..model_config import AttentionOptions, LayerKind, ModelConfig, check_window, common_fields, parse_layer_type
from ..metadata import GroupMetadata
from ..rope import Rotary, apply_rope_half
from .base import MODELS, PagedAttentionLayer, PagedCausalLM, RMSNorm


class GQAAttention(PagedAttentionLayer):
    """Grouped-query attention with ``q_proj/k_proj/v_proj/o_proj`` (transformers names).

    Options read from ``config.attention``: q/k/v and o biases, per-head q/k RMSNorm (Qwen3,
    Gemma 3; ``norm`` picks the norm class), the softmax scale and gpt-oss attention sinks (a
    ``sinks`` parameter, one logit per query head).
    """

    def __init__(self, config: ModelConfig, layer_index: int, norm: type[nn.Module] = RMSNorm) -> None:
        super().__init__()
        self.add_gqa_projections(config, layer_index)
        self.window = config.sliding_window if config.layer_kinds[layer_index] == "sliding" else None
        opts = config.attention
        self.scale = opts.scale if opts.scale is not None else self.head_dim ** -0.5
        d = self.head_dim
        self.q_norm = norm(d, config.rms_norm_eps) if opts.qk_norm else None
        self.k_norm = norm(d, config.rms_norm_eps) if opts.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(self.num_heads)) if opts.sinks else None

    def key_value(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values ``[T, kv_heads, head_dim]`` of hidden states ``x``."""
        t = x.shape[0]
        cos, sin = rope
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        return apply_rope_half(k, cos, sin), v

    def write_only(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                   cache: torch.Tensor, meta: GroupMetadata) -> None:
        """Store the K/V of ``x`` at the metadata's write slots without attending (a DFlash
        drafter's context entries)."""
        write_kv(cache, meta, *self.key_value(x, rope))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: torch.Tensor, meta: GroupMetadata) -> torch.Tensor:
        t = x.shape[0]
        cos, sin = rope
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope_half(q, cos, sin)
        write_kv(cache, meta, *self.key_value(x, rope))
        out = paged_attention(q, cache, meta, self.scale, self.sinks)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))

    def check_spec(self, spec: AttentionSpec) -> None:
        name = f"model.layers.{self.layer_index}.self_attn"
        want = "sliding" if self.window is not None else "full"
        if rule_class(spec).kind != want:
            raise ValueError(f"layer {name!r} needs a {want} attention spec, got {type(spec).__name__}")
        if spec.window_tokens != self.window:
            raise ValueError(f"layer {name!r} has window {self.window}, spec has {spec.window_tokens}")
        if (spec.num_kv_heads, spec.head_dim) != (self.num_kv_heads, self.head_dim):
            raise ValueError(
                f"layer {name!r} has {self.num_kv_heads} KV heads of {self.head_dim}, spec has "
                f"{spec.num_kv_heads} of {spec.head_dim}"
            )


@MODELS.register("mistral")  # decorators apply bottom-up: llama registers first
@MODELS.register("qwen3")
@MODELS.register("qwen2")
@MODELS.register("llama")
class LlamaForCausalLM(PagedCausalLM):
    """Llama / Qwen2 / Qwen3 / Mistral; the base of the Gemma 3 and gpt-oss models."""

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        common = common_fields(raw, raw.get("hidden_act", "silu"))
        model_type, layers = common["model_type"], common["num_hidden_layers"]
        head_dim = raw.get("head_dim") or common["hidden_size"] // common["num_attention_heads"]
        if raw.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not supported")
        window: int | None = raw.get("sliding_window")
        kinds: list[LayerKind]
        if model_type == "llama":
            window, kinds = None, ["full"] * layers
        elif model_type == "mistral":
            kinds = ["sliding" if window is not None else "full"] * layers
        else:  # qwen2, qwen3
            if not raw.get("use_sliding_window", False):
                window = None
            layer_types = raw.get("layer_types")
            if layer_types is None:
                first_sliding = int(raw.get("max_window_layers", 28))
                kinds = ["sliding" if window is not None and i >= first_sliding else "full"
                         for i in range(layers)]
            else:
                kinds = [parse_layer_type(t) for t in layer_types]
        if len(kinds) != layers:
            raise ValueError(f"layer_types has {len(kinds)} entries for {layers} layers")
        bias = bool(raw.get("attention_bias", False))
        return ModelConfig(
            **common,
            head_dim=int(head_dim),
            layer_kinds=tuple(kinds),
            sliding_window=check_window(kinds, window),
            mlp_bias=bool(raw.get("mlp_bias", False)) if model_type == "llama" else False,
            attention=AttentionOptions(qkv_bias=True if model_type == "qwen2" else bias,
                                       o_bias=False if model_type == "qwen2" else bias,
                                       qk_norm=model_type == "qwen3"),
        )

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.rotary = Rotary(config, config.head_dim)

    def make_attention(self, layer_index: int) -> GQAAttention:
        return GQAAttention(self.config, layer_index)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(positions, dtype)

    def attention_spec(self, layer_index: int, block_size: int, dtype: str = "float32") -> AttentionSpec:
        c = self.config
        kw = dict(block_size=block_size, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, dtype=dtype)
        if c.layer_kinds[layer_index] == "sliding":
            assert c.sliding_window is not None
            return SlidingWindow(window=c.sliding_window, **kw)
        return FullAttention(**kw)
