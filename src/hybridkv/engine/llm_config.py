"""The former name of :mod:`hybridkv.engine.llm_options` (import from there)."""

from .llm_options import ENGINE_SCHEDULER, CacheConfig, RuntimeConfig, StoreConfig

__all__ = ["CacheConfig", "ENGINE_SCHEDULER", "RuntimeConfig", "StoreConfig"]
