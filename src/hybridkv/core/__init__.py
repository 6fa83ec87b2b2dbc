"""The pure bookkeeping core: block ids, hashes and counts; no tensors, no engine."""

from importlib.machinery import EXTENSION_SUFFIXES as _EXTENSION_SUFFIXES

from hybridkv.core import manager as _manager
from hybridkv.core.blockref import BlockRef, TableRef
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.coordinator import CacheHit, ExternalHit, StateBlocks, StateExport
from hybridkv.core.events import AllBlocksCleared, BlockRemoved, BlockStored, PrefixCacheStats
from hybridkv.core.hashing import BlockHasher
from hybridkv.core.hints import Hint, HintStats
from hybridkv.core.manager import KVCacheManager
from hybridkv.core.free_queue import FreeBlockQueue
from hybridkv.core.pool import NULL_BLOCK, BlockPool
from hybridkv.core.request import LoRA, MultiModalItem, Request, RequestCacheParams
from hybridkv.core.retention_config import RetentionConfig, TokenRange
from hybridkv.core.rules import HitRule, make_rule
from hybridkv.core.spec_decode import SPEC_METHODS, SpecDecode, parse_spec
from hybridkv.core.specs import (MLA, AttentionSpec, ChunkedLocal, FullAttention, KVCacheConfig,
                                 KVCacheGroup, SlidingWindow, StateSpec)

#: True when the core runs from the optional compiled build (setup.py, Cython: the same .py
#: files compiled); False for the pure-Python source (no build, or HYBRIDKV_PURE_PYTHON=1).
COMPILED: bool = (_manager.__file__ or "").endswith(tuple(_EXTENSION_SUFFIXES))
if COMPILED:        # the queue the compiled pool uses (its reference: free_queue.FreeBlockQueue)
    from hybridkv.core.free_queue_native import FreeBlockQueue  # type: ignore[import-untyped,no-redef]  # noqa: F811

__all__ = [
    "COMPILED",
    "AllBlocksCleared", "AttentionSpec", "BlockHasher", "BlockPool", "BlockRef", "BlockRemoved", "BlockStored",
    "CacheHit", "CacheOptions", "ChunkedLocal", "ExternalHit", "FreeBlockQueue", "FullAttention", "Hint", "HintStats", "HitRule", "KVCacheConfig",
    "KVCacheGroup", "KVCacheManager", "LoRA", "MLA", "MultiModalItem", "NULL_BLOCK", "make_rule",
    "PrefixCacheStats", "Request", "RequestCacheParams", "RetentionConfig", "SPEC_METHODS", "SlidingWindow",
    "SpecDecode",
    "StateBlocks", "StateExport", "StateSpec", "TableRef", "TokenRange", "parse_spec",
]
