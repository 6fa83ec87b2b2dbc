"""Build an engine model from a Hugging Face-format directory (``config.json`` + safetensors).

The model family comes from :data:`~hybridkv.engine.models.base.MODELS` by ``model_type``; the
package ``__init__`` has imported (registered) every family before any function here runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ..model_config import ModelConfig, read_config_json
from ..versions import check_checkpoint_version
from .base import MODELS, PagedCausalLM

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


def parse_model_config(raw: dict[str, Any]) -> ModelConfig:
    """The :class:`ModelConfig` of a parsed ``config.json``, read by its ``model_type``'s family.

    Raises:
        ValueError: an unknown ``model_type`` (the message lists the registered ones), or a
            config the family does not support.
    """
    return MODELS.get(raw.get("model_type")).parse_config(raw)


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read ``<model_dir>/config.json`` into a :class:`ModelConfig`; warns (once per version)
    when the transformers version that wrote it is outside the tested range
    (:mod:`hybridkv.engine.versions`).

    Raises:
        FileNotFoundError: ``model_dir`` is not a directory or has no ``config.json``.
    """
    raw = read_config_json(model_dir)
    check_checkpoint_version(raw, model_dir)
    return parse_model_config(raw)


def build_model(config: ModelConfig) -> PagedCausalLM:
    """An uninitialised model for ``config`` (weights are whatever torch initialises)."""
    return MODELS.get(config.model_type)(config)


def read_safetensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``model_dir`` (CPU)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {str(model_dir)!r}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_model(model_dir: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None) -> PagedCausalLM:
    """Load a checkpoint directory into the matching engine model, in eval mode.

    Args:
        model_dir: directory with ``config.json`` and ``*.safetensors`` (HF parameter names).
        device: where to put the weights.
        dtype: weight/compute dtype; default is the checkpoint's.

    Raises:
        ValueError: unsupported architecture, or checkpoint keys the model does not expect /
            parameters the checkpoint lacks (``lm_head.weight`` may be absent when tied).
    """
    config = load_model_config(model_dir)
    state = {k: v for k, v in read_safetensors(model_dir).items() if _keep(k, config)}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model = build_model(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if config.tie_word_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {str(model_dir)!r} does not match {type(model).__name__}: "
            f"missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    if dtype is None:
        dtype = next(iter(state.values())).dtype
    return model.to(device=device, dtype=dtype).eval()


def _keep(key: str, config: ModelConfig) -> bool:
    """Drop rotary buffers and layers past ``num_hidden_layers`` (e.g. DeepSeek MTP layers)."""
    if key.endswith("rotary_emb.inv_freq"):
        return False
    m = _LAYER_KEY.match(key)
    return m is None or int(m.group(1)) < config.num_hidden_layers
