"""State models: decoders mixing paged full attention with recurrent (linear-attention / SSM) layers.

A recurrent layer keeps, per request, a **conv state** (the last ``conv_kernel - 1`` inputs of
its depthwise causal convolution, ``[conv_kernel - 1, conv_dim]``) and a **recurrent state**
(gated delta net ``[v_heads, k_head_dim, v_head_dim]``, Mamba2 ``[heads, head_dim, ssm_state]``,
fp32). Those states live in a :class:`RecurrentStateStore` owned by the model, keyed by the
sequence's ``state_key`` (the request id), not in the paged KV cache:

* a sequence starting at position 0 starts from zero states;
* a sequence starting at ``start > 0`` needs the store to hold its state at exactly ``start``
  (the previous chunk or decode step); anything else raises :class:`StateMissingError` — a
  prefix-cache hit or a rewind cannot be served from KV pages alone, so it fails loudly instead
  of continuing from a wrong state;
* a step computes on a working copy and commits every sequence's state at ``start + n`` only
  after the whole forward pass succeeded;
* :meth:`RecurrentStateStore.release` drops a request's state (finish, abort, preemption: a
  preempted request is recomputed from position 0).

Speculative decoding: a verify step marks its acceptable lengths (``SequenceInput.snapshot_from``);
the layers keep the state after each of them and, once the drafts are verified,
:meth:`HybridStateLM.accept_state` rewinds to the accepted length, so rejected drafts never stay
in the state (docs/state-groups.md §2.7, choice (b)).

The engine (:mod:`hybridkv.engine.state_pages`) keeps states between steps in the pool (the
state group's extents, with prefix-cache checkpoints) and loads a step's working copies into
this store before the forward pass; a model used on its own keeps them here.

The recurrences run token by token in fp32 (the reference engine favours exactness over speed:
chunk boundaries anywhere give the same state as one pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from hybridkv.core.rules import rule_class
from hybridkv.core.specs import AttentionSpec, FullAttention, StateSpec

from ..model_config import AttentionOptions, LayerKind, ModelConfig, RopeConfig, StateLayerConfig
from ..kv_cache import PagedKVCache
from ..metadata import GroupMetadata, StepMetadata
from .base import LayerRope, PagedCausalLM


_STATE_LAYER_TYPES: dict[str, LayerKind] = {
    "full_attention": "full", "attention": "full", "linear_attention": "linear", "mamba": "linear",
    "mlp": "mlp",
}


def state_layer_kinds(raw: dict[str, Any], types: list[str]) -> tuple[LayerKind, ...]:
    """A state model's per-layer types (``layer_types`` / ``layers_block_type`` entries) as kinds.

    Raises:
        ValueError: a count different from ``num_hidden_layers``, or an unsupported type.
    """
    model_type = raw["model_type"]
    layers = int(raw.get("num_hidden_layers", len(types)))
    if len(types) != layers:
        raise ValueError(f"{model_type}: {len(types)} layer types for {layers} layers")
    bad = [t for t in types if t not in _STATE_LAYER_TYPES]
    if bad:
        raise ValueError(f"{model_type}: unsupported layer type {bad[0]!r}; supported: "
                         f"{', '.join(sorted(_STATE_LAYER_TYPES))} (MoE layers of nemotron_h are not implemented)")
    return tuple(_STATE_LAYER_TYPES[t] for t in types)


def state_model_config(raw: dict[str, Any], kinds: tuple[LayerKind, ...], state: StateLayerConfig,
                       rope: RopeConfig, eps: float) -> ModelConfig:
    """The :class:`ModelConfig` of a state model: its attention fields read the common way."""
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        model_type=raw["model_type"], vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]), num_hidden_layers=len(kinds),
        num_attention_heads=heads, num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads), rms_norm_eps=eps,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope=rope, layer_kinds=kinds, hidden_act="silu",
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        attention=AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=raw["model_type"] == "qwen3_next"),
        state=state,
    )


class StateMissingError(RuntimeError):
    """A sequence continues at a position the state store holds no state for."""


@dataclass(slots=True)
class RequestState:
    """One request's recurrent-layer states after ``position`` tokens.

    ``conv`` / ``ssm`` map a layer index to its tensor; a missing layer means zeros (position 0).
    Layers replace tensors (never write in place), so a shallow copy is a safe working copy.
    """

    position: int
    conv: dict[int, torch.Tensor] = field(default_factory=dict)
    ssm: dict[int, torch.Tensor] = field(default_factory=dict)
    marks: frozenset[int] = frozenset()
    snaps: dict[int, tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]] = field(default_factory=dict)
    sources: dict[int, tuple[object, int]] = field(default_factory=dict)

    def copy(self) -> RequestState:
        """A working copy (snapshots of an earlier step are dropped; ``sources`` are kept)."""
        return RequestState(self.position, dict(self.conv), dict(self.ssm), sources=dict(self.sources))

    def snapshot(self, position: int, layer: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        """Keep ``layer``'s states after ``position`` tokens (a length a verify may accept)."""
        c, s = self.snaps.setdefault(position, ({}, {}))
        c[layer], s[layer] = conv, ssm

    def layer(self, index: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(conv, ssm)`` of layer ``index`` before this step's tokens (None: zeros).

        A layer listed in ``sources`` (set by :meth:`HybridStateLM.run` to ``(state, t)``)
        starts from another sequence's snapshot after ``t`` tokens, taken earlier in the same
        layer of the same step: a prefix hit on a checkpoint that an earlier sequence of the
        batch writes in this very step. Raises :class:`StateMissingError` when it is absent."""
        src = self.sources.get(index)
        if src is None or index in self.ssm:
            return self.conv.get(index), self.ssm.get(index)
        other, t = src
        snap = other.snaps.get(t) if isinstance(other, RequestState) else None
        if snap is None or index not in snap[1]:
            raise StateMissingError(f"layer {index}: the checkpoint after {t} tokens that this sequence "
                                    "restores is not computed earlier in the step")
        return snap[0][index], snap[1][index]

    def at(self, position: int) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Every layer's ``(conv, ssm)`` after ``position`` tokens: the state itself or a
        snapshot this step kept; anything else raises :class:`StateMissingError`."""
        if position == self.position:
            return self.conv, self.ssm
        snap = self.snaps.get(position)
        if snap is None:
            raise StateMissingError(f"no recurrent state after {position} tokens (state at {self.position}, "
                                    f"snapshots {sorted(self.snaps)})")
        return snap


class RecurrentStateStore:
    """Per-request recurrent states of one model (see the module docstring for the contract)."""

    def __init__(self) -> None:
        self._states: dict[object, RequestState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def position(self, key: object) -> int | None:
        """Tokens the stored state of ``key`` covers (None: no state)."""
        state = self._states.get(key)
        return None if state is None else state.position

    def begin(self, key: object, start: int) -> RequestState:
        """A working copy of ``key``'s state at ``start`` (fresh zeros when ``start == 0``)."""
        if start == 0:
            return RequestState(0)
        state = self._states.get(key) if key is not None else None
        if state is None or state.position != start:
            have = "no state" if state is None else f"a state at position {state.position}"
            raise StateMissingError(
                f"sequence {key!r} continues at position {start} but the recurrent state store holds "
                f"{have}; recurrent layers cannot resume from KV pages (a prefix hit needs a "
                "checkpoint of the state)")
        return state.copy()

    def rewind(self, key: object, position: int) -> None:
        """Keep ``key``'s state after ``position`` tokens, dropping the tokens after it
        (rejected drafts). ``position`` must be the stored position or one the last step
        snapshotted (``SequenceInput.snapshot_from``); anything else raises
        :class:`StateMissingError`, so a rejected draft can never stay in the state."""
        state = self._states.get(key)
        if state is None:
            raise StateMissingError(f"sequence {key!r} has no recurrent state to rewind to {position}")
        if position != state.position:
            snap = state.snaps.get(position)
            if snap is None:
                raise StateMissingError(
                    f"sequence {key!r}: no recurrent state at position {position} (stored "
                    f"{state.position}, snapshots {sorted(state.snaps)})")
            state.conv, state.ssm = dict(snap[0]), dict(snap[1])
            state.position = position
        state.snaps = {}

    def get(self, key: object) -> RequestState:
        """``key``'s stored state (after a step: with the snapshots that step kept)."""
        state = self._states.get(key)
        if state is None:
            raise StateMissingError(f"sequence {key!r} has no recurrent state")
        return state

    def commit(self, key: object, state: RequestState) -> None:
        """Store ``state`` for ``key`` (a ``None`` key is a one-shot sequence: nothing stored)."""
        if key is not None:
            self._states[key] = state

    def release(self, key: object) -> None:
        """Forget ``key``'s state (no-op when absent)."""
        self._states.pop(key, None)

    def clear(self) -> None:
        self._states.clear()


class StepContext(NamedTuple):
    """What a layer needs besides its cache: RoPE tables, per-sequence rows and states."""

    rope: LayerRope | None
    seq_rows: tuple[slice, ...]
    states: list[RequestState]


def causal_conv(u: torch.Tensor, prev: torch.Tensor | None, weight: torch.Tensor,
                bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU of ``u`` ``[n, C]`` continuing from ``prev`` ``[K-1, C]``.

    ``weight`` is an ``nn.Conv1d`` weight ``[C, 1, K]``. Returns ``(out [n, C], inputs)``: the
    output of each new step and ``[prev; u]``, whose rows ``[j, j + K - 1)`` are the conv state
    after ``j`` of the new steps (:func:`conv_state_after`).
    """
    k = weight.shape[-1]
    if prev is None:
        prev = u.new_zeros((k - 1, u.shape[1]))
    full = torch.cat((prev.to(u.dtype), u), dim=0)
    out = nn.functional.conv1d(full.t()[None], weight, bias, groups=u.shape[1])[0].t()
    return nn.functional.silu(out), full


def conv_state_after(inputs: torch.Tensor, j: int, kernel: int) -> torch.Tensor:
    """The conv state (last ``kernel - 1`` inputs) after ``j`` new steps of :func:`causal_conv`."""
    return inputs[j:j + kernel - 1].clone()


class HybridStateLM(PagedCausalLM):
    """Base of the state models: full-attention layers on paged KV, recurrent layers on the
    :class:`RecurrentStateStore`, every layer a ``forward(x, ctx, cache, meta)`` block.

    Subclasses build ``self.model`` / ``self.lm_head`` (or their own names with :meth:`embed`,
    :meth:`final_norm` and :attr:`blocks`) in ``__init__`` after calling this one.
    """

    has_state = True

    def __init__(self, config: ModelConfig) -> None:  # noqa: D107 - builds no layers itself
        nn.Module.__init__(self)
        self.config = config
        self.states = RecurrentStateStore()

    # ---- layout ------------------------------------------------------------------------------
    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.model.layers

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.norm(x)

    def attention_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.config.layer_kinds) if k == "full"]

    def make_attention(self, layer_index: int):  # pragma: no cover - layers are built by subclasses
        raise NotImplementedError

    def attention_spec(self, layer_index: int, block_size: int, dtype: str = "float32") -> AttentionSpec:
        c = self.config
        return FullAttention(block_size=block_size, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                             dtype=dtype)

    def state_spec(self, block_size: int, state_dtype: str = "float32") -> StateSpec:
        """The :class:`StateSpec` of the recurrent layers: checkpoints every ``block_size``
        tokens, conv state ``[conv_kernel - 1, conv_dim]`` in the model's dtype (it holds layer
        inputs), recurrent state in ``state_dtype`` (computed in fp32; the core refuses dtypes
        outside :data:`~hybridkv.core.specs.STATE_DTYPES`, naming them)."""
        st = self.config.state
        if st is None:  # pragma: no cover - state models always parse a StateLayerConfig
            raise ValueError(f"{self.config.model_type} has no recurrent-layer config")
        conv_dtype = str(self.dtype).removeprefix("torch.")
        return StateSpec(block_size=block_size, conv_shape=(st.conv_kernel - 1, st.conv_dim),
                         conv_dtype=conv_dtype, state_shape=st.state_shape, state_dtype=state_dtype)

    def check_kv_cache(self, kv_cache: PagedKVCache) -> None:
        for i in self.attention_layers():
            name = self.layer_names[i]
            try:
                spec = kv_cache.group(name).spec
            except KeyError:
                raise ValueError(f"the KV cache has no layer {name!r}") from None
            self.blocks[i].attention.check_spec(spec)

    def group_indices(self, kv_cache: PagedKVCache) -> tuple[int, ...]:
        return tuple(sorted({kv_cache.group_index(self.layer_names[i]) for i in self.attention_layers()}))

    def release_state(self, key: object) -> None:
        """Drop ``key``'s recurrent state (finished, aborted or preempted request)."""
        self.states.release(key)

    def accept_state(self, key: object, position: int) -> None:
        """After verification: keep the state after ``position`` tokens (rejected drafts out)."""
        self.states.rewind(key, position)

    # ---- forward -----------------------------------------------------------------------------
    def run(self, meta: StepMetadata, kv_cache: PagedKVCache,
            capture: Sequence[int] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if capture:
            raise ValueError(f"{type(self).__name__} does not expose layer features (capture={capture!r})")
        keys = meta.state_keys or (None,) * len(meta.seq_rows)
        starts = meta.starts or tuple(int(meta.positions[r.start]) for r in meta.seq_rows)
        if len({k for k in keys if k is not None}) != sum(k is not None for k in keys):
            raise ValueError(f"a step holds one sequence per state key, got {list(keys)}")
        states = [self.states.begin(k, s) for k, s in zip(keys, starts)]
        by_key = dict(zip(keys, states))
        snap_from = meta.snapshot_from or (None,) * len(states)
        extra = meta.state_marks or ((),) * len(states)
        for state, lo, more, rows in zip(states, snap_from, extra, meta.seq_rows):
            marks = set(more)  # checkpoints to export
            if lo is not None:  # verify step: keep the state after every acceptable length
                marks.update(range(lo, state.position + rows.stop - rows.start))
            state.marks = frozenset(marks)
            state.sources = {i: (by_key.get(k), t) for i, (k, t) in state.sources.items()}
        x = self.embed(meta.token_ids)
        ctx = StepContext(self.rope_tables(meta.positions, x.dtype), meta.seq_rows, states)
        for i, block in enumerate(self.blocks):
            if self.config.layer_kinds[i] == "full":
                name = self.layer_names[i]
                gi = kv_cache.group_index(name)
                x = block(x, ctx, kv_cache.layer(name), meta.groups[gi])
            else:
                x = block(x, ctx, None, None)
        for key, state, rows in zip(keys, states, meta.seq_rows):
            state.position += rows.stop - rows.start
            self.states.commit(key, state)
        return self.final_norm(x), []


def per_sequence(ctx: StepContext) -> list[tuple[slice, RequestState]]:
    """``(rows, state)`` of every sequence of the step."""
    return list(zip(ctx.seq_rows, ctx.states))


def attention_call(attn: nn.Module, x: torch.Tensor, ctx: StepContext, cache: torch.Tensor | None,
                   meta: GroupMetadata | None) -> torch.Tensor:
    """Run a paged attention module; a full-attention layer always has a cache and metadata."""
    if cache is None or meta is None:
        raise ValueError(f"layer {attn.layer_index}: attention needs its KV-cache group metadata")
    return attn(x, ctx.rope, cache, meta)


def check_full_attention_spec(layer: nn.Module, spec: AttentionSpec) -> None:
    """The check_spec of a state model's attention layer: a FullAttention spec (no window)
    with the layer's KV heads and head dim. Raises ValueError naming the layer."""
    name = f"model.layers.{layer.layer_index}.self_attn"
    if rule_class(spec).kind != "full" or spec.window_tokens is not None:
        raise ValueError(f"layer {name!r} needs a FullAttention spec, got {type(spec).__name__}")
    if (spec.num_kv_heads, spec.head_dim) != (layer.num_kv_heads, layer.head_dim):
        raise ValueError(f"layer {name!r} has {layer.num_kv_heads} KV heads of {layer.head_dim}, spec has "
                         f"{spec.num_kv_heads} of {spec.head_dim}")
