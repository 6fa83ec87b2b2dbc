"""Profile files: measured steps of one model on one device, the constants fitted to them, and
host <-> device copy times; and the shipped default.

A profile is one JSON object (``"format": "hybridkv-profile"``, ``"version": 1``)::

    device     {name, kind: cuda | cpu, gpu: GPU preset name or null, memory_bytes,
                peak_flops, peak_bw, peak_source, reference: {gemm_flops_s, copy_bytes_s}}
    software   {python, torch, cuda, hybridkv, ...}
    model      {preset, trim: {layers_per_group, width_divisor, vocab_size},
                num_params, active_params}                          (of the weights built)
    method     {dtype, timer, decode, timing, attention_kernels, split_kv?, ...}   how it was timed
    grid       [{kind: prefill | decode | mixed, new_tokens, context, batch,
                 decode_batch, decode_context, median_s, min_s, repeats, host_s}, ...]
    kernels    [{kind: kernel, attention, step, flops, bytes, units, causal, median_s, ...}]
    fit        {params: Calibration fields, model_form, points, fit_steps?, ratios,
                max_abs_error, mean_abs_error, loo?, held_out?}
    transfer   {h2d_bw, d2h_bw, latency_s, per_copy_s, pageable_h2d_bw, source, points}

The efficiencies in ``fit.params`` are fractions of ``device.peak_flops`` / ``peak_bw`` (a GPU
preset's datasheet numbers where ``device.gpu`` names one, else the measured reference).
:meth:`Profile.refit` fits again from ``grid`` and ``kernels`` alone, so a profile taken on a
GPU can be refitted anywhere. ``fit.fit_steps``, when present, names the grid steps the
constants are fitted to (a refit keeps to them); the other steps are held out, and
``fit.held_out`` gives their predicted / measured ratios. Whether the decode kernel split its
keys (:attr:`Calibration.split_kv`) comes from ``method.split_kv`` or, failing that, from the
names of the decode kernels the profiler recorded (``method.attention_kernels``).

The shipped default (``hybridkv/cost/data/h100-llama-3.1-8b.profile.json``) holds 75 steps of
a model with Llama-3.1-8B's shapes measured by ``hybridkv profile`` on one H100 SXM with
PyTorch 2.11 kernels (FlashAttention's split-KV decode); its constants are fitted to 24 of
them (a grid shared with earlier measurements) and the other 51 are held out. Its copy times
are :data:`~hybridkv.cost.transfer.DEFAULT_TRANSFER`. It is the default calibration for
``--gpu h100``; every other GPU preset gets the same efficiencies applied to its own datasheet
peaks (:func:`default_calibration`).
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hybridkv.cost.calibrated import CalibratedCostModel, Calibration
from hybridkv.cost.calibration_fit import KernelPoint, fit_calibration, leave_one_out, predict_points
from hybridkv.cost.costmodel import CostModel
from hybridkv.cost.grid import GridPoint
from hybridkv.cost.presets import GPU_PRESETS, GpuPreset, ModelPreset, get_preset
from hybridkv.cost.shapes import Trim, trimmed_preset
from hybridkv.cost.transfer import DEFAULT_TRANSFER, CopyPoint, TransferModel, fit_transfer

if TYPE_CHECKING:
    from hybridkv.cost.comm import DeployedCostModel
    from hybridkv.cost.deployment import Deployment

__all__ = ["COST_MODELS", "DEFAULT_PROFILE_PATH", "FORMAT", "MODEL_FORM", "VERSION", "MeasuredRun", "Profile",
           "copy_points_from_jsonl",
           "cost_model", "default_calibration", "default_profile", "load_profile",
           "profile_from_measurements", "software_versions"]

FORMAT = "hybridkv-profile"
VERSION = 1
MODEL_FORM = 3
"""The calibrated model's form a profile's ``fit.params`` belong to (``fit.model_form``); a fit
of another form is recomputed from the grid when the profile is read."""
DEFAULT_PROFILE_PATH = Path(__file__).resolve().parent / "data" / "h100-llama-3.1-8b.profile.json"
COST_MODELS = ("calibrated", "roofline")
"""``cost_model`` kinds: the calibrated model (default) and the roofline fallback."""


@dataclass(frozen=True)
class Profile:
    """A profile file's content (format: module docstring).

    ``calibration`` is None for a profile whose grid has not been fitted yet.
    """

    device: dict[str, Any]
    model: dict[str, Any]
    points: tuple[GridPoint, ...]
    kernels: tuple[KernelPoint, ...] = ()
    calibration: Calibration | None = None
    fit: dict[str, Any] = field(default_factory=dict)
    transfer: TransferModel = DEFAULT_TRANSFER
    software: dict[str, Any] = field(default_factory=dict)
    method: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("name", "peak_flops", "peak_bw"):
            if key not in self.device:
                raise ValueError(f"profile device section lacks {key!r}")
        if not (float(self.device["peak_flops"]) > 0 and float(self.device["peak_bw"]) > 0):
            raise ValueError("profile device peak_flops and peak_bw must be > 0")
        gpu = self.device.get("gpu")
        if gpu is not None and gpu not in GPU_PRESETS:
            raise ValueError(f"profile device gpu {gpu!r} is not a GPU preset; valid: {', '.join(GPU_PRESETS)}")
        if "preset" not in self.model:
            raise ValueError("profile model section lacks 'preset'")
        self.model_preset()                            # the preset exists and trims

    # ---- what the profile describes ---------------------------------------------------------------
    def gpu_preset(self) -> GpuPreset:
        """The device as a GPU preset: the named preset, or the profile's own peaks."""
        gpu = self.device.get("gpu")
        if gpu is not None:
            return GPU_PRESETS[gpu]
        return GpuPreset(str(self.device["name"]), int(self.device.get("memory_bytes", 0)),
                         float(self.device["peak_bw"]), float(self.device["peak_flops"]),
                         str(self.device.get("peak_source", "measured by hybridkv profile")))

    def model_preset(self) -> ModelPreset:
        """The model the grid was measured with: the preset, trimmed as recorded, with the
        parameter counts of the weights the profiler built where recorded."""
        trim = Trim(**self.model.get("trim", {}))
        preset = trimmed_preset(get_preset(self.model["preset"]), trim)
        if "num_params" in self.model:
            preset = replace(preset, num_params=int(self.model["num_params"]),
                             active_params=int(self.model.get("active_params", self.model["num_params"])))
        return preset

    @property
    def label(self) -> str:
        """A short description: model on device."""
        return f"{self.model['preset']} on {self.device['name']}"

    @property
    def split_kv(self) -> bool:
        """Whether the measured decode kernel split a request's keys over several work units:
        ``method.split_kv`` when recorded, else whether the recorded decode kernels
        (``method.attention_kernels``) are split-KV ones, else True (what serving engines run)."""
        if "split_kv" in self.method:
            return bool(self.method["split_kv"])
        kernels = self.method.get("attention_kernels") or {}
        decode = [name for step, names in kernels.items() if step.startswith("1@") for name in names]
        return any("splitkv" in name.lower() for name in decode) if decode else True

    @property
    def fit_steps(self) -> tuple[str, ...] | None:
        """The grid steps the constants are fitted to (None: all of them)."""
        steps = self.fit.get("fit_steps")
        return tuple(steps) if steps is not None else None

    # ---- fitting ---------------------------------------------------------------------------------
    def refit(self, loo: bool = False, fit_steps: tuple[str, ...] | None = None) -> Profile:
        """This profile with ``calibration`` and ``fit`` recomputed from its grid and kernels.

        Args:
            loo: also the leave-one-out ratios of the fitted steps (one refit per step).
            fit_steps: fit to these grid steps only and hold the others out (default: the
                steps the profile's fit names, else every step).

        Raises:
            ValueError: a step of ``fit_steps`` that the grid does not hold.
        """
        model, gpu = self.model_preset(), self.gpu_preset()
        steps = fit_steps if fit_steps is not None else self.fit_steps
        if steps is not None:
            known = {p.step for p in self.points}
            missing = [s for s in steps if s not in known]
            if missing:
                raise ValueError(f"fit step(s) {', '.join(missing)} are not in the profile's grid")
        fitted = tuple(p for p in self.points if steps is None or p.step in steps)
        held = tuple(p for p in self.points if steps is not None and p.step not in steps)
        prior = Calibration(split_kv=self.split_kv)
        res = fit_calibration(model, gpu, fitted, self.kernels, prior=prior)
        err = np.abs(np.array(res.ratios) - 1.0)
        fit: dict[str, Any] = {"params": res.calibration.to_json(), "model_form": MODEL_FORM,
                               "points": len(fitted), "kernels": len(self.kernels),
                               "max_abs_error": float(err.max()), "mean_abs_error": float(err.mean()),
                               "ratios": list(res.ratios)}
        if steps is not None:
            fit["fit_steps"] = [p.step for p in fitted]
        if held:
            ratios = list(predict_points(model, gpu, res.calibration, held)
                          / np.array([p.median_s for p in held]))
            herr = np.abs(np.array(ratios) - 1.0)
            fit["held_out"] = {"steps": [p.step for p in held], "ratios": [float(r) for r in ratios],
                               "max_abs_error": float(herr.max()), "mean_abs_error": float(herr.mean()),
                               "within_10pct": int((herr <= 0.10).sum())}
        if loo and len(fitted) > 1:
            ratios = leave_one_out(model, gpu, fitted, prior=prior)
            lerr = np.abs(np.array(ratios) - 1.0)
            fit["loo"] = {"ratios": ratios, "max_abs_error": float(lerr.max()),
                          "mean_abs_error": float(lerr.mean())}
        return replace(self, calibration=res.calibration, fit=fit)

    # ---- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        fit = dict(self.fit)
        if self.calibration is not None:
            fit["params"] = self.calibration.to_json()
        return {"format": FORMAT, "version": VERSION, "device": self.device, "software": self.software,
                "model": self.model, "method": self.method,
                "grid": [p.to_json() for p in self.points],
                "kernels": [k.to_json() for k in self.kernels], "fit": fit,
                "transfer": self.transfer.to_json()}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Profile:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: not a profile, an unsupported version, or a bad section (named).
        """
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"not a hybridkv profile (need \"format\": \"{FORMAT}\")")
        if obj.get("version") != VERSION:
            raise ValueError(f"profile version {obj.get('version')!r} is not supported; this hybridkv "
                             f"reads version {VERSION}")
        for key in ("device", "model", "grid"):
            if key not in obj:
                raise ValueError(f"profile lacks its {key!r} section")
        fit = dict(obj.get("fit") or {})
        if fit.get("model_form", 1) != MODEL_FORM:     # constants of another model form: refit
            fit = {"fit_steps": fit["fit_steps"]} if "fit_steps" in fit else {}
        cal = Calibration.from_json(fit["params"]) if "params" in fit else None
        transfer = TransferModel.from_json(obj["transfer"]) if obj.get("transfer") else DEFAULT_TRANSFER
        return cls(device=dict(obj["device"]), model=dict(obj["model"]),
                   points=tuple(GridPoint.from_json(p) for p in obj["grid"]),
                   kernels=tuple(KernelPoint.from_json(k) for k in obj.get("kernels", ())),
                   calibration=cal, fit=fit, transfer=transfer,
                   software=dict(obj.get("software") or {}), method=dict(obj.get("method") or {}))

    def save(self, path: str | Path) -> None:
        """Write the profile as indented JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def load_profile(path: str | Path) -> Profile:
    """Read a profile file, fitting it when it carries no fitted constants.

    Raises:
        ValueError: one line naming the file and what is wrong with it.
    """
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read profile {str(p)!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile {str(p)!r} is not JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        prof = Profile.from_json(obj)
    except ValueError as exc:
        raise ValueError(f"profile {str(p)!r}: {exc}") from None
    return prof if prof.calibration is not None else prof.refit()


@lru_cache(maxsize=1)
def default_profile() -> Profile:
    """The shipped H100 profile (read once)."""
    return load_profile(DEFAULT_PROFILE_PATH)


def default_calibration(gpu: GpuPreset) -> tuple[Calibration, str]:
    """The calibration a GPU preset gets without a profile, and where it comes from.

    ``h100``: fitted to the shipped H100 measurements. Any other GPU: the same efficiencies
    and overheads on its own datasheet peaks (H200 has H100's compute die and faster memory;
    for other architectures this is an assumption until a profile is measured).
    """
    prof = default_profile()
    cal = prof.calibration
    assert cal is not None                           # the shipped file is fitted
    measured_on = prof.device.get("gpu")
    if gpu.name == measured_on:
        return cal, f"calibrated: fitted to {prof.fit['points']} steps measured on one {prof.device['name']}"
    return cal, (f"calibrated: efficiencies measured on {measured_on}, carried over to {gpu.name}'s "
                 f"datasheet peaks")


def cost_model(preset: ModelPreset, gpu: GpuPreset, num_gpus: int = 1, profile: Profile | None = None,
               kind: str = "calibrated", deployment: Deployment | None = None,
               ) -> CostModel | CalibratedCostModel | DeployedCostModel:
    """The step-time model a simulation uses.

    ``kind="roofline"``: the roofline (:class:`CostModel`) on ``gpu``. ``"calibrated"``
    (default): with a ``profile``, its fitted constants on the profile's device peaks;
    without, :func:`default_calibration` on ``gpu``'s peaks. With a ``deployment``
    (:class:`~hybridkv.cost.deployment.Deployment`) that communicates (``tp`` or ``ep`` > 1),
    the model is built for its group's GPUs and wrapped in
    :class:`~hybridkv.cost.comm.DeployedCostModel`, which adds the collectives; ``num_gpus``
    is then the deployment's ``tp``.

    Raises:
        ValueError: an unknown ``kind``, or a profile without fitted constants.
    """
    if deployment is not None and (deployment.tp > 1 or deployment.ep > 1):
        from hybridkv.cost.comm import DeployedCostModel
        inner = _compute_model(preset, gpu, deployment.group, profile, kind)
        return DeployedCostModel(inner, deployment)
    return _compute_model(preset, gpu, num_gpus, profile, kind)


def _compute_model(preset: ModelPreset, gpu: GpuPreset, num_gpus: int, profile: Profile | None,
                   kind: str) -> CostModel | CalibratedCostModel:
    """:func:`cost_model` without a deployment: the compute model on ``num_gpus`` GPUs."""
    if kind not in COST_MODELS:
        raise ValueError(f"unknown cost model {kind!r}; valid: {', '.join(COST_MODELS)}")
    if kind == "roofline":
        return CostModel(preset, gpu, num_gpus=num_gpus)
    if profile is not None:
        if profile.calibration is None:
            raise ValueError(f"profile {profile.label!r} has no fitted constants; refit it first")
        return CalibratedCostModel(preset, profile.gpu_preset(), profile.calibration, num_gpus,
                                   source=f"calibrated: profile of {profile.label}")
    cal, source = default_calibration(gpu)
    return CalibratedCostModel(preset, gpu, cal, num_gpus, source=source)


def _read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{str(path)!r} line {i} is not JSON: {exc.msg}") from None
    return rows


def copy_points_from_jsonl(path: str | Path) -> list[CopyPoint]:
    """Copy measurements in the published JSON-lines form: ``copy`` rows (``bytes``, ``h2d_s``,
    ``d2h_s``), ``pageable_h2d`` rows (``bytes``, ``GBps``) and ``scattered_h2d`` rows
    (``block_bytes``, ``blocks``, ``s``); other rows are ignored."""
    out: list[CopyPoint] = []
    for row in _read_jsonl(path):
        kind = row.get("kind")
        if kind == "copy":
            out += [CopyPoint("h2d", int(row["bytes"]), float(row["h2d_s"])),
                    CopyPoint("d2h", int(row["bytes"]), float(row["d2h_s"]))]
        elif kind == "pageable_h2d":
            out.append(CopyPoint("h2d", int(row["bytes"]), row["bytes"] / (row["GBps"] * 1e9), pinned=False))
        elif kind == "scattered_h2d":
            out.append(CopyPoint("h2d", int(row["block_bytes"]), float(row["s"]), copies=int(row["blocks"])))
    return out


@dataclass(frozen=True)
class MeasuredRun:
    """What ran when measurements were taken elsewhere (recorded in the profile).

    ``device_name``: the device as it named itself (non-empty); ``split_kv``: whether the
    decode kernel that ran splits a request's keys (recorded in the profile's ``method``);
    ``software``: versions (:func:`software_versions` and more); ``method``: how it measured.
    """

    device_name: str
    split_kv: bool = True
    software: dict[str, Any] = field(default_factory=dict)
    method: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.device_name, str) or not self.device_name:
            raise ValueError(f"MeasuredRun: device_name must be a non-empty str, got {self.device_name!r}")
        if not isinstance(self.split_kv, bool):
            raise ValueError(f"MeasuredRun: split_kv must be True or False, got {self.split_kv!r}")


def profile_from_measurements(steps: str | Path, preset: str, gpu: str, run: MeasuredRun,
                              transfer: str | Path | None = None, transfer_source: str = "") -> Profile:
    """A fitted profile from step times measured elsewhere by ``run``, in JSON lines:
    ``prefill`` / ``decode`` / ``mixed`` rows as :meth:`GridPoint.from_json` reads them, plus
    optional reference rows ``{"kind": "gemm8192", "tflops": x}`` and ``{"kind": "copy2GiB",
    "tb_s_read_plus_write": y}``. ``transfer``: copy rows (:func:`copy_points_from_jsonl`),
    described by ``transfer_source``.

    Raises:
        ValueError: an unknown GPU preset, a bad row, or no step row.
    """
    if gpu not in GPU_PRESETS:
        raise ValueError(f"unknown GPU preset {gpu!r}; valid GPUs: {', '.join(GPU_PRESETS)}")
    g = GPU_PRESETS[gpu]
    points, reference = [], {}
    for row in _read_jsonl(steps):
        kind = row.get("kind")
        if kind in ("prefill", "decode", "mixed"):
            points.append(GridPoint.from_json(row))
        elif kind == "gemm8192":
            reference["gemm_flops_s"] = float(row["tflops"]) * 1e12
        elif kind == "copy2GiB":
            reference["copy_bytes_s"] = float(row["tb_s_read_plus_write"]) * 1e12
    if not points:
        raise ValueError(f"{str(steps)!r} holds no prefill, decode or mixed row")
    tm = (fit_transfer(copy_points_from_jsonl(transfer), transfer_source) if transfer is not None
          else DEFAULT_TRANSFER)
    device = {"name": run.device_name, "kind": "cuda", "gpu": gpu, "memory_bytes": g.memory_bytes,
              "peak_flops": g.flops, "peak_bw": g.mem_bw, "peak_source": g.source, "reference": reference}
    prof = Profile(device=device, model={"preset": preset, "trim": Trim().to_json()},
                   points=tuple(points), transfer=tm, software=dict(run.software),
                   method={**run.method, "split_kv": run.split_kv})
    return prof.refit(loo=True)


def software_versions() -> dict[str, Any]:
    """Python, numpy and hybridkv versions (the profiler adds torch and CUDA)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        own = version("hybridkv")
    except PackageNotFoundError:
        own = "unknown"
    return {"python": platform.python_version(), "numpy": np.__version__, "hybridkv": own,
            "platform": platform.platform()}
