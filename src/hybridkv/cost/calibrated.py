r"""Calibrated step-time model: what one engine step costs on a measured GPU.

The roofline (:mod:`hybridkv.cost.costmodel`) charges every FLOP at one efficiency and every
byte at another and takes the larger. Measured steps do not behave that way: GEMMs reach a
different fraction of peak than attention, attention over a cached context runs slower than
a fresh causal prompt, a decode batch of one cannot fill the GPU, every step pays a fixed
overhead, and a step launched eagerly takes at least the host's time to issue it. This model charges each of those separately,
with efficiencies fitted to measured steps (:mod:`hybridkv.cost.calibration_fit`).

A step's work is ``[(new_tokens, context_before), ...]`` as for the roofline. With ``T`` the
step's new tokens, ``R`` its requests (each samples one row of logits), ``G`` GPUs, peak FLOP/s
``F`` and bandwidth ``B`` from the GPU preset (``F_gemm``: its peak in the model's
:attr:`~hybridkv.cost.presets.ModelPreset.gemm_dtype`, FP8's for an FP8 model, else ``F``)::

    a      = (2 * P_tok * tile(T) + 2 * P_head * tile(R)) / (G * F_gemm * gemm_efficiency)   # GEMM compute
    b      = weight_bytes(T) / (G * B * weight_bw_efficiency)                   # weight reads
    gemm   = (a**p + b**p) ** (1/p),   p = gemm_blend                           # smooth roofline
    attn   = sum over KV groups g and attention calls k of
             L_g * s_kind(g) * (max(flops_k / (G * F * e_k), bytes_k / (G * B * attn_bw_efficiency))
                                    / min(1, units_k * splits_k / (G * attn_saturation_blocks))
                                + blocks_k / G * attn_block_s)
    gpu    = gemm + attn + graph_overhead_s
    time   = gpu                                       for a step whose requests are all decodes
           = (gpu**q + eager_host_s**q) ** (1/q),  q = host_overlap       for any other step

``P_tok`` are the parameters every token multiplies (active parameters less the LM head and an
untied embedding), ``P_head`` the LM head's. The GEMM term is an efficiency that depends on
the token count: weight-read bound for few tokens, ``gemm_efficiency`` of peak for many, with
``gemm_blend`` saying how sharp the turn is (infinite: the plain roofline ``max``). GEMM
kernels compute whole tiles of :data:`GEMM_ROW_TILE` rows, so the compute term counts the
tokens (and the LM head's rows) rounded up to a multiple of it, ``tile(x)``: a step of 544
tokens computes as many rows as one of 576.

Attention is composed the way an engine runs a step: all tokens of a step go through one GEMM
pass, and attention runs per request for a prefill chunk (one call of ``n`` queries over
``c + n`` keys) and as one batched call for all decodes (requests with at most :data:`DECODE_MAX_NEW`
new tokens, speculative verification included). A call's FLOPs are its (query, key) pairs
(:meth:`HitRule.attention_keys`: windows and chunks included) times ``4 * attn_width`` (MLA:
divided by its compression ratio), its bytes the KV it reads and writes
(:meth:`HitRule.kv_span`); ``e_k`` is ``attn_causal_efficiency`` for a chunk with no cached
context (the plain causal kernel) and ``attn_context_efficiency`` otherwise, but never more
than the causal one for a prefill chunk (a context never makes a chunk cheaper). A call's
*units* are its kernel's blocks of work: per request, query heads times 64-query blocks for a
prefill chunk (``max(1, n / 64)`` of them for the occupancy; whole blocks for
``attn_block_s``; a recurrent layer's chunk, which carries its
state from block to block, one unit per head), and for a one-token decode the KV heads times
the 64-row blocks its packed query heads fill (one per KV head for grouped-query attention);
fewer than ``attn_saturation_blocks`` leave streaming multiprocessors idle and the call slows
in proportion; a decode batch with unequal contexts counts ``bytes / max(bytes per unit)``
units (its busiest unit bounds it, so a request added to a step never makes it faster). A
decode, a new or a cached token added to a call that leaves the GPU idle can make it slightly
faster (at most :data:`MONOTONE_SLACK`: its units, and so its occupancy, can grow faster than its
work). With
``split_kv`` (what serving engines run: FlashAttention's split-KV kernels, FlashInfer,
TensorRT-LLM's multi-block mode) a call also splits each request's keys over
``splits_k = min(MAX_KV_SPLITS, max(1, S / KV_SPLIT_KEYS))`` units, ``S`` the keys of its
request (a decode batch: of its longest request), so a decode batch of one over a long context still fills the
GPU; without it (a kernel that runs one unit per request and KV head) it does not. Every work
block also costs ``attn_block_s`` beyond its FLOPs and bytes (loading its queries, the
softmax's last pass, writing its output): ``blocks_k`` counts them all (a decode batch of ``B``
requests has ``B`` times a request's units). A recurrent (state) layer's call reads and writes
its state once per request and does ``4 * state size`` FLOPs per token. ``s_kind`` is a
per-attention-kind time multiplier (1 unless a profile measured that kind's kernels, see
:class:`Calibration`).

A step whose requests are all decodes is replayed as a CUDA graph (as engines run decode
steps): its time is the GPU's, ``graph_overhead_s`` included (the gaps between its many small
kernels, paid by every step). Any other step is launched eagerly, kernel by kernel from the host: the GPU runs
while the host issues the next kernels, so the step takes the larger of the GPU time and the
host's issue time ``eager_host_s``, joined smoothly (``host_overlap``: 1 = the two add up,
large = the plain ``max``; a step with little GPU work is host-bound). An empty step costs 0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from operator import truediv
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

from hybridkv.core.specs import AttentionSpec, StateSpec
from hybridkv.core.validation import check_int
from hybridkv.cost.calibrated_formula import (DECODE_MAX_NEW, GEMM_ROW_TILE, KV_SPLIT_KEYS, MAX_KV_SPLITS,
                                              MONOTONE_SLACK, QUERY_BLOCK, STATE_KIND, GroupTerms,
                                              StepFeatures, blend, decode_units, evaluate_features,
                                              group_rule, host_bound, kv_splits, row_tile)
from hybridkv.cost.calibration import ATTENTION_KINDS, Calibration, attention_kind
from hybridkv.cost.costmodel import StepCost
from hybridkv.cost.presets import GpuPreset, ModelPreset

__all__ = ["ATTENTION_KINDS", "DECODE_MAX_NEW", "FEW_CHUNKS", "GEMM_ROW_TILE", "KV_SPLIT_KEYS",
           "MAX_KV_SPLITS", "MONOTONE_SLACK", "QUERY_BLOCK", "Calibration", "CalibratedCostModel",
           "StepFeatures", "attention_kind", "blend", "evaluate_features", "host_bound", "kv_splits",
           "row_tile"]

FEW_CHUNKS = 8
"""Most prefill chunks a step evaluated with Python numbers has (more: with arrays)."""


@cython.cfunc
@cython.locals(i=cython.Py_ssize_t, x=cython.Py_ssize_t, lo=cython.Py_ssize_t, hi=cython.Py_ssize_t,
               total=cython.Py_ssize_t)
def _int_range(values: list[Any]) -> tuple[int, int, int] | None:
    """``(min, max, sum)`` of a non-empty list of ints in one pass; None when one of its items
    is not an ``int``."""
    for v in values:
        if type(v) is not int:
            return None
    lo = hi = values[0]
    total = 0
    for i in range(len(values)):
        x = values[i]
        total += x
        if x < lo:
            lo = x
        elif x > hi:
            hi = x
    return lo, hi, total


@cython.cfunc
@cython.cpow(True)
@cython.locals(t=cython.double, f_c=cython.double, f_p=cython.double, bw_a=cython.double,
               sat=cython.double, blk=cython.double, split=cython.bint, s=cython.double,
               big=cython.double, is_state=cython.bint, pair_flops=cython.double,
               kv_bytes=cython.double, state_bytes=cython.double, n=cython.double, c=cython.double,
               w=cython.double, by=cython.double, sp=cython.double, nf=cython.double,
               keys=cython.double)
def _chunks_time(t: float, chunks: list[tuple[float, float]], group: tuple[Any, ...], f_c: float,
                 f_p: float, bw_a: float, sat: float, blk: float, split: bool) -> float:
    """``t`` plus the attention time of one group (a :meth:`CalibratedCostModel._consts` group
    entry) over prefill ``chunks`` (``(new, context)`` pairs), one call per chunk, added in
    order: the array formula's terms, one chunk at a time."""
    s, _, big, is_state, rule, pair_flops, kv_bytes, state_bytes = group
    for n, c in chunks:
        nf = n / QUERY_BLOCK if n > QUERY_BLOCK else 1.0
        if is_state:                # the state runs chunk to chunk: one unit per head
            w, by, sp, nf = n * pair_flops / (f_c if c == 0 else f_p), state_bytes, 1.0, 1.0
        else:
            w = rule.attention_keys(n, c) * pair_flops / (f_c if c == 0 else f_p)
            keys = rule.kv_span(n, c) + n
            by = kv_bytes * keys
            sp = min(float(MAX_KV_SPLITS), max(1.0, keys / KV_SPLIT_KEYS)) if split else 1.0   # kv_splits()
        w = w if w > by / bw_a else by / bw_a
        t += s * (w / min(1.0, big * nf * sp / sat) + big * math.ceil(n / QUERY_BLOCK) * blk)
    return t


class CalibratedCostModel:
    """Calibrated step time for one model on ``num_gpus`` GPUs (formula: module docstring).

    Args:
        model: the model preset (its ``shapes``, when present, give the LM head and heads).
        gpu: the GPU preset (peak FLOP/s and bandwidth the efficiencies refer to).
        calibration: the fitted constants.
        num_gpus: GPUs sharing the work (ideal split; the communication is added by
            :class:`hybridkv.cost.comm.DeployedCostModel`).
        source: where ``calibration`` comes from (shown by ``hybridkv cost`` and in results).
    """

    kind = "calibrated"

    def __init__(self, model: ModelPreset, gpu: GpuPreset, calibration: Calibration,
                 num_gpus: int = 1, source: str = "") -> None:
        check_int("CalibratedCostModel.num_gpus", num_gpus, 1)
        self.model = model
        self.gpu = gpu
        self.calibration = calibration
        self.num_gpus = num_gpus
        self.source = source
        s = model.shapes
        head = s.head_params if s is not None else 0
        untied = s.untied_embedding_params if s is not None else 0
        self._tok_flops = 2.0 * max(model.active_params - head - untied, 1)
        self._head_flops = 2.0 * head
        self._weights = (model.num_params - untied) * model.weight_bytes_per_param
        self._gemm_peak = gpu.gemm_flops(model.gemm_dtype)   # FP8 GEMMs: the FP8 peak
        self._active_frac = (model.active_params - untied) / max(model.num_params - untied, 1)
        heads = s.num_heads if s is not None else None
        groups = []
        for g in model.groups:
            spec = g.spec
            kind = attention_kind(spec)
            if kind == "state":                   # attention kind "state": a StateSpec
                shape = cast(StateSpec, spec).state_shape
                size = math.prod(shape)
                groups.append(GroupTerms(group_rule(spec), len(g.layer_names), ATTENTION_KINDS.index(kind),
                                     4.0 * size, 0.0, 2.0 * spec.page_size_bytes,
                                     float(shape[0]), float(shape[0]), 1.0))
                continue
            q_heads = heads or max(1, model.attn_width // spec.head_dim)
            kv_heads = 1 if kind == "mla" else spec.num_kv_heads
            groups.append(GroupTerms(group_rule(spec), len(g.layer_names), ATTENTION_KINDS.index(kind),
                                 4.0 * model.attn_width / spec.compress_ratio,
                                 float(spec.bytes_per_token), 0.0, float(q_heads), float(kv_heads),
                                 q_heads / kv_heads))
        # Groups with one spec (a draft group beside its target, recurrent layers split into
        # several groups) cost the same per layer: one entry with their layers summed.
        merged: dict[tuple[AttentionSpec, int], GroupTerms] = {}
        for g, grp in zip(model.groups, groups):
            key = (g.spec, grp.kind)
            prev = merged.get(key)
            merged[key] = grp if prev is None else dataclasses.replace(prev, layers=prev.layers + grp.layers)
        self._groups = tuple(merged.values())
        self._consts_for: tuple[Any, ...] | None = None    # (calibration, GPU, GPUs, _consts())

    def __repr__(self) -> str:
        return (f"CalibratedCostModel({self.model.name!r}, {self.gpu.name!r}, num_gpus={self.num_gpus}, "
                f"source={self.source!r})")

    def weight_bytes(self, num_tokens: int | float) -> float:
        """Weight bytes a step of ``num_tokens`` tokens reads (untied embedding excluded: a
        gather; MoE: expected experts touched, as in the roofline)."""
        if num_tokens <= 0:
            return 0.0
        return self._weights * (1.0 - (1.0 - self._active_frac) ** num_tokens)

    # ---- features -------------------------------------------------------------------------------
    def features_arrays(self, new: NDArray[np.float64], ctx: NDArray[np.float64]) -> StepFeatures:
        """:class:`StepFeatures` of the step ``zip(new, ctx)`` (float arrays, entries with no new
        token ignored)."""
        new = np.asarray(new, dtype=np.float64)
        ctx = np.asarray(ctx, dtype=np.float64)
        keep = new > 0
        if not keep.all():
            new, ctx = new[keep], ctx[keep]
        G = float(self.num_gpus)
        total = float(new.sum())
        rows = float(new.size)
        dec = new <= DECODE_MAX_NEW
        pre = ~dec
        n_pre = int(pre.sum())
        any_dec = n_pre < new.size
        flops, nbytes, units, splits, nblocks, layers, causal, decode, kinds = [], [], [], [], [], [], [], [], []
        blocks = np.ceil(new[pre] / QUERY_BLOCK)                   # empty when no prefill
        fill = np.maximum(1.0, new[pre] / QUERY_BLOCK)             # occupancy: no partial-block jumps
        for g in self._groups:
            if g.kind == STATE_KIND:
                f = new * g.pair_flops
                b = np.full(new.shape, g.state_bytes)
                span = None
            else:
                f = g.rule.attention_keys(new, ctx) * g.pair_flops
                span = g.rule.kv_span(new, ctx) + new
                b = g.kv_bytes * span
            if n_pre:
                flops.append(f[pre] / G)
                nbytes.append(b[pre] / G)
                # a recurrent layer carries its state chunk to chunk: one unit per head and request
                units.append(g.prefill_heads * (np.ones(n_pre) if g.kind == STATE_KIND else fill) / G)
                splits.append(np.ones(n_pre) if span is None else kv_splits(span[pre]))
                nblocks.append(g.prefill_heads * blocks / G)
                layers.append(np.full(n_pre, g.layers, dtype=np.float64))
                causal.append(ctx[pre] == 0)
                decode.append(np.zeros(n_pre, dtype=bool))
                kinds.append(np.full(n_pre, g.kind))
            if any_dec:
                d_units = decode_units(g, new[dec])
                d_bytes = b[dec]
                flops.append(np.array([f[dec].sum() / G]))
                nbytes.append(np.array([d_bytes.sum() / G]))
                # The batch's busiest unit bounds it: effective units = bytes / max bytes per unit.
                units.append(np.array([d_bytes.sum() / float((d_bytes / d_units).max()) / G]))
                splits.append(np.array([1.0 if span is None else float(kv_splits(span[dec].max()))]))
                nblocks.append(np.array([float(d_units.sum()) / G]))
                layers.append(np.array([float(g.layers)]))
                causal.append(np.array([False]))
                decode.append(np.array([True]))
                kinds.append(np.array([g.kind]))
        cat = np.concatenate if flops else (lambda _: np.zeros(0))
        return StepFeatures(
            tokens=int(total),
            gemm_flops=(self._tok_flops * total + self._head_flops * rows) / G,
            gemm_tile_flops=(self._tok_flops * row_tile(total) + self._head_flops * row_tile(rows)) / G,
            weight_bytes=self.weight_bytes(total) / G,
            eager=n_pre > 0,
            call_flops=cat(flops), call_bytes=cat(nbytes), call_units=cat(units),
            call_splits=cat(splits), call_blocks=cat(nblocks),
            call_layers=cat(layers), call_causal=cat(causal).astype(bool), call_decode=cat(decode).astype(bool),
            call_kind=cat(kinds).astype(np.int64))

    def features(self, work: Iterable[tuple[int, int]]) -> StepFeatures:
        """:class:`StepFeatures` of ``work = [(new_tokens, context_before), ...]``.

        Raises:
            ValueError: for a negative count.
        """
        pairs = list(work)
        for new, ctx in pairs:
            if new < 0 or ctx < 0:
                raise ValueError(f"step work needs new_tokens >= 0 and context >= 0, got ({new}, {ctx})")
        if not pairs:
            return self.features_arrays(np.zeros(0), np.zeros(0))
        news, ctxs = zip(*pairs)
        return self.features_arrays(np.array(news, dtype=np.float64), np.array(ctxs, dtype=np.float64))

    # ---- time -----------------------------------------------------------------------------------
    def step(self, work: Iterable[tuple[int, int]]) -> StepCost:
        """Cost of one step scheduling ``work`` (with the compute / memory / attention split)."""
        return evaluate_features(self.features(work), self.calibration, self.gpu, self._gemm_peak)

    def step_time(self, work: Iterable[tuple[int, int]]) -> float:
        """Seconds one step scheduling ``work`` takes."""
        return self.step(work).time_s

    def step_time_arrays(self, new: NDArray[Any] | list[int], ctx: NDArray[Any] | list[int]) -> float:
        """:meth:`step_time` for ``work = zip(new, ctx)`` (the simulator's hot path).

        The same formula as :meth:`step` evaluated without building :class:`StepFeatures`
        (the two agree to rounding, tested). Lists of ints (the simulator's steps) with at
        most :data:`FEW_CHUNKS` prefill chunks, a step's usual shape, are evaluated with
        Python numbers (:meth:`_few_time`), anything else with arrays (:meth:`_array_time`):
        the same time, bit for bit (tested).
        """
        if new.__class__ is list:
            return self._few_time(new, ctx)  # type: ignore[arg-type]  # ctx is a list when new is
        return self._array_time(new, ctx)

    def _array_time(self, new: NDArray[Any] | list[int], ctx: NDArray[Any] | list[int]) -> float:
        """:meth:`step_time_arrays` evaluated over arrays (any number of requests)."""
        new = np.asarray(new, dtype=np.float64)
        ctx = np.asarray(ctx, dtype=np.float64)
        if new.size == 0:
            return 0.0
        if new.min() <= 0:
            keep = new > 0
            new, ctx = new[keep], ctx[keep]
            if new.size == 0:
                return 0.0
        cal = self.calibration
        den_a, den_b, p, inv_p, bw_a, sat, blk, f_x, f_c, split, overhead, _ = self._consts()
        total = float(new.sum())
        tile = GEMM_ROW_TILE                                 # row_tile(), inlined
        a = (self._tok_flops * (-(-total // tile) * tile) + self._head_flops * (-(-new.size // tile) * tile)) \
            / den_a
        b = self.weight_bytes(total) / den_b
        m = a if a > b else b
        t: float = m * ((a / m) ** p + (b / m) ** p) ** inv_p   # float ** float: typed Any
        dec = new <= DECODE_MAX_NEW
        n_dec = int(dec.sum())
        all_dec = n_dec == new.size
        if not all_dec and n_dec:
            pre_new, pre_ctx = new[~dec], ctx[~dec]
            dec_new, dec_ctx = new[dec], ctx[dec]
        elif all_dec:
            dec_new, dec_ctx = new, ctx
        else:
            pre_new, pre_ctx = new, ctx
        if n_dec:
            dec_total = float(dec_new.sum())
            first = float(dec_new[0])
            uniform = first == dec_new.max() == dec_new.min()
        max_splits = float(MAX_KV_SPLITS)
        scale = cal.kind_scale
        f_p = f_x if f_x < f_c else f_c                   # a prefill chunk after a context
        few = not all_dec and pre_new.size <= FEW_CHUNKS   # a few chunks: one by one (_chunks_time)
        if few:
            chunks = list(zip(pre_new.tolist(), pre_ctx.tolist()))
        elif not all_dec:
            blocks = np.ceil(pre_new / QUERY_BLOCK)
            fill = np.maximum(1.0, pre_new / QUERY_BLOCK)
        for g, consts in zip(self._groups, self._consts()[-1]):
            s = g.layers * scale[g.kind]
            if few:
                t = _chunks_time(t, chunks, consts, f_c, f_p, bw_a, sat, blk, split)
            elif not all_dec:
                splits: NDArray[np.float64] | float
                if g.kind == STATE_KIND:
                    w = pre_new * g.pair_flops / np.where(pre_ctx == 0, f_c, f_p)
                    by = g.state_bytes
                    splits = 1.0 / fill                   # one unit per head: the state runs chunk to chunk
                else:
                    f = g.rule.attention_keys(pre_new, pre_ctx) * g.pair_flops
                    w = f / np.where(pre_ctx == 0, f_c, f_p)
                    keys = g.rule.kv_span(pre_new, pre_ctx) + pre_new
                    by = g.kv_bytes * keys
                    # kv_splits(keys), inlined
                    splits = (np.minimum(np.maximum(keys * (1.0 / KV_SPLIT_KEYS), 1.0), max_splits) if split
                              else 1.0)
                occ = np.minimum(1.0, g.prefill_heads * fill * splits / sat)
                t += s * float((np.maximum(w, by / bw_a) / occ).sum() + g.prefill_heads * blocks.sum() * blk)
            if n_dec:
                if g.kind == STATE_KIND:
                    f = dec_total * g.pair_flops
                    by = g.state_bytes * n_dec
                    units = nblk = (g.decode_one * n_dec if uniform and first == 1.0
                                    else float(decode_units(g, dec_new).sum()))
                else:
                    f = float(g.rule.attention_keys(dec_new, dec_ctx).sum()) * g.pair_flops
                    span = g.rule.kv_span(dec_new, dec_ctx) + dec_new
                    by = g.kv_bytes * float(span.sum())
                    top = float(span.max())
                    if uniform:        # equal units per request: bytes / max bytes per unit
                        one = g.decode_one if first == 1.0 else float(decode_units(g, dec_new[:1])[0])
                        units = one * by / (g.kv_bytes * top)
                        nblk = one * n_dec
                    else:
                        per = decode_units(g, dec_new)
                        units = by / (g.kv_bytes * float((span / per).max()))
                        nblk = float(per.sum())
                    if split:          # kv_splits(top), inlined
                        units *= min(max_splits, max(1.0, top / KV_SPLIT_KEYS))
                occ_d = min(1.0, units / sat)
                w = max(f / f_x, by / bw_a)
                t += s * (w / occ_d + nblk * blk)
        t += overhead
        if all_dec:
            return t
        h, q = cal.eager_host_s, cal.host_overlap          # host_bound(t, h, q), inlined (t > 0)
        m = t if t > h else h
        eager: float = m * ((t / m) ** q + (h / m) ** q) ** (1.0 / q)   # float ** float: typed Any
        return eager

    @cython.cpow(True)
    @cython.locals(n_dec=cython.Py_ssize_t, total=cython.double, dec_total=cython.double,
                   a=cython.double, b=cython.double, m=cython.double,
                   first=cython.double, uniform=cython.bint, ones=cython.bint, is_state=cython.bint,
                   s=cython.double, one=cython.double, big=cython.double, pair_flops=cython.double,
                   kv_bytes=cython.double, state_bytes=cython.double, f=cython.double,
                   by=cython.double, top=cython.double, u=cython.double, units=cython.double,
                   nblk=cython.double, occ=cython.double, w=cython.double, h=cython.double,
                   q=cython.double, den_a=cython.double, den_b=cython.double, p=cython.double,
                   inv_p=cython.double, bw_a=cython.double, sat=cython.double, blk=cython.double,
                   f_x=cython.double, f_c=cython.double, f_p=cython.double, overhead=cython.double,
                   n=cython.double, tile=cython.double, rows=cython.double)
    def _few_time(self, new: list[int], ctx: list[int]) -> float:
        """:meth:`step_time_arrays` of a step of at most :data:`FEW_CHUNKS` prefill chunks (any
        number of decodes) with Python numbers, its constants computed once per (calibration,
        GPU, GPU count) by :meth:`_consts`; a step with more chunks goes to
        :meth:`_array_time`. The chunks add their terms one by one, in order; the decode
        call's sums over requests add integers (tokens, pairs, KV positions, work units, each
        below 2**53), exact in any order, and a maximum never rounds, so they equal the
        arrays' and every other operation is the same float operation: the time is the array
        formula's, bit for bit (tested)."""
        if not new:
            return 0.0
        chunks: list[tuple[float, float]] = []
        scan = _int_range(new)
        if scan is None or _int_range(ctx) is None:   # not all ints: the arrays (the rules'
            return self._array_time(new, ctx)           # sums over lists take ints)
        if scan[0] >= 1 and scan[1] <= DECODE_MAX_NEW:
            dec_new, dec_ctx = new, ctx                  # a decode step: no list built
        else:
            scan = None
            dec_new, dec_ctx = [], []
            for x, y in zip(new, ctx):
                if x > DECODE_MAX_NEW:
                    chunks.append((float(x), float(y)))      # the array path's numbers
                elif x > 0:
                    dec_new.append(x)
                    dec_ctx.append(y)
            if len(chunks) > FEW_CHUNKS:
                return self._array_time(new, ctx)
            if not chunks and not dec_new:
                return 0.0
        den_a, den_b, p, inv_p, bw_a, sat, blk, f_x, f_c, split, overhead, groups = self._consts()
        n_dec = len(dec_new)
        if scan is None and n_dec:
            scan = (min(dec_new), max(dec_new), sum(dec_new))
        lo, hi, dec_sum = scan if scan is not None else (0, 0, 0)
        dec_total = float(dec_sum)
        total = dec_total
        for n, c in chunks:
            total += n
        tile = GEMM_ROW_TILE
        rows = n_dec + len(chunks)
        a = (self._tok_flops * (-(-total // tile) * tile) + self._head_flops * (-(-rows // tile) * tile)) / den_a
        b = self.weight_bytes(total) / den_b
        m = a if a > b else b
        t: float = m * ((a / m) ** p + (b / m) ** p) ** inv_p
        first, uniform, ones = 0.0, False, False
        if n_dec:
            first = float(dec_new[0])
            uniform = lo == hi
            ones = uniform and first == 1.0             # every decode is of one token
        f_p = f_x if f_x < f_c else f_c                   # a prefill chunk after a context
        for group in groups:
            s, one, big, is_state, rule, pair_flops, kv_bytes, state_bytes = group
            if chunks:
                t = _chunks_time(t, chunks, group, f_c, f_p, bw_a, sat, blk, split)
            if not n_dec:
                continue
            # the decode call: decode_units is a one-token decode's units, else a chunk's blocks
            if not ones:
                per = [one if x == 1 else big * float(math.ceil(x / QUERY_BLOCK)) for x in dec_new]
            if is_state:
                f = dec_total * pair_flops
                by = state_bytes * n_dec
                units = nblk = one * n_dec if ones else float(sum(per))
            else:
                f = float(rule.attention_keys_sum(dec_new, dec_ctx)) * pair_flops
                if uniform:        # equal units per request: bytes / max bytes per unit
                    span_sum, span_max = rule.span_sum_max(dec_new, dec_ctx)
                    by = kv_bytes * float(span_sum)
                    top = float(span_max)
                    u = one if ones else per[0]
                    units = u * by / (kv_bytes * top)
                    nblk = u * n_dec
                else:
                    span = [k + x for k, x in zip(map(rule.kv_span, dec_new, dec_ctx), dec_new)]
                    by = kv_bytes * float(sum(span))
                    top = float(max(span))
                    units = by / (kv_bytes * float(max(map(truediv, span, per))))
                    nblk = float(sum(per))
                if split:
                    units *= min(float(MAX_KV_SPLITS), max(1.0, top / KV_SPLIT_KEYS))
            occ = min(1.0, units / sat)
            w = max(f / f_x, by / bw_a)
            t += s * (w / occ + nblk * blk)
        t += overhead
        if not chunks:
            return t
        h, q = self.calibration.eager_host_s, self.calibration.host_overlap   # host_bound(), inlined
        m = t if t > h else h
        eager: float = m * ((t / m) ** q + (h / m) ** q) ** (1.0 / q)
        return eager

    def _consts(self) -> tuple[Any, ...]:
        """:meth:`step_time_arrays`'s constants (the GEMM and weight denominators, the blend
        exponent and its inverse, the attention bandwidth, saturation, per-block time,
        context and causal FLOP rates, split-KV, the graph overhead, and per group the decode
        terms), computed once per (calibration, GPU, GPU count)."""
        c = self._consts_for
        if c is not None and c[0] is self.calibration and c[1] is self.gpu and c[2] == self.num_gpus:
            cached: tuple[Any, ...] = c[3]
            return cached
        consts = self._compute_consts()
        self._consts_for = (self.calibration, self.gpu, self.num_gpus, consts)
        return consts

    def _compute_consts(self) -> tuple[Any, ...]:
        cal = self.calibration
        G = float(self.num_gpus)
        F = self.gpu.flops * G
        B = self.gpu.mem_bw * G
        p = cal.gemm_blend
        scale = cal.kind_scale
        groups = tuple((g.layers * scale[g.kind], g.decode_one, g.prefill_heads, g.kind == STATE_KIND, g.rule,
                        g.pair_flops, g.kv_bytes, g.state_bytes) for g in self._groups)
        return (self._gemm_peak * G * cal.gemm_efficiency, B * cal.weight_bw_efficiency, p, 1.0 / p,
                B * cal.attn_bw_efficiency, cal.attn_saturation_blocks * G, cal.attn_block_s / G,
                F * cal.attn_context_efficiency, F * cal.attn_causal_efficiency, cal.split_kv,
                cal.graph_overhead_s, groups)
