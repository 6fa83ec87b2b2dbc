"""Write HF-format checkpoint directories from engine modules: random models for benchmarks,
smoke runs and tests (a DFlash drafter has no transformers class to build one with).

The weights are random but well-conditioned (norm gains near 1, unit-gain matrices), so the
logits are far from uniform and greedy decoding is stable.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

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


def dflash_config(target: ModelConfig, *, num_layers: int = 1, block_size: int = 8,
                  target_layer_ids: tuple[int, ...] | None = None, mask_token_id: int | None = None,
                  num_heads: int | None = None, num_kv_heads: int | None = None,
                  head_dim: int | None = None, intermediate_size: int | None = None) -> dict[str, Any]:
    """A DFlash ``config.json`` dict sized for ``target`` (hidden size and vocabulary shared)."""
    n = target.num_hidden_layers
    ids = target_layer_ids if target_layer_ids is not None else tuple(sorted({0, n // 2, n - 1}))
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": intermediate_size or target.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads or target.num_attention_heads,
        "num_key_value_heads": num_kv_heads or target.num_key_value_heads,
        "head_dim": head_dim or target.head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": target.max_position_embeddings,
        "block_size": block_size,
        "dflash_config": {"target_layer_ids": list(ids),
                          "mask_token_id": target.vocab_size - 1 if mask_token_id is None else mask_token_id},
    }


def random_dflash(directory: str | Path, config: dict[str, Any], seed: int = 0) -> Path:
    """A random DFlash drafter checkpoint for a :func:`dflash_config` dict."""
    layer_config, ids, mask, block = dflash_config_from_dict(config)
    model = DFlashDraftModel(layer_config, ids, mask, block)
    randomize(model, seed)
    return save_checkpoint(model, config, directory)
