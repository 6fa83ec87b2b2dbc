"""The options of :class:`~hybridkv.engine.llm.LLM`, grouped by what they configure.

::

    LLM(model_dir,                        the common path: everything else has a default
        spec="dflash:7", draft_model=DIR,  speculative decoding (parse_spec's grammar)
        kv_store=store,                    an external KV tier
        cache=CacheConfig(...),            the paged KV cache and its manager
        scheduler=SchedulerConfig(...),    batching limits (hybridkv.sched; ENGINE_SCHEDULER by default)
        runtime=RuntimeConfig(...),        device, dtype, drafter and debugging options
        store=StoreConfig(...))            how the engine shares KV through ``kv_store``

Each config is a frozen dataclass that validates itself on construction, so a bad value is
reported with its name and valid range before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridkv.core.validation import check_int
from hybridkv.sched import SchedulerConfig

__all__ = ["CacheConfig", "ENGINE_SCHEDULER", "RuntimeConfig", "StoreConfig"]

DEFAULT_KV_CACHE_BYTES = 128 << 20
HASH_ALGOS = ("xxh3_128", "sha256")
KV_CACHE_DTYPES = ("float32", "float16", "bfloat16")

#: The engine's scheduler defaults: smaller than a server's, for a CPU reference engine.
#: ``max_model_len=None`` means: the model's, capped at 4096 and at what one request can hold.
ENGINE_SCHEDULER = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=64)


def _int_at_least(owner: str, name: str, value: Any, low: int, *, optional: bool = False) -> None:
    check_int(f"{owner}.{name}", value, low, optional=optional)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The paged KV cache and its manager.

    Args:
        block_size: tokens per block, for every group, or per layer kind (``{"full": 16,
            "sliding": 8, "mla": 64}``); drafter groups use the "full" size (or the smallest).
        num_blocks: pool size including the null block (>= 2); default from ``kv_cache_bytes``.
        kv_cache_bytes: KV budget when ``num_blocks`` is not given (default 128 MiB).
        kv_cache_dtype: dtype of the KV tensors (default: the model's compute dtype).
        enable_prefix_caching: reuse cached prefixes across requests.
        retention_interval: sliding-window retention, None (dense), 0 (replay boundaries) or N.
        hash_algo: ``xxh3_128`` or ``sha256``; default xxh3_128, or sha256 with a ``kv_store``
            (keys shared across processes and tenants).
        hash_seed: the block-hash seed; engines sharing a store need the same one (default
            with a store: a fixed shared seed; without: a random one).
        vllm_compat: run the manager in vLLM-0.33-compatible mode.
        eviction_policy: the order cached free blocks are reused in (``lru``, vLLM's, by
            default; ``priority`` honours ``LLM.generate(retention=...)``; see
            :data:`hybridkv.core.eviction.POLICIES`). Retention TTLs use the wall clock.
        hints: take application hints (``LLM.generate(hint=...)``, :class:`hybridkv.core.hints.Hint`)
            under any eviction policy (off by default; not with ``vllm_compat``); ``"force"``
            follows every hint untested (``CacheOptions(hints="force")``).
        state_dtype: recurrent-state dtype of state models' checkpoints and live states
            (``float32`` default; ``bfloat16`` / ``float16`` halve their memory but round the
            state; the core names the valid values).
    """

    block_size: int | Mapping[str, int] = 16
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool = True
    retention_interval: int | None = 0
    hash_algo: str | None = None
    hash_seed: str | None = None
    vllm_compat: bool = False
    eviction_policy: str = "lru"
    hints: bool | str = False
    state_dtype: str = "float32"

    def __post_init__(self) -> None:
        from hybridkv.core.eviction import resolve_policy
        resolve_policy(self.eviction_policy)     # ValueError naming the valid policies
        if not (isinstance(self.hints, bool) or self.hints == "force"):
            raise ValueError(f"CacheConfig.hints must be True, False or 'force', got {self.hints!r}")
        sizes = self.block_size.values() if isinstance(self.block_size, Mapping) else [self.block_size]
        if not sizes:
            raise ValueError("CacheConfig.block_size must name at least one layer kind")
        for v in sizes:
            _int_at_least("CacheConfig", "block_size", v, 1)
        _int_at_least("CacheConfig", "num_blocks", self.num_blocks, 2, optional=True)
        _int_at_least("CacheConfig", "kv_cache_bytes", self.kv_cache_bytes, 1, optional=True)
        _int_at_least("CacheConfig", "retention_interval", self.retention_interval, 0, optional=True)
        if self.hash_algo is not None and self.hash_algo not in HASH_ALGOS:
            raise ValueError(f"CacheConfig.hash_algo must be one of {', '.join(HASH_ALGOS)}, "
                             f"got {self.hash_algo!r}")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"CacheConfig.kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Where and how the engine computes.

    Args:
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device``; default CUDA when available.
        dtype: weight / compute dtype (a ``torch.dtype``; default: the checkpoint's).
        ngram_sizes: ``(min n, max n)`` of the n-gram drafter.
        record_logits: keep every computed position's logits (``GenerationOutput.logits``).
        check_draft_slots: make a draft write outside a request's blocks raise (default: it
            lands wherever the persistent block-table row points, as on a GPU).
    """

    device: Any = None
    dtype: Any = None
    ngram_sizes: tuple[int, int] = (1, 4)
    record_logits: bool = False
    check_draft_slots: bool = False

    def __post_init__(self) -> None:
        n = self.ngram_sizes
        if isinstance(n, list):
            n = tuple(n)
            object.__setattr__(self, "ngram_sizes", n)
        if (not isinstance(n, tuple) or len(n) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in n)
                or not 1 <= n[0] <= n[1]):
            raise ValueError(f"RuntimeConfig.ngram_sizes must be (min_n, max_n) with 1 <= min_n <= max_n, "
                             f"got {n!r}")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """How an engine shares KV through its ``kv_store``.

    Args:
        namespace: what must match for two engines to share KV (default: a digest of the
            model directory's config and weight files).
        load: load prefixes found in the store instead of recomputing them.
        save: save the blocks the manager caches.
        admit_after: save a block only when the manager caches it for the N-th time (a
            frequency admission filter; 1: every block).
    """

    namespace: str | None = None
    load: bool = True
    save: bool = True
    admit_after: int = 1

    def __post_init__(self) -> None:
        _int_at_least("StoreConfig", "admit_after", self.admit_after, 1)
