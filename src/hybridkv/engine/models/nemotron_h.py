"""Nemotron-H: a Mamba2 / attention / MLP hybrid (``model_type`` ``nemotron_h``).

Module names follow transformers: ``backbone.embeddings``, ``backbone.layers.{i}.norm`` +
``backbone.layers.{i}.mixer``, ``backbone.norm_f``, ``lm_head``. Every layer is one pre-norm
residual block whose mixer is one of:

* ``full``: GQA attention without RoPE and without biases (``q_proj``/``k_proj``/``v_proj``/``o_proj``);
* ``linear`` (Mamba2): ``in_proj`` -> ``[z (gate), xBC, dt]``; causal depthwise conv + SiLU over
  ``xBC``; per head ``h`` (B/C group ``h // (heads / n_groups)``), with
  ``dt = max(softplus(dt + dt_bias), time_step_min)`` and ``A = -exp(A_log)``, per token
  ``S <- exp(dt A) S + dt x B^T;  y = S C + D x`` (``S`` ``[head_dim, ssm_state]``, fp32); then a
  group RMSNorm of ``y * silu(z)`` (``n_groups`` groups) times ``weight``, and ``out_proj``;
* ``mlp``: ``down(act(up(x)))`` with ``relu2`` (squared ReLU) by default.

MoE layers (``E`` / ``moe``) are not implemented; the config reader refuses them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridkv.core.specs import AttentionSpec

from ..attention import paged_attention, write_kv
from ..model_config import ModelConfig, RopeConfig, StateLayerConfig
from ..metadata import GroupMetadata
from .base import MODELS, PagedAttentionLayer, RMSNorm
from .recurrent import (HybridStateLM, StepContext, attention_call, causal_conv, check_full_attention_spec,
                        conv_state_after, per_sequence, state_layer_kinds, state_model_config)

_PATTERN: dict[str, str] = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


class PlainAttention(PagedAttentionLayer):
    """GQA attention without positional encoding (Nemotron-H relies on its Mamba layers)."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.add_gqa_projections(config, layer_index)

    def forward(self, x: torch.Tensor, rope: object, cache: torch.Tensor, meta: GroupMetadata) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        q = self.q_proj(x).view(t, self.num_heads, d)
        write_kv(cache, meta, self.k_proj(x).view(t, self.num_kv_heads, d), self.v_proj(x).view(t, self.num_kv_heads, d))
        return self.o_proj(paged_attention(q, cache, meta, d ** -0.5).reshape(t, self.num_heads * d))

    def check_spec(self, spec: AttentionSpec) -> None:
        check_full_attention_spec(self, spec)


class GroupGatedRMSNorm(nn.Module):
    """``weight * groupnorm(x * silu(gate))``: RMS over each of ``groups`` equal slices, fp32."""

    def __init__(self, size: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.groups, self.eps = groups, eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        y = x.float() * nn.functional.silu(gate.float())
        g = y.view(*y.shape[:-1], self.groups, -1)
        y = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)).view_as(y)
        return self.weight * y.to(dtype)


class Mamba2Mixer(nn.Module):
    """The Mamba2 mixer; per-request conv and SSM states in the step's states."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        s = config.state
        assert s is not None
        self.layer_index = layer_index
        self.heads, self.head_dim, self.groups, self.n = s.mamba_heads, s.mamba_head_dim, s.n_groups, s.ssm_state_size
        self.inner = self.heads * self.head_dim
        self.conv_dim = self.inner + 2 * self.groups * self.n
        self.dt_min = s.time_step_min
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, s.conv_kernel, groups=self.conv_dim,
                                bias=s.conv_bias, padding=s.conv_kernel - 1)
        self.in_proj = nn.Linear(config.hidden_size, self.inner + self.conv_dim + self.heads, bias=s.proj_bias)
        self.dt_bias = nn.Parameter(torch.ones(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GroupGatedRMSNorm(self.inner, self.groups, s.norm_eps)
        self.out_proj = nn.Linear(self.inner, config.hidden_size, bias=s.proj_bias)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        z, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, self.heads], dim=-1)
        dt = nn.functional.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min)
        A = -self.A_log.float().exp()
        D = self.D.float()
        rep = self.heads // self.groups
        k_len = self.conv1d.weight.shape[-1]
        y = torch.empty((x.shape[0], self.heads, self.head_dim), dtype=torch.float32, device=x.device)
        for rows, state in per_sequence(ctx):
            prev, S = state.layer(self.layer_index)
            conv_out, inputs = causal_conv(xbc[rows], prev, self.conv1d.weight,
                                           self.conv1d.bias)
            h, B, C = conv_out.float().split([self.inner, self.groups * self.n, self.groups * self.n], dim=-1)
            n = h.shape[0]
            h = h.view(n, self.heads, self.head_dim)
            B = B.view(n, self.groups, self.n).repeat_interleave(rep, dim=1)
            C = C.view(n, self.groups, self.n).repeat_interleave(rep, dim=1)
            S = x.new_zeros((self.heads, self.head_dim, self.n), dtype=torch.float32) if S is None else S.clone()
            d = dt[rows]
            decay = (d * A).exp()
            for i in range(n):
                S = S * decay[i][:, None, None] + (d[i][:, None] * h[i])[:, :, None] * B[i][:, None, :]
                y[rows.start + i] = (S * C[i][:, None, :]).sum(-1) + D[:, None] * h[i]
                if state.position + i + 1 in state.marks:
                    state.snapshot(state.position + i + 1, self.layer_index, conv_state_after(inputs, i + 1, k_len), S)
            state.ssm[self.layer_index] = S
            state.conv[self.layer_index] = conv_state_after(inputs, n, k_len)
        out = self.norm(y.reshape(x.shape[0], self.inner).to(x.dtype), z)
        return self.out_proj(out.to(x.dtype))


class PlainMLP(nn.Module):
    """``down(act(up(x)))`` with squared ReLU (``relu2``) or SiLU."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        s = config.state
        assert s is not None
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.relu2 = s.mlp_act == "relu2"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_proj(x)
        h = torch.relu(h).square() if self.relu2 else nn.functional.silu(h)
        return self.down_proj(h)


class NemotronHBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.kind = config.layer_kinds[layer_index]
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.kind == "full":
            self.mixer: nn.Module = PlainAttention(config, layer_index)
        elif self.kind == "linear":
            self.mixer = Mamba2Mixer(config, layer_index)
        else:
            self.mixer = PlainMLP(config)

    @property
    def attention(self) -> PlainAttention:
        assert isinstance(self.mixer, PlainAttention)
        return self.mixer

    def forward(self, x: torch.Tensor, ctx: StepContext, cache: torch.Tensor | None,
                meta: GroupMetadata | None) -> torch.Tensor:
        h = self.norm(x)
        if self.kind == "full":
            h = attention_call(self.mixer, h, ctx, cache, meta)
        elif self.kind == "linear":
            h = self.mixer(h, ctx)
        else:
            h = self.mixer(h)
        return x + h


class NemotronHBackbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, config.rms_norm_eps)


@MODELS.register("nemotron_h")
class NemotronHForCausalLM(HybridStateLM):
    """Nemotron-H without MoE layers: ``layers_block_type`` (or ``hybrid_override_pattern``)
    gives ``full`` (attention), ``linear`` (Mamba2) or ``mlp`` layers."""

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        types = raw.get("layers_block_type")
        if types is None:
            types = [_PATTERN.get(c, c) for c in str(raw.get("hybrid_override_pattern", ""))]
        kinds = state_layer_kinds(raw, list(types))
        act = raw.get("mlp_hidden_act", "relu2")
        if act not in ("relu2", "silu"):
            raise ValueError(f"unsupported mlp_hidden_act {act!r} for nemotron_h; supported: 'relu2', 'silu'")
        if raw.get("mamba_hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported mamba_hidden_act {raw.get('mamba_hidden_act')!r}; only 'silu'")
        mh, md = int(raw["mamba_num_heads"]), int(raw["mamba_head_dim"])
        ng, ns = int(raw["n_groups"]), int(raw["ssm_state_size"])
        if mh % ng:
            raise ValueError(f"mamba_num_heads {mh} must be a multiple of n_groups {ng}")
        if raw.get("sliding_window") is not None:
            raise ValueError("nemotron_h with sliding_window is not supported")
        eps = float(raw.get("layer_norm_epsilon", 1e-5))
        state = StateLayerConfig(
            conv_kernel=int(raw.get("conv_kernel", 4)), conv_dim=mh * md + 2 * ng * ns,
            mamba_heads=mh, mamba_head_dim=md, n_groups=ng, ssm_state_size=ns,
            conv_bias=bool(raw.get("use_conv_bias", True)), proj_bias=bool(raw.get("use_bias", False)),
            time_step_min=float(raw.get("time_step_min", 0.0)), norm_eps=eps, mlp_act=act,
        )
        return state_model_config(raw, kinds, state, RopeConfig(), eps)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.backbone = NemotronHBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight

    @property
    def blocks(self) -> nn.ModuleList:
        return self.backbone.layers

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone.norm_f(x)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embeddings(token_ids)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> None:  # type: ignore[override]
        return None
