"""The decoder skeleton shared by every engine model, and its paged forward pass.

Module names follow transformers (``model.embed_tokens``, ``model.layers.{i}.self_attn``,
``model.layers.{i}.mlp``, ``model.norm``, ``lm_head``), so a Hugging Face checkpoint's state
dict loads unchanged. The KV-cache layer name of layer ``i`` is its attention module's name,
``model.layers.{i}.self_attn``; KV-cache groups list those names.

A forward step::

    seqs ──build_step_metadata──► packed tokens, positions, per-group slots/reads
    embed ─► for each layer: norm ─► attention (write K/V to pages, read via block table) ─► +res
                              norm ─► SwiGLU MLP ─► +res
    norm ─► lm_head on the requested rows ─► logits per sequence
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

import torch
from torch import nn

from hybridkv.core.registry import Registry
from hybridkv.core.specs import AttentionSpec

from ..model_config import ModelConfig
from ..kv_cache import PagedKVCache
from ..metadata import GroupMetadata, SequenceInput, StepMetadata, build_step_metadata

LogitsMode = Literal["last", "all", "none"]
RopeTables = tuple[torch.Tensor, torch.Tensor]
# One (cos, sin) pair for every layer, or one per layer kind ("full", "sliding", ...).
LayerRope = Union[RopeTables, Mapping[str, RopeTables]]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": nn.functional.silu,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
}


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, scaled by ``weight``.

    Llama's order casts the normalised value back to the input dtype and then scales it;
    ``scale_in_fp32`` scales first and casts last (gpt-oss, T5). The two agree in fp32 and
    differ by rounding in bf16 / fp16.
    """

    def __init__(self, size: int, eps: float = 1e-6, scale_in_fp32: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_in_fp32:
            return (self.weight * x).to(dtype)
        return self.weight * x.to(dtype)


class GatedMLP(nn.Module):
    """Gated feed-forward: ``down(act(gate(x)) * up(x))`` (SwiGLU with ``silu``, GeGLU with gelu)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PagedAttentionLayer(nn.Module, ABC):
    """One attention layer reading and writing a paged cache."""

    layer_index: int

    @abstractmethod
    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: torch.Tensor, meta: GroupMetadata) -> torch.Tensor:
        """``x`` ``[T, hidden]`` -> ``[T, hidden]``; writes this step's K/V (or latent) first."""

    @abstractmethod
    def check_spec(self, spec: AttentionSpec) -> None:
        """Raise ValueError if ``spec`` cannot hold this layer's KV."""

    def add_gqa_projections(self, config: ModelConfig, layer_index: int, q_factor: int = 1) -> None:
        """Set ``layer_index``, the head counts and the GQA projections ``q/k/v/o_proj`` (biases
        from ``attention.qkv_bias`` / ``attention.o_bias``); ``q_proj`` is ``q_factor`` times wider (2: a query and
        its output gate per head). The checkpoints' names, so weights load by name."""
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        h, d = config.hidden_size, self.head_dim
        opts = config.attention
        self.q_proj = nn.Linear(h, self.num_heads * d * q_factor, bias=opts.qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=opts.qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=opts.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=opts.o_bias)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP (the dense gated MLP unless one is given);
    ``norm`` builds its two norms from ``(size, eps)``."""

    def __init__(self, config: ModelConfig, attn: PagedAttentionLayer, mlp: nn.Module | None = None,
                 norm: Callable[[int, float], nn.Module] = RMSNorm) -> None:
        super().__init__()
        self.input_layernorm = norm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = attn
        self.post_attention_layernorm = norm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp if mlp is not None else GatedMLP(
            config.hidden_size, config.intermediate_size, config.mlp_bias, config.hidden_act)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                cache: torch.Tensor, meta: GroupMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Embedding, decoder layers and the final norm (transformers' ``model`` submodule)."""

    def __init__(self, config: ModelConfig, layers: list[DecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class PagedCausalLM(nn.Module, ABC):
    """A causal LM whose attention runs over a :class:`PagedKVCache`.

    Subclasses build the attention layers and the rotary table and describe each layer's KV
    spec; this class owns the paged forward pass.

    Attributes:
        kv_prefix: prepended to every KV-cache layer name (a drafter model sharing one
            :class:`~hybridkv.core.specs.KVCacheConfig` with its target uses ``"draft."``).
    """

    kv_prefix: str = ""
    has_state: bool = False
    """True for models with per-request recurrent state (:mod:`.recurrent`): prefix caching is
    off for them until the core has state groups (docs/state-groups.md)."""

    @classmethod
    @abstractmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        """This family's :class:`ModelConfig` from a parsed ``config.json`` whose ``model_type``
        the class is registered for; ValueError names what the family does not support."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config, [self.make_layer(i) for i in range(config.num_hidden_layers)])
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # ------------------------------------------------------------------ per-architecture
    def make_layer(self, layer_index: int) -> nn.Module:
        """Build decoder layer ``layer_index`` (a pre-norm block around :meth:`make_attention`)."""
        return DecoderLayer(self.config, self.make_attention(layer_index))

    @abstractmethod
    def make_attention(self, layer_index: int) -> PagedAttentionLayer:
        """Build the attention module of layer ``layer_index``."""

    @abstractmethod
    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> LayerRope:
        """``(cos, sin)`` for the packed positions, or one such pair per layer kind."""

    @abstractmethod
    def attention_spec(self, layer_index: int, block_size: int, dtype: str = "float32") -> AttentionSpec:
        """The KV-cache spec of layer ``layer_index`` at ``block_size`` tokens per block."""

    # ------------------------------------------------------------------ naming
    @property
    def layer_names(self) -> tuple[str, ...]:
        """KV-cache layer names, ``{kv_prefix}model.layers.{i}.self_attn``, in layer order."""
        return tuple(f"{self.kv_prefix}model.layers.{i}.self_attn" for i in range(self.config.num_hidden_layers))

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def check_kv_cache(self, kv_cache: PagedKVCache) -> None:
        """Raise ValueError unless every layer has a cache whose spec fits it."""
        for name, layer in zip(self.layer_names, self.model.layers):
            try:
                spec = kv_cache.group(name).spec
            except KeyError:
                raise ValueError(f"the KV cache has no layer {name!r}") from None
            layer.self_attn.check_spec(spec)

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, seqs: Sequence[SequenceInput] | StepMetadata, kv_cache: PagedKVCache,
                logits: LogitsMode = "last") -> list[torch.Tensor]:
        """Run one step: write every new token's KV into the cache and return logits.

        Args:
            seqs: the step's sequences (or metadata already built from them).
            kv_cache: the paged cache; its config's groups must cover every layer.
            logits: "last" -> one ``[vocab]`` row per sequence (shape ``[1, vocab]``),
                "all" -> ``[n_new, vocab]`` per sequence, "none" -> empty list (prefill chunks
                whose logits are not needed).

        Returns:
            One fp32 logits tensor per sequence, in input order.
        """
        self.check_kv_cache(kv_cache)
        meta = seqs if isinstance(seqs, StepMetadata) else build_step_metadata(
            seqs, kv_cache.config, self.device, group_indices=self.group_indices(kv_cache))
        hidden = self.hidden_states(meta, kv_cache)
        if logits == "none":
            return []
        if logits == "last":
            rows = [hidden[r.stop - 1: r.stop] for r in meta.seq_rows]
        elif logits == "all":
            rows = [hidden[r] for r in meta.seq_rows]
        else:
            raise ValueError(f"logits must be 'last', 'all' or 'none', got {logits!r}")
        out = self.compute_logits(torch.cat(rows, dim=0))
        return list(out.split([r.shape[0] for r in rows]))

    def release_state(self, key: object) -> None:
        """Forget the per-request state of ``key`` (attention-only models keep none)."""

    def accept_state(self, key: object, position: int) -> None:
        """Drop the per-request state past ``position`` tokens (rejected drafts; no-op here)."""

    def group_indices(self, kv_cache: PagedKVCache) -> tuple[int, ...]:
        """Indices of the KV-cache groups holding this model's layers (ascending)."""
        return tuple(sorted({kv_cache.group_index(name) for name in self.layer_names}))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings ``[T, hidden]`` of ``token_ids``."""
        return self.model.embed_tokens(token_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[n, vocab]`` of final-norm hidden states ``[n, hidden]``."""
        return self.lm_head(hidden).float()

    def hidden_states(self, meta: StepMetadata, kv_cache: PagedKVCache) -> torch.Tensor:
        """Final-norm hidden states ``[T, hidden]`` of the packed step."""
        return self.run(meta, kv_cache)[0]

    def run(self, meta: StepMetadata, kv_cache: PagedKVCache,
            capture: Sequence[int] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The packed step's final-norm hidden states, and the outputs of the decoder layers
        listed in ``capture`` (before the final norm; a drafter's context features)."""
        x = self.embed(meta.token_ids)
        ropes = self.rope_tables(meta.positions, x.dtype)
        kinds = self.config.layer_kinds
        captured: dict[int, torch.Tensor] = {}
        for i, (name, layer) in enumerate(zip(self.layer_names, self.model.layers)):
            gi = kv_cache.group_index(name)
            rope = ropes if isinstance(ropes, tuple) else ropes[kinds[i]]
            x = layer(x, rope, kv_cache.layer(name), meta.groups[gi])
            if i in capture:
                captured[i] = x
        return self.model.norm(x), [captured[i] for i in capture]


#: HF ``model_type`` -> the engine model class that runs it. A model family is one module in
#: this package whose class (a :class:`PagedCausalLM` with ``parse_config``) is decorated with
#: ``@MODELS.register("<model_type>")`` once per type it runs, plus its import line in
#: ``models/__init__.py``.
MODELS: Registry[type[PagedCausalLM]] = Registry("model_type", value_base=PagedCausalLM)
