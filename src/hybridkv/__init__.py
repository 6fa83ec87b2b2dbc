"""hybridkv: prefix-caching KV-cache management for hybrid-attention LLMs with speculative decoding.

The public API of the core lives here; see README.md for a tour.
"""

from hybridkv import _purepy

if _purepy.requested():      # HYBRIDKV_PURE_PYTHON=1: the .py source even where compiled
    _purepy.install()
elif (_why := _purepy.stale()) is not None:
    import sys as _sys
    print(f"hybridkv: the compiled build is stale ({_why}); running the pure-Python source "
          "(same behaviour, slower). Rebuild it with: pip install -e .", file=_sys.stderr)
    _purepy.install()

from hybridkv.core import (MLA, AllBlocksCleared, BlockRemoved, BlockStored, CacheHit, CacheOptions,
                           ChunkedLocal, ExternalHit, FullAttention, Hint, KVCacheConfig, KVCacheGroup,
                           KVCacheManager, LoRA, MultiModalItem, PrefixCacheStats, Request,
                           RequestCacheParams, RetentionConfig, SlidingWindow, SpecDecode, StateSpec, TokenRange)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The engine needs torch; import it only when asked for, so ``import hybridkv`` stays light.
    if name in ("LLM", "GenerationOutput"):
        from hybridkv.engine import llm
        return getattr(llm, name)
    if name in ("CacheConfig", "RequestParams", "RuntimeConfig", "SpeculativeConfig", "StoreConfig"):
        from hybridkv.engine import llm_options
        return getattr(llm_options, name)
    raise AttributeError(f"module 'hybridkv' has no attribute {name!r}")

__all__ = [
    "AllBlocksCleared", "BlockRemoved", "CacheConfig", "ExternalHit", "GenerationOutput", "LLM",
    "RuntimeConfig", "StoreConfig", "BlockStored", "CacheHit", "CacheOptions", "ChunkedLocal",
    "FullAttention", "Hint", "KVCacheConfig", "KVCacheGroup", "KVCacheManager", "LoRA", "MLA",
    "MultiModalItem", "PrefixCacheStats", "Request", "RequestCacheParams", "RequestParams",
    "RetentionConfig", "SlidingWindow", "SpecDecode", "SpeculativeConfig", "StateSpec", "TokenRange",
]
