"""The options of :class:`~hybridkv.engine.llm.LLM`, grouped by what they configure.

::

    LLM(model_dir,                        the common path: everything else has a default
        spec="ngram:3",                    speculative decoding (parse_spec's grammar), or
        spec=SpeculativeConfig("dflash:7", draft_model=DIR)   with a drafter checkpoint
        cache=CacheConfig(...),            the paged KV cache, its manager and its KV events
        scheduler=SchedulerConfig(...),    batching limits (hybridkv.sched; ENGINE_SCHEDULER by default)
        runtime=RuntimeConfig(...),        device, dtype, drafter and debugging options
        store=StoreConfig(kv_store, ...))  an external KV tier and how the engine shares KV through it
    llm.generate(prompts, max_tokens, RequestParams(...))   the per-request options

Each config is a frozen dataclass that validates itself on construction, so a bad value is
reported with its name and valid range before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridkv.core.hints import Hint
from hybridkv.core.retention_config import RetentionConfig
from hybridkv.core.spec_decode import SpecDecode, parse_spec
from hybridkv.core.validation import check_int
from hybridkv.sched import SchedulerConfig

if TYPE_CHECKING:
    from hybridkv.connectors.stores.base import KVStore

__all__ = ["CacheConfig", "ENGINE_SCHEDULER", "ENGINE_SPEC_METHODS", "RequestParams", "RuntimeConfig",
           "SpeculativeConfig", "StoreConfig", "engine_spec"]

DEFAULT_KV_CACHE_BYTES = 128 << 20
HASH_ALGOS = ("xxh3_128", "sha256")
KV_CACHE_DTYPES = ("float32", "float16", "bfloat16")

#: The engine's scheduler defaults: smaller than a server's, for a CPU reference engine.
#: ``max_model_len=None`` means: the model's, capped at 4096 and at what one request can hold.
ENGINE_SCHEDULER = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=64)


ENGINE_SPEC_METHODS = ("ngram", "draft_model", "dflash")


def engine_spec(spec: str | SpecDecode | None) -> SpecDecode | None:
    """``spec`` (a :func:`~hybridkv.core.spec_decode.parse_spec` string, a SpecDecode or None)
    as a SpecDecode the reference engine can draft with (ngram, draft_model, dflash), or None."""
    if isinstance(spec, str):
        spec = parse_spec(spec)
    elif spec is not None and not isinstance(spec, SpecDecode):
        raise ValueError(f"spec must be a string METHOD:K, a SpecDecode or None, got {spec!r}")
    if spec is not None and spec.method not in ENGINE_SPEC_METHODS:
        raise ValueError(f"the reference engine drafts with {', '.join(ENGINE_SPEC_METHODS)}; "
                         f"{spec.method!r} is not implemented")
    return spec


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding with a drafter checkpoint (``LLM(spec=...)``; a method that needs
    no checkpoint, ngram, can be given as a plain ``"ngram:K"`` string instead).

    Args:
        method: ``"ngram:K"``, ``"draft_model:K"`` or ``"dflash:K"`` (the grammar of
            :func:`~hybridkv.core.spec_decode.parse_spec`) or a :class:`SpecDecode`; stored as the
            SpecDecode.
        draft_model: the drafter's directory: a small causal LM with the target's vocabulary
            (draft_model) or a DFlash drafter (dflash).
    """

    method: str | SpecDecode
    draft_model: str | Path | None = None

    def __post_init__(self) -> None:
        spec = engine_spec(self.method)
        if spec is None:
            raise ValueError(f"SpeculativeConfig.method must be a string METHOD:K or a SpecDecode, "
                             f"got {self.method!r}")
        object.__setattr__(self, "method", spec)


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
            default; ``priority`` honours ``RequestParams(retention=...)``; see
            :data:`hybridkv.core.eviction.POLICIES`). Retention TTLs use the wall clock.
        hints: take application hints (``RequestParams(hint=...)``, :class:`hybridkv.core.hints.Hint`)
            under any eviction policy (off by default; not with ``vllm_compat``); ``"force"``
            follows every hint untested (``CacheOptions(hints="force")``).
        state_dtype: recurrent-state dtype of state models' checkpoints and live states
            (``float32`` default; ``bfloat16`` / ``float16`` halve their memory but round the
            state; the core names the valid values).
        kv_events: publish the manager's KV events after every step in vLLM 0.33's ZMQ format:
            a ``hybridkv.events.KVEventsConfig`` (a publisher is started; ``LLM.close`` stops
            it), or any object with ``publish(batch)``. Hashes default to sha256 then.
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
    kv_events: Any = None

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
    """An external KV tier and how an engine shares KV through it.

    Args:
        kv_store: the tier (``LocalCPUStore``, ``MooncakeStore``): computed blocks are saved to
            it and prefixes found in it are loaded instead of recomputed. None (the default):
            no tier, and the other fields keep their defaults.
        namespace: what must match for two engines to share KV (default: a digest of the
            model directory's config and weight files).
        load: load prefixes found in the store instead of recomputing them.
        save: save the blocks the manager caches.
        admit_after: save a block only when the manager caches it for the N-th time (a
            frequency admission filter; 1: every block).
    """

    kv_store: KVStore | None = None
    namespace: str | None = None
    load: bool = True
    save: bool = True
    admit_after: int = 1

    def __post_init__(self) -> None:
        _int_at_least("StoreConfig", "admit_after", self.admit_after, 1)
        sharing = (self.namespace, self.load, self.save, self.admit_after)
        if self.kv_store is None and sharing != (None, True, True, 1):
            raise ValueError(f"{self!r} configures sharing through a kv_store; give kv_store too")


@dataclass(frozen=True, slots=True)
class RequestParams:
    """The per-request options of ``LLM.generate`` / ``LLM.submit`` (in the spirit of vLLM's
    ``SamplingParams``). Each per-request field takes one value for every prompt or a list /
    tuple with one per prompt; the lengths are checked against the prompts by ``submit``.

    Args:
        cache_salt: salt (or one per prompt); requests only share cache within a salt.
        stop_token_ids: extra stop tokens (for every prompt); the model's EOS ids stop too
            unless ``ignore_eos``.
        ignore_eos: do not stop at the model's EOS ids.
        priority: one *scheduling* priority per prompt, as in vLLM (lower runs first under
            ``SchedulerConfig(policy="priority")``); it does not touch the cache.
        retention: how long each request's blocks stay cached (one
            :class:`~hybridkv.core.retention_config.RetentionConfig` or one per prompt, None for
            none); needs ``CacheConfig(eviction_policy="priority")``.
        hint: what the application knows about each request's session (one
            :class:`~hybridkv.core.hints.Hint` or one per prompt, None for none): it ends, pin a
            prefix, it resumes soon; needs ``CacheConfig(hints=True)``.
        cache_control, prompt_cache_key, prompt_cache_retention, nvext: the public APIs' cache
            fields (Anthropic, OpenAI, Dynamo; one value or one per prompt), mapped onto each
            request's hint by :func:`~hybridkv.core.public_hints.public_hint` (e.g.
            ``cache_control={"type": "ephemeral", "ttl": "1h"}``: the prompt is kept an hour
            past its last use); need ``CacheConfig(hints=True)``.
        checkpoints: prompt positions worth a later hit, e.g. the end of a shared system prompt
            (:attr:`hybridkv.core.request.Request.checkpoints`): one sequence of positions for
            every prompt, or one per prompt; recurrent-state layers then keep a checkpoint there
            from the first request on.
    """

    cache_salt: str | None | Sequence[str | None] = None
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    priority: Sequence[int] | None = None
    retention: RetentionConfig | None | Sequence[RetentionConfig | None] = None
    hint: Hint | None | Sequence[Hint | None] = None
    cache_control: Mapping | None | Sequence[Mapping | None] = None
    prompt_cache_key: str | None | Sequence[str | None] = None
    prompt_cache_retention: str | None | Sequence[str | None] = None
    nvext: Mapping | None | Sequence[Mapping | None] = None
    checkpoints: Sequence[int] | Sequence[Sequence[int]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"RequestParams.ignore_eos must be True or False, got {self.ignore_eos!r}")
        stops = self.stop_token_ids or ()
        bad = next((t for t in stops if isinstance(t, bool) or not isinstance(t, int)), None)
        if bad is not None or isinstance(self.stop_token_ids, (str, int)):
            raise ValueError(f"RequestParams.stop_token_ids must be a sequence of token ids (ints), "
                             f"got {self.stop_token_ids!r}")
