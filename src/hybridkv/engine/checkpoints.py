"""Write HF-format checkpoint directories from engine modules: random models for benchmarks,
smoke runs and tests (a DFlash drafter has no transformers class to build one with).

The weights are random but well-conditioned (norm gains near 1, unit-gain matrices), so the
logits are far from uniform and greedy decoding is stable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from hybridkv.core.validation import check_int

from .model_config import ModelConfig
from .models.dflash import DFlashDraftModel, dflash_config_from_dict
from .models.loader import build_model, parse_model_config


def randomize(module: nn.Module, seed: int = 0, scale: float = 1.0) -> None:
    """Deterministic, well-conditioned random weights (in place)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            elif "embed" in name:
                p.copy_(noise)
            else:
                p.copy_(scale * noise / math.sqrt(p.shape[-2] if p.dim() == 3 else p.shape[1]))


def save_checkpoint(module: nn.Module, config: dict[str, Any], directory: str | Path,
                    skip: tuple[str, ...] = ()) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (tied / shared tensors stored once)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in module.state_dict().items():
        if any(name.startswith(s) for s in skip) or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        state[name] = t.detach().to("cpu").contiguous()
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def random_model(directory: str | Path, config: dict[str, Any], seed: int = 0) -> Path:
    """A random checkpoint for an HF ``config.json`` dict (any supported ``model_type``)."""
    model = build_model(parse_model_config(config))
    randomize(model, seed)
    if model.config.tie_word_embeddings:
        return save_checkpoint(model, config, directory, skip=("lm_head.",))
    return save_checkpoint(model, config, directory)


@dataclass(frozen=True, slots=True)
class DFlashShape:
    """The shape of a DFlash drafter built for a target by :func:`dflash_config`; the sizes
    left None are the target's.

    Args:
        num_layers: drafter layers (>= 1).
        block_size: tokens drafted per block (>= 2: the last known token plus drafts).
        target_layer_ids: target layers whose features the drafter reads (default: the first,
            middle and last).
        mask_token_id: the mask token (default: the target's last vocabulary id).
        num_heads, num_kv_heads, head_dim, intermediate_size: attention and MLP sizes (>= 1).
    """

    num_layers: int = 1
    block_size: int = 8
    target_layer_ids: tuple[int, ...] | None = None
    mask_token_id: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None

    def __post_init__(self) -> None:
        check_int("DFlashShape.num_layers", self.num_layers, 1)
        check_int("DFlashShape.block_size", self.block_size, 2)
        check_int("DFlashShape.mask_token_id", self.mask_token_id, 0, optional=True)
        for name in ("num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            check_int(f"DFlashShape.{name}", getattr(self, name), 1, optional=True)
        if self.target_layer_ids is not None:
            ids = tuple(self.target_layer_ids)
            if not ids:
                raise ValueError("DFlashShape.target_layer_ids must name at least one layer, got ()")
            for i in ids:
                check_int("DFlashShape.target_layer_ids", i, 0)
            object.__setattr__(self, "target_layer_ids", ids)


def dflash_config(target: ModelConfig, shape: DFlashShape | None = None) -> dict[str, Any]:
    """A DFlash ``config.json`` dict sized for ``target`` (hidden size and vocabulary shared)."""
    shape = shape if shape is not None else DFlashShape()
    n = target.num_hidden_layers
    ids = shape.target_layer_ids if shape.target_layer_ids is not None else tuple(sorted({0, n // 2, n - 1}))
    mask = target.vocab_size - 1 if shape.mask_token_id is None else shape.mask_token_id
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": shape.intermediate_size or target.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads or target.num_attention_heads,
        "num_key_value_heads": shape.num_kv_heads or target.num_key_value_heads,
        "head_dim": shape.head_dim or target.head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": target.max_position_embeddings,
        "block_size": shape.block_size,
        "dflash_config": {"target_layer_ids": list(ids), "mask_token_id": mask},
    }


def random_dflash(directory: str | Path, config: dict[str, Any], seed: int = 0) -> Path:
    """A random DFlash drafter checkpoint for a :func:`dflash_config` dict."""
    layer_config, ids, mask, block = dflash_config_from_dict(config)
    model = DFlashDraftModel(layer_config, ids, mask, block)
    randomize(model, seed)
    return save_checkpoint(model, config, directory)
