"""Qwen3-Next: gated delta net (linear attention) layers + gated full-attention layers, MoE MLPs.

Per layer (``model.layers.{i}``): ``input_layernorm`` -> token mixer -> +res ->
``post_attention_layernorm`` -> MLP -> +res. Norms are zero-centred (``1 + weight``).

* ``self_attn`` (full): ``q_proj`` yields the query and an output gate per head
  (``[.., heads, 2 * head_dim]`` split in halves); per-head q/k norms; RoPE on the first
  ``partial_rotary_factor * head_dim`` dims; ``o_proj(attn * sigmoid(gate))``.
* ``linear_attn`` (gated delta net): ``in_proj_qkvz`` / ``in_proj_ba`` in per-key-head groups;
  a causal depthwise conv + SiLU over ``[q, k, v]``; q, k L2-normalised, q scaled by
  ``k_head_dim ** -0.5``; per value head with ``g = -exp(A_log) * softplus(a + dt_bias)`` and
  ``beta = sigmoid(b)`` the state ``S`` ``[k_dim, v_dim]`` follows, per token,
  ``S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q``; then a gated RMSNorm
  ``norm(o) * w * silu(z)`` and ``out_proj``.
* ``mlp``: a sparse MoE (softmax router, top-k, optionally renormalised; experts stored per
  expert as ``experts.{e}.{gate,up,down}_proj``, the checkpoint layout) plus a sigmoid-gated shared expert,
  or a dense SwiGLU MLP on ``mlp_only_layers`` / when ``num_experts == 0``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.core.specs import AttentionSpec

from ..attention import paged_attention, write_kv
from ..model_config import ModelConfig, StateLayerConfig, parse_rope
from ..metadata import GroupMetadata
from ..rope import Rotary, apply_rope_half
from .base import MODELS, Backbone, GatedMLP, PagedAttentionLayer
from .gemma3 import GemmaRMSNorm  # norm(x) * (1 + weight), fp32: the same norm as Qwen3-Next
from .recurrent import (
    HybridStateLM,
    StepContext,
    attention_call,
    check_full_attention_spec,
    causal_conv,
    conv_state_after,
    per_sequence,
    state_layer_kinds,
    state_model_config,
)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedAttention(PagedAttentionLayer):
    """Full attention with an output gate, per-head zero-centred q/k norms and partial RoPE."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.add_gqa_projections(config, layer_index, q_factor=2)
        d = self.head_dim
        self.q_norm = GemmaRMSNorm(d, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(d, config.rms_norm_eps)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = cos.shape[-1]
        return torch.cat((apply_rope_half(x[..., :r], cos, sin), x[..., r:]), dim=-1)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: torch.Tensor, meta: GroupMetadata) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        q, gate = self.q_proj(x).view(t, self.num_heads, 2 * d).chunk(2, dim=-1)
        q = self._rope(self.q_norm(q), *rope)
        k = self._rope(self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, d)), *rope)
        v = self.v_proj(x).view(t, self.num_kv_heads, d)
        write_kv(cache, meta, k, v)
        out = paged_attention(q, cache, meta, d ** -0.5)
        out = out.reshape(t, self.num_heads * d) * torch.sigmoid(gate.reshape(t, self.num_heads * d))
        return self.o_proj(out)

    def check_spec(self, spec: AttentionSpec) -> None:
        check_full_attention_spec(self, spec)


class GatedRMSNorm(nn.Module):
    """``norm(x) * weight * silu(gate)`` over the last dim, in fp32 (norm before gate)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        y = x.float()
        y = self.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (y * nn.functional.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """The gated delta net mixer (``linear_attn``); per-request state in the step's states."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        s = config.state
        assert s is not None
        self.layer_index = layer_index
        self.nk, self.nv, self.dk, self.dv = s.num_k_heads, s.num_v_heads, s.k_head_dim, s.v_head_dim
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, s.conv_kernel, groups=self.conv_dim,
                                bias=False, padding=s.conv_kernel - 1)
        self.in_proj_qkvz = nn.Linear(config.hidden_size, 2 * key_dim + 2 * value_dim, bias=False)
        self.in_proj_ba = nn.Linear(config.hidden_size, 2 * self.nv, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, s.norm_eps)
        self.out_proj = nn.Linear(value_dim, config.hidden_size, bias=False)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``mixed_qkv [T, conv_dim]``, ``z [T, nv, dv]``, ``b, a [T, nv]`` (per-key-head groups)."""
        t, r = x.shape[0], self.nv // self.nk
        qkvz = self.in_proj_qkvz(x).view(t, self.nk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = qkvz.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = self.in_proj_ba(x).view(t, self.nk, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat((q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)), dim=-1)
        return mixed, z.reshape(t, self.nv, self.dv), b.reshape(t, self.nv), a.reshape(t, self.nv)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        mixed, z, b, a = self._project(x)
        beta = torch.sigmoid(b).float()
        g = (-self.A_log.float().exp() * nn.functional.softplus(a.float() + self.dt_bias)).exp()
        out = torch.empty((x.shape[0], self.nv, self.dv), dtype=torch.float32, device=x.device)
        rep = self.nv // self.nk
        k_len = self.conv1d.weight.shape[-1]
        for rows, state in per_sequence(ctx):
            prev, S = state.layer(self.layer_index)
            conv_out, inputs = causal_conv(mixed[rows], prev, self.conv1d.weight, None)
            q, k, v = conv_out.float().split([self.nk * self.dk, self.nk * self.dk, self.nv * self.dv], dim=-1)
            n = q.shape[0]
            q = l2_normalize(q.view(n, self.nk, self.dk)).repeat_interleave(rep, dim=1) * self.dk ** -0.5
            k = l2_normalize(k.view(n, self.nk, self.dk)).repeat_interleave(rep, dim=1)
            v = v.view(n, self.nv, self.dv)
            S = x.new_zeros((self.nv, self.dk, self.dv), dtype=torch.float32) if S is None else S.clone()
            bt, gt = beta[rows], g[rows]
            for i in range(n):
                S = S * gt[i][:, None, None]
                delta = (v[i] - (S * k[i][:, :, None]).sum(-2)) * bt[i][:, None]
                S = S + k[i][:, :, None] * delta[:, None, :]
                out[rows.start + i] = (S * q[i][:, :, None]).sum(-2)
                if state.position + i + 1 in state.marks:
                    state.snapshot(state.position + i + 1, self.layer_index, conv_state_after(inputs, i + 1, k_len), S)
            state.ssm[self.layer_index] = S
            state.conv[self.layer_index] = conv_state_after(inputs, n, k_len)
        y = self.norm(out.to(x.dtype), z)
        return self.out_proj(y.reshape(x.shape[0], self.nv * self.dv))


class Experts(nn.ModuleList):
    """Routed SwiGLU experts ``experts.{e}.{gate,up,down}_proj`` (the checkpoint layout)."""

    def __init__(self, num: int, hidden: int, intermediate: int) -> None:
        super().__init__(GatedMLP(hidden, intermediate) for _ in range(num))

    def forward(self, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in index.unique().tolist():
            tok, slot = (index == e).nonzero(as_tuple=True)
            out.index_add_(0, tok, (self[e](x[tok]) * weights[tok, slot, None]).to(out.dtype))
        return out


class SparseMoE(nn.Module):
    """Softmax top-k router over routed experts plus a sigmoid-gated shared expert."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        s = config.state
        assert s is not None
        self.top_k, self.renormalize = s.num_experts_per_tok, s.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, s.num_experts, bias=False)
        self.experts = Experts(s.num_experts, config.hidden_size, s.moe_intermediate_size)
        self.shared_expert = GatedMLP(config.hidden_size, s.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top, index = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            top = top / top.sum(-1, keepdim=True)
        routed = self.experts(x, index, top.to(logits.dtype))
        return routed + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        s = config.state
        assert s is not None
        self.kind = config.layer_kinds[layer_index]
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.kind == "full":
            self.self_attn = GatedAttention(config, layer_index)
        else:
            self.linear_attn = GatedDeltaNet(config, layer_index)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoE(config) if layer_index in s.moe_layers else GatedMLP(
            config.hidden_size, config.intermediate_size)

    @property
    def attention(self) -> GatedAttention:
        return self.self_attn

    def forward(self, x: torch.Tensor, ctx: StepContext, cache: torch.Tensor | None,
                meta: GroupMetadata | None) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.kind == "full":
            h = attention_call(self.self_attn, h, ctx, cache, meta)
        else:
            h = self.linear_attn(h, ctx)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


@MODELS.register("qwen3_next")
class Qwen3NextForCausalLM(HybridStateLM):
    """Qwen3-Next (``model_type`` ``qwen3_next``): ``layer_types`` are ``full`` (gated attention)
    or ``linear`` (gated delta net)."""

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        kinds = state_layer_kinds(raw, list(raw["layer_types"]))
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r} for qwen3_next; only 'silu' is implemented")
        rope = parse_rope(raw)
        factor = float(rope.params.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
        nk, nv = int(raw["linear_num_key_heads"]), int(raw["linear_num_value_heads"])
        dk, dv = int(raw["linear_key_head_dim"]), int(raw["linear_value_head_dim"])
        if nv % nk:
            raise ValueError(f"linear_num_value_heads {nv} must be a multiple of linear_num_key_heads {nk}")
        experts = int(raw.get("num_experts") or 0)
        step = int(raw.get("decoder_sparse_step") or 1)
        only = set(raw.get("mlp_only_layers") or [])
        eps = float(raw.get("rms_norm_eps", 1e-6))
        state = StateLayerConfig(
            conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)), conv_dim=2 * nk * dk + nv * dv,
            num_k_heads=nk, num_v_heads=nv, k_head_dim=dk, v_head_dim=dv,
            norm_eps=eps, partial_rotary_factor=factor,
            num_experts=experts, num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0),
            shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            moe_layers=tuple(i for i in range(len(kinds))
                             if experts > 0 and i not in only and (i + 1) % step == 0),
        )
        return state_model_config(raw, kinds, state, rope, eps)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        s = config.state
        assert s is not None
        layers = [Qwen3NextDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        self.model = Backbone(config, layers)  # type: ignore[arg-type]
        self.model.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(config, int(config.head_dim * s.partial_rotary_factor))

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(positions, dtype)
