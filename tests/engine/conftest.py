"""Fixtures for the engine tests: tiny transformers models saved to disk and reloaded by the engine."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.engine.helpers import ARCHS, Built, build  # noqa: E402

SLIDING_ARCHS = ("qwen2_swa", "qwen3_swa", "mistral")


@pytest.fixture(scope="session")
def built_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Built]:
    """Every architecture in :data:`ARCHS`, built once per session."""
    return {name: build(arch, tmp_path_factory.mktemp(name)) for name, arch in ARCHS.items()}


@pytest.fixture(params=list(ARCHS))
def built(request: pytest.FixtureRequest, built_models: dict[str, Built]) -> Built:
    return built_models[request.param]


@pytest.fixture(params=SLIDING_ARCHS)
def built_sliding(request: pytest.FixtureRequest, built_models: dict[str, Built]) -> Built:
    return built_models[request.param]
