"""config.json parsing, checkpoint loading and the no-transformers import guarantee."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.helpers import Built
from hybridkv.engine import load_model, load_model_config, parse_model_config
from hybridkv.engine.kv_groups import make_kv_cache_config
from hybridkv.engine.llm_options import RequestParams

BASE = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
            num_attention_heads=2)


def test_qwen2_layer_pattern_matches_transformers() -> None:
    """``max_window_layers`` without ``layer_types``: layers >= max_window_layers slide,
    exactly as Qwen2Config derives ``layer_types``."""
    from transformers import Qwen2Config

    kw = dict(BASE, use_sliding_window=True, sliding_window=5, max_window_layers=4)
    hf = Qwen2Config(**kw)
    ours = parse_model_config(dict(kw, model_type="qwen2"))
    assert [{"full": "full_attention", "sliding": "sliding_attention"}[k] for k in ours.layer_kinds] \
        == hf.layer_types
    assert ours.sliding_window == 5
    off = parse_model_config(dict(kw, model_type="qwen2", use_sliding_window=False))
    assert off.layer_kinds == ("full",) * 6 and off.sliding_window is None


def test_legacy_rope_fields() -> None:
    """transformers 4.x configs keep ``rope_theta`` and ``rope_scaling`` at top level."""
    cfg = parse_model_config(dict(BASE, model_type="llama", rope_theta=5e5,
                                     rope_scaling={"type": "linear", "factor": 2.0}))
    assert (cfg.rope.rope_type, cfg.rope.theta, cfg.rope.params) == ("linear", 5e5, {"factor": 2.0})


@pytest.mark.parametrize("raw, match", [
    (dict(BASE, model_type="gpt2"), "unknown model_type 'gpt2'; valid: llama, qwen2"),
    (dict(BASE, model_type="llama", hidden_act="gelu"), "only 'silu'"),
    (dict(BASE, model_type="deepseek_v3", kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4,
          v_head_dim=4, first_k_dense_replace=1), "MoE layers are not implemented"),
    (dict(BASE, model_type="qwen2", layer_types=["chunked_attention"] * 6), "unsupported layer type"),
])
def test_unsupported_configs_raise(raw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_model_config(raw)


def test_loader_rejects_mismatched_checkpoint(built_models: dict[str, Built], tmp_path: Path) -> None:
    src = built_models["qwen2_swa"].path
    raw = json.loads((src / "config.json").read_text())
    raw["model_type"] = "llama"  # llama has no q/k/v biases: the checkpoint has unexpected keys
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected"):
        load_model(tmp_path)


def test_tied_embeddings_and_dtype(built_models: dict[str, Built]) -> None:
    built = built_models["llama"]
    assert load_model_config(built.path).tie_word_embeddings
    model = load_model(built.path, dtype=torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.dtype == torch.bfloat16
    assert model.rotary.inv_freq.dtype == torch.float32  # RoPE frequencies are never rounded


def test_kv_cache_config_from_model(built_models: dict[str, Built]) -> None:
    model = built_models["qwen2_swa"].model
    cfg = make_kv_cache_config(model, {"full": 16, "sliding": 8}, num_blocks=12)
    assert [(g.name, g.layer_names) for g in cfg.groups] == [
        ("full_attention", ("model.layers.0.self_attn", "model.layers.3.self_attn")),
        ("sliding_attention", ("model.layers.1.self_attn", "model.layers.2.self_attn")),
    ]
    assert cfg.groups[1].spec.window == 12 and cfg.alignment == 16
    mla = make_kv_cache_config(built_models["deepseek"].model, 8, num_blocks=4)
    assert mla.groups[0].spec.latent_dim == 32 + 8
    with pytest.raises(ValueError, match="no block size for 'sliding'"):
        make_kv_cache_config(model, {"full": 16}, num_blocks=12)


def test_cache_spec_mismatch_is_rejected(built_models: dict[str, Built]) -> None:
    from hybridkv.engine import PagedKVCache, SequenceInput

    model = built_models["qwen2_swa"].model
    wrong = make_kv_cache_config(built_models["mistral"].model, 4, num_blocks=8)
    with pytest.raises(ValueError, match="the KV cache has no layer|needs a"):
        model([SequenceInput([1], 0, [[1]])], PagedKVCache(wrong))


def test_engine_imports_without_transformers() -> None:
    code = "import sys, hybridkv.engine; sys.exit('transformers' in sys.modules)"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert result.returncode == 0


# --------------------------------------------------------------------------- model registry
def test_a_new_family_is_one_class_and_one_registration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A toy family with GPT-2-style config names (``n_embd``, ``n_layer``, ...) registered with
    one decorator: config parsing, building, the random checkpoint writer and the loader all find
    it through ``MODELS``; its logits equal the Llama it renames; unknown types list it."""
    from hybridkv.engine import MODELS, LlamaForCausalLM, ModelConfig
    from hybridkv.engine.checkpoints import random_model
    from hybridkv.engine.model_config import RopeConfig

    monkeypatch.setattr(MODELS, "_table", dict(MODELS._table))  # the registration ends with the test

    @MODELS.register("toy_gpt")
    class ToyForCausalLM(LlamaForCausalLM):
        @classmethod
        def parse_config(cls, raw: dict) -> ModelConfig:
            return ModelConfig(
                model_type="toy_gpt", vocab_size=raw["vocab_size"], hidden_size=raw["n_embd"],
                intermediate_size=4 * raw["n_embd"], num_hidden_layers=raw["n_layer"],
                num_attention_heads=raw["n_head"], num_key_value_heads=raw["n_head"],
                head_dim=raw["n_embd"] // raw["n_head"], rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope=RopeConfig(), layer_kinds=("full",) * raw["n_layer"])

    toy = dict(model_type="toy_gpt", vocab_size=40, n_embd=16, n_layer=2, n_head=2)
    assert isinstance(parse_model_config(toy), ModelConfig)
    path = random_model(tmp_path / "toy", toy, seed=1)
    model = load_model(path)
    assert type(model) is ToyForCausalLM
    llama_raw = dict(model_type="llama", vocab_size=40, hidden_size=16, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=2, rms_norm_eps=1e-6)
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(llama_raw))
    (tmp_path / "llama" / "model.safetensors").symlink_to(path / "model.safetensors")
    from hybridkv.engine import LLM, CacheConfig, RuntimeConfig
    outs = [LLM(p, cache=CacheConfig(num_blocks=16), runtime=RuntimeConfig(device="cpu", record_logits=True))
            .generate([[1, 2, 3, 4, 5]], max_tokens=4, params=RequestParams(ignore_eos=True))[0]
            for p in (path, tmp_path / "llama")]
    assert outs[0].token_ids == outs[1].token_ids
    assert torch.equal(outs[0].logits[1][-1], outs[1].logits[1][-1])
    with pytest.raises(ValueError, match="unknown model_type 'gpt2'; valid: .*toy_gpt"):
        parse_model_config(dict(toy, model_type="gpt2"))
    with pytest.raises(ValueError, match="model_type 'toy_gpt' is already registered"):
        MODELS.register("toy_gpt", ToyForCausalLM)


def test_registered_families() -> None:
    """Every family the engine runs, in registration order, one class per family module."""
    from hybridkv.engine import MODELS

    assert MODELS.names() == ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gpt_oss", "deepseek_v3",
                              "qwen3_next", "nemotron_h")
    assert {cls.__name__ for cls in (MODELS.get(k) for k in MODELS)} == {
        "LlamaForCausalLM", "Gemma3ForCausalLM", "GptOssForCausalLM", "DeepseekV3ForCausalLM",
        "Qwen3NextForCausalLM", "NemotronHForCausalLM"}


def test_a_layer_refuses_a_spec_of_another_attention_type_by_name(built_models: dict[str, Built]) -> None:
    """check_spec asks the spec's registered type (its rule's ``kind``), not its class: a
    sliding layer refuses full attention, a full one a window, an MLA layer a K/V spec, each
    naming the layer, the type it needs and the class it got."""
    from hybridkv.core.specs import MLA, FullAttention, SlidingWindow
    swa = built_models["qwen2_swa"].model.model.layers
    kinds = [layer.self_attn.window is not None for layer in swa]
    slide, full = swa[kinds.index(True)].self_attn, swa[kinds.index(False)].self_attn
    with pytest.raises(ValueError, match=rf"^layer 'model.layers.{slide.layer_index}.self_attn' needs "
                                         r"a sliding attention spec, got FullAttention$"):
        slide.check_spec(FullAttention(4))
    with pytest.raises(ValueError, match=rf"^layer 'model.layers.{full.layer_index}.self_attn' needs "
                                         r"a full attention spec, got MLA$"):
        full.check_spec(MLA(4))
    mla = built_models["deepseek"].model.model.layers[0].self_attn
    with pytest.raises(ValueError, match=r"^layer 'model.layers.0.self_attn' needs an MLA spec, got "
                                         r"SlidingWindow$"):
        mla.check_spec(SlidingWindow(4, window=8))
