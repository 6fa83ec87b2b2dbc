"""The tested transformers range: one source (``hybridkv.engine.versions``), declared in
pyproject.toml, and a one-line warning naming it for a checkpoint or tokenizer outside it."""

from __future__ import annotations

import json
import re
import tomllib
import warnings
from pathlib import Path

import pytest

from hybridkv.engine import load_model_config
from hybridkv.engine import versions
from hybridkv.engine.versions import TESTED_TRANSFORMERS, UntestedTransformersWarning, in_tested_range, range_text
from tests.engine.helpers import Built

ROOT = Path(__file__).resolve().parents[2]


def test_range_ends_and_parsing() -> None:
    low, high = TESTED_TRANSFORMERS
    assert in_tested_range(low) and in_tested_range(high)
    assert in_tested_range(high.rsplit(".", 1)[0] + ".9")            # a patch of the newest minor
    assert not in_tested_range("4.57.5") and not in_tested_range("5.25.0")
    assert in_tested_range("5.0.0.dev0") and not in_tested_range("4.55.0.dev0")
    assert not in_tested_range("nightly")
    assert range_text() == ">=4.57.6,<5.25"


def test_pyproject_declares_the_tested_range() -> None:
    """Both extras that install transformers pin exactly the range CI tests."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra in ("engine", "test"):
        reqs = [r for r in project["optional-dependencies"][extra] if r.startswith("transformers")]
        assert reqs == [f"transformers{range_text()}"], (extra, reqs)


def test_ci_runs_the_oldest_end() -> None:
    """.ci/run runs the engine suite in a venv with the oldest supported transformers, the
    version read from :data:`TESTED_TRANSFORMERS` (the newest is the main environment's)."""
    script = (ROOT / ".ci" / "run").read_text()
    assert "TESTED_TRANSFORMERS[0]" in script and '"transformers==$OLDEST"' in script
    assert re.search(r'"\$VENV/bin/python" -m pytest [^\n]*tests/engine\n', script)


def _checkpoint(tmp_path: Path, built: Built, version: str | None) -> Path:
    raw = json.loads((built.path / "config.json").read_text())
    if version is None:
        raw.pop("transformers_version", None)
    else:
        raw["transformers_version"] = version
    out = tmp_path / f"ckpt-{version}"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(raw))
    return out


def test_outside_range_warns_once_in_one_line(tmp_path: Path, built_models: dict[str, Built],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "_warned", set())
    old = _checkpoint(tmp_path, built_models["llama"], "4.40.0")
    with pytest.warns(UntestedTransformersWarning) as record:
        load_model_config(old)
        load_model_config(old)
    assert len(record) == 1
    msg = str(record[0].message)
    assert "\n" not in msg and "4.40.0" in msg and "transformers>=4.57.6,<5.25" in msg
    assert re.search(r"checkpoint 'ckpt-4.40.0' was written by transformers 4.40.0", msg)


@pytest.mark.parametrize("version", [None, TESTED_TRANSFORMERS[0], TESTED_TRANSFORMERS[1]])
def test_inside_range_is_silent(tmp_path: Path, built_models: dict[str, Built], version: str | None,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "_warned", set())
    path = _checkpoint(tmp_path, built_models["gpt_oss"], version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model_config(path).model_type == "gpt_oss"


def test_installed_transformers_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "_warned", set())
    with pytest.warns(UntestedTransformersWarning, match="installed transformers 4.45.0, outside"):
        versions.check_installed_transformers("4.45.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        versions.check_installed_transformers(TESTED_TRANSFORMERS[1])
