"""Random-weight layers of a preset's shapes and one engine step over them (PyTorch).

The step is built the way the published H100 measurements were taken, so a profile is
comparable with them:

* GEMMs through ``torch.nn.functional.linear`` (cuBLAS): separate Q, K, V and O projections,
  one fused gate-up projection and the down projection of a SwiGLU MLP;
* RMSNorm and SiLU as separate PyTorch ops (``rms_norm``: computed in float32, scaled, cast
  back; one op);
* attention by ``scaled_dot_product_attention`` with native grouped-query attention
  (``enable_gqa``) and the queries at the last positions of the keys (lower-right causal)
  over the cached context plus the new tokens: a chunk with no context is the plain causal
  mask (``is_causal``), a single query sees every key (no mask), and a chunk after a context
  runs FlashAttention's lower-right causal kernel directly where it applies (the kernel the
  ``causal_lower_right`` mask dispatches to, without the per-call mask object), else the
  mask; the new tokens' K/V are written in place into a preallocated cache (no copy of the
  context) through views made once per step shape; no rotary embedding;
* the LM head on the last position of each prefill request and on every decode row.

All tokens of a step go through one GEMM pass; attention runs once per layer for the prefill
part (a batch of equal chunks) and once for the decode part (a batch of single tokens).

Other layer types, where PyTorch has no standard kernel, use stand-ins (each documented in
the method section of a profile):

* sliding window: a decode reads the last ``window`` positions (exact); a prefill chunk runs
  in blocks of ``window`` queries, each over the keys from ``window - 1`` before the block
  (up to ``window - 1`` more keys per query than the window needs);
* chunked-local attention: the chunk is split at attention-chunk boundaries (exact);
* MLA: prefill up-projects the cached latents to per-head K/V and runs SDPA (V padded to
  the QK width); decode runs absorbed attention over the latents with matmuls and a float32
  softmax;
* recurrent (gated delta net, Mamba2): chunked linear attention (64-token chunks, no gating)
  in batched matmuls over a float32 state; the convolution is left out;
* MoE: the activated path (top-k experts plus shared experts) as one dense SwiGLU MLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from hybridkv.core.rules import make_rule
from hybridkv.core.specs import MLA, STORAGE_KINDS, StateSpec
from hybridkv.cost.presets import ModelPreset

__all__ = ["Plan", "StepModel"]

STATE_CHUNK = 64


@dataclass(frozen=True, slots=True)
class Plan:
    """One step's shape: ``batch`` prefill chunks of ``new`` tokens after ``context``, and
    ``decode_batch`` decodes after ``decode_context``."""

    new: int = 0
    context: int = 0
    batch: int = 0
    decode_batch: int = 0
    decode_context: int = 0

    @property
    def prefill_tokens(self) -> int:
        return self.new * self.batch

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_batch


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm over the last dimension (float32 inside, the input's dtype out)."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


_FLASH_LOWER_RIGHT: dict[tuple, bool] = {}


def _flash_lower_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether FlashAttention's causal kernel (lower-right aligned) runs these shapes; decided
    once per device, dtype and head layout, and checked once against the masked call."""
    if q.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return False
    key = (q.device, q.dtype, q.shape[1], k.shape[1], q.shape[-1])
    ok = _FLASH_LOWER_RIGHT.get(key)
    if ok is None:
        try:
            from torch.backends.cuda import SDPAParams, can_use_flash_attention
            gqa = q.shape[1] != k.shape[1]
            ok = q.shape[-1] % 8 == 0 and bool(can_use_flash_attention(
                SDPAParams(q, k, v, None, 0.0, False, gqa)))
            if ok:
                want = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]), enable_gqa=gqa)
                got = _flash_causal(q, k, v)
                ok = bool(torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2))
        except (RuntimeError, TypeError, ImportError):
            ok = False
        _FLASH_LOWER_RIGHT[key] = ok
    return ok


def _flash_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, is_causal=True, return_debug_mask=False, scale=1.0 / math.sqrt(q.shape[-1]))[0]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of ``q`` (B, Hq, n, D) over ``k``/``v`` (B, Hkv, S, D), lower-right causal:
    query ``i`` sees the keys up to position ``S - n + i``."""
    n, s = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if n == s:                       # no context before the chunk: the plain causal mask
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if n == 1:                       # one query after every key sees them all
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    if _flash_lower_right(q, k, v):
        return _flash_causal(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, s), enable_gqa=gqa)


class _Layer:
    """Weights and caches of one decoder layer; subclasses implement ``attention``."""

    def __init__(self, model: StepModel) -> None:
        self.m = model
        h = model.hidden
        self.ln1 = model.ones(h)
        self.ln2 = model.ones(h)
        width = model.mlp_width
        self.w_gate_up = model.weight(2 * width, h)
        self.w_down = model.weight(h, width)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        g, u = F.linear(x, self.w_gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, self.w_down)

    def forward(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        x = x + self.attention(rms_norm(x, self.ln1), plan)
        return x + self.mlp(rms_norm(x, self.ln2))

    def allocate(self, plan: Plan) -> None:
        """Allocate this layer's (random) caches for ``plan``."""
        raise NotImplementedError

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The per-token projections attention reads (queries, keys, values or latents)."""
        raise NotImplementedError

    def core(self, proj: tuple[torch.Tensor, ...], plan: Plan) -> torch.Tensor:
        """Cache writes and attention (or the recurrence): the part a kernel point times."""
        raise NotImplementedError

    def attention(self, h: torch.Tensor, plan: Plan) -> torch.Tensor:
        return F.linear(self.core(self.project(h), plan), self.wo)


class _Attention(_Layer):
    """Full, sliding-window or chunked-local attention with GQA."""

    def __init__(self, model: StepModel, spec) -> None:
        super().__init__(model)
        self.heads = model.heads
        self.kv_heads = spec.num_kv_heads
        self.d = spec.head_dim
        h = model.hidden
        self.wq = model.weight(self.heads * self.d, h)
        self.wk = model.weight(self.kv_heads * self.d, h)
        self.wv = model.weight(self.kv_heads * self.d, h)
        self.wo = model.weight(h, self.heads * self.d)
        rule = make_rule(spec)
        self.window = rule.window
        self.chunk = rule.chunk
        self.cache: dict[str, torch.Tensor] = {}

    def allocate(self, plan: Plan) -> None:
        m = self.m
        self.cache = {}
        if plan.batch:
            c, n = plan.context, plan.new
            shape = (plan.batch, self.kv_heads, c + n, self.d)
            for name in ("kp", "vp"):
                self.cache[name] = m.randn(shape)
                self.cache[name + "_new"] = self.cache[name][:, :, c:c + n]      # where the chunk's K/V go
        if plan.decode_batch:
            c = plan.decode_context
            shape = (plan.decode_batch, self.kv_heads, c + 1, self.d)
            for name in ("kd", "vd"):
                self.cache[name] = m.randn(shape)
                self.cache[name + "_new"] = self.cache[name][:, :, c:c + 1]

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: int) -> torch.Tensor:
        n = q.shape[2]
        if self.window is None and self.chunk is None:
            return sdpa(q, k, v)                      # the cache holds exactly c + n positions
        out = []
        pos = c
        while pos < c + n:                    # query blocks: windows, or attention chunks
            if self.chunk is not None:
                lo = pos - pos % self.chunk
                end = min(c + n, lo + self.chunk)
            else:
                lo = max(0, pos - self.window + 1)
                end = min(c + n, pos + self.window)
            out.append(sdpa(q[:, :, pos - c:end - c], k[:, :, lo:end], v[:, :, lo:end]))
            pos = end
        return torch.cat(out, dim=2) if len(out) > 1 else out[0]

    def _decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: int) -> torch.Tensor:
        lo = 0
        if self.window is not None:
            lo = max(0, c + 1 - self.window)
        elif self.chunk is not None:
            lo = c - c % self.chunk
        if lo == 0:
            return sdpa(q, k, v)                      # the cache holds exactly c + 1 positions
        return sdpa(q, k[:, :, lo:c + 1], v[:, :, lo:c + 1])

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.linear(h, self.wq), F.linear(h, self.wk), F.linear(h, self.wv)

    def core(self, proj: tuple[torch.Tensor, ...], plan: Plan) -> torch.Tensor:
        q, k, v = proj
        cache = self.cache
        outs = []
        p = plan.prefill_tokens
        if plan.decode_batch and plan.batch:              # a mixed step: split the rows
            parts = [(t[:p], t[p:]) for t in (q, k, v)]
        else:
            parts = [(t, t) for t in (q, k, v)]
        if plan.batch:
            b, n = plan.batch, plan.new
            (qp, _), (kp, _), (vp, _) = parts
            cache["kp_new"].copy_(kp.view(b, n, self.kv_heads, self.d).transpose(1, 2))
            cache["vp_new"].copy_(vp.view(b, n, self.kv_heads, self.d).transpose(1, 2))
            o = self._prefill(qp.view(b, n, self.heads, self.d).transpose(1, 2), cache["kp"], cache["vp"],
                              plan.context)
            outs.append(o.transpose(1, 2).reshape(p, self.heads * self.d))
        if plan.decode_batch:
            b = plan.decode_batch
            (_, qd), (_, kd), (_, vd) = parts
            cache["kd_new"].copy_(kd.view(b, 1, self.kv_heads, self.d).transpose(1, 2))
            cache["vd_new"].copy_(vd.view(b, 1, self.kv_heads, self.d).transpose(1, 2))
            o = self._decode(qd.view(b, 1, self.heads, self.d).transpose(1, 2), cache["kd"], cache["vd"],
                             plan.decode_context)
            outs.append(o.transpose(1, 2).reshape(b, self.heads * self.d))
        return torch.cat(outs) if len(outs) > 1 else outs[0]


class _MLA(_Layer):
    """Multi-head latent attention: unabsorbed prefill, absorbed decode."""

    def __init__(self, model: StepModel, spec: MLA) -> None:
        super().__init__(model)
        s = model.preset.shapes.mla
        h = model.hidden
        self.heads = model.heads
        self.nope, self.rope, self.vd = s.qk_nope_head_dim, spec.qk_rope_head_dim, s.v_head_dim
        self.rank = spec.kv_lora_rank
        self.wq_a = model.weight(s.q_lora_rank, h)
        self.q_ln = model.ones(s.q_lora_rank)
        self.wq_b = model.weight(self.heads * (self.nope + self.rope), s.q_lora_rank)
        self.wkv_a = model.weight(self.rank + self.rope, h)
        self.kv_ln = model.ones(self.rank)
        self.wkv_b = model.weight(self.heads * (self.nope + self.vd), self.rank)
        self.wo = model.weight(h, self.heads * self.vd)
        w = self.wkv_b.view(self.heads, self.nope + self.vd, self.rank)
        self.w_uk = w[:, :self.nope]                        # (H, nope, rank)
        self.w_uv = w[:, self.nope:]                        # (H, v, rank)
        self.cache: dict[str, torch.Tensor] = {}

    def allocate(self, plan: Plan) -> None:
        lat = self.rank + self.rope
        self.cache = {}
        if plan.batch:
            self.cache["p"] = self.m.randn((plan.batch, plan.context + plan.new, lat))
        if plan.decode_batch:
            self.cache["d"] = self.m.randn((plan.decode_batch, plan.decode_context + 1, lat))

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q = F.linear(rms_norm(F.linear(h, self.wq_a), self.q_ln), self.wq_b)
        kv = F.linear(h, self.wkv_a)
        return q.view(-1, self.heads, self.nope + self.rope), torch.cat(
            [rms_norm(kv[:, :self.rank], self.kv_ln), kv[:, self.rank:]], dim=-1)

    def core(self, proj: tuple[torch.Tensor, ...], plan: Plan) -> torch.Tensor:
        H, qk = self.heads, self.nope + self.rope
        q, latent = proj
        outs = []
        p = plan.prefill_tokens
        if plan.batch:
            b, n, c = plan.batch, plan.new, plan.context
            cache = self.cache["p"]
            cache[:, c:c + n] = latent[:p].view(b, n, -1)
            ctx = cache[:, :c + n]
            up = F.linear(ctx[..., :self.rank], self.wkv_b).view(b, c + n, H, self.nope + self.vd)
            k = torch.cat([up[..., :self.nope], ctx[..., self.rank:].unsqueeze(2).expand(b, c + n, H, self.rope)],
                          dim=-1).transpose(1, 2)
            v = F.pad(up[..., self.nope:], (0, qk - self.vd)).transpose(1, 2)
            o = sdpa(q[:p].view(b, n, H, qk).transpose(1, 2), k, v)[..., :self.vd]
            outs.append(o.transpose(1, 2).reshape(p, H * self.vd))
        if plan.decode_batch:
            b, c = plan.decode_batch, plan.decode_context
            cache = self.cache["d"]
            cache[:, c:c + 1] = latent[p:].view(b, 1, -1)
            ctx = cache[:, :c + 1]                                           # (B, S, rank + rope)
            qd = q[p:]
            q_lat = torch.einsum("bhn,hnr->bhr", qd[..., :self.nope], self.w_uk)
            qf = torch.cat([q_lat, qd[..., self.nope:]], dim=-1)             # (B, H, rank + rope)
            scores = torch.matmul(qf, ctx.transpose(1, 2)).float() * (1.0 / math.sqrt(qk))
            probs = torch.softmax(scores, dim=-1).to(ctx.dtype)
            o_lat = torch.matmul(probs, ctx[..., :self.rank])                # (B, H, rank)
            outs.append(torch.einsum("bhr,hvr->bhv", o_lat, self.w_uv).reshape(b, H * self.vd))
        return torch.cat(outs) if len(outs) > 1 else outs[0]


class _State(_Layer):
    """Recurrent-layer stand-in: chunked linear attention over a float32 state."""

    def __init__(self, model: StepModel, spec: StateSpec) -> None:
        super().__init__(model)
        s = model.preset.shapes.state
        self.hs, self.dk, self.dv = spec.state_shape[0], spec.state_shape[1], spec.state_shape[2]
        if s is not None and s.kind == "mamba2":
            self.dk, self.dv = spec.state_shape[2], spec.state_shape[1]
        h = model.hidden
        self.w_in = model.weight(self.hs * (2 * self.dk + self.dv), h)
        self.wo = model.weight(h, self.hs * self.dv)
        self.cache: dict[str, torch.Tensor] = {}

    def allocate(self, plan: Plan) -> None:
        self.cache = {}
        if plan.batch:
            self.cache["p"] = self.m.randn((plan.batch, self.hs, self.dk, self.dv), torch.float32)
        if plan.decode_batch:
            self.cache["d"] = self.m.randn((plan.decode_batch, self.hs, self.dk, self.dv), torch.float32)

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hs, dk, dv = self.hs, self.dk, self.dv
        return tuple(F.linear(h, self.w_in).split([hs * dk, hs * dk, hs * dv], dim=-1))

    def core(self, proj: tuple[torch.Tensor, ...], plan: Plan) -> torch.Tensor:
        hs, dk, dv = self.hs, self.dk, self.dv
        q, k, v = proj
        outs = []
        h = q
        p = plan.prefill_tokens
        if plan.batch:
            b, n = plan.batch, plan.new
            nc = -(-n // STATE_CHUNK)
            pad = nc * STATE_CHUNK - n

            def chunks(t, d):
                t = t[:p].view(b, n, hs, d).transpose(1, 2)
                return F.pad(t, (0, 0, 0, pad)).view(b, hs, nc, STATE_CHUNK, d)

            Q, K, V = chunks(q, dk), chunks(k, dk), chunks(v, dv)
            mask = torch.ones(STATE_CHUNK, STATE_CHUNK, dtype=torch.bool, device=h.device).tril()
            intra = torch.matmul(torch.matmul(Q, K.transpose(-1, -2)).masked_fill(~mask, 0), V)
            U = torch.matmul(K.transpose(-1, -2).float(), V.float())              # (b, hs, nc, dk, dv)
            S0 = self.cache["p"]
            prefix = S0.unsqueeze(2) + torch.cumsum(U, dim=2) - U
            o = intra + torch.matmul(Q.float(), prefix).to(h.dtype)
            S0.add_(U.sum(dim=2))
            outs.append(o.view(b, hs, nc * STATE_CHUNK, dv)[:, :, :n].transpose(1, 2).reshape(p, hs * dv))
        if plan.decode_batch:
            b = plan.decode_batch
            S = self.cache["d"]
            qd, kd, vd = (t[p:].view(b, hs, -1).float() for t in (q, k, v))
            S.add_(torch.einsum("bhk,bhv->bhkv", kd, vd))      # the token's own update, then read
            o = torch.einsum("bhk,bhkv->bhv", qd, S)
            outs.append(o.to(h.dtype).reshape(b, hs * dv))
        return torch.cat(outs) if len(outs) > 1 else outs[0]


#: the timed layer of each storage kind (:data:`~hybridkv.core.specs.STORAGE_KINDS`): what a
#: cached position holds decides how the layer computes
_LAYERS: dict[str, type[_Layer]] = {"kv": _Attention, "latent": _MLA, "state": _State}
assert set(_LAYERS) == set(STORAGE_KINDS)


class StepModel:
    """A preset's decoder (target layers, in model order) with random weights on ``device``.

    Args:
        preset: the model (with :attr:`~hybridkv.cost.presets.ModelPreset.shapes`).
        device: a torch device.
        dtype: weight and activation dtype (recurrent states stay float32).
        seed: seeds the weights.

    Raises:
        ValueError: the preset has no layer shapes.
    """

    def __init__(self, preset: ModelPreset, device: torch.device | str, dtype: torch.dtype,
                 seed: int = 0) -> None:
        s = preset.shapes
        if s is None:
            raise ValueError(f"preset {preset.name!r} has no layer shapes to build")
        self.preset = preset
        self.device = torch.device(device)
        self.dtype = dtype
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.hidden = s.hidden_size
        self.heads = s.num_heads
        self.mlp_width = s.mlp_width
        layers: list[tuple[int, _Layer]] = []
        for g in preset.groups:
            if g.is_draft:
                continue
            for name in g.layer_names:
                spec = g.spec
                layer: _Layer = _LAYERS[spec.storage](self, spec)
                layers.append((int(name.rpartition(".")[2]), layer))
        self.layers = [layer for _, layer in sorted(layers, key=lambda t: t[0])]
        self.embed = self.weight(s.vocab_size, s.hidden_size)
        self.final_ln = self.ones(s.hidden_size)
        self.lm_head = self.embed if s.tie_word_embeddings else self.weight(s.vocab_size, s.hidden_size)
        self.num_params = self._count()

    # ---- tensors ---------------------------------------------------------------------------------
    def weight(self, rows: int, cols: int) -> torch.Tensor:
        w = torch.empty((rows, cols), device=self.device, dtype=self.dtype)
        return w.normal_(0.0, 1.0 / math.sqrt(cols), generator=self.gen)

    def ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, device=self.device, dtype=self.dtype)

    def randn(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.empty(shape, device=self.device, dtype=dtype or self.dtype)
        return t.normal_(0.0, 1.0, generator=self.gen)

    def _count(self) -> int:
        seen: set[int] = set()
        total = 0
        objs = [self, *self.layers]
        for obj in objs:
            for value in vars(obj).values():
                if isinstance(value, torch.Tensor) and value.dim() == 2 and value.data_ptr() not in seen \
                        and value.is_contiguous():
                    seen.add(value.data_ptr())
                    total += value.numel()
        return total

    # ---- one step --------------------------------------------------------------------------------
    def allocate(self, plan: Plan) -> None:
        """Allocate (random) caches for ``plan`` in every layer."""
        for layer in self.layers:
            layer.allocate(plan)

    def free(self) -> None:
        for layer in self.layers:
            layer.cache = {}

    def inputs(self, plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids of the step and the rows the LM head reads."""
        ids = torch.randint(0, self.embed.shape[0], (plan.tokens,), device=self.device, generator=self.gen)
        rows = [(i + 1) * plan.new - 1 for i in range(plan.batch)]
        rows += range(plan.prefill_tokens, plan.tokens)
        return ids, torch.tensor(rows, device=self.device, dtype=torch.long)

    def forward(self, ids: torch.Tensor, rows: torch.Tensor, plan: Plan) -> torch.Tensor:
        """One step: every layer over all tokens, then the LM head on ``rows``."""
        x = F.embedding(ids, self.embed)
        for layer in self.layers:
            x = layer.forward(x, plan)
        return F.linear(rms_norm(x.index_select(0, rows), self.final_ln), self.lm_head)

