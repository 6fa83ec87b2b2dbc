"""Reference PyTorch runtime: HF-format models running paged attention over block tables.

Typical use::

    model = load_model("path/to/hf_dir")
    kv_config = make_kv_cache_config(model, {"full": 16, "sliding": 8}, num_blocks=64)
    cache = PagedKVCache(kv_config)
    logits = model([SequenceInput(token_ids, start=0, block_tables=[full_table, swa_table])], cache)

Requires torch and safetensors; transformers is only used by the tests as the oracle.
"""

from .config import ModelConfig, load_model_config
from .kv_cache import NULL_BLOCK, PagedKVCache, default_device, torch_dtype
from .kv_config import kv_cache_groups, make_kv_cache_config
from .metadata import GroupMetadata, SequenceInput, StepMetadata, build_step_metadata
from .models import DeepseekV3ForCausalLM, LlamaForCausalLM, PagedCausalLM, build_model, load_model

__all__ = [
    "NULL_BLOCK",
    "DeepseekV3ForCausalLM",
    "GroupMetadata",
    "LlamaForCausalLM",
    "ModelConfig",
    "PagedCausalLM",
    "PagedKVCache",
    "SequenceInput",
    "StepMetadata",
    "build_model",
    "build_step_metadata",
    "default_device",
    "kv_cache_groups",
    "load_model",
    "load_model_config",
    "make_kv_cache_config",
    "torch_dtype",
]
