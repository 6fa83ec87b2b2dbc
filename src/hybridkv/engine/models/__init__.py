"""Engine models: plain-torch decoders that load Hugging Face-format checkpoints.

Use :func:`~hybridkv.engine.models.loader.load_model` to build one from a directory.

A model family is one module here: a :class:`PagedCausalLM` subclass with ``parse_config``
(its ``config.json`` fields), decorated ``@MODELS.register("<model_type>")`` for each HF
``model_type`` it runs, and one import line below (the registry lists families in this order).
"""

from .base import MODELS, PagedCausalLM
# Registration lines: each module registers its classes once, on import.
from .llama import LlamaForCausalLM  # isort: skip
from .gemma3 import Gemma3ForCausalLM  # isort: skip
from .gpt_oss import GptOssForCausalLM  # isort: skip
from .deepseek import DeepseekV3ForCausalLM  # isort: skip
from .qwen3_next import Qwen3NextForCausalLM  # isort: skip
from .nemotron_h import NemotronHForCausalLM  # isort: skip
from .loader import build_model, load_model, load_model_config, parse_model_config
from .recurrent import HybridStateLM, RecurrentStateStore, StateMissingError

__all__ = [
    "MODELS",
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
    "load_model_config",
    "parse_model_config",
]
