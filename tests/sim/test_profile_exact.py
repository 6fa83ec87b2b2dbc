"""Profile files, exactly: copy rows to copy points (units), the decode kernel's split-KV from
its recorded names, a device without a GPU preset priced at its own measured peaks, and a
profile's cost model on the profile's device whatever ``--gpu`` says."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.cost.profile import (MeasuredRun, copy_points_from_jsonl, cost_model, default_profile,
                                  profile_from_measurements)
from hybridkv.cost.transfer import CopyPoint


def test_copy_rows_become_copy_points_in_bytes_and_seconds(tmp_path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"kind": "copy", "bytes": 1048576, "h2d_s": 2e-5, "d2h_s": 3e-5},
        {"kind": "pageable_h2d", "bytes": 268435456, "GBps": 17.0},
        {"kind": "scattered_h2d", "block_bytes": 65536, "blocks": 1024, "s": 0.0135},
        {"kind": "gemm8192", "tflops": 700},
    ]) + "\n")
    assert copy_points_from_jsonl(path) == [
        CopyPoint("h2d", 1048576, 2e-5), CopyPoint("d2h", 1048576, 3e-5),
        CopyPoint("h2d", 268435456, 268435456 / 17e9, pinned=False),
        CopyPoint("h2d", 65536, 0.0135, copies=1024)]


@pytest.mark.parametrize("method, split", [
    ({"attention_kernels": {"1@1024x8": ["flash_fwd_splitkv_kernel<...>"], "2048@0": ["flash_fwd"]}}, True),
    ({"attention_kernels": {"1@1024x8": ["flash_fwd_kernel<...>"], "2048@0": ["flash_fwd_splitkv"]}}, False),
    ({"attention_kernels": {"2048@0": ["flash_fwd"]}}, True),          # no decode recorded
    ({}, True),
    ({"split_kv": False, "attention_kernels": {"1@64": ["flash_fwd_splitkv"]}}, False),   # recorded wins
])
def test_split_kv_comes_from_the_decode_kernels_names(method, split) -> None:
    prof = dataclasses.replace(default_profile(), method=method)
    assert prof.split_kv is split


def test_a_device_without_a_gpu_preset_is_priced_at_its_measured_peaks() -> None:
    base = default_profile()
    device = {**base.device, "gpu": None, "name": "my accelerator", "peak_flops": 1.25e14,
              "peak_bw": 2.5e12, "memory_bytes": 48 * 2**30}
    prof = dataclasses.replace(base, device=device)
    gpu = prof.gpu_preset()
    assert (gpu.name, gpu.flops, gpu.mem_bw, gpu.memory_bytes) == ("my accelerator", 1.25e14, 2.5e12, 48 * 2**30)
    # the profile's cost model runs on those peaks, whatever GPU the caller names
    model = cost_model(get_preset("llama-3.1-8b"), get_gpu("b200"), 2, prof)
    assert model.gpu == gpu and model.calibration == base.calibration and model.num_gpus == 2
    assert model.source == "calibrated: profile of llama-3.1-8b on my accelerator"


def test_measured_run_record_and_the_checks_before_the_fit(tmp_path) -> None:
    """MeasuredRun: defaults, refused values, frozen; profile_from_measurements checks the GPU
    preset and the step rows before it fits anything."""
    run = MeasuredRun("NVIDIA H100 80GB HBM3")
    assert (run.split_kv, run.software, run.method) == (True, {}, {})
    with pytest.raises(ValueError) as exc:
        MeasuredRun("")
    assert str(exc.value) == "MeasuredRun: device_name must be a non-empty str, got ''"
    with pytest.raises(ValueError) as exc:
        MeasuredRun("gpu", split_kv=1)  # type: ignore[arg-type]
    assert str(exc.value) == "MeasuredRun: split_kv must be True or False, got 1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.split_kv = False  # type: ignore[misc]
    steps = tmp_path / "steps.jsonl"
    steps.write_text(json.dumps({"kind": "gemm8192", "tflops": 700.0}) + "\n")
    with pytest.raises(ValueError, match=r"^unknown GPU preset 'h1000'; valid GPUs: "):
        profile_from_measurements(steps, "llama-3.1-8b", "h1000", run)
    with pytest.raises(ValueError) as exc:
        profile_from_measurements(steps, "llama-3.1-8b", "h100", run)
    assert str(exc.value) == f"{str(steps)!r} holds no prefill, decode or mixed row"
