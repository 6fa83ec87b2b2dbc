"""The calibrated model against the shared H100 reference steps, the shipped profile, the
copy-time model, the profile file.

The 24 reference steps (and the copies) are kept as test data in ``tests/data``; the
``calibration_dir`` fixture finds the original measurement folder when this checkout has one
(and checks the copy against it), and skips with the reason when it does not. The reference's
decode kernel did not split a request's keys (its batch-1 decode at 8k context took 2.95 ms
more than at 1k; the split-KV decode of the shipped profile's run, 0.47 ms more), so the
model's form is judged on it with ``split_kv=False``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from hybridkv.cost.calibrated import Calibration
from hybridkv.cost.calibration_fit import fit_calibration, leave_one_out
from hybridkv.cost.costmodel import CostModel
from hybridkv.cost.grid import GridPoint
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.cost.profile import (DEFAULT_PROFILE_PATH, copy_points_from_jsonl, cost_model,
                                  default_calibration, default_profile, load_profile)
from hybridkv.cost.transfer import DEFAULT_TRANSFER, CopyPoint, TransferModel, fit_transfer
from tests.support.fits import assert_same_fit

DATA = Path(__file__).resolve().parents[1] / "data"
STEPS = DATA / "h100-llama-3.1-8b.jsonl"
H100_PROFILE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-llama-3.1-8b.profile.json"
COPIES = DATA / "h100-pcie.jsonl"
H100 = get_gpu("h100")
LLAMA = get_preset("llama-3.1-8b")


def _points(path: Path) -> list[GridPoint]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [GridPoint.from_json(r) for r in rows if r["kind"] in ("prefill", "decode")]


@pytest.fixture(scope="module")
def calibration_dir() -> Path:
    """The folder of the original H100 measurements, found beside the checkout."""
    for parent in Path(__file__).resolve().parents:
        cand = parent.parent / "shared" / "calibration"
        if (cand / STEPS.name).is_file():
            return cand
    pytest.skip("the original H100 measurement folder (shared/calibration beside the checkout) is "
                "not here; the copy in tests/data is tested instead")


def test_test_data_is_the_measurement(calibration_dir: Path) -> None:
    assert (calibration_dir / STEPS.name).read_text() == STEPS.read_text()
    assert (calibration_dir / COPIES.name).read_text() == COPIES.read_text()


def test_model_form_leave_one_out_on_the_reference_is_within_10_percent() -> None:
    """Each reference step predicted by the model fitted to the other 23 (24 fits, about a
    second): the form, with the reference's unsplit decode kernel, within 10 % of every step."""
    points = _points(STEPS)
    ratios = leave_one_out(LLAMA, H100, points, prior=Calibration(split_kv=False))
    assert len(ratios) == 24
    err = np.abs(np.array(ratios) - 1)
    assert err.max() < 0.10 and err.mean() < 0.04
    # A kernel that splits cannot reproduce the reference's slow batch-1 decode at 8k, even
    # fitted to all 24 steps: the kernel, not the fit, is what split_kv says.
    split = fit_calibration(LLAMA, H100, points).ratios
    assert split[[p.step for p in points].index("1@8192")] < 0.85


def test_the_shipped_default_on_the_reference_steps() -> None:
    """The shipped default (fitted to another run of this grid, with split-KV decode) predicts
    the reference directly: mean error 7.2 %, 18 of 24 within 10 %, its worst the batch-1
    decode at 8k (-23 %: the reference's kernel did not split); the roofline's mean is 14.8 %."""
    points = _points(STEPS)
    model = cost_model(LLAMA, H100)
    assert model.kind == "calibrated" and "fitted to 24 steps" in model.source
    ratios = {p.step: model.step_time(p.work()) / p.median_s for p in points}
    err = np.abs(np.array(list(ratios.values())) - 1)
    roof = CostModel(LLAMA, H100)
    roof_err = np.abs(np.array([roof.step_time(p.work()) / p.median_s for p in points]) - 1)
    assert err.mean() < 0.10 < roof_err.mean()
    assert min(ratios, key=ratios.get) == "1@8192" and ratios["1@8192"] < 0.85
    assert sorted(err)[-2] < 0.20                  # every other step: the two runs' harness offset


def test_shipped_profile_is_the_h100_measurement_fitted_to_the_reference_grid() -> None:
    prof = default_profile()
    measured = load_profile(H100_PROFILE)
    assert [(p.step, p.median_s) for p in prof.points] == [(p.step, p.median_s) for p in measured.points]
    assert prof.fit_steps == tuple(p.step for p in measured.points if p.step in {q.step for q in _points(STEPS)})
    assert sorted(prof.fit_steps) == sorted(p.step for p in _points(STEPS))
    assert prof.split_kv and prof.calibration.split_kv and prof.software["torch"] == "2.11.0+cu130"
    held = prof.fit["held_out"]
    assert len(held["steps"]) == 51 and set(held["steps"]).isdisjoint(prof.fit_steps)
    assert held["max_abs_error"] < 0.10 and held["within_10pct"] == 51
    assert prof.fit["loo"]["max_abs_error"] < 0.10
    again = prof.refit()                           # keeps to the recorded fit steps
    assert again.fit_steps == prof.fit_steps
    assert_same_fit(again.calibration, prof.calibration)
    with pytest.raises(ValueError, match="fit step.s. 3@3 are not in the profile's grid"):
        prof.refit(fit_steps=("3@3",))


def test_other_gpus_carry_the_h100_efficiencies_over() -> None:
    cal, src = default_calibration(H100)
    cal2, src2 = default_calibration(get_gpu("h200"))
    assert cal2 == cal and "carried over to h200" in src2 and "fitted" in src
    h200 = cost_model(LLAMA, get_gpu("h200"))
    work = [(1, 4096)] * 32                       # decode: memory-bound, H200 is faster
    assert h200.step_time(work) < cost_model(LLAMA, H100).step_time(work)


def test_cost_model_kinds() -> None:
    assert isinstance(cost_model(LLAMA, H100, kind="roofline"), CostModel)
    with pytest.raises(ValueError, match="unknown cost model 'exact'; valid: calibrated, roofline"):
        cost_model(LLAMA, H100, kind="exact")


# ---- copies ---------------------------------------------------------------------------------------


def test_default_copy_times_match_the_measured_copies() -> None:
    t = DEFAULT_TRANSFER
    assert "measured on one H100 SXM machine" in t.source
    assert t.h2d_bw == pytest.approx(55e9, rel=0.01) and t.d2h_bw == pytest.approx(55e9, rel=0.01)
    assert t.per_copy_s == pytest.approx(13.3e-6, rel=0.05)
    assert (1 << 20) / t.copy_time(1 << 20) == pytest.approx(46e9, rel=0.03)       # 46 GB/s at 1 MiB
    for p in copy_points_from_jsonl(COPIES):
        if p.bytes >= (1 << 20) or p.copies > 1:       # below 1 MiB a single copy is latency noise
            assert t.copy_time(p.bytes, p.copies, p.direction, p.pinned) == pytest.approx(p.seconds, rel=0.03)
    # latency-bound below ~256 KiB: a 64 KiB block costs about what a 256 KiB block costs
    assert t.copy_time(64 << 10, 100) == t.copy_time(256 << 10, 100)
    assert t.copy_time(4 << 20, 100) > 3 * t.copy_time(256 << 10, 100)


def test_copy_model_checks_its_input() -> None:
    with pytest.raises(ValueError, match="direction must be 'h2d' or 'd2h'"):
        DEFAULT_TRANSFER.copy_time(10, direction="up")
    with pytest.raises(ValueError, match="pageable copies are measured host-to-device only"):
        DEFAULT_TRANSFER.copy_time(10, direction="d2h", pinned=False)
    with pytest.raises(ValueError, match="no pinned d2h copy of at least 64 MiB"):
        fit_transfer([CopyPoint("h2d", 1 << 27, 0.003)], "x")
    assert TransferModel.from_json(DEFAULT_TRANSFER.to_json()) == DEFAULT_TRANSFER


# ---- the profile file -----------------------------------------------------------------------------


def test_profile_round_trips_through_its_file(tmp_path: Path) -> None:
    prof = default_profile()
    path = tmp_path / "p.json"
    prof.save(path)
    back = load_profile(path)
    assert back.calibration == prof.calibration and back.points == prof.points
    assert back.transfer == prof.transfer and back.device == prof.device


def test_profile_without_constants_is_fitted_on_load(tmp_path: Path) -> None:
    obj = default_profile().to_json()
    del obj["fit"]
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(obj))
    assert load_profile(path).calibration is not None


def test_fit_of_an_older_model_form_is_redone_on_load(tmp_path: Path) -> None:
    obj = default_profile().to_json()
    params = obj["fit"]["params"]
    obj["fit"] = {"params": {**{k: v for k, v in params.items() if k not in ("eager_host_s", "host_overlap")},
                             "eager_overhead_s": 0.0014},          # no model_form: the first form
                  "fit_steps": obj["fit"]["fit_steps"]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(obj))
    prof = load_profile(path)
    assert_same_fit(prof.calibration, default_profile().calibration)
    assert prof.fit["model_form"] == 3
    assert prof.fit_steps == default_profile().fit_steps     # refitted to the same steps


@pytest.mark.parametrize("edit, words", [
    (lambda o: o.update(format="other"), "not a hybridkv profile"),
    (lambda o: o.update(version=99), "profile version 99 is not supported"),
    (lambda o: o.pop("grid"), "lacks its 'grid' section"),
    (lambda o: o["device"].update(gpu="tpu"), "device gpu 'tpu' is not a GPU preset"),
    (lambda o: o["model"].update(preset="gpt-9"), "unknown model preset 'gpt-9'"),
    (lambda o: o["grid"][0].pop("context"), "lacks field 'context'"),
    (lambda o: o["fit"]["params"].update(gemm_efficiency=3.0), "gemm_efficiency must be in"),
])
def test_bad_profile_is_one_line_naming_the_file(tmp_path: Path, edit, words) -> None:
    obj = json.loads(DEFAULT_PROFILE_PATH.read_text())
    edit(obj)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ValueError) as err:
        load_profile(path)
    assert words in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_unreadable_profile_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read profile"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        load_profile(tmp_path / "x.json")


def test_a_profile_times_the_simulation() -> None:
    from hybridkv.sim.simulator import SimConfig, Simulator
    from hybridkv.sim.traffic.workitems import items_from_trace
    from hybridkv.sim.traffic.workloads import get_workload
    items = items_from_trace(get_workload("chat", seed=0))[:40]
    base = SimConfig(LLAMA, H100, num_blocks=4000, optimum=False)
    slow = dataclasses.replace(default_profile(), calibration=dataclasses.replace(
        default_profile().calibration, gemm_efficiency=0.2))
    runs = {name: Simulator(cfg).run(items) for name, cfg in (
        ("calibrated", base), ("roofline", dataclasses.replace(base, cost_model="roofline")),
        ("slow", dataclasses.replace(base, profile=slow)))}
    assert "fitted to 24 steps" in runs["calibrated"].config["cost_model"]
    assert runs["roofline"].config["cost_model"].startswith("roofline")
    assert "profile of llama-3.1-8b" in runs["slow"].config["cost_model"]
    assert runs["slow"].makespan_s > runs["calibrated"].makespan_s
    assert runs["roofline"].makespan_s != runs["calibrated"].makespan_s


# ---- the evaluation scripts (benchmarks/) ----------------------------------------------------------


def _script(name: str):
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gpu_like_profile(tmp_path: Path, scale: dict[str, float], offset: float = 1.0) -> Path:
    """A profile of the 24 shared-grid steps as the shipped run measured them plus new steps
    'measured' as the shipped calibration predicts them, times ``scale[kind]``; every time
    times ``offset`` (a harness that is uniformly slower)."""
    from hybridkv.cost.calibration_fit import predict_points
    shipped = default_profile()
    grid = [GridPoint.from_step(s) for s in ("2048@6144,1@1024x48", "8192@20480", "1@4096x96",
                                             "384@0,1@1024x24", "1@20480x6", "5120@0")]
    assert not {p.step for p in grid} & {p.step for p in shipped.points}
    times = predict_points(LLAMA, H100, shipped.calibration, grid)
    pts = [dataclasses.replace(p, median_s=float(t) * scale.get(p.kind, 1.0) * offset, min_s=float(t))
           for p, t in zip(grid, times)]
    pts += [dataclasses.replace(p, median_s=p.median_s * offset) for p in shipped.points
            if p.step in shipped.fit_steps]
    prof = dataclasses.replace(shipped, points=tuple(pts), kernels=(), fit={})
    path = tmp_path / "gpu.json"
    prof.refit().save(path)
    return path


def test_heldout_script_passes_a_profile_the_model_predicts(tmp_path: Path, capsys) -> None:
    path = _gpu_like_profile(tmp_path, {})
    assert _script("costmodel_heldout").main([str(path), "--json", str(tmp_path / "o.json")]) == 0
    text = capsys.readouterr().out
    assert "verdict (a): PASS: 6 steps" in text and "verdict (b): PASS: 6 steps" in text
    assert "refit on this profile's 24 shared-grid steps" in text
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["a"]["run_offset"]["steps"] == 24 and out["a"]["run_offset"]["max"] == pytest.approx(1.0)
    assert out["b"]["summary"]["mixed"]["steps"] == 2
    assert out["b"]["summary"]["long-context prefill (>= 16k)"]["steps"] == 1


def test_heldout_script_fails_when_a_held_out_kind_is_off(tmp_path: Path, capsys) -> None:
    path = _gpu_like_profile(tmp_path, {"mixed": 1.25})
    assert _script("costmodel_heldout").main([str(path), "--quiet"]) == 1
    text = capsys.readouterr().out
    assert "verdict (a): FAIL: 2 of 6 steps" in text and "verdict (b): FAIL: 2 of 6 steps" in text
    assert "2048@6144,1@1024x48 -20.0%" in text


def test_heldout_script_separates_a_harness_offset_from_model_error(tmp_path: Path, capsys) -> None:
    # Every step 20 % slower (another harness): the shipped model misses every new step, but
    # the model refitted to the same harness's shared-grid steps predicts them all.
    path = _gpu_like_profile(tmp_path, {}, offset=1.2)
    assert _script("costmodel_heldout").main([str(path), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "verdict (a): FAIL: 6 of 6 steps" in text and "verdict (b): PASS" in text
    assert "this run / shipped run on the 24 repeated steps: mean +20.0%" in text


def test_accuracy_script_reports_old_and_new_error(capsys) -> None:
    assert _script("costmodel_accuracy").main([]) == 0
    text = capsys.readouterr().out
    assert "roofline (mfu 0.5, mbu 0.8, 2 ms)" in text and "calibrated, leave-one-out" in text
