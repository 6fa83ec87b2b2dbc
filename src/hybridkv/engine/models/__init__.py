"""Engine models: plain-torch decoders that load Hugging Face-format checkpoints.

Use :func:`~hybridkv.engine.models.loader.load_model` to build one from a directory.
"""

from .base import PagedCausalLM
from .deepseek import DeepseekV3ForCausalLM
from .llama import LlamaForCausalLM
from .loader import MODEL_CLASSES, build_model, load_model

__all__ = [
    "MODEL_CLASSES",
    "DeepseekV3ForCausalLM",
    "LlamaForCausalLM",
    "PagedCausalLM",
    "build_model",
    "load_model",
]
