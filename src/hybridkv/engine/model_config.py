"""What the engine's models read from a Hugging Face-format ``config.json``: :class:`ModelConfig`.

The engine does not import transformers; each model family parses the ``config.json`` fields
it needs (its class's ``parse_config``, found through :data:`hybridkv.engine.models.MODELS` by
``model_type``) into a frozen :class:`ModelConfig` built from the records and helpers here.
Fields follow the transformers names so a reader can check them against the original config.

Per-layer attention kinds (``layer_kinds``) are resolved once, exactly as transformers resolves
them, because the KV-cache groups are built from them: ``full`` and ``sliding`` (GQA over KV
pages), ``mla`` (a latent page per token), ``linear`` (a recurrent state per request instead of
KV pages) and ``mlp`` (no token mixer); the last two have no KV-cache group of their own
(:data:`STATE_LAYER_KINDS`, see :mod:`hybridkv.engine.models.recurrent`).

A sliding layer with window ``W`` lets the query at position ``t`` read keys ``[t - W + 1, t]``
(``W`` tokens including itself), the transformers mask ``kv_idx > q_idx - W``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

LayerKind = Literal["full", "sliding", "mla", "linear", "mlp"]

STATE_LAYER_KINDS = ("linear", "mlp")
"""Layer kinds without KV pages (no KV-cache group)."""

HF_LAYER_TYPES: dict[str, LayerKind] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
}


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (transformers ``rope_parameters``).

    Attributes:
        rope_type: "default", "linear", "llama3" or "yarn".
        theta: the RoPE base.
        params: the remaining fields of ``rope_parameters`` (``factor``, ...), unchanged.
    """

    rope_type: str = "default"
    theta: float = 10000.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AttentionOptions:
    """How a GQA layer computes beyond its head counts.

    Attributes:
        qkv_bias / o_bias: biases of the q/k/v and o projections (Qwen2: q/k/v only).
        qk_norm: per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
        scale: softmax scale override (Gemma 3: ``query_pre_attn_scalar ** -0.5``); None:
            ``head_dim ** -0.5``.
        sinks: one learned sink logit per query head joins every softmax (gpt-oss).
    """

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    scale: float | None = None
    sinks: bool = False


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V3), transformers names.

    Attributes:
        kv_lora_rank: width of the cached latent (plus ``qk_rope_head_dim`` rotated key dims).
        q_lora_rank: low-rank query projection width, None for a direct ``q_proj``.
        qk_nope_head_dim / qk_rope_head_dim / v_head_dim: per-head sizes.
        rope_interleave: RoPE pairs adjacent dims (else half-split).
        attention_bias: biases of the down projections and ``o_proj``.
    """

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True
    attention_bias: bool = False


@dataclass(frozen=True)
class ExpertsConfig:
    """gpt-oss's mixture of experts: ``num_local_experts`` clamped-SwiGLU experts, the top
    ``num_experts_per_tok`` per token; ``swiglu_limit`` clamps, ``swiglu_alpha`` is the gain."""

    num_local_experts: int
    num_experts_per_tok: int
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


@dataclass(frozen=True)
class StateLayerConfig:
    """Recurrent-layer and MoE fields of the state models (transformers names).

    Gated delta net (qwen3_next): ``linear_num_key_heads`` / ``linear_num_value_heads`` heads of
    ``linear_key_head_dim`` / ``linear_value_head_dim``; recurrent state per layer
    ``[value_heads, key_head_dim, value_head_dim]`` fp32. Mamba2 (nemotron_h): ``mamba_num_heads``
    heads of ``mamba_head_dim``, ``n_groups`` B/C groups of ``ssm_state_size``; state
    ``[heads, head_dim, ssm_state_size]``. Both: a depthwise causal conv of ``conv_kernel`` taps
    over ``conv_dim`` channels whose state is the last ``conv_kernel - 1`` inputs.
    """

    conv_kernel: int
    conv_dim: int
    num_k_heads: int = 0          # GDN
    num_v_heads: int = 0
    k_head_dim: int = 0
    v_head_dim: int = 0
    mamba_heads: int = 0          # Mamba2
    mamba_head_dim: int = 0
    n_groups: int = 0
    ssm_state_size: int = 0
    conv_bias: bool = False
    proj_bias: bool = False
    time_step_min: float = 0.0
    norm_eps: float = 1e-6
    partial_rotary_factor: float = 1.0
    num_experts: int = 0          # MoE (qwen3_next: every layer with num_experts > 0)
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[int, ...] = ()
    mlp_act: str = "silu"

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """Per-layer recurrent state shape of one request."""
        if self.num_v_heads:
            return (self.num_v_heads, self.k_head_dim, self.v_head_dim)
        return (self.mamba_heads, self.mamba_head_dim, self.ssm_state_size)


@dataclass(frozen=True)
class ModelConfig:
    """What the engine's models need from ``config.json``.

    Attributes:
        model_type: a key of :data:`hybridkv.engine.models.MODELS`.
        vocab_size, hidden_size, intermediate_size, num_hidden_layers: usual meanings.
        num_attention_heads: query heads.
        num_key_value_heads: KV heads (GQA); equals ``num_attention_heads`` for MLA.
        head_dim: per-head size of Q/K/V (GQA); the RoPE size for MLA.
        rms_norm_eps: epsilon of the decoder RMSNorms.
        tie_word_embeddings: ``lm_head`` shares the embedding matrix.
        rope: rotary parameters.
        layer_kinds: per layer, a :data:`LayerKind`.
        sliding_window: window ``W`` of the sliding layers (None when there are none).
        hidden_act: activation of the gated MLP (transformers name).
        max_position_embeddings: used by the llama3 / yarn RoPE variants.
        mlp_bias: biases of the dense MLP's projections.
        attention: the GQA layers' options (biases, q/k norm, scale, sinks).
        local_rope: RoPE of the sliding layers when it differs from ``rope`` (Gemma 3's
            ``sliding_attention`` parameters); None: every layer uses ``rope``.
        final_logit_softcapping: ``cap * tanh(logits / cap)`` on the output logits (Gemma).
        mla: the MLA fields (DeepSeek-V3), None for GQA models.
        experts: gpt-oss's MoE, None for a dense MLP.
        state: the recurrent layers and MoE of a state model (``qwen3_next``, ``nemotron_h``).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope: RopeConfig
    layer_kinds: tuple[LayerKind, ...]
    sliding_window: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    mlp_bias: bool = False
    attention: AttentionOptions = AttentionOptions()
    local_rope: RopeConfig | None = None
    final_logit_softcapping: float | None = None
    mla: MLAConfig | None = None
    experts: ExpertsConfig | None = None
    state: StateLayerConfig | None = None


# --------------------------------------------------------------------------- parsing helpers
def common_fields(raw: dict[str, Any], act: str, allowed_acts: tuple[str, ...] = ("silu",),
                  rope: RopeConfig | None = None) -> dict[str, Any]:
    """The :class:`ModelConfig` fields every GQA / MLA family reads the same way.

    Raises:
        ValueError: ``act`` is not one of ``allowed_acts``.
    """
    if act not in allowed_acts:
        raise ValueError(f"unsupported hidden_act {act!r} for {raw.get('model_type')}; only "
                         f"{', '.join(map(repr, allowed_acts))} is implemented")
    heads = int(raw["num_attention_heads"])
    return dict(
        model_type=raw["model_type"],
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope=parse_rope(raw) if rope is None else rope,
        hidden_act=act,
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
    )


def check_window(kinds: tuple[LayerKind, ...] | list[LayerKind], window: Any) -> int | None:
    """The sliding window as an int, or None when no layer slides.

    Raises:
        ValueError: a layer slides and ``window`` is missing or not positive.
    """
    if "sliding" not in kinds:
        return None
    if window is None or int(window) <= 0:
        raise ValueError(f"sliding layers need a positive sliding_window, got {window!r}")
    return int(window)


def layer_kinds_or_pattern(raw: dict[str, Any], layers: int, pattern: int) -> tuple[LayerKind, ...]:
    """``layer_types`` when given, else every ``pattern``-th layer full and the others sliding."""
    layer_types = raw.get("layer_types")
    if layer_types is None:
        kinds = ["sliding" if (i + 1) % pattern else "full" for i in range(layers)]
    else:
        kinds = [parse_layer_type(t) for t in layer_types]
    if len(kinds) != layers:
        raise ValueError(f"layer_types has {len(kinds)} entries for {layers} layers")
    return tuple(kinds)  # type: ignore[arg-type]


def parse_layer_type(name: str) -> LayerKind:
    """An HF ``layer_types`` entry as a :data:`LayerKind`."""
    try:
        return HF_LAYER_TYPES[name]
    except KeyError:
        raise ValueError(
            f"unsupported layer type {name!r}; supported: {', '.join(HF_LAYER_TYPES)}"
        ) from None


def parse_rope(raw: dict[str, Any]) -> RopeConfig:
    """Read ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (4.x)."""
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    params = dict(params)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    return RopeConfig(rope_type=rope_type, theta=theta, params=params)


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    """The parsed ``<model_dir>/config.json``.

    Raises:
        FileNotFoundError: ``model_dir`` is not a directory or has no ``config.json``.
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        what = "is not a directory" if not Path(model_dir).is_dir() else "has no config.json"
        raise FileNotFoundError(f"model {str(model_dir)!r} {what} (want a Hugging Face checkpoint "
                                "directory: config.json and *.safetensors)")
    with path.open() as f:
        return json.load(f)
