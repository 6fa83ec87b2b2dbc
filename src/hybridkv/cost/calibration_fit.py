"""Fit the calibrated model's constants to measured steps (numpy only), and check the fit by
leave-one-out.

The fit minimises the squared log-ratio of predicted to measured time over the grid points,
plus a weak pull (weight :data:`PRIOR_WEIGHT` per constant) toward the generic
:class:`~hybridkv.cost.calibrated.Calibration` defaults, so a grid that says nothing about a
constant (no decode points, say) leaves it at its generic value instead of anywhere. Each
constant is fitted in a space where every value is valid: efficiencies through a logistic
map into (0, 1), the two blend exponents as ``1 + exp``, the saturation as ``exp``, the
overhead, the host time and the time per attention block as a square. The minimiser is
Levenberg-Marquardt with a forward-difference Jacobian, started from the generic values and
two variants; the best end point wins. Whether the attention kernel splits a decode's keys
(:attr:`Calibration.split_kv`) is not fitted: it is taken from ``prior``, a property of the
kernel that ran.

:func:`leave_one_out` refits without each point in turn and predicts it: the error a new
measurement of the same kind should expect, not how well the fit reproduces its own data.

Kernel points of attention kinds other than full attention (sliding window, MLA, a recurrent
stand-in) set :attr:`Calibration.kind_scale`: the geometric-mean ratio of measured to
predicted time of that kind's kernels, divided by the same ratio of full-attention kernels
timed at the same shapes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hybridkv.cost.attention_calls import AttentionCalls, call_times
from hybridkv.cost.calibrated import ATTENTION_KINDS, CalibratedCostModel, Calibration, StepFeatures, blend
from hybridkv.cost.grid import GridPoint
from hybridkv.cost.presets import GpuPreset, ModelPreset

__all__ = ["FitResult", "HeldOut", "KernelPoint", "PRIOR_WEIGHT", "fit_calibration", "held_out", "leave_one_out",
           "predict_points"]

PRIOR_WEIGHT = 0.02
"""Weight of the pull toward the generic constants (in each constant's fitting space)."""

_NAMES = Calibration.scalar_names()
_UNIT = {"gemm_efficiency", "weight_bw_efficiency", "attn_causal_efficiency",
         "attn_context_efficiency", "attn_bw_efficiency"}
_EXPONENT = {"gemm_blend", "host_overlap"}
_SECONDS_SCALE = {"attn_block_s": 1e-8}
"""Seconds = theta ** 2 * scale (default 1e-3: overheads of a millisecond or so)."""


def _to_theta(cal: Calibration) -> NDArray[np.float64]:
    out = []
    for name in _NAMES:
        v = getattr(cal, name)
        if name in _UNIT:
            v = min(max(v, 1e-6), 1 - 1e-6)
            out.append(math.log(v / (1 - v)))
        elif name in _EXPONENT:
            out.append(math.log(max(v - 1.0, 1e-6)))
        elif name == "attn_saturation_blocks":
            out.append(math.log(v))
        else:                                   # seconds = theta ** 2 * scale
            out.append(math.sqrt(v / _SECONDS_SCALE.get(name, 1e-3)))
    return np.array(out)


def _from_theta(theta: NDArray[np.float64], kind_scale: tuple[float, ...], split_kv: bool) -> Calibration:
    kw = {}
    for name, t in zip(_NAMES, theta):
        t = float(np.clip(t, -30.0, 30.0))
        if name in _UNIT:
            kw[name] = min(1.0 / (1.0 + math.exp(-t)), 1.0)
        elif name in _EXPONENT:
            kw[name] = 1.0 + math.exp(t)
        elif name == "attn_saturation_blocks":
            kw[name] = math.exp(t)
        else:
            kw[name] = min(t * t * _SECONDS_SCALE.get(name, 1e-3), 0.49)
    return Calibration(**kw, kind_scale=kind_scale, split_kv=split_kv)


@dataclass(frozen=True, slots=True)
class KernelPoint:
    """One timed attention kernel call of one kind (one layer), with its work.

    Attributes:
        attention: the :data:`~hybridkv.cost.calibrated.ATTENTION_KINDS` entry timed.
        step: the request shape in step syntax (for reading; the fit uses the fields below).
        flops, bytes, units: the call's work as the model counts it (per layer).
        causal: a chunk with no cached context.
        median_s, min_s: measured seconds of one call.
        note: how the kernel was run (stand-ins say so).
    """

    attention: str
    step: str
    flops: float
    bytes: float
    units: float
    causal: bool
    median_s: float
    min_s: float
    note: str = ""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind {self.attention!r}; valid: {', '.join(ATTENTION_KINDS)}")
        if not (self.median_s > 0 and self.flops >= 0 and self.bytes >= 0 and self.units > 0):
            raise ValueError(f"kernel point {self.step!r} needs median_s > 0, flops/bytes >= 0, units > 0")

    def to_json(self) -> dict[str, Any]:
        return {"kind": "kernel", **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> KernelPoint:
        try:
            return cls(attention=obj["attention"], step=obj["step"], flops=float(obj["flops"]),
                       bytes=float(obj["bytes"]), units=float(obj["units"]), causal=bool(obj["causal"]),
                       median_s=float(obj["median_s"]), min_s=float(obj.get("min_s", obj["median_s"])),
                       note=str(obj.get("note", "")))
        except KeyError as exc:
            raise ValueError(f"kernel point {obj!r} lacks field {exc.args[0]!r}") from None


class _Batch:
    """Features of many steps, concatenated for one vectorised evaluation."""

    def __init__(self, feats: Sequence[StepFeatures]) -> None:
        self.n = len(feats)
        self.gemm_flops = np.array([f.gemm_tile_flops for f in feats])
        self.weight_bytes = np.array([f.weight_bytes for f in feats])
        self.eager = np.array([f.eager for f in feats])
        self.step_of = np.concatenate([np.full(f.call_flops.size, i) for i, f in enumerate(feats)]
                                      or [np.zeros(0, dtype=np.int64)]).astype(np.int64)

        def cat(name: str) -> NDArray[Any]:
            parts = [getattr(f, name) for f in feats]
            return np.concatenate(parts) if parts else np.zeros(0)

        self.calls = AttentionCalls(cat("call_flops"), cat("call_bytes"), cat("call_units"),
                                    cat("call_layers"), cat("call_causal").astype(bool),
                                    cat("call_kind").astype(np.int64), cat("call_splits"),
                                    cat("call_blocks"), cat("call_decode").astype(bool))

    def times(self, cal: Calibration, gpu: GpuPreset) -> NDArray[np.float64]:
        a = self.gemm_flops / (gpu.flops * cal.gemm_efficiency)
        b = self.weight_bytes / (gpu.mem_bw * cal.weight_bw_efficiency)
        gemm = blend(a, b, cal.gemm_blend)
        calls = call_times(cal, gpu.flops, gpu.mem_bw, self.calls)
        gpu_s = gemm + np.bincount(self.step_of, weights=calls, minlength=self.n) + cal.graph_overhead_s
        host = blend(gpu_s, np.full(self.n, cal.eager_host_s), cal.host_overlap)
        return np.where(self.eager, host, gpu_s)


def predict_points(model: ModelPreset, gpu: GpuPreset, cal: Calibration,
                   points: Sequence[GridPoint]) -> NDArray[np.float64]:
    """Predicted seconds of each grid point under ``cal`` (vectorised; the same formula as
    :meth:`CalibratedCostModel.step`)."""
    cm = CalibratedCostModel(model, gpu, cal)
    return _Batch([cm.features(p.work()) for p in points]).times(cal, gpu)


def _lm(fun: Callable[[NDArray[np.float64]], NDArray[np.float64]], theta0: NDArray[np.float64],
        iters: int = 200) -> tuple[NDArray[np.float64], float]:
    """Levenberg-Marquardt on ``fun(theta) -> residuals``; returns (theta, sum of squares)."""
    theta = theta0.astype(np.float64).copy()
    r = fun(theta)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(iters):
        h = 1e-6 * (1.0 + np.abs(theta))
        J = np.empty((r.size, theta.size))
        for j in range(theta.size):
            t = theta.copy()
            t[j] += h[j]
            J[:, j] = (fun(t) - r) / h[j]
        A = J.T @ J
        g = J.T @ r
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-9 * np.eye(theta.size)), -g)
            cand = theta + step
            rc = fun(cand)
            cc = float(rc @ rc)
            if np.isfinite(cc) and cc < cost:
                gain = cost - cc
                theta, r, cost = cand, rc, cc
                lam = max(lam / 3.0, 1e-12)
                improved = True
                break
            lam *= 4.0
        if not improved or gain < 1e-14 * max(cost, 1e-30):
            break
    return theta, cost


@dataclass(frozen=True, slots=True)
class FitResult:
    """A fitted calibration and how well it reproduces its points.

    Attributes:
        calibration: the fitted constants.
        ratios: predicted / measured time of each step point (in-sample).
        kernel_ratios: the same for kernel points (after the kind scales).
        cost: the minimised sum of squares (data and prior).
    """

    calibration: Calibration
    ratios: tuple[float, ...]
    kernel_ratios: tuple[float, ...]
    cost: float


def _kernel_call(k: KernelPoint, kind: int) -> AttentionCalls:
    """One kernel measurement as a single one-layer call of attention kind index ``kind``."""
    return AttentionCalls(np.array([k.flops]), np.array([k.bytes]), np.array([k.units]),
                          np.array([1.0]), np.array([k.causal]), np.array([kind]))


def _kind_scale(model: ModelPreset, gpu: GpuPreset, cal: Calibration,
                kernels: Sequence[KernelPoint]) -> tuple[float, ...]:
    if not kernels:
        return cal.kind_scale
    base = dataclasses.replace(cal, kind_scale=(1.0,) * len(ATTENTION_KINDS))
    logs: dict[str, list[float]] = {}
    for k in kernels:
        pred = float(call_times(base, gpu.flops, gpu.mem_bw, _kernel_call(k, 0))[0])
        logs.setdefault(k.attention, []).append(math.log(k.median_s / pred))
    ref = float(np.mean(logs["full"])) if "full" in logs else 0.0
    return tuple(1.0 if kind == "full" or kind not in logs
                 else float(np.clip(math.exp(float(np.mean(logs[kind])) - ref), 0.011, 99.0))
                 for kind in ATTENTION_KINDS)


def fit_calibration(model: ModelPreset, gpu: GpuPreset, points: Sequence[GridPoint],
                    kernels: Sequence[KernelPoint] = (), prior: Calibration | None = None) -> FitResult:
    """Fit the calibrated model of ``model`` on ``gpu``'s peaks to measured ``points``.

    Args:
        model: the model the points were measured with.
        gpu: the peaks the efficiencies refer to.
        points: measured steps (median seconds are fitted).
        kernels: measured attention kernels of other kinds (set ``kind_scale``).
        prior: the constants the weak prior pulls toward (default: the generic ones); its
            ``split_kv`` is kept.

    Raises:
        ValueError: no step point, or a point with a non-positive median.
    """
    if not points:
        raise ValueError("no measured step to fit")
    bad = [p for p in points if not p.median_s > 0]
    if bad:
        raise ValueError(f"grid point {bad[0].step!r} has median_s {bad[0].median_s!r}; need > 0")
    prior = prior or Calibration()
    cm = CalibratedCostModel(model, gpu, prior)
    batch = _Batch([cm.features(p.work()) for p in points])
    measured = np.log(np.array([p.median_s for p in points]))
    theta_prior = _to_theta(prior)
    scale = prior.kind_scale

    def residuals(theta: NDArray[np.float64]) -> NDArray[np.float64]:
        cal = _from_theta(theta, scale, prior.split_kv)
        pred = batch.times(cal, gpu)
        return np.concatenate([np.log(np.maximum(pred, 1e-30)) - measured,
                               PRIOR_WEIGHT * (theta - theta_prior)])

    starts = [theta_prior]
    for over, host, blend_p, block in ((0.0005, 0.001, 2.0, 1e-8), (0.002, 0.01, 8.0, 5e-8)):
        starts.append(_to_theta(dataclasses.replace(prior, graph_overhead_s=over, eager_host_s=host,
                                                    gemm_blend=blend_p, host_overlap=blend_p,
                                                    attn_block_s=block)))
    best = min((_lm(residuals, s) for s in starts), key=lambda tc: tc[1])
    cal = _from_theta(best[0], scale, prior.split_kv)
    cal = dataclasses.replace(cal, kind_scale=_kind_scale(model, gpu, cal, kernels))
    ratios = batch.times(cal, gpu) / np.exp(measured)
    kratios = []
    for k in kernels:
        t = call_times(cal, gpu.flops, gpu.mem_bw, _kernel_call(k, ATTENTION_KINDS.index(k.attention)))[0]
        kratios.append(float(t / k.median_s))
    return FitResult(cal, tuple(float(x) for x in ratios), tuple(kratios), best[1])


def leave_one_out(model: ModelPreset, gpu: GpuPreset, points: Sequence[GridPoint],
                  prior: Calibration | None = None) -> list[float]:
    """Predicted / measured time of each point by a fit to all the others."""
    out = []
    for i, p in enumerate(points):
        rest = list(points[:i]) + list(points[i + 1:])
        cal = fit_calibration(model, gpu, rest, prior=prior).calibration
        out.append(float(predict_points(model, gpu, cal, [p])[0] / p.median_s))
    return out


@dataclass(frozen=True, slots=True)
class HeldOut:
    """A fit to some measured steps and its predictions of the others.

    Attributes:
        calibration: the constants fitted to ``fit``.
        fit, test: the steps fitted to and the steps predicted.
        fit_ratios, test_ratios: predicted / measured time of each.
        test_gpu_s: the predicted GPU time of each test step (no host term).
        test_host_bound: whether a test step is eager and its predicted GPU time is below the
            fitted host issue time (its time is then the host's, not the GPU's).
    """

    calibration: Calibration
    fit: tuple[GridPoint, ...]
    test: tuple[GridPoint, ...]
    fit_ratios: tuple[float, ...]
    test_ratios: tuple[float, ...]
    test_gpu_s: tuple[float, ...]
    test_host_bound: tuple[bool, ...]


def held_out(model: ModelPreset, gpu: GpuPreset, points: Sequence[GridPoint], fit_steps: set[str],
             prior: Calibration | None = None) -> HeldOut:
    """Fit to the ``points`` whose step is in ``fit_steps`` and predict the others.

    Raises:
        ValueError: no point to fit or none to predict.
    """
    fit = tuple(p for p in points if p.step in fit_steps)
    test = tuple(p for p in points if p.step not in fit_steps)
    if not fit or not test:
        raise ValueError(f"held-out split needs steps on both sides; got {len(fit)} to fit and "
                         f"{len(test)} to predict")
    cal = fit_calibration(model, gpu, fit, prior=prior).calibration
    ratios = [predict_points(model, gpu, cal, ps) / np.array([p.median_s for p in ps]) for ps in (fit, test)]
    gpu_s = predict_points(model, gpu, dataclasses.replace(cal, eager_host_s=0.0), test)
    bound = tuple(bool(p.kind != "decode" and g < cal.eager_host_s) for p, g in zip(test, gpu_s))
    return HeldOut(cal, fit, test, tuple(float(r) for r in ratios[0]), tuple(float(r) for r in ratios[1]),
                   tuple(float(g) for g in gpu_s), bound)
