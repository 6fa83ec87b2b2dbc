"""Fixtures for the engine tests: tiny transformers models saved to disk and reloaded by the engine."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch  # noqa: E402

from tests.engine.helpers import ARCHS, Built, build  # noqa: E402

# The models are tiny: intra-op threads only add synchronisation, and on a loaded 2-core machine
# their spin-waits make each small matmul ~50x slower. One thread keeps the suite fast and stable.
torch.set_num_threads(1)

def pytest_report_header() -> str:
    """The oracle's version and whether it lies in the range the engine claims (a run outside it
    is a measurement, not a proof of that claim)."""
    import transformers

    from hybridkv.engine.versions import in_tested_range, range_text

    where = "in" if in_tested_range(transformers.__version__) else "OUTSIDE"
    return f"engine oracle: transformers {transformers.__version__} ({where} the tested range {range_text()})"


SLIDING_ARCHS = ("qwen2_swa", "qwen3_swa", "mistral", "gemma3", "gpt_oss")


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


@pytest.fixture(scope="session")
def drafter_dirs(tmp_path_factory: pytest.TempPathFactory, built_models: dict[str, Built]):
    """``get(arch_name, kind)``: a drafter directory for that target, built once per session.

    kinds: ``"small"`` (a 1-layer Llama with the shared vocabulary, random weights),
    ``"copy"`` (the target's own checkpoint: every draft is accepted), ``"dflash"`` (a random
    DFlash drafter reading the target's first and last layers, block size 5).
    """
    from hybridkv.engine import load_model_config
    from hybridkv.engine.checkpoints import DFlashShape, dflash_config, random_dflash
    from tests.engine.helpers import SMALL_DRAFT

    made: dict[tuple[str, str], object] = {}

    def get(name: str, kind: str):
        key = (name, kind)
        if key not in made:
            if kind == "copy":
                made[key] = built_models[name].path
            elif kind == "small":
                made[key] = build(SMALL_DRAFT, tmp_path_factory.mktemp("small"), seed=5).path
            elif kind == "dflash":
                target = load_model_config(built_models[name].path)
                cfg = dflash_config(target, DFlashShape(num_layers=2, block_size=5,
                                                        target_layer_ids=(0, target.num_hidden_layers - 1)))
                made[key] = random_dflash(tmp_path_factory.mktemp(f"dflash_{name}"), cfg, seed=3)
            else:
                raise KeyError(kind)
        return made[key]

    return get
