"""DeepSeek-V3-style multi-head latent attention (MLA) with dense SwiGLU MLPs.

Per token the cache stores one latent row (no separate V)::

    latent = [ kv_a_layernorm(c_kv)  (kv_lora_rank) | rope(k_pe)  (qk_rope_head_dim) ]

and attention re-expands the gathered latents: ``kv_b_proj(c_kv)`` gives per-head
``k_nope`` and ``v``; the shared rotated ``k_pe`` is broadcast to every head. This is the
"naive" (non-absorbed) MLA, numerically the same computation as transformers.

transformers details matched here: ``q_a_layernorm``/``kv_a_layernorm`` use eps 1e-6 (not
``rms_norm_eps``); with ``rope_interleave`` the rotated rope dims are stored de-interleaved;
for non-default RoPE with ``mscale_all_dim`` the softmax scale is multiplied by ``mscale**2``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from hybridkv.core.rules import rule_class
from hybridkv.core.specs import MLA, AttentionSpec

from ..attention import paged_mla_attention, write_kv
from ..model_config import MLAConfig, ModelConfig, common_fields
from ..metadata import GroupMetadata
from ..rope import Rotary, apply_rope_half, apply_rope_interleaved, yarn_mscale
from .base import MODELS, PagedAttentionLayer, PagedCausalLM, RMSNorm

_LORA_NORM_EPS = 1e-6


def mla_softmax_scale(config: ModelConfig) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` for scaled RoPE."""
    mla = config.mla
    assert mla is not None
    scale = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) ** -0.5
    if config.rope.rope_type != "default":
        mscale_all_dim = config.rope.params.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = yarn_mscale(config.rope.params["factor"], mscale_all_dim)
            scale = scale * m * m
    return scale


class MLAAttention(PagedAttentionLayer):
    """MLA with transformers' DeepSeek-V3 parameter names."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        mla = config.mla
        assert mla is not None
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.kv_lora_rank = mla.kv_lora_rank
        self.nope_dim = mla.qk_nope_head_dim
        self.rope_dim = mla.qk_rope_head_dim
        self.v_dim = mla.v_head_dim
        self.q_lora_rank = mla.q_lora_rank
        self.interleave = mla.rope_interleave
        self.scale = mla_softmax_scale(config)
        h, qk_dim, bias = config.hidden_size, self.nope_dim + self.rope_dim, mla.attention_bias
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(h, self.num_heads * qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, _LORA_NORM_EPS)
            self.q_b_proj = nn.Linear(self.q_lora_rank, self.num_heads * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, _LORA_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.num_heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, h, bias=bias)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope_interleaved(x, cos, sin) if self.interleave else apply_rope_half(x, cos, sin)

    def expand_latent(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents ``[L, kv_lora_rank + rope]`` -> keys ``[L, H, nope + rope]``, values ``[L, H, v]``."""
        n = latent.shape[0]
        c_kv, k_pe = latent.split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv = self.kv_b_proj(c_kv).view(n, self.num_heads, self.nope_dim + self.v_dim)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat((k_nope, k_pe[:, None, :].expand(n, self.num_heads, self.rope_dim)), dim=-1)
        return k, v

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: torch.Tensor, meta: GroupMetadata) -> torch.Tensor:
        t = x.shape[0]
        cos, sin = rope
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(t, self.num_heads, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        q = torch.cat((q_nope, self._rotate(q_pe, cos, sin)), dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        k_pe = self._rotate(k_pe[:, None, :], cos, sin)[:, 0]
        write_kv(cache, meta, torch.cat((self.kv_a_layernorm(c_kv), k_pe), dim=-1))
        out = paged_mla_attention(q, cache, meta, self.scale, self.expand_latent)
        return self.o_proj(out.reshape(t, self.num_heads * self.v_dim))

    def check_spec(self, spec: AttentionSpec) -> None:
        name = f"model.layers.{self.layer_index}.self_attn"
        if rule_class(spec).kind != "mla":
            raise ValueError(f"layer {name!r} needs an MLA spec, got {type(spec).__name__}")
        spec = cast(MLA, spec)                   # the "mla" kind is MLA's rule
        if (spec.kv_lora_rank, spec.qk_rope_head_dim) != (self.kv_lora_rank, self.rope_dim):
            raise ValueError(
                f"layer {name!r} has kv_lora_rank={self.kv_lora_rank}, qk_rope_head_dim={self.rope_dim}; "
                f"spec has {spec.kv_lora_rank}, {spec.qk_rope_head_dim}"
            )


@MODELS.register("deepseek_v3")
class DeepseekV3ForCausalLM(PagedCausalLM):
    """DeepSeek-V3 with MLA on every layer (``layer_kinds`` all ``mla``) and dense MLPs (no MoE)."""

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        common = common_fields(raw, raw.get("hidden_act", "silu"))
        layers = common["num_hidden_layers"]
        first_dense = raw.get("first_k_dense_replace")
        if first_dense is not None and int(first_dense) < layers:
            raise ValueError(
                f"MoE layers are not implemented: first_k_dense_replace={first_dense} < "
                f"num_hidden_layers={layers}; set first_k_dense_replace >= num_hidden_layers"
            )
        if common["num_key_value_heads"] != common["num_attention_heads"]:
            raise ValueError("MLA needs num_key_value_heads == num_attention_heads")
        rope_dim = int(raw["qk_rope_head_dim"])
        q_lora = raw.get("q_lora_rank")
        return ModelConfig(
            **common,
            head_dim=rope_dim,
            layer_kinds=("mla",) * layers,
            mla=MLAConfig(
                kv_lora_rank=int(raw["kv_lora_rank"]),
                q_lora_rank=None if q_lora is None else int(q_lora),
                qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
                qk_rope_head_dim=rope_dim,
                v_head_dim=int(raw["v_head_dim"]),
                rope_interleave=bool(raw.get("rope_interleave", True)),
                attention_bias=bool(raw.get("attention_bias", False)),
            ),
        )

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        assert config.mla is not None
        self.rotary = Rotary(config, config.mla.qk_rope_head_dim)

    def make_attention(self, layer_index: int) -> MLAAttention:
        return MLAAttention(self.config, layer_index)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(positions, dtype)

    def attention_spec(self, layer_index: int, block_size: int, dtype: str = "float32") -> AttentionSpec:
        mla = self.config.mla
        assert mla is not None
        return MLA(block_size=block_size, kv_lora_rank=mla.kv_lora_rank, qk_rope_head_dim=mla.qk_rope_head_dim,
                   head_dim=mla.kv_lora_rank + mla.qk_rope_head_dim, dtype=dtype)
