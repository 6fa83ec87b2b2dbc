"""Shared fixtures for the simulator tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _trace_dir() -> Path | None:
    """The Mooncake trace folder: $HYBRIDKV_TRACES, <repo>/../shared/traces, <repo>/shared/traces
    or /work/shared/traces."""
    repo = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("HYBRIDKV_TRACES"), repo.parent / "shared" / "traces",
                  repo / "shared" / "traces", "/work/shared/traces"]
    for c in candidates:
        if c and (Path(c) / "mooncake_conversation.jsonl").is_file():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def trace_dir() -> Path:
    d = _trace_dir()
    if d is None:
        pytest.skip("Mooncake traces not found (set HYBRIDKV_TRACES)")
    return d
