"""Paged attention in plain torch: write new K/V into pages, read them back through block tables.

Both functions take packed ``[T, ...]`` tensors for one layer and a
:class:`~hybridkv.engine.metadata.GroupMetadata` built for that layer's group. Attention is
computed per sequence, like transformers' eager path: scores in the compute dtype, a softmax
in fp32, masked keys at ``-inf`` (every query can see at least itself, so no row is empty).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .metadata import GroupMetadata

KVExpander = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def write_kv(cache: torch.Tensor, meta: GroupMetadata, *values: torch.Tensor) -> None:
    """Store the new tokens' entries into their slots.

    Args:
        cache: a GQA layer cache ``[2, blocks, bs, heads, dim]`` (pass ``k, v``) or an MLA
            latent cache ``[blocks, bs, latent]`` (pass the latent).
        meta: the layer's group metadata (write slots, never block 0).
    """
    b, o = meta.write_blocks, meta.write_offsets
    if cache.dim() == 5:
        k, v = values
        cache[0, b, o] = k.to(cache.dtype)
        cache[1, b, o] = v.to(cache.dtype)
    else:
        (latent,) = values
        cache[b, o] = latent.to(cache.dtype)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
            sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q ``[n, H, Dk]``, k ``[L, H, Dk]``, v ``[L, H, Dv]``, mask ``[n, L]`` -> ``[n, H, Dv]``.

    ``sinks`` ``[H]`` (gpt-oss): one extra logit per head joins the softmax and is then dropped,
    so a head can put probability mass on "no token".
    """
    scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
    scores = scores.masked_fill(~mask[None], float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        h, n, _ = scores.shape
        sink = sinks.to(scores.dtype)[:, None, None].expand(h, n, 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1, dtype=torch.float32)
        probs = probs[..., :-1].to(q.dtype)
    return torch.einsum("hnl,lhd->nhd", probs, v)


def paged_attention(q: torch.Tensor, cache: torch.Tensor, meta: GroupMetadata, scale: float,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """GQA attention of packed queries over K/V gathered from a paged cache.

    Args:
        q: ``[T, num_heads, head_dim]`` rotated queries.
        cache: ``[2, blocks, bs, num_kv_heads, head_dim]``, already holding this step's K/V.
        meta: the layer's group metadata.
        scale: softmax scale (``head_dim ** -0.5`` unless the model says otherwise).
        sinks: optional ``[num_heads]`` attention-sink logits.

    Returns:
        ``[T, num_heads, head_dim]``.
    """
    out = torch.empty_like(q)
    rep = q.shape[1] // cache.shape[3]
    for s in meta.sequences:
        k = cache[0, s.key_blocks, s.key_offsets].to(q.dtype)
        v = cache[1, s.key_blocks, s.key_offsets].to(q.dtype)
        if rep > 1:  # query head h reads KV head h // rep
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out[s.rows] = _attend(q[s.rows], k, v, s.mask, scale, sinks)
    return out


def paged_mla_attention(
    q: torch.Tensor, cache: torch.Tensor, meta: GroupMetadata, scale: float, expand: KVExpander
) -> torch.Tensor:
    """MLA attention: gather cached latents, expand them to per-head K/V, attend.

    Args:
        q: ``[T, num_heads, qk_nope + qk_rope]`` queries (rope part already rotated).
        cache: ``[blocks, bs, kv_lora_rank + qk_rope]`` latents, holding this step's entries.
        meta: the layer's group metadata.
        scale: softmax scale.
        expand: maps gathered latents ``[L, latent]`` to ``(k [L, H, Dk], v [L, H, Dv])``.

    Returns:
        ``[T, num_heads, v_head_dim]``.
    """
    outs: list[torch.Tensor] = []
    for s in meta.sequences:
        k, v = expand(cache[s.key_blocks, s.key_offsets].to(q.dtype))
        outs.append(_attend(q[s.rows], k, v, s.mask, scale))
    return torch.cat(outs, dim=0)
