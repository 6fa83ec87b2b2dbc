r"""Roofline cost model: how long one engine step takes, from peak rates at fixed efficiencies.

The explainable fallback (``--cost-model roofline``); the default is the calibrated model of
:mod:`hybridkv.cost.calibrated`, which this module's :class:`StepCost` also describes.

A step's work is a list of ``(new_tokens, context_before)`` pairs, one per scheduled request:
a prefill chunk computes ``new_tokens`` tokens after ``context_before`` cached/computed ones; a
decode is ``(1, context)`` (or ``(1 + k, context)`` with k speculative tokens).

With ``T = Σ new_tokens`` over the step, for each KV group ``g`` (``L_g`` layers, per-token KV
bytes ``b_g`` summed over its layers, window ``W_g``)::

    keys_g(n, c)    = Σ_{p=c}^{c+n-1} visible_g(p)          # (query, key) pairs per layer
                      visible(p) = p + 1 (full), min(p + 1, W) (sliding), p mod C + 1 (chunked C)
    span_g(n, c)    = distinct KV positions the chunk reads
                    = c + n (full), min(c + n, n + W - 1) (sliding), c + n - C*floor(c / C) (chunked)

    FLOPs  = 2 * active_params * T  +  Σ_req Σ_g 4 * attn_width * L_g * keys_g(n, c) / r_g
    bytes  = weight_bytes(T)  +  Σ_req Σ_g b_g * (span_g(n, c) + n)        # KV read + KV written
    weight_bytes(T) = wbpp * P * (1 - (1 - A/P) ** T)                       # MoE: experts touched
    time   = max(FLOPs / (num_gpus * peak_flops * mfu),
                 bytes / (num_gpus * peak_bw * mbu)) + step_overhead_s

An FP8 model (``gemm_dtype`` fp8) charges its ``2 * active_params * T`` GEMM FLOPs at the GPU's
FP8 peak: in the compute term they count ``peak_flops / fp8_peak`` times (the FLOPs reported
stay the real ones). ``r_g`` is an MLA group's ``compress_ratio`` (1 otherwise); ``b_g`` already includes it. ``A``
and ``P`` are active and total parameters and ``wbpp`` the bytes per weight; for a dense model
``A = P`` and every step reads all weights once. For MoE, each token is modelled as touching a
random fraction ``A/P`` of the weights, so a batch of ``T`` tokens reads the expected union
(``A`` for one token, approaching ``P`` for large batches).
Multiple GPUs (``num_gpus``) share the compute ideally; their communication is added by
:mod:`hybridkv.cost.comm` for a deployment. An empty step costs 0.

This is a first-order model: no kernel launch detail, no MLA
absorption; on measured H100 steps it is off by a mean of 15 % and up to 32 %
(docs/cost-model.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from hybridkv.core.rules import HitRule, make_rule
from hybridkv.core.specs import AttentionSpec
from hybridkv.core.validation import check_int

from hybridkv.cost.presets import GpuPreset, ModelPreset

__all__ = ["CostModel", "StepCost", "attention_keys", "kv_span"]


#: The longest list of requests :meth:`CostModel.step_time_arrays` sums with Python ints
#: (shorter than this, building arrays costs more than it saves).
INT_BATCH = 32


@lru_cache(maxsize=256)
def _rule(spec: AttentionSpec) -> HitRule:
    """The spec's hit rule (specs are frozen and hashable; rules are pure)."""
    return make_rule(spec)


def attention_keys(spec: AttentionSpec, new_tokens: int, context: int) -> int:
    """(query, key) pairs one layer of ``spec`` computes for tokens ``[context, context + new_tokens)``.

    The spec's hit rule says which keys a query reads (:meth:`HitRule.attention_keys`): full
    attention (and MLA) every earlier token and itself, a sliding window the last ``window``
    tokens, chunked-local attention its own chunk up to itself.
    """
    return int(_rule(spec).attention_keys(new_tokens, context))   # ints in, an int out


def kv_span(spec: AttentionSpec, new_tokens: int, context: int) -> int:
    """Distinct cached/new KV positions tokens ``[context, context + new_tokens)`` read in one layer."""
    return int(_rule(spec).kv_span(new_tokens, context))          # ints in, an int out


@dataclass(frozen=True, slots=True)
class StepCost:
    """Cost of one step, split into the terms that make it up.

    Attributes:
        flops: floating-point operations.
        bytes: HBM bytes moved (weights + KV read + KV written).
        compute_s: roofline: ``flops`` at the effective compute rate; calibrated: the GEMMs'
            share of their time that is compute-bound.
        memory_s: roofline: ``bytes`` at the effective bandwidth; calibrated: the GEMMs'
            weight-read share.
        time_s: the step's time (0 for an empty step).
        attention_s: calibrated: attention kernels' time (roofline: 0, attention is in the
            other two terms).
        overhead_s: the fixed per-step time included in ``time_s``.
        model: ``"roofline"`` or ``"calibrated"``.
        comm_s: the communication included in ``time_s`` (tensor- and expert-parallel
            collectives: :mod:`hybridkv.cost.comm`; 0 on one GPU).
    """

    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    time_s: float
    attention_s: float = 0.0
    overhead_s: float = 0.0
    model: str = "roofline"
    comm_s: float = 0.0

    @property
    def bound(self) -> str:
        """``"compute"``, ``"memory"``, ``"attention"`` or ``"communication"``: the largest term."""
        terms = {"compute": self.compute_s, "memory": self.memory_s, "attention": self.attention_s,
                 "communication": self.comm_s}
        return max(terms, key=terms.__getitem__)

    def to_json(self) -> dict[str, Any]:
        """The fields and ``bound`` as a JSON object."""
        return {"time_s": self.time_s, "compute_s": self.compute_s, "memory_s": self.memory_s,
                "attention_s": self.attention_s, "overhead_s": self.overhead_s, "comm_s": self.comm_s,
                "flops": self.flops, "bytes": self.bytes, "bound": self.bound, "model": self.model}


@dataclass(frozen=True, slots=True)
class CostModel:
    """Roofline step-time model for one model on ``num_gpus`` GPUs (formula: module docstring).

    Attributes:
        model: the model preset (its groups give the KV layout; draft groups count as KV).
        gpu: the GPU preset.
        mfu: achieved fraction of peak FLOP/s (0, 1].
        mbu: achieved fraction of peak bandwidth (0, 1].
        step_overhead_s: fixed time added to every non-empty step (scheduling, launches).
        num_gpus: GPUs sharing the work (an ideal split; :mod:`hybridkv.cost.comm` adds the
            communication).
    """

    kind: ClassVar[str] = "roofline"

    model: ModelPreset
    gpu: GpuPreset
    mfu: float = 0.5
    mbu: float = 0.8
    step_overhead_s: float = 0.002
    num_gpus: int = 1
    # per group of the model: its rule, 4 * attn_width * layers (FLOPs per (query, key) pair),
    # its compress ratio and its KV bytes per token over its layers (set by __post_init__)
    _groups: tuple[tuple[HitRule, float, int, int], ...] = field(init=False, repr=False, compare=False, default=())
    # (2 * active_params (x BF16 / FP8 peak for an FP8 model), num_gpus * peak FLOP/s * mfu, num_gpus * peak bytes/s * mbu): the
    # formula's constant factors, multiplied in the formula's own order (set by __post_init__)
    _consts: tuple[float, ...] = field(init=False, repr=False, compare=False, default=())
    # weight_bytes(T) by T, filled as step_time_arrays meets each T (at most the token budget)
    _weights: dict[float, float] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("mfu", "mbu"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"CostModel.{name} must be in (0, 1], got {value!r}")
        if self.step_overhead_s < 0:
            raise ValueError(f"CostModel.step_overhead_s must be >= 0, got {self.step_overhead_s!r}")
        check_int("CostModel.num_gpus", self.num_gpus, 1)
        m = self.model
        object.__setattr__(self, "_groups", tuple(
            (_rule(g.spec), 4.0 * m.attn_width * len(g.layer_names), g.spec.compress_ratio,
             g.spec.bytes_per_token * len(g.layer_names)) for g in m.groups))
        # FP8 GEMMs (gemm_dtype) run at the GPU's FP8 peak: their FLOPs count as BF16 FLOPs
        # times this ratio (1.0 for BF16, so the formula is unchanged there)
        gemm_scale = self.gpu.flops / self.gpu.gemm_flops(m.gemm_dtype)
        object.__setattr__(self, "_consts", (2.0 * m.active_params * gemm_scale,
                                             self.num_gpus * self.gpu.flops * self.mfu,
                                             self.num_gpus * self.gpu.mem_bw * self.mbu))

    @property
    def source(self) -> str:
        """The model's constants in words (shown beside its times)."""
        return (f"roofline: mfu {self.mfu:g}, mbu {self.mbu:g}, "
                f"{self.step_overhead_s * 1e3:g} ms per step")

    def weight_bytes(self, num_tokens: int) -> float:
        """Weight bytes a step of ``num_tokens`` tokens reads (MoE: expected experts touched)."""
        m = self.model
        if num_tokens <= 0:
            return 0.0
        frac = m.active_params / m.num_params
        return m.num_params * (1.0 - (1.0 - frac) ** num_tokens) * m.weight_bytes_per_param

    def step(self, work: Iterable[tuple[int, int]]) -> StepCost:
        """Cost of one step scheduling ``work`` = ``[(new_tokens, context_before), ...]``.

        Raises:
            ValueError: for a negative count. Entries with ``new_tokens == 0`` are ignored.
        """
        m = self.model
        groups = [
            (_rule(g.spec), len(g.layer_names), g.spec.bytes_per_token * len(g.layer_names),
             g.spec.compress_ratio)
            for g in m.groups
        ]
        total_new = 0
        attn_flops = 0.0
        kv_bytes = 0.0
        for new, ctx in work:
            if new < 0 or ctx < 0:
                raise ValueError(f"step work needs new_tokens >= 0 and context >= 0, got ({new}, {ctx})")
            if new == 0:
                continue
            total_new += new
            for rule, layers, bpt, ratio in groups:
                attn_flops += 4.0 * m.attn_width * layers * rule.attention_keys(new, ctx) / ratio
                kv_bytes += bpt * (rule.kv_span(new, ctx) + new)
        if total_new == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        flops = 2.0 * m.active_params * total_new + attn_flops
        nbytes = self.weight_bytes(total_new) + kv_bytes
        compute_s = (self._consts[0] * total_new + attn_flops) / (self.num_gpus * self.gpu.flops * self.mfu)
        memory_s = nbytes / (self.num_gpus * self.gpu.mem_bw * self.mbu)
        return StepCost(flops, nbytes, compute_s, memory_s, max(compute_s, memory_s) + self.step_overhead_s,
                        overhead_s=self.step_overhead_s)

    def step_time(self, work: Iterable[tuple[int, int]]) -> float:
        """Seconds one step scheduling ``work`` takes (:meth:`step`'s ``time_s``)."""
        return self.step(work).time_s

    def step_time_arrays(self, new: NDArray[Any] | list[int], ctx: NDArray[Any] | list[int]) -> float:
        """:meth:`step_time` for ``work = zip(new, ctx)`` (arrays or lists of token counts); the
        simulator's hot path.

        Same formula, with each group's (query, key) pairs and KV positions summed over the
        requests before they are scaled. Those sums are exact integers (every term is an
        integer below 2**53), so numpy's float64 sums and Python's int sums are the same
        number: a list of at most :data:`INT_BATCH` requests (a decode step's usual batch)
        is summed with ints, with no array to build, anything else with numpy; both give the
        same time, bit for bit (tested). Agrees with :meth:`step` to floating-point rounding
        (tested).
        """
        attn_flops = 0.0
        kv_bytes = 0.0
        total_new: float                        # an int for a list, a float for arrays
        if new.__class__ is list and len(new) <= INT_BATCH:
            total_new = sum(new)
            if total_new == 0:
                return 0.0
            ctx_list: list[int] = ctx  # type: ignore[assignment]  # a list when new is (the contract)
            for rule, pair_flops, ratio, bpt in self._groups:   # ints work in the formulas
                attn_flops += pair_flops * float(rule.attention_keys_sum(new, ctx_list)) / ratio
                kv_bytes += bpt * float(rule.kv_span_sum(new, ctx_list) + total_new)
        else:
            new = np.asarray(new, dtype=np.float64)
            ctx = np.asarray(ctx, dtype=np.float64)
            total_new = float(new.sum())
            if total_new == 0:
                return 0.0
            for rule, pair_flops, ratio, bpt in self._groups:   # and so do arrays
                attn_flops += pair_flops * float(rule.attention_keys(new, ctx).sum()) / ratio
                kv_bytes += bpt * float((rule.kv_span(new, ctx) + new).sum())
        two_active, flop_rate, byte_rate = self._consts
        flops = two_active * total_new + attn_flops
        weights = self._weights.get(total_new)
        if weights is None:
            weights = self._weights[total_new] = self.weight_bytes(int(total_new))
        compute_s = flops / flop_rate
        memory_s = (weights + kv_bytes) / byte_rate
        return max(compute_s, memory_s) + self.step_overhead_s
