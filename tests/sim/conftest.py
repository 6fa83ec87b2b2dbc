"""Shared fixtures for the simulator tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hybridkv.sim.traffic.traces import BUNDLED_TRACES

TRACE_DIR = Path(__file__).resolve().parents[2] / "src" / "hybridkv" / "sim" / "traffic" / "data"
"""The bundled Mooncake traces, inside the repository (``mooncake_<name>.jsonl.xz``)."""


@pytest.fixture(scope="session")
def trace_dir() -> Path:
    """The folder of the bundled traces. A missing file skips locally and fails under CI=true
    (CI must never pass by skipping the real-trace tests)."""
    missing = [t.file for t in BUNDLED_TRACES.values() if not (TRACE_DIR / t.file).is_file()]
    if missing:
        message = f"bundled traces missing from {TRACE_DIR}: {', '.join(missing)}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return TRACE_DIR
