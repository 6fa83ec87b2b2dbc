"""The calibrated model's fitted constants (:class:`Calibration`) and the attention kinds its
per-kind time multiplier is indexed by (:data:`ATTENTION_KINDS`, :func:`attention_kind`).
The formula they enter is :mod:`hybridkv.cost.calibrated`'s."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hybridkv.core.rules import rule_class
from hybridkv.core.specs import AttentionSpec

__all__ = ["ATTENTION_KINDS", "Calibration", "attention_kind"]

ATTENTION_KINDS = ("full", "sliding", "chunked", "mla", "state")
"""Attention kinds with their own time multiplier (:attr:`Calibration.kind_scale`)."""


def attention_kind(spec: AttentionSpec) -> str:
    """The :data:`ATTENTION_KINDS` entry of ``spec``: its rule's ``cost_kind``.

    Raises:
        ValueError: the registered type names a cost kind outside :data:`ATTENTION_KINDS`.
    """
    kind = rule_class(spec).cost_kind
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"{type(spec).__name__}'s rule has cost_kind {kind!r}; valid: "
                         f"{', '.join(ATTENTION_KINDS)}")
    return kind


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted constants of the calibrated model (formula: module docstring).

    The field defaults are generic starting values (the roofline's 0.5 / 0.8, 2 ms of overhead
    and of host time), not a measurement; :func:`hybridkv.cost.profile.default_calibration` gives the measured
    ones.

    Attributes:
        gemm_efficiency: fraction of peak FLOP/s the GEMMs reach at large token counts.
        weight_bw_efficiency: fraction of peak bandwidth at which weights stream at small
            token counts.
        gemm_blend: sharpness of the turn between the two (>= 1; large = roofline ``max``).
        attn_causal_efficiency: fraction of peak FLOP/s of attention over a chunk with no
            cached context.
        attn_context_efficiency: the same after a cached context (at most the causal one,
            for a prefill chunk) and for decode FLOPs.
        attn_bw_efficiency: fraction of peak bandwidth attention reads KV (and state) at.
        attn_saturation_blocks: attention work blocks that keep the GPU busy (per GPU).
        attn_block_s: GPU time each attention work block of one layer adds beyond its FLOPs
            and bytes (per GPU: blocks run side by side, so this is the GPU's time per block,
            not one block's latency).
        graph_overhead_s: fixed GPU time of every step (the gaps between its kernels).
        eager_host_s: host time to issue a step launched eagerly (one with a prefill chunk).
        host_overlap: how the host's issue time and the GPU time combine in an eager step
            (>= 1; 1: they add up; large: the larger of the two).
        kind_scale: time multiplier per :data:`ATTENTION_KINDS` entry (1: as full attention).
        split_kv: the attention kernel splits a request's keys over more units when a call
            alone would leave the GPU idle (split-KV, as serving engines' decode kernels do);
            not fitted: a property of the kernel measured.
    """

    gemm_efficiency: float = 0.5
    weight_bw_efficiency: float = 0.8
    gemm_blend: float = 4.0
    attn_causal_efficiency: float = 0.35
    attn_context_efficiency: float = 0.35
    attn_bw_efficiency: float = 0.8
    attn_saturation_blocks: float = 132.0
    attn_block_s: float = 2e-8
    graph_overhead_s: float = 0.002
    eager_host_s: float = 0.002
    host_overlap: float = 4.0
    kind_scale: tuple[float, ...] = field(default=(1.0,) * len(ATTENTION_KINDS))
    split_kv: bool = True

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "weight_bw_efficiency", "attn_causal_efficiency",
                     "attn_context_efficiency", "attn_bw_efficiency"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"Calibration.{name} must be in (0, 1], got {value!r}")
        for name in ("gemm_blend", "host_overlap"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 1):
                raise ValueError(f"Calibration.{name} must be >= 1, got {value!r}")
        if not (isinstance(self.attn_saturation_blocks, (int, float)) and self.attn_saturation_blocks > 0):
            raise ValueError(f"Calibration.attn_saturation_blocks must be > 0, got "
                             f"{self.attn_saturation_blocks!r}")
        for name in ("graph_overhead_s", "eager_host_s", "attn_block_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"Calibration.{name} must be in [0, 1) seconds, got {value!r}")
        if not isinstance(self.split_kv, bool):
            raise ValueError(f"Calibration.split_kv must be true or false, got {self.split_kv!r}")
        scale = tuple(float(x) for x in self.kind_scale)
        if len(scale) != len(ATTENTION_KINDS) or not all(0 < x < 100 for x in scale):
            raise ValueError(f"Calibration.kind_scale must be {len(ATTENTION_KINDS)} multipliers in "
                             f"(0, 100) for {', '.join(ATTENTION_KINDS)}, got {self.kind_scale!r}")
        object.__setattr__(self, "kind_scale", scale)

    @classmethod
    def scalar_names(cls) -> tuple[str, ...]:
        """The fitted scalar fields (everything but ``kind_scale`` and ``split_kv``), in order."""
        return tuple(f.name for f in fields(cls) if f.name not in ("kind_scale", "split_kv"))

    def to_json(self) -> dict[str, Any]:
        """A JSON object: the scalar fields, ``kind_scale`` as ``{kind: multiplier}``, ``split_kv``."""
        out: dict[str, Any] = {name: getattr(self, name) for name in self.scalar_names()}
        out["kind_scale"] = dict(zip(ATTENTION_KINDS, self.kind_scale))
        out["split_kv"] = self.split_kv
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Calibration:
        """Inverse of :meth:`to_json`; raises ValueError naming an unknown or missing field."""
        if not isinstance(obj, dict):
            raise ValueError(f"calibration parameters must be a JSON object, got {type(obj).__name__}")
        known = set(cls.scalar_names()) | {"kind_scale", "split_kv"}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"unknown calibration parameter(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(sorted(known))}")
        missing = sorted(set(cls.scalar_names()) - set(obj))
        if missing:
            raise ValueError(f"calibration parameters lack {', '.join(missing)}")
        scale = obj.get("kind_scale", {})
        bad = sorted(set(scale) - set(ATTENTION_KINDS))
        if bad:
            raise ValueError(f"unknown attention kind(s) {', '.join(bad)} in kind_scale; valid: "
                             f"{', '.join(ATTENTION_KINDS)}")
        kw = {name: float(obj[name]) for name in cls.scalar_names()}
        return cls(**kw, kind_scale=tuple(float(scale.get(k, 1.0)) for k in ATTENTION_KINDS),
                   split_kv=obj.get("split_kv", True))
