"""Layer shapes of a model preset: what the calibrated cost model and the profiler need beyond
the KV layout.

A :class:`ModelShapes` record holds the widths a forward pass is built from (hidden size,
heads, MLP width, vocabulary, MoE routing, MLA ranks, recurrent-state heads). The presets in
:mod:`hybridkv.cost.presets` fill it from their ``config.json`` fields; the cost model reads the
LM head's size and the query heads from it, and ``hybridkv profile`` builds random-weight
layers of exactly these shapes.

:func:`trimmed_preset` gives a smaller copy of a preset with the same group types (fewer
layers, narrower widths, a small vocabulary) for profiling on a CPU; it is a pure function of
its arguments, so a profile that records them rebuilds the same model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, cast

from hybridkv.core.specs import MLA, AttentionSpec, KVCacheGroup, StateSpec, is_state
from hybridkv.core.validation import check_int

__all__ = ["MLAShape", "MoEShape", "ModelShapes", "StateShape", "Trim", "trimmed_preset"]


@dataclass(frozen=True, slots=True)
class MoEShape:
    """Routed experts of a mixture-of-experts MLP.

    Attributes:
        num_experts: routed experts per MoE layer.
        top_k: routed experts each token uses.
        expert_intermediate: one expert's MLP width.
        shared_intermediate: width of the always-on shared expert(s) (0: none).
        dense_layers: leading layers with a dense MLP instead of experts (DeepSeek-V3's
            ``first_k_dense_replace``; 0: every layer is MoE).
    """

    num_experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int = 0
    dense_layers: int = 0


@dataclass(frozen=True, slots=True)
class MLAShape:
    """Multi-head latent attention widths (DeepSeek-V2/V3 ``config.json`` names)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True)
class StateShape:
    """A recurrent (linear-attention / state-space) layer's heads.

    Attributes:
        kind: ``"gated-delta-net"`` or ``"mamba2"`` (the profiler times one stand-in for both).
        num_heads: value heads (one ``head_k_dim x head_v_dim`` state each).
        head_k_dim, head_v_dim: the state's two widths.
    """

    kind: str
    num_heads: int
    head_k_dim: int
    head_v_dim: int


@dataclass(frozen=True, slots=True)
class ModelShapes:
    """Widths of one decoder layer and the LM head.

    Attributes:
        hidden_size: model width.
        num_heads: query heads of an attention layer.
        head_dim: query/key head width of a full or sliding attention layer.
        intermediate_size: dense MLP width (SwiGLU: gate, up, down); 0 when every layer is MoE.
        vocab_size: vocabulary (LM head rows).
        tie_word_embeddings: the LM head is the embedding matrix (counted once in the
            parameters).
        moe: routed experts, or None for a dense MLP.
        mla: MLA widths for MLA groups, or None.
        state: recurrent-layer heads for state groups, or None.
    """

    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    moe: MoEShape | None = None
    mla: MLAShape | None = None
    state: StateShape | None = None

    @property
    def head_params(self) -> int:
        """Parameters of the LM head (``vocab_size * hidden_size``)."""
        return self.vocab_size * self.hidden_size

    @property
    def untied_embedding_params(self) -> int:
        """Parameters of an embedding matrix that is not also the LM head (0 when tied)."""
        return 0 if self.tie_word_embeddings else self.head_params

    @property
    def mlp_width(self) -> int:
        """MLP width one token runs through (dense width, or top-k experts plus shared)."""
        if self.moe is None:
            return self.intermediate_size
        return self.moe.top_k * self.moe.expert_intermediate + self.moe.shared_intermediate


@dataclass(frozen=True, slots=True)
class Trim:
    """How :func:`trimmed_preset` shrinks a preset (all 0/1 values mean "keep").

    Attributes:
        layers_per_group: layers kept in each KV group (0: all).
        width_divisor: divides hidden size, heads, KV heads and MLP widths (1: keep).
        vocab_size: LM head rows (0: keep).
    """

    layers_per_group: int = 0
    width_divisor: int = 1
    vocab_size: int = 0

    def __post_init__(self) -> None:
        check_int("Trim.layers_per_group", self.layers_per_group, 0)
        check_int("Trim.width_divisor", self.width_divisor, 1)
        check_int("Trim.vocab_size", self.vocab_size, 0)

    @property
    def is_identity(self) -> bool:
        return self.layers_per_group == 0 and self.width_divisor == 1 and self.vocab_size == 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _div(x: int, d: int) -> int:
    return max(1, x // d)


class _Preset(Protocol):
    """What :func:`trimmed_preset` reads of a :class:`~hybridkv.cost.presets.ModelPreset` (a
    dataclass; this module cannot import its class: the presets module imports this one)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def name(self) -> str: ...
    @property
    def groups(self) -> tuple[KVCacheGroup, ...]: ...
    @property
    def shapes(self) -> ModelShapes | None: ...
    @property
    def source(self) -> str: ...


_P = TypeVar("_P", bound=_Preset)


def trimmed_preset(preset: _P, trim: Trim) -> _P:
    """A copy of ``preset`` (a :class:`~hybridkv.cost.presets.ModelPreset` with shapes) shrunk
    by ``trim``: the same groups and attention types, fewer layers, narrower widths.

    Parameter counts are recomputed from the trimmed shapes (a dense SwiGLU layer, or the
    activated MoE path; attention projections of width ``heads * head_dim``). Head dims are
    kept, except that a ``width_divisor`` above 1 also caps them at 64; windows and chunk sizes
    are kept. The parameter counts are estimates (the profiler records the counts of the
    weights it actually builds).

    Raises:
        ValueError: the preset has no shapes.
    """
    if trim.is_identity:
        return preset
    s = preset.shapes
    if s is None:
        raise ValueError(f"preset {preset.name!r} has no layer shapes; it cannot be trimmed")
    d = trim.width_divisor
    cap = 64 if d > 1 else 1 << 30            # head widths are capped only when narrowing
    heads = _div(s.num_heads, d)
    head_dim = min(s.head_dim, cap)
    groups = []
    layer_total = 0
    for g in preset.groups:
        names = g.layer_names[:trim.layers_per_group] if trim.layers_per_group else g.layer_names
        spec: AttentionSpec = g.spec
        if spec.storage == "kv":                 # K and V per head: fewer, narrower heads
            kv = _div(spec.num_kv_heads, d)
            while heads % kv:
                kv -= 1
            spec = dataclasses.replace(spec, num_kv_heads=kv, head_dim=min(spec.head_dim, cap))
        elif spec.storage == "latent":           # a narrower latent (storage "latent": an MLA)
            latent = cast(MLA, spec)
            spec = dataclasses.replace(latent, kv_lora_rank=_div(latent.kv_lora_rank, d),
                                       qk_rope_head_dim=_div(latent.qk_rope_head_dim, d))
        elif spec.storage == "state" and s.state is not None:   # storage "state": a StateSpec
            st, rec = s.state, cast(StateSpec, spec)
            spec = dataclasses.replace(rec, conv_shape=(rec.conv_shape[0], _div(rec.conv_shape[1], d)),
                                       state_shape=(_div(st.num_heads, d), min(st.head_k_dim, cap),
                                                    min(st.head_v_dim, cap)))
        groups.append(dataclasses.replace(g, spec=spec, layer_names=tuple(names)))
        if not g.is_draft:
            layer_total += len(names)
    moe = s.moe and dataclasses.replace(s.moe, num_experts=_div(s.moe.num_experts, d),
                                        top_k=min(s.moe.top_k, _div(s.moe.num_experts, d)),
                                        expert_intermediate=_div(s.moe.expert_intermediate, d),
                                        shared_intermediate=(s.moe.shared_intermediate // d))
    mla = s.mla and MLAShape(_div(s.mla.q_lora_rank, d), _div(s.mla.kv_lora_rank, d),
                             min(s.mla.qk_nope_head_dim, cap), _div(s.mla.qk_rope_head_dim, d),
                             min(s.mla.v_head_dim, cap))
    state = s.state and StateShape(s.state.kind, _div(s.state.num_heads, d),
                                   min(s.state.head_k_dim, cap), min(s.state.head_v_dim, cap))
    shapes = ModelShapes(
        hidden_size=heads * head_dim, num_heads=heads, head_dim=head_dim,
        intermediate_size=s.intermediate_size // d, vocab_size=trim.vocab_size or s.vocab_size,
        tie_word_embeddings=s.tie_word_embeddings, moe=moe, mla=mla, state=state)
    h = shapes.hidden_size
    attn_width = heads * head_dim
    kv_width = max((getattr(g.spec, "num_kv_heads", 1) * getattr(g.spec, "head_dim", head_dim)
                    for g in groups if not is_state(g.spec)), default=0)
    per_layer_attn = 2 * h * attn_width + 2 * h * kv_width
    per_layer_mlp = 3 * h * shapes.mlp_width
    total_experts = (3 * h * (moe.num_experts * moe.expert_intermediate + moe.shared_intermediate)
                     if moe else per_layer_mlp)
    embed = shapes.head_params + shapes.untied_embedding_params
    active = layer_total * (per_layer_attn + per_layer_mlp) + embed
    total = layer_total * (per_layer_attn + total_experts) + embed
    return dataclasses.replace(
        preset, name=f"{preset.name}/trim", groups=tuple(groups), num_params=total,
        active_params=active, num_layers=layer_total, hidden_size=h, attn_width=attn_width,
        shapes=shapes, source=f"{preset.source}; trimmed ({trim})")
