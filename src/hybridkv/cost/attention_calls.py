"""The attention term of the calibrated cost model: the seconds of each attention call.

:func:`call_times` prices every call of an :class:`AttentionCalls` record at once (numpy
arrays, one entry per call); :mod:`hybridkv.cost.calibrated` sums them per step and
:mod:`hybridkv.cost.calibration_fit` per grid point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hybridkv.cost.calibration import Calibration

__all__ = ["AttentionCalls", "call_times"]


@dataclass(frozen=True)
class AttentionCalls:
    """Attention calls, one entry per call in each array (what :func:`call_times` prices).

    ``flops``/``nbytes``: one layer's work; ``units``: its effective work units; ``layers``:
    the layers it runs in; ``causal``: a fresh causal chunk; ``kind``: the index of its
    attention kind in ``ATTENTION_KINDS``; ``splits``: the KV splits a split-KV kernel adds;
    ``blocks``: all work blocks of the call (None: ``units``); ``decode``: a decode call, else
    a prefill chunk. The six per-call arrays must have one shape.
    """

    flops: NDArray[np.float64]
    nbytes: NDArray[np.float64]
    units: NDArray[np.float64]
    layers: NDArray[np.float64]
    causal: NDArray[np.bool_]
    kind: NDArray[np.int64]
    splits: NDArray[np.float64] | float = 1.0
    blocks: NDArray[np.float64] | None = None
    decode: NDArray[np.bool_] | bool = True

    def __post_init__(self) -> None:
        shape = np.shape(self.flops)
        for name in ("nbytes", "units", "layers", "causal", "kind"):
            if np.shape(getattr(self, name)) != shape:
                raise ValueError(f"AttentionCalls: {name} has shape {np.shape(getattr(self, name))}; "
                                 f"valid: the shape of flops, {shape}")


def call_times(cal: Calibration, peak_flops: float, peak_bw: float,
               calls: AttentionCalls) -> NDArray[np.float64]:
    """Seconds of each attention call of ``calls`` (all its layers), per the formula."""
    flops, nbytes, units, layers = calls.flops, calls.nbytes, calls.units, calls.layers
    causal, kind, splits, blocks, decode = calls.causal, calls.kind, calls.splits, calls.blocks, calls.decode
    e_c, e_x = cal.attn_causal_efficiency, cal.attn_context_efficiency
    eff = np.where(causal, e_c, np.where(decode, e_x, min(e_x, e_c)))
    work = np.maximum(flops / (peak_flops * eff), nbytes / (peak_bw * cal.attn_bw_efficiency))
    occupancy = np.minimum(1.0, (units * splits if cal.split_kv else units) / cal.attn_saturation_blocks)
    scale: NDArray[np.float64] = np.asarray(cal.kind_scale)[kind]
    per_block = (units if blocks is None else blocks) * cal.attn_block_s
    return layers * scale * (work / np.maximum(occupancy, 1e-12) + per_block)
