"""Reference PyTorch runtime: HF-format models running paged attention over block tables.

Typical use::

    model = load_model("path/to/hf_dir")
    kv_config = make_kv_cache_config(model, {"full": 16, "sliding": 8}, num_blocks=64)
    cache = PagedKVCache(kv_config)
    logits = model([SequenceInput(token_ids, start=0, block_tables=[full_table, swa_table])], cache)

or, driven by the shared scheduler with prefix caching and speculative decoding::

    llm = LLM("path/to/hf_dir", spec="ngram:3", cache=CacheConfig(block_size=16))
    outs = llm.generate([[1, 2, 3]], max_tokens=32)

Requires torch and safetensors; transformers is only used by the tests as the oracle (and for
tokenizers without a ``tokenizer.json``). The transformers versions the engine is proven equal
to are :data:`hybridkv.engine.versions.TESTED_TRANSFORMERS`.

Modules: ``model_config`` (what a model reads from ``config.json``), ``kv_groups`` (the
KV-cache groups of a model), ``llm_options`` (the option records of :class:`LLM`).
"""

from .model_config import ModelConfig
from .kv_cache import NULL_BLOCK, PagedKVCache, default_device, torch_dtype
from .kv_groups import kv_cache_groups, make_kv_cache_config
from .metadata import GroupMetadata, SequenceInput, StepMetadata, build_step_metadata
from .block_table import BlockTableRows
from .drafters import DFlashDrafter, Drafter, DraftModelDrafter, NgramDrafter
from .llm import LLM, GenerationOutput, engine_spec
from .llm_options import (ENGINE_SCHEDULER, CacheConfig, RequestParams, RuntimeConfig, SpeculativeConfig,
                          StoreConfig)
from .models import (MODELS, DeepseekV3ForCausalLM, Gemma3ForCausalLM, GptOssForCausalLM, LlamaForCausalLM,
                     PagedCausalLM, build_model, load_model, load_model_config, parse_model_config)
from .models.dflash import DFlashDraftModel, load_dflash
from .runner import EngineCore, EngineStats

__all__ = [
    "NULL_BLOCK",
    "BlockTableRows",
    "CacheConfig",
    "ENGINE_SCHEDULER",
    "DFlashDraftModel",
    "DFlashDrafter",
    "DeepseekV3ForCausalLM",
    "DraftModelDrafter",
    "Drafter",
    "EngineCore",
    "EngineStats",
    "Gemma3ForCausalLM",
    "GenerationOutput",
    "GptOssForCausalLM",
    "GroupMetadata",
    "LLM",
    "MODELS",
    "LlamaForCausalLM",
    "NgramDrafter",
    "ModelConfig",
    "PagedCausalLM",
    "PagedKVCache",
    "RuntimeConfig",
    "SequenceInput",
    "StepMetadata",
    "RequestParams",
    "SpeculativeConfig",
    "StoreConfig",
    "build_model",
    "build_step_metadata",
    "default_device",
    "kv_cache_groups",
    "load_dflash",
    "load_model",
    "load_model_config",
    "engine_spec",
    "make_kv_cache_config",
    "parse_model_config",
    "torch_dtype",
]
