"""Engine models: plain-torch decoders that load Hugging Face-format checkpoints.

Use :func:`~hybridkv.engine.models.loader.load_model` to build one from a directory.
"""

from .base import PagedCausalLM
from .deepseek import DeepseekV3ForCausalLM
from .gemma3 import Gemma3ForCausalLM
from .gpt_oss import GptOssForCausalLM
from .llama import LlamaForCausalLM
from .loader import MODEL_CLASSES, build_model, load_model

__all__ = [
    "MODEL_CLASSES",
    "DeepseekV3ForCausalLM",
    "Gemma3ForCausalLM",
    "GptOssForCausalLM",
    "LlamaForCausalLM",
    "PagedCausalLM",
    "build_model",
    "load_model",
]
