"""hybridkv: prefix-caching KV-cache management for hybrid-attention LLMs with speculative decoding.

The public API of the core lives here; see README.md for a tour.
"""

from hybridkv.core import (MLA, AllBlocksCleared, BlockRemoved, BlockStored, CacheHit,
                           ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup,
                           KVCacheManager, LoRA, MultiModalItem, PrefixCacheStats, Request,
                           SlidingWindow, SpecDecode)

__version__ = "0.1.0"

__all__ = [
    "AllBlocksCleared", "BlockRemoved", "BlockStored", "CacheHit", "ChunkedLocal",
    "FullAttention", "KVCacheConfig", "KVCacheGroup", "KVCacheManager", "LoRA", "MLA",
    "MultiModalItem", "PrefixCacheStats", "Request", "SlidingWindow", "SpecDecode",
]
