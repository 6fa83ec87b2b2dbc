"""The engine's option records: defaults, a refused value with its message, frozen; and what
``dflash_config`` makes of a :class:`DFlashShape` (no model is loaded)."""

from __future__ import annotations

import dataclasses

import pytest

from hybridkv.core.spec_decode import SpecDecode
from hybridkv.engine.checkpoints import DFlashShape, dflash_config
from hybridkv.engine.llm_options import CacheConfig, RequestParams, SpeculativeConfig, StoreConfig
from hybridkv.engine.models.loader import parse_model_config


def test_request_params() -> None:
    p = RequestParams()
    assert (p.cache_salt, p.stop_token_ids, p.ignore_eos, p.priority, p.retention, p.hint, p.cache_control,
            p.prompt_cache_key, p.prompt_cache_retention, p.nvext, p.checkpoints) == \
        (None, None, False, None, None, None, None, None, None, None, None)
    with pytest.raises(ValueError, match=r"^RequestParams.ignore_eos must be True or False, got 'yes'$"):
        RequestParams(ignore_eos="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^RequestParams.stop_token_ids must be a sequence of token ids "
                                         r"\(ints\), got \[1, 'x'\]$"):
        RequestParams(stop_token_ids=[1, "x"])  # type: ignore[list-item]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.ignore_eos = True  # type: ignore[misc]


def test_speculative_config() -> None:
    s = SpeculativeConfig("dflash:7", draft_model="d")
    assert s.method == SpecDecode(method="dflash", num_speculative_tokens=7) and s.draft_model == "d"
    assert SpeculativeConfig("ngram:3").draft_model is None
    with pytest.raises(ValueError, match=r"^SpeculativeConfig.method must be a string METHOD:K or a SpecDecode, "
                                         r"got None$"):
        SpeculativeConfig(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="drafts with ngram, draft_model, dflash; 'eagle' is not implemented"):
        SpeculativeConfig("eagle:3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.draft_model = None  # type: ignore[misc]


def test_store_and_cache_configs_carry_the_tier_and_the_events() -> None:
    s = StoreConfig()
    assert (s.kv_store, s.namespace, s.load, s.save, s.admit_after) == (None, None, True, True, 1)
    assert StoreConfig(kv_store=None).kv_store is None
    with pytest.raises(ValueError, match=r"^StoreConfig\(kv_store=None, namespace=None, load=True, save=False, "
                                         r"admit_after=1\) configures sharing through a kv_store; give kv_store too$"):
        StoreConfig(save=False)
    assert CacheConfig().kv_events is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.kv_store = object()  # type: ignore[misc]


TARGET = parse_model_config({"model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "head_dim": 8, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
                             "rope_theta": 10000.0})


def test_dflash_shape() -> None:
    d = DFlashShape()
    assert (d.num_layers, d.block_size, d.target_layer_ids, d.mask_token_id, d.num_heads, d.num_kv_heads,
            d.head_dim, d.intermediate_size) == (1, 8, None, None, None, None, None, None)
    cfg = dflash_config(TARGET)
    assert (cfg["num_hidden_layers"], cfg["block_size"], cfg["dflash_config"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"]) == \
        (1, 8, {"target_layer_ids": [0, 2, 4], "mask_token_id": 99}, 4, 2, 8, 64)
    cfg = dflash_config(TARGET, DFlashShape(num_layers=2, block_size=5, target_layer_ids=[0, 4], mask_token_id=7,
                                            num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=48))
    assert (cfg["num_hidden_layers"], cfg["block_size"], cfg["dflash_config"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"]) == \
        (2, 5, {"target_layer_ids": [0, 4], "mask_token_id": 7}, 2, 1, 16, 48)
    assert DFlashShape(target_layer_ids=[1, 2]).target_layer_ids == (1, 2)
    with pytest.raises(ValueError, match=r"^DFlashShape.block_size must be an integer >= 2, got 1$"):
        DFlashShape(block_size=1)
    with pytest.raises(ValueError, match=r"^DFlashShape.target_layer_ids must be an integer >= 0, got -1$"):
        DFlashShape(target_layer_ids=(0, -1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.num_layers = 2  # type: ignore[misc]
