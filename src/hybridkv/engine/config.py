"""Model configuration read from a Hugging Face-format ``config.json``.

The engine does not import transformers; it reads the handful of ``config.json`` fields its
models need into a frozen :class:`ModelConfig`. Fields follow the transformers names so a
reader can check them against the original config.

Per-layer attention kinds (``layer_kinds``) are resolved here once, exactly as transformers
resolves them, because the KV-cache groups are built from them:

==============  ==============================================================================
model_type      layer kinds
==============  ==============================================================================
llama           every layer ``full``
qwen2, qwen3    ``layer_types`` if given; else ``sliding`` for layers ``i >= max_window_layers``
                when ``use_sliding_window`` is true, otherwise ``full``
mistral         every layer ``sliding`` when ``sliding_window`` is set, else ``full``
gemma3_text     ``layer_types`` if given; else every ``sliding_window_pattern``-th layer (default
                6th) ``full``, the others ``sliding`` (Gemma 3)
gpt_oss         ``layer_types`` if given; else even layers ``sliding``, odd layers ``full``
deepseek_v3     every layer ``mla``
qwen3_next      ``layer_types``: ``full`` (gated attention) or ``linear`` (gated delta net)
nemotron_h      ``layers_block_type``: ``full`` (attention), ``linear`` (Mamba2) or ``mlp``
==============  ==============================================================================

``linear`` layers keep a recurrent state per request instead of KV pages and ``mlp`` layers
have no token mixer; neither has a KV-cache group (see :mod:`hybridkv.engine.models.recurrent`).

A sliding layer with window ``W`` lets the query at position ``t`` read keys ``[t - W + 1, t]``
(``W`` tokens including itself), the transformers mask ``kv_idx > q_idx - W``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

LayerKind = Literal["full", "sliding", "mla", "linear", "mlp"]

LLAMA_FAMILY = ("llama", "qwen2", "qwen3", "mistral")
GEMMA_FAMILY = ("gemma3_text",)
GPT_OSS_FAMILY = ("gpt_oss",)
MLA_FAMILY = ("deepseek_v3",)
STATE_FAMILY = ("qwen3_next", "nemotron_h")
SUPPORTED_MODEL_TYPES = LLAMA_FAMILY + GEMMA_FAMILY + GPT_OSS_FAMILY + MLA_FAMILY + STATE_FAMILY
STATE_LAYER_KINDS = ("linear", "mlp")
"""Layer kinds without KV pages (no KV-cache group)."""

# Activations of the gated MLP, by their transformers names.
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")

_HF_LAYER_TYPES: dict[str, LayerKind] = {
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
class ModelConfig:
    """What the engine's models need from ``config.json``.

    Attributes:
        model_type: one of :data:`SUPPORTED_MODEL_TYPES`.
        vocab_size, hidden_size, intermediate_size, num_hidden_layers: usual meanings.
        num_attention_heads: query heads.
        num_key_value_heads: KV heads (GQA); equals ``num_attention_heads`` for MLA.
        head_dim: per-head size of Q/K/V (Llama family); the RoPE size for MLA.
        rms_norm_eps: epsilon of the decoder RMSNorms.
        tie_word_embeddings: ``lm_head`` shares the embedding matrix.
        rope: rotary parameters.
        layer_kinds: per layer, "full", "sliding" or "mla".
        sliding_window: window ``W`` of the sliding layers (None when there are none).
        qkv_bias / o_bias / mlp_bias: linear biases (Qwen2: q/k/v only; Llama: configurable).
        qk_norm: per-head RMSNorm of q and k before RoPE (Qwen3).
        kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
        rope_interleave, first_k_dense_replace, attention_bias: MLA (DeepSeek-V3) fields.
        max_position_embeddings: used by the llama3 / yarn RoPE variants.
        local_rope: RoPE of the sliding layers when it differs from ``rope`` (Gemma 3's
            ``sliding_attention`` parameters); None: every layer uses ``rope``.
        attn_scale: softmax scale override (Gemma 3: ``query_pre_attn_scalar ** -0.5``);
            None: ``head_dim ** -0.5``.
        final_logit_softcapping: ``cap * tanh(logits / cap)`` on the output logits (Gemma).
        num_local_experts, num_experts_per_tok, swiglu_alpha, swiglu_limit: gpt-oss MoE.
        attention_sinks: one learned sink logit per query head joins every softmax (gpt-oss).
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
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_interleave: bool = False
    attention_bias: bool = False
    local_rope: RopeConfig | None = None
    attn_scale: float | None = None
    final_logit_softcapping: float | None = None
    num_local_experts: int | None = None
    num_experts_per_tok: int | None = None
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attention_sinks: bool = False
    state: StateLayerConfig | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed ``config.json``; raises ValueError on unsupported models."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if model_type in STATE_FAMILY:
            return _state_model_from_dict(cls, raw)
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        layers = int(raw["num_hidden_layers"])
        kv_heads = raw.get("num_key_value_heads") or heads
        if model_type in GEMMA_FAMILY:
            act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        else:
            act = raw.get("hidden_act", "silu")
        allowed = SUPPORTED_ACTIVATIONS if model_type in GEMMA_FAMILY else ("silu",)
        if act not in allowed:
            raise ValueError(
                f"unsupported hidden_act {act!r} for {model_type}; only {', '.join(map(repr, allowed))} "
                "is implemented")
        common: dict[str, Any] = dict(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(kv_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            rope=_parse_rope(raw) if model_type not in GEMMA_FAMILY else RopeConfig(),
            hidden_act=act,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        )
        if model_type in MLA_FAMILY:
            return cls._mla_from_dict(raw, common)
        if model_type in GEMMA_FAMILY:
            return cls._gemma3_from_dict(raw, common)
        if model_type in GPT_OSS_FAMILY:
            return cls._gpt_oss_from_dict(raw, common)
        return cls._llama_from_dict(raw, common)

    @classmethod
    def _gemma3_from_dict(cls, raw: dict[str, Any], common: dict[str, Any]) -> ModelConfig:
        layers = common["num_hidden_layers"]
        if raw.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=True is not supported (causal decoding only)")
        head_dim = int(raw.get("head_dim") or 256)
        kinds = _layer_kinds_or_pattern(raw, layers, int(raw.get("sliding_window_pattern")
                                                          or raw.get("_sliding_window_pattern") or 6))
        window = raw.get("sliding_window")
        if "sliding" in kinds and (window is None or int(window) <= 0):
            raise ValueError(f"sliding layers need a positive sliding_window, got {window!r}")
        full_rope, local_rope = _parse_gemma_rope(raw)
        common = dict(common, rope=full_rope, tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)))
        softcap = raw.get("final_logit_softcapping")
        return cls(
            **common,
            head_dim=head_dim,
            layer_kinds=kinds,
            sliding_window=int(window) if "sliding" in kinds else None,
            qkv_bias=bool(raw.get("attention_bias", False)),
            o_bias=bool(raw.get("attention_bias", False)),
            qk_norm=True,
            local_rope=local_rope,
            attn_scale=float(raw.get("query_pre_attn_scalar", head_dim)) ** -0.5,
            final_logit_softcapping=None if softcap is None else float(softcap),
        )

    @classmethod
    def _gpt_oss_from_dict(cls, raw: dict[str, Any], common: dict[str, Any]) -> ModelConfig:
        layers = common["num_hidden_layers"]
        head_dim = int(raw.get("head_dim") or common["hidden_size"] // common["num_attention_heads"])
        kinds = _layer_kinds_or_pattern(raw, layers, 2)
        window = raw.get("sliding_window")
        if "sliding" in kinds and (window is None or int(window) <= 0):
            raise ValueError(f"sliding layers need a positive sliding_window, got {window!r}")
        bias = bool(raw.get("attention_bias", True))
        return cls(
            **common,
            head_dim=head_dim,
            layer_kinds=kinds,
            sliding_window=int(window) if "sliding" in kinds else None,
            qkv_bias=bias,
            o_bias=bias,
            num_local_experts=int(raw.get("num_local_experts") or raw.get("num_experts")),
            num_experts_per_tok=int(raw.get("num_experts_per_tok", 4)),
            swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
            attention_sinks=True,
        )

    @classmethod
    def _llama_from_dict(cls, raw: dict[str, Any], common: dict[str, Any]) -> ModelConfig:
        model_type = common["model_type"]
        layers = common["num_hidden_layers"]
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
                kinds = [_parse_layer_type(t) for t in layer_types]
        if len(kinds) != layers:
            raise ValueError(f"layer_types has {len(kinds)} entries for {layers} layers")
        if "sliding" in kinds and (window is None or int(window) <= 0):
            raise ValueError(f"sliding layers need a positive sliding_window, got {window!r}")
        if "sliding" not in kinds:
            window = None
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            **common,
            head_dim=int(head_dim),
            layer_kinds=tuple(kinds),
            sliding_window=None if window is None else int(window),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3",
        )

    @classmethod
    def _mla_from_dict(cls, raw: dict[str, Any], common: dict[str, Any]) -> ModelConfig:
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
        return cls(
            **common,
            head_dim=rope_dim,
            layer_kinds=("mla",) * layers,
            kv_lora_rank=int(raw["kv_lora_rank"]),
            q_lora_rank=None if q_lora is None else int(q_lora),
            qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
            qk_rope_head_dim=rope_dim,
            v_head_dim=int(raw["v_head_dim"]),
            rope_interleave=bool(raw.get("rope_interleave", True)),
            attention_bias=bool(raw.get("attention_bias", False)),
        )


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


_STATE_LAYER_TYPES: dict[str, LayerKind] = {
    "full_attention": "full", "attention": "full", "linear_attention": "linear", "mamba": "linear",
    "mlp": "mlp",
}
_NEMOTRON_PATTERN: dict[str, str] = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _state_model_from_dict(cls: type[ModelConfig], raw: dict[str, Any]) -> ModelConfig:
    """qwen3_next / nemotron_h: layer kinds, attention fields and :class:`StateLayerConfig`."""
    model_type = raw["model_type"]
    layers = int(raw["num_hidden_layers"]) if "num_hidden_layers" in raw else None
    if model_type == "qwen3_next":
        types = list(raw["layer_types"])
    else:
        types = raw.get("layers_block_type")
        if types is None:
            types = [_NEMOTRON_PATTERN.get(c, c) for c in str(raw.get("hybrid_override_pattern", ""))]
    if layers is None:
        layers = len(types)
    if len(types) != layers:
        raise ValueError(f"{model_type}: {len(types)} layer types for {layers} layers")
    bad = [t for t in types if t not in _STATE_LAYER_TYPES]
    if bad:
        raise ValueError(f"{model_type}: unsupported layer type {bad[0]!r}; supported: "
                         f"{', '.join(sorted(_STATE_LAYER_TYPES))} (MoE layers of nemotron_h are not implemented)")
    kinds = tuple(_STATE_LAYER_TYPES[t] for t in types)
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    if model_type == "qwen3_next":
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r} for qwen3_next; only 'silu' is implemented")
        rope = _parse_rope(raw)
        factor = float(rope.params.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
        nk, nv = int(raw["linear_num_key_heads"]), int(raw["linear_num_value_heads"])
        dk, dv = int(raw["linear_key_head_dim"]), int(raw["linear_value_head_dim"])
        if nv % nk:
            raise ValueError(f"linear_num_value_heads {nv} must be a multiple of linear_num_key_heads {nk}")
        experts = int(raw.get("num_experts") or 0)
        step = int(raw.get("decoder_sparse_step") or 1)
        only = set(raw.get("mlp_only_layers") or [])
        state = StateLayerConfig(
            conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)), conv_dim=2 * nk * dk + nv * dv,
            num_k_heads=nk, num_v_heads=nv, k_head_dim=dk, v_head_dim=dv,
            norm_eps=float(raw.get("rms_norm_eps", 1e-6)), partial_rotary_factor=factor,
            num_experts=experts, num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0),
            shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            moe_layers=tuple(i for i in range(layers) if experts > 0 and i not in only and (i + 1) % step == 0),
        )
        eps = float(raw.get("rms_norm_eps", 1e-6))
        bias = bool(raw.get("attention_bias", False))
    else:
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
        rope = RopeConfig()
        bias = bool(raw.get("attention_bias", False))
    return cls(
        model_type=model_type, vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim, rms_norm_eps=eps, tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope=rope, layer_kinds=kinds, hidden_act="silu",
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        qkv_bias=bias, o_bias=bias, mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3_next", state=state,
    )


def _layer_kinds_or_pattern(raw: dict[str, Any], layers: int, pattern: int) -> tuple[LayerKind, ...]:
    """``layer_types`` when given, else every ``pattern``-th layer full and the others sliding."""
    layer_types = raw.get("layer_types")
    if layer_types is None:
        kinds = ["sliding" if (i + 1) % pattern else "full" for i in range(layers)]
    else:
        kinds = [_parse_layer_type(t) for t in layer_types]
    if len(kinds) != layers:
        raise ValueError(f"layer_types has {len(kinds)} entries for {layers} layers")
    return tuple(kinds)


def _parse_gemma_rope(raw: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
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
    return _parse_rope({"rope_parameters": full}), _parse_rope({"rope_parameters": local})


def _parse_layer_type(name: str) -> LayerKind:
    try:
        return _HF_LAYER_TYPES[name]
    except KeyError:
        raise ValueError(
            f"unsupported layer type {name!r}; supported: {', '.join(_HF_LAYER_TYPES)}"
        ) from None


def _parse_rope(raw: dict[str, Any]) -> RopeConfig:
    """Read ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (4.x)."""
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    params = dict(params)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    return RopeConfig(rope_type=rope_type, theta=theta, params=params)


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read ``<model_dir>/config.json`` into a :class:`ModelConfig`.

    Raises:
        FileNotFoundError: ``model_dir`` is not a directory or has no ``config.json``.
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        what = "is not a directory" if not Path(model_dir).is_dir() else "has no config.json"
        raise FileNotFoundError(f"model {str(model_dir)!r} {what} (want a Hugging Face checkpoint "
                                "directory: config.json and *.safetensors)")
    with path.open() as f:
        return ModelConfig.from_dict(json.load(f))
