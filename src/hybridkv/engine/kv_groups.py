"""Derive a :class:`~hybridkv.core.specs.KVCacheConfig` from an engine model.

Layers are grouped by attention kind ("full", "sliding", "mla"); each kind gets its own block
size. Optionally each kind is split into groups of at most ``layers_per_group`` layers (vLLM's
hybrid allocator uses equal-sized groups so that one block id is one page per layer slot).
"""

from __future__ import annotations

from collections.abc import Mapping

from hybridkv.core.specs import KVCacheConfig, KVCacheGroup

from .model_config import STATE_LAYER_KINDS, LayerKind
from .models.base import PagedCausalLM

GROUP_NAMES: dict[LayerKind, str] = {
    "full": "full_attention",
    "sliding": "sliding_attention",
    "mla": "mla",
    "linear": "recurrent_state",
}


def kv_cache_groups(model: PagedCausalLM, block_size: int | Mapping[str, int], dtype: str = "float32",
                    layers_per_group: int | None = None, is_draft: bool = False,
                    state_dtype: str = "float32") -> tuple[KVCacheGroup, ...]:
    """KV-cache groups for ``model``'s layers. Every group name starts with the model's
    ``kv_prefix``, as its layer names do (a drafter's: ``"draft."``).

    Args:
        model: the engine model.
        block_size: tokens per block for every kind, or per kind ("full", "sliding", "mla").
        dtype: cache dtype name (a :data:`hybridkv.core.specs.DTYPE_BYTES` key torch can store).
        layers_per_group: split each kind into groups of at most this many layers
            (named ``<kind>.<k>``); None keeps one group per kind (named by :data:`GROUP_NAMES`).
        is_draft: mark the groups as a speculative drafter's (``KVCacheGroup.is_draft``).
        state_dtype: recurrent-state dtype of a state model's ``linear`` layers, which form
            :class:`~hybridkv.core.specs.StateSpec` groups whose block size (the checkpoint
            granularity) is the ``linear`` entry of ``block_size``.
    """
    by_kind: dict[LayerKind, list[int]] = {}
    for i, kind in enumerate(model.config.layer_kinds):
        if kind in STATE_LAYER_KINDS and kind != "linear":  # MLP-only layers own no cache
            continue
        by_kind.setdefault(kind, []).append(i)
    groups: list[KVCacheGroup] = []
    for kind, layers in by_kind.items():
        if isinstance(block_size, Mapping):
            if kind == "linear" and kind not in block_size and "full" in block_size:
                bs = block_size["full"]  # checkpoints at the full-attention block size
            elif kind not in block_size:
                raise ValueError(f"no block size for {kind!r} layers; got sizes for {sorted(block_size)}")
            else:
                bs = block_size[kind]
        else:
            bs = block_size
        if kind == "linear":
            spec = model.state_spec(bs, state_dtype)  # type: ignore[attr-defined]
        else:
            spec = model.attention_spec(layers[0], bs, dtype)
        step = layers_per_group or len(layers)
        chunks = [layers[i:i + step] for i in range(0, len(layers), step)]
        for k, chunk in enumerate(chunks):
            name = GROUP_NAMES[kind] if layers_per_group is None else f"{GROUP_NAMES[kind]}.{k}"
            layer_names = tuple(model.layer_names[i] for i in chunk)
            groups.append(KVCacheGroup(model.kv_prefix + name, spec, layer_names, is_draft=is_draft))
    return tuple(groups)


def make_kv_cache_config(model: PagedCausalLM, block_size: int | Mapping[str, int], num_blocks: int,
                         dtype: str = "float32", layers_per_group: int | None = None) -> KVCacheConfig:
    """A :class:`KVCacheConfig` with :func:`kv_cache_groups` and ``num_blocks`` (incl. block 0)."""
    return KVCacheConfig(kv_cache_groups(model, block_size, dtype, layers_per_group), num_blocks=num_blocks)
