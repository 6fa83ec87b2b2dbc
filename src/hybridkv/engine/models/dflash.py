"""A DFlash-style parallel drafter: one forward pass drafts k tokens from the target's features.

The drafter is a few Qwen3-style decoder layers that share the target's embeddings and LM
head. Its KV cache (one full-attention group, ``is_draft=True``) holds two kinds of entries::

    positions:    0 ........................ N'-2 | N'-1   N'   ...  N'+k-1
    draft KV:     context entries                 | bonus  mask ...  mask      <- the query block
                  K/V of hidden_norm(fc(target     (written into the k+1 lookahead slots, then
                  features)), one per computed     overwritten by context entries once the
                  target position                  target has computed those positions)

* **context**: for every position the target computed, the target's hidden states after the
  layers ``target_layer_ids`` are concatenated, projected by ``fc`` and normed by
  ``hidden_norm``; each draft layer stores its own ``k_proj``/``v_proj`` of that vector;
* **query block**: the bonus token (the last sampled token, whose target KV does not exist
  yet) and k mask tokens, embedded by the target, run through the draft layers; block queries
  see all context entries and each other (no causal mask inside the block); the LM head on
  the k mask rows gives the k drafts at once.

A checkpoint directory holds a Qwen3-style ``config.json`` with ``block_size`` (k + 1 at most)
and ``dflash_config = {"target_layer_ids": [...], "mask_token_id": id}``, and safetensors
with ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and ``layers.{i}.*`` (no embeddings
or LM head: those are the target's).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hybridkv.core.specs import FullAttention, KVCacheGroup

from ..model_config import ModelConfig
from ..kv_cache import PagedKVCache
from ..metadata import StepMetadata
from ..rope import Rotary
from .base import DecoderLayer, RMSNorm
from .llama import GQAAttention, LlamaForCausalLM

DFLASH_GROUP = "dflash"


class DFlashDraftModel(nn.Module):
    """The drafter's layers, context projection and final norm.

    Args:
        config: the draft layers' (Qwen3-style) config; ``hidden_size`` must equal the target's.
        target_layer_ids: target decoder layers whose outputs form the context features.
        mask_token_id: the token id that fills the k draft positions of the query block.
        block_size: the query block size the drafter was trained for (k <= block_size - 1).
    """

    kv_prefix = "dflash."

    def __init__(self, config: ModelConfig, target_layer_ids: Sequence[int], mask_token_id: int,
                 block_size: int) -> None:
        super().__init__()
        if any(kind != "full" for kind in config.layer_kinds):
            raise ValueError("DFlash draft layers must all be full attention")
        if not target_layer_ids:
            raise ValueError("DFlash needs at least one target layer id for its context features")
        self.config = config
        self.target_layer_ids = tuple(int(i) for i in target_layer_ids)
        self.mask_token_id = int(mask_token_id)
        self.block_size = int(block_size)
        h = config.hidden_size
        self.layers = nn.ModuleList(DecoderLayer(config, GQAAttention(config, i))
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.rotary = Rotary(config, config.head_dim)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(f"{self.kv_prefix}layers.{i}.self_attn" for i in range(self.config.num_hidden_layers))

    @property
    def max_draft_tokens(self) -> int:
        return self.block_size - 1

    def kv_cache_groups(self, block_size: int, dtype: str = "float32") -> tuple[KVCacheGroup, ...]:
        """The drafter's single full-attention group (``is_draft=True``)."""
        c = self.config
        spec = FullAttention(block_size=block_size, num_kv_heads=c.num_key_value_heads,
                             head_dim=c.head_dim, dtype=dtype)
        return (KVCacheGroup(DFLASH_GROUP, spec, self.layer_names, is_draft=True),)

    def _layer_meta(self, meta: StepMetadata, kv_cache: PagedKVCache, name: str):
        gi = kv_cache.group_index(name)
        group = meta.groups[gi]
        if group is None:
            raise ValueError(f"step metadata has no entry for the drafter group of {name!r}")
        return kv_cache.layer(name), group

    @torch.no_grad()
    def write_context(self, features: Sequence[torch.Tensor], meta: StepMetadata, kv_cache: PagedKVCache) -> None:
        """Store context K/V at the metadata's positions.

        Args:
            features: per target layer in ``target_layer_ids``, its outputs ``[T, hidden]``
                for the T packed positions of ``meta``.
            meta: metadata of the positions (only the drafter group's write slots are used).
            kv_cache: the shared paged cache.
        """
        ctx = self.hidden_norm(self.fc(torch.cat(list(features), dim=-1)))
        rope = self.rotary(meta.positions, ctx.dtype)
        for name, layer in zip(self.layer_names, self.layers):
            cache, group = self._layer_meta(meta, kv_cache, name)
            layer.self_attn.write_only(ctx, rope, cache, group)

    @torch.no_grad()
    def block_hidden(self, x: torch.Tensor, meta: StepMetadata, kv_cache: PagedKVCache) -> torch.Tensor:
        """Run the query blocks (embedded ``x`` ``[T, hidden]``): write their K/V into the
        lookahead slots, attend (non-causal sequences), return final-norm hidden states."""
        rope = self.rotary(meta.positions, x.dtype)
        for name, layer in zip(self.layer_names, self.layers):
            cache, group = self._layer_meta(meta, kv_cache, name)
            x = layer(x, rope, cache, group)
        return self.norm(x)


def dflash_config_from_dict(raw: dict[str, Any]) -> tuple[ModelConfig, tuple[int, ...], int, int]:
    """Parse a DFlash ``config.json``: (layer config, target layer ids, mask token id, block size)."""
    dflash = raw.get("dflash_config") or {}
    ids = dflash.get("target_layer_ids")
    mask = dflash.get("mask_token_id", raw.get("mask_token_id"))
    if ids is None or mask is None:
        raise ValueError("a DFlash config.json needs dflash_config.target_layer_ids and mask_token_id")
    block = int(raw.get("block_size", 16))
    if block < 2:
        raise ValueError(f"DFlash block_size must be >= 2 (bonus + at least one draft), got {block}")
    fields = dict(raw, model_type="qwen3", use_sliding_window=False)
    fields.pop("layer_types", None)
    return LlamaForCausalLM.parse_config(fields), tuple(int(i) for i in ids), int(mask), block


def load_dflash(model_dir: str | Path, device: torch.device | str = "cpu",
                dtype: torch.dtype | None = None) -> DFlashDraftModel:
    """Load a DFlash drafter directory (see the module docstring for the format)."""
    from .loader import read_safetensors

    raw = json.loads((Path(model_dir) / "config.json").read_text())
    config, ids, mask, block = dflash_config_from_dict(raw)
    model = DFlashDraftModel(config, ids, mask, block)
    state = {k: v for k, v in read_safetensors(model_dir).items() if not k.endswith("rotary_emb.inv_freq")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"DFlash checkpoint {str(model_dir)!r} does not match: missing {missing[:8]}, "
                         f"unexpected {unexpected[:8]}")
    if dtype is None:
        dtype = next(iter(state.values())).dtype
    return model.to(device=device, dtype=dtype).eval()
