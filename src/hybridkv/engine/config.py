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
==============  ==============================================================================

A sliding layer with window ``W`` lets the query at position ``t`` read keys ``[t - W + 1, t]``
(``W`` tokens including itself), the transformers mask ``kv_idx > q_idx - W``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

LayerKind = Literal["full", "sliding", "mla"]

LLAMA_FAMILY = ("llama", "qwen2", "qwen3", "mistral")
GEMMA_FAMILY = ("gemma3_text",)
GPT_OSS_FAMILY = ("gpt_oss",)
MLA_FAMILY = ("deepseek_v3",)
SUPPORTED_MODEL_TYPES = LLAMA_FAMILY + GEMMA_FAMILY + GPT_OSS_FAMILY + MLA_FAMILY

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

    @property
    def is_mla(self) -> bool:
        return self.model_type in MLA_FAMILY

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed ``config.json``; raises ValueError on unsupported models."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
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
