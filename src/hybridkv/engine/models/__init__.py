"""Engine models: plain-torch decoders that load Hugging Face-format checkpoints.

Use :func:`~hybridkv.engine.models.loader.load_model` to build one from a directory.
"""

from .base import PagedCausalLM
from .deepseek import DeepseekV3ForCausalLM
from .gemma3 import Gemma3ForCausalLM
from .gpt_oss import GptOssForCausalLM
from .llama import LlamaForCausalLM
from .loader import MODEL_CLASSES, build_model, load_model
from .nemotron_h import NemotronHForCausalLM
from .qwen3_next import Qwen3NextForCausalLM
from .recurrent import HybridStateLM, RecurrentStateStore, StateMissingError

__all__ = [
    "MODEL_CLASSES",
    "DeepseekV3ForCausalLM",
    "Gemma3ForCausalLM",
    "GptOssForCausalLM",
    "HybridStateLM",
    "NemotronHForCausalLM",
    "Qwen3NextForCausalLM",
    "RecurrentStateStore",
    "StateMissingError",
    "LlamaForCausalLM",
    "PagedCausalLM",
    "build_model",
    "load_model",
]
