"""Rotary position embeddings (RoPE), computed for arbitrary absolute positions.

Paged attention never sees a contiguous ``arange``: a step packs new tokens of many sequences,
each starting at its own cached length. :class:`Rotary` therefore maps a flat position vector
to ``cos``/``sin`` tables, and the ``apply_*`` functions rotate ``[tokens, heads, dim]`` tensors.

Two layouts exist:

* *half* (Llama, Qwen2, Mistral): dimension ``i`` pairs with ``i + dim/2``.
* *interleaved* (DeepSeek-V3 with ``rope_interleave``): dimension ``2i`` pairs with ``2i + 1``;
  the rotated output is written de-interleaved (all even results, then all odd ones), which is
  what transformers produces and therefore what a cached rotated key looks like.

Supported ``rope_type``: default, linear, llama3, yarn.
"""

from __future__ import annotations

import math

import torch

from .model_config import ModelConfig, RopeConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 when ``scale <= 1``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(rope: RopeConfig, dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (``[dim / 2]`` fp32) and the cos/sin scale for one RoPE config."""
    if rope.rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_type {rope.rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    p = rope.params
    if rope.rope_type == "linear":
        return inv_freq / p["factor"], 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, p), 1.0
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope.theta, dim, p, max_position_embeddings)
    return inv_freq, 1.0


def _llama3_inv_freq(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(base: float, dim: int, p: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    original = p.get("original_max_position_embeddings") or max_pos
    factor = p.get("factor") or max_pos / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class Rotary(torch.nn.Module):
    """cos/sin tables for arbitrary positions.

    Args:
        config: the model config (``rope``, ``max_position_embeddings``).
        dim: rotary dimension (the head size for Llama; ``qk_rope_head_dim`` for MLA).
    """

    def __init__(self, config: ModelConfig, dim: int) -> None:
        super().__init__()
        # A plain attribute, not a buffer: ``model.to(bfloat16)`` must not round the frequencies.
        self.inv_freq, self.attention_scaling = rope_inv_freq(config.rope, dim, config.max_position_embeddings)

    @torch.no_grad()
    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(cos, sin)`` of shape ``[len(positions), dim]`` in ``dtype``."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[tokens, heads, dim]`` with half-split pairs; cos/sin are ``[tokens, dim]``."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + _rotate_half(x) * sin


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs ``(x[2i], x[2i+1])``; output is de-interleaved like transformers."""
    half = cos.shape[-1] // 2
    cos, sin = cos[:, None, :half], sin[:, None, :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
