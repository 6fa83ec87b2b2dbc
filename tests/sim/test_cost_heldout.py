"""The calibrated model held out on GPU profiles: fitted to a profile's shared-grid steps,
predicting its other steps (``benchmarks/costmodel_heldout.py``, protocol (b)).

``benchmarks/data`` holds profiles measured by ``hybridkv profile`` on lent GPUs (its README
says how). The shared grid is the 24 steps the shipped calibration is fitted to; the shipped
calibration is this fit on the H100 profile, so for that profile protocol (a), the shipped
constants as they are, is protocol (b).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from hybridkv.cost.calibrated import Calibration
from hybridkv.cost.calibration_fit import held_out, predict_points
from hybridkv.cost.presets import get_gpu
from hybridkv.cost.profile import default_calibration, default_profile, load_profile

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
H100_PROFILE = DATA / "h100-llama-3.1-8b.profile.json"
H200_PROFILE = DATA / "h200-llama-3.1-8b.profile.json"


def _held_out(path: Path):
    prof = load_profile(path)
    return held_out(prof.model_preset(), prof.gpu_preset(), prof.points, set(default_profile().fit_steps),
                    prior=Calibration(split_kv=prof.split_kv))


@pytest.fixture(scope="module")
def h100():
    return _held_out(H100_PROFILE)


def test_the_h100_profile_repeats_the_shared_grid(h100) -> None:
    assert len(h100.fit) == 24 and len(h100.test) == 51
    assert max(abs(r - 1) for r in h100.fit_ratios) < 0.05            # the fit itself
    kinds = [p.kind for p in h100.test]
    assert (kinds.count("prefill"), kinds.count("decode"), kinds.count("mixed")) == (18, 18, 15)
    assert load_profile(H100_PROFILE).split_kv          # its recorded decode kernel is split-KV


def test_refit_on_the_shared_grid_predicts_every_other_h100_step_within_10_percent(h100) -> None:
    """The acceptance test of the model: every held-out step of the H100 profile within 10 %
    (mixed steps, prefill chunks after 16k-31k cached tokens, batch-1 decodes up to 32k,
    decode batches up to 512 included)."""
    misses = [(p.step, round(r - 1, 3)) for p, r in zip(h100.test, h100.test_ratios) if abs(r - 1) > 0.10]
    assert misses == []
    assert np.mean(np.abs(np.array(h100.test_ratios) - 1)) < 0.04


def test_the_shipped_default_is_that_fit(h100) -> None:
    """Protocol (a) is protocol (b) on this profile: the shipped constants are the fit to its 24
    shared-grid steps, and never saw the other 51."""
    cal, source = default_calibration(get_gpu("h100"))
    shipped = default_profile()
    assert "fitted to 24 steps measured on one NVIDIA H100" in source
    for name in Calibration.scalar_names():
        assert getattr(cal, name) == pytest.approx(getattr(h100.calibration, name), rel=1e-6), name
    assert shipped.fit["held_out"]["ratios"] == pytest.approx(list(h100.test_ratios), rel=1e-6)


def test_h200_profile_has_a_few_shared_grid_steps() -> None:
    """The H200 run measured the default grid only: 6 shared-grid steps, too few to pin the
    constants (the benchmark reports its (b) result with that caveat)."""
    res = _held_out(H200_PROFILE)
    assert len(res.fit) == 6 and len(res.test) == 51
    assert load_profile(H200_PROFILE).gpu_preset().name == "h200"


def test_held_out_recovers_a_model_it_generated() -> None:
    shipped = default_profile()
    model, gpu = shipped.model_preset(), shipped.gpu_preset()
    pts = list(shipped.points)
    pts = [dataclasses.replace(p, median_s=float(t)) for p, t in
           zip(pts, predict_points(model, gpu, shipped.calibration, pts))]
    fit = {p.step for p in pts[::2]}
    res = held_out(model, gpu, pts, fit)
    assert {p.step for p in res.fit} == fit and len(res.test) == len(pts) - len(fit)
    assert max(abs(r - 1) for r in res.test_ratios) < 0.02
    with pytest.raises(ValueError, match="needs steps on both sides; got 75 to fit and 0 to predict"):
        held_out(model, gpu, pts, {p.step for p in pts})
