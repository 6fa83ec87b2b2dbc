"""The calibrated model's formula (:mod:`hybridkv.cost.calibrated`'s docstring has it): its
constants, the per-layer terms of one KV group's attention calls, and the formula over a
step's :class:`StepFeatures`: the reference :class:`~hybridkv.cost.calibrated.CalibratedCostModel`'s
step times are tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from hybridkv.core.rules import HitRule, make_rule
from hybridkv.core.specs import AttentionSpec
from hybridkv.cost.attention_calls import AttentionCalls, call_times
from hybridkv.cost.calibration import ATTENTION_KINDS, Calibration
from hybridkv.cost.costmodel import StepCost
from hybridkv.cost.presets import GpuPreset

DECODE_MAX_NEW = 16
"""A request with at most this many new tokens runs in the step's batched decode call."""

QUERY_BLOCK = 64
"""Queries per attention work block (the unit of :attr:`Calibration.attn_saturation_blocks`)."""

GEMM_ROW_TILE = 64
"""Rows (tokens) of one GEMM tile: the GEMM compute term counts whole tiles."""

MONOTONE_SLACK = 0.02
"""Most a step's predicted time may fall, relatively, when work is added to it (a decode, a new
or cached token): the occupancy terms are not monotone. Worst found by a random search of
60,000 steps over the presets: 0.68 % (a verification batch whose longest request changes);
under-filled prefill chunks: 0.12 %. A new request never lowers the time."""

KV_SPLIT_KEYS = 128
"""Keys of one request a split-KV unit covers at least (FlashAttention's key block)."""

MAX_KV_SPLITS = 128
"""Most units a split-KV kernel splits one request's keys into (FlashAttention's limit)."""

STATE_KIND = ATTENTION_KINDS.index("state")


def row_tile(rows: float) -> float:
    """``rows`` rounded up to whole :data:`GEMM_ROW_TILE` tiles (0 stays 0)."""
    return math.ceil(rows / GEMM_ROW_TILE) * GEMM_ROW_TILE


def kv_splits(keys: float | NDArray[np.float64]) -> float | NDArray[np.float64]:
    """Units a split-KV kernel spreads one request's ``keys`` keys over (at least 1, at most
    :data:`MAX_KV_SPLITS`; elementwise for an array)."""
    return np.minimum(float(MAX_KV_SPLITS), np.maximum(1.0, np.asarray(keys, dtype=np.float64) / KV_SPLIT_KEYS))


@lru_cache(maxsize=256)
def group_rule(spec: AttentionSpec) -> HitRule:
    return make_rule(spec)


@dataclass(frozen=True, slots=True)
class GroupTerms:
    """Per KV group constants of the attention calls (per layer, before dividing by GPUs)."""

    rule: HitRule
    layers: int
    kind: int
    pair_flops: float         # FLOPs per (query, key) pair (state: per token)
    kv_bytes: float           # KV bytes per cached/new position
    state_bytes: float        # state bytes read + written per request (state groups)
    prefill_heads: float      # query heads (prefill units per 64-query block)
    decode_heads: float       # KV heads a decode's queries are packed under
    decode_group: float       # query rows per KV head of one decode token

    @property
    def decode_one(self) -> float:
        """Work units of one one-token decode (:func:`decode_units` of ``new == 1``)."""
        return self.decode_heads * math.ceil(self.decode_group / QUERY_BLOCK)


def decode_units(g: GroupTerms, new: NDArray[np.float64]) -> NDArray[np.float64]:
    """Work units of each request of a decode call: one token packs its KV head's query heads
    into blocks of 64 rows; a few tokens (speculative verification) run one block per query
    head and 64 tokens, as a prefill chunk does."""
    return np.where(new == 1, g.decode_one, g.prefill_heads * np.ceil(new / QUERY_BLOCK))


@dataclass(frozen=True, slots=True)
class StepFeatures:
    """A step's work reduced to what the calibrated formula needs (no fitted constant in it).

    Every quantity is per GPU (already divided by the tensor-parallel degree). ``gemm_flops``
    are the GEMMs' FLOPs, ``gemm_tile_flops`` the same over whole :data:`GEMM_ROW_TILE` tiles
    (what the kernels compute). One entry per attention call of one group: FLOPs, bytes and
    work units of one layer (``call_units``: effective units, the busiest one bounding a decode
    batch), the KV splits a split-KV kernel may add (``call_splits``; 1 for a recurrent
    layer), all its work blocks (``call_blocks``), the group's layer count, whether it is a
    fresh causal chunk (``call_causal``), whether it is a decode call (``call_decode``), and
    its :data:`ATTENTION_KINDS` index.
    """

    tokens: int
    gemm_flops: float
    gemm_tile_flops: float
    weight_bytes: float
    eager: bool
    call_flops: NDArray[np.float64]
    call_bytes: NDArray[np.float64]
    call_units: NDArray[np.float64]
    call_splits: NDArray[np.float64]
    call_blocks: NDArray[np.float64]
    call_layers: NDArray[np.float64]
    call_causal: NDArray[np.bool_]
    call_decode: NDArray[np.bool_]
    call_kind: NDArray[np.int64]


def host_bound(gpu_s: float, host_s: float, q: float) -> float:
    """An eager step's time: GPU time ``gpu_s`` and host issue time ``host_s`` joined by
    ``(gpu_s**q + host_s**q) ** (1/q)`` (never less than either, increasing in both)."""
    m = gpu_s if gpu_s > host_s else host_s
    if m <= 0.0:
        return 0.0
    joined: float = m * ((gpu_s / m) ** q + (host_s / m) ** q) ** (1.0 / q)   # float ** float: typed Any
    return joined


def blend(a: NDArray[np.float64], b: NDArray[np.float64], p: float) -> NDArray[np.float64]:
    """``(a**p + b**p) ** (1/p)`` without overflow."""
    m = np.maximum(a, b)
    safe = np.where(m > 0, m, 1.0)
    return np.where(m > 0, safe * ((a / safe) ** p + (b / safe) ** p) ** (1.0 / p), 0.0)


def evaluate_features(f: StepFeatures, cal: Calibration, gpu: GpuPreset,
                      gemm_peak: float | None = None) -> StepCost:
    """The :class:`StepCost` of features ``f`` under ``cal`` on ``gpu``'s peaks (``gemm_peak``:
    the GEMMs' peak FLOP/s when not ``gpu.flops``, BF16's: :meth:`GpuPreset.gemm_flops`)."""
    if f.tokens == 0:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, model="calibrated")
    a = f.gemm_tile_flops / ((gpu.flops if gemm_peak is None else gemm_peak) * cal.gemm_efficiency)
    b = f.weight_bytes / (gpu.mem_bw * cal.weight_bw_efficiency)
    p = cal.gemm_blend
    m = max(a, b)
    gemm = m * ((a / m) ** p + (b / m) ** p) ** (1.0 / p) if m > 0 else 0.0
    calls = AttentionCalls(f.call_flops, f.call_bytes, f.call_units, f.call_layers, f.call_causal,
                           f.call_kind, f.call_splits, f.call_blocks, f.call_decode)
    attn = float(call_times(cal, gpu.flops, gpu.mem_bw, calls).sum())
    gpu_s = gemm + attn + cal.graph_overhead_s
    total = host_bound(gpu_s, cal.eager_host_s, cal.host_overlap) if f.eager else gpu_s
    over = total - gemm - attn if f.eager else cal.graph_overhead_s
    # Split the blended GEMM time between its compute and weight-read terms in proportion.
    share = a ** p / (a ** p + b ** p) if m > 0 else 0.0
    attn_flops = float((f.call_flops * f.call_layers).sum())
    attn_bytes = float((f.call_bytes * f.call_layers).sum())
    return StepCost(f.gemm_flops + attn_flops, f.weight_bytes + attn_bytes, gemm * share,
                    gemm * (1.0 - share), total, attention_s=attn, overhead_s=over,
                    model="calibrated")
