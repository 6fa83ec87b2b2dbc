"""``LLM``: batch generation on the reference engine, driven by the shared scheduler.

    llm = LLM("path/to/hf_dir", spec="ngram:3", cache=CacheConfig(block_size=16, num_blocks=512))
    outs = llm.generate([[1, 2, 3], "a prompt"], max_tokens=32)
    outs[0].token_ids, outs[0].num_cached_tokens

Everything lives in one process: the model (plain torch, CPU or CUDA), a
:class:`~hybridkv.core.manager.KVCacheManager` whose groups are the model's layer kinds (plus
the drafter's, marked ``is_draft``), a :class:`~hybridkv.engine.kv_cache.PagedKVCache` sized
from that config, a :class:`~hybridkv.sched.Scheduler` and an
:class:`~hybridkv.engine.runner.EngineCore`. The prefix cache persists across ``generate``
calls. Sampling is greedy. The options are grouped in config objects
(:mod:`hybridkv.engine.llm_options`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import xxhash

from hybridkv.connectors.connector import KVConnector
from hybridkv.connectors.layout import KVLayout
from hybridkv.connectors.stores.base import KVStore
from hybridkv.connectors.transfer import KVTransfer
from hybridkv.core.manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.core.public_hints import public_hint
from hybridkv.core.spec_decode import SpecDecode
from hybridkv.core.specs import KVCacheConfig
from hybridkv.sched import EngineRequest, Scheduler, SchedulerConfig

from .drafters import DFlashDrafter, DraftModelDrafter, Drafter, NgramDrafter
from .kv_cache import PagedKVCache, default_device
from .kv_groups import kv_cache_groups
from .llm_options import (DEFAULT_KV_CACHE_BYTES, ENGINE_SCHEDULER, ENGINE_SPEC_METHODS, CacheConfig,
                          RequestParams, RuntimeConfig, SpeculativeConfig, StoreConfig, engine_spec)
from .models import load_model
from .models.dflash import load_dflash
from .runner import EngineCore, EngineStats
from hybridkv.core.cache_options import CacheOptions
from hybridkv.connectors.transfer import TransferOptions
from hybridkv.core.request import RequestCacheParams

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass
class GenerationOutput:
    """One request's result.

    Attributes:
        request_id: the id given or assigned.
        prompt_token_ids: the prompt.
        token_ids: generated tokens.
        text: decoded ``token_ids`` when the model directory has a tokenizer, else None.
        finish_reason: "length", "stop", "max_model_len" or "aborted".
        num_cached_tokens: prefix-cache hit at the request's first admission.
        num_preemptions: times the request was preempted and recomputed.
        num_external_tokens: tokens loaded from the KV store instead of computed.
        logits: with ``record_logits``: (positions, ``[n, vocab]`` fp32) of every computed
            real position (recomputed positions repeat).
    """

    request_id: object
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str
    num_cached_tokens: int
    num_preemptions: int
    logits: tuple[list[int], torch.Tensor] | None = field(default=None, repr=False)
    num_external_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "prompt_token_ids": self.prompt_token_ids,
                "token_ids": self.token_ids, "text": self.text, "finish_reason": self.finish_reason,
                "prefix_cache_hit_tokens": self.num_cached_tokens, "num_preemptions": self.num_preemptions}


class Tokenizer:
    """The model directory's tokenizer (``tokenizer.json`` through the ``tokenizers`` library,
    else transformers' AutoTokenizer when other tokenizer files exist)."""

    def __init__(self, impl: Any, kind: str) -> None:
        self._impl, self._kind = impl, kind

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer | None:
        d = Path(model_dir)
        if (d / "tokenizer.json").is_file():
            try:
                from tokenizers import Tokenizer as FastTokenizer

                return cls(FastTokenizer.from_file(str(d / "tokenizer.json")), "tokenizers")
            except ImportError:  # pragma: no cover - tokenizers ships with transformers
                pass
        if any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                           "vocab.json")):
            import transformers  # lazy: the engine does not need transformers

            from .versions import check_installed_transformers

            check_installed_transformers(transformers.__version__)
            AutoTokenizer = transformers.AutoTokenizer
            return cls(AutoTokenizer.from_pretrained(str(d)), "transformers")
        return None

    def encode(self, text: str) -> list[int]:
        if self._kind == "tokenizers":
            return list(self._impl.encode(text).ids)
        return list(self._impl.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        if self._kind == "tokenizers":
            return self._impl.decode(list(ids), skip_special_tokens=True)
        return self._impl.decode(list(ids), skip_special_tokens=True)


def eos_token_ids(model_dir: str | Path) -> tuple[int, ...]:
    """``eos_token_id`` from ``generation_config.json`` or ``config.json`` (int or list)."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is None:
                continue
            return tuple(int(v) for v in (value if isinstance(value, list) else [value]))
    return ()


SHARED_HASH_SEED = "hybridkv-shared-v1"
"""Block-hash seed of engines that share a KV store (their hashes must agree)."""


def model_namespace(model_dir: str | Path) -> str:
    """A digest of a model directory's config and weight files (names, sizes, first bytes):
    engines with different weights never share KV through a store."""
    d = Path(model_dir)
    h = xxhash.xxh3_64()
    h.update((d / "config.json").read_bytes())
    for f in sorted(d.glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
    return f"model-{h.hexdigest()}"


def max_len_that_fits(config: KVCacheConfig, cap: int, *, retention_interval: int | None = 0,
                      vllm_compat: bool = False) -> int:
    """The largest max_model_len <= cap one request of which fits the pool (0 if none), by the
    manager's own rule (:meth:`KVCacheManager.blocks_for_request`)."""
    usable = config.num_blocks - 1  # type: ignore[operator]

    def need(length: int) -> int:
        return KVCacheManager.blocks_for_request(config, length, retention_interval=retention_interval,
                                                 vllm_compat=vllm_compat)

    lo, hi = 0, cap
    while lo < hi:  # need() is non-decreasing in the length
        mid = (lo + hi + 1) // 2
        if need(mid) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _config(name: str, value: Any, cls: type, default: Any = None) -> Any:
    """``value`` if it is a ``cls``; its default when None; else a clear error."""
    if value is None:
        return default if default is not None else cls()
    if not isinstance(value, cls):
        raise ValueError(f"{name} must be a {cls.__name__}, got {type(value).__name__}: {value!r}")
    return value


class LLM:
    """Greedy batch generation with paged attention, prefix caching and speculative decoding.

    Args:
        model: an HF-format directory (``config.json`` + ``*.safetensors``).
        spec: speculative decoding: a :class:`SpeculativeConfig` (method and drafter
            checkpoint; draft_model and dflash need one), or for ngram just ``"ngram:K"`` (the
            grammar of :func:`~hybridkv.core.spec_decode.parse_spec`) or a :class:`SpecDecode`.
        cache: block sizes, pool size, prefix caching, retention, hashing, KV events
            (:class:`CacheConfig`).
        scheduler: batching limits (:class:`~hybridkv.sched.SchedulerConfig`; default
            :data:`~hybridkv.engine.llm_options.ENGINE_SCHEDULER`). ``max_model_len=None``:
            ``min(max_position_embeddings, 4096)`` reduced to what one request can hold.
        runtime: device, dtype, n-gram sizes, logits recording, draft-slot checks
            (:class:`RuntimeConfig`).
        store: an external KV tier (``LocalCPUStore``, ``MooncakeStore``) and its namespace,
            load and save switches (:class:`StoreConfig`).
    """

    def __init__(self, model: str | Path, *, spec: str | SpecDecode | SpeculativeConfig | None = None,
                 cache: CacheConfig | None = None, scheduler: SchedulerConfig | None = None,
                 runtime: RuntimeConfig | None = None, store: StoreConfig | None = None) -> None:
        cache = _config("cache", cache, CacheConfig)
        scheduler = _config("scheduler", scheduler, SchedulerConfig, ENGINE_SCHEDULER)
        runtime = _config("runtime", runtime, RuntimeConfig)
        store = _config("store", store, StoreConfig)
        kv_store, kv_events = store.kv_store, cache.kv_events
        if isinstance(spec, SpeculativeConfig):
            self.spec, draft_model = spec.method, spec.draft_model
        else:
            self.spec, draft_model = engine_spec(spec), None
        self.model_dir = Path(model)
        self.device = torch.device(runtime.device) if runtime.device is not None else default_device()
        self.model = load_model(self.model_dir, device=self.device, dtype=runtime.dtype)
        if self.model.has_state:
            cache = self._state_model_cache(cache, kv_store)
        self.drafter = self._make_drafter(self.spec, draft_model, runtime.ngram_sizes, runtime.dtype)
        kinds = set(self.model.config.layer_kinds)
        if isinstance(cache.block_size, Mapping):
            sizes = {k: int(v) for k, v in cache.block_size.items()}
        else:
            sizes = {kind: int(cache.block_size) for kind in kinds | {"full"}}
        cache_dtype = cache.kv_cache_dtype or _DTYPE_NAMES.get(self.model.dtype, "float32")
        groups = kv_cache_groups(self.model, sizes, cache_dtype, state_dtype=cache.state_dtype)
        if self.drafter is not None:
            groups = groups + self.drafter.kv_cache_groups(sizes, cache_dtype)
        num_blocks = cache.num_blocks
        if num_blocks is None:
            probe = KVCacheConfig(groups, num_blocks=1 << 30)  # only its block_bytes is read
            num_blocks = max(2, (cache.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES) // probe.block_bytes)
        self.kv_config = KVCacheConfig(groups, num_blocks=int(num_blocks))
        max_model_len = scheduler.max_model_len
        if max_model_len is None:
            cap = min(self.model.config.max_position_embeddings, 4096)
            max_model_len = max_len_that_fits(self.kv_config, cap, retention_interval=cache.retention_interval,
                                              vllm_compat=cache.vllm_compat)
            if max_model_len < 2:
                need = KVCacheManager.blocks_for_request(self.kv_config, 2, retention_interval=cache.retention_interval,
                                                         vllm_compat=cache.vllm_compat)
                raise ValueError(f"the pool of {num_blocks} blocks cannot hold even a 2-token request; give "
                                 f"num_blocks >= {need + 1}")
            scheduler = replace(scheduler, max_model_len=max_model_len)
        self.max_model_len = max_model_len
        hash_seed = cache.hash_seed
        if hash_seed is None and kv_store is not None:
            hash_seed = SHARED_HASH_SEED
        hash_algo = cache.hash_algo
        if hash_algo is None:  # keys shared across processes and tenants: a cryptographic hash
            hash_algo = "sha256" if kv_store is not None or kv_events is not None else "xxh3_128"
        self.cache_config, self.scheduler_config, self.runtime, self.store_config = cache, scheduler, runtime, store
        self.kv = KVCacheManager(self.kv_config, CacheOptions(
            spec_decode=self.spec, retention_interval=cache.retention_interval,
            enable_caching=cache.enable_prefix_caching, hash_algo=hash_algo, hash_seed=hash_seed,
            max_model_len=max_model_len, vllm_compat=cache.vllm_compat, enable_events=kv_events is not None,
            max_in_flight_tokens=scheduler.max_num_batched_tokens, eviction_policy=cache.eviction_policy,
            hints=cache.hints))
        self.cache = PagedKVCache(self.kv_config, device=self.device)
        self.connector: KVConnector | None = None
        if kv_store is not None:
            layout = KVLayout.register({n: self.cache.layer(n) for n in self.cache.layer_names},
                                       self.kv_config)
            namespace = store.namespace if store.namespace is not None else model_namespace(self.model_dir)
            transfer = KVTransfer(layout, kv_store, TransferOptions(namespace=namespace))
            self.connector = KVConnector(self.kv, transfer, load=store.load, save=store.save,
                                         admit_after=store.admit_after)
        self.scheduler = Scheduler(self.kv, scheduler, connector=self.connector)
        self.engine = EngineCore(self.model, self.kv, self.scheduler, self.cache, self.drafter, runtime)
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        self.eos_token_ids = eos_token_ids(self.model_dir)
        self._next_id = 0
        self.kv_events = None
        if kv_events is not None:
            from hybridkv.events.stream import attach_kv_events
            self.kv_events = attach_kv_events(self.kv, self.engine.step_hooks, kv_events)

    def _state_model_cache(self, cache: CacheConfig, kv_store: KVStore | None) -> CacheConfig:
        """A state model (recurrent layers: qwen3_next, nemotron_h) keeps its recurrent states
        in a state group of the pool: live states and prefix-cache checkpoints are extents
        (docs/state-groups.md, :mod:`hybridkv.engine.state_pages`), so prefix caching works as
        for any model. A KV store is refused (checkpoints are not kept in external tiers).
        Speculative decoding works with ngram and draft_model (only accepted tokens reach the
        state and its checkpoints); dflash is refused (it reads target layer features)."""
        kind = self.model.config.model_type
        if self.spec is not None and self.spec.method == "dflash":
            raise ValueError(f"speculative method 'dflash' is not supported for {kind}; use ngram or "
                             "draft_model")
        if kv_store is not None:
            raise ValueError(f"a kv_store is not supported for {kind}: loaded KV blocks cannot restore "
                             "its recurrent state")
        return cache

    def _make_drafter(self, spec: SpecDecode | None, draft_dir: str | Path | None,
                      ngram_sizes: tuple[int, int], dtype: torch.dtype | None) -> Drafter | None:
        if spec is None:
            return None
        if spec.method == "ngram":
            return NgramDrafter(*ngram_sizes)
        if draft_dir is None:
            raise ValueError(f"speculative method {spec.method!r} needs draft_model=DIR")
        if spec.method == "dflash":
            drafter_model = load_dflash(draft_dir, device=self.device, dtype=dtype or self.model.dtype)
            if drafter_model.config.hidden_size != self.model.config.hidden_size:
                raise ValueError(f"DFlash hidden_size {drafter_model.config.hidden_size} differs from the "
                                 f"target's {self.model.config.hidden_size}")
            bad = [i for i in drafter_model.target_layer_ids if not 0 <= i < self.model.config.num_hidden_layers]
            if bad:
                raise ValueError(f"DFlash target_layer_ids {bad} are not layers of the target "
                                 f"({self.model.config.num_hidden_layers} layers)")
            return DFlashDrafter(drafter_model)
        small = load_model(draft_dir, device=self.device, dtype=dtype or self.model.dtype)
        if small.has_state:
            raise ValueError(f"draft model {str(draft_dir)!r} is a {small.config.model_type} (recurrent "
                             "layers); a draft model must be attention-only")
        if small.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"draft model vocab_size {small.config.vocab_size} differs from the "
                             f"target's {self.model.config.vocab_size}")
        return DraftModelDrafter(small)

    # ---- generation ---------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt (text needs a tokenizer); ``ValueError`` for an id outside the
        model's vocabulary."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{str(self.model_dir)!r} has no tokenizer; pass token ids instead of text")
            return self.tokenizer.encode(prompt)
        ids = [int(t) for t in prompt]
        vocab = self.model.config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary of "
                             f"{str(self.model_dir)!r}: ids are in [0, {vocab})")
        return ids

    def generate(self, prompts: Sequence[str | Sequence[int]] | str, max_tokens: int | Sequence[int] = 16,
                 params: RequestParams | None = None) -> list[GenerationOutput]:
        """Generate greedily for every prompt (one batch, continuous batching); outputs in order.

        Args:
            prompts: token-id lists or strings (strings need a tokenizer), or one string.
            max_tokens: output tokens per request (one value or one per prompt).
            params: the per-request options (:class:`~hybridkv.engine.llm_options.RequestParams`:
                cache salt, stop tokens, priority, retention, hints, public cache fields,
                checkpoints; one value for every prompt or one per prompt).
        """
        reqs = self.submit(prompts, max_tokens, params)
        self.engine.run()
        return self.collect(reqs)

    def submit(self, prompts: Sequence[str | Sequence[int]] | str, max_tokens: int | Sequence[int] = 16,
               params: RequestParams | None = None) -> list[EngineRequest]:
        """Queue requests without running them (drive ``llm.engine.step()`` yourself, then
        :meth:`collect`). Arguments as for :meth:`generate`."""
        params = _config("params", params, RequestParams)
        cache_salt, priority, retention = params.cache_salt, params.priority, params.retention
        hint, checkpoints = params.hint, params.checkpoints
        if isinstance(prompts, str):
            prompts = [prompts]
        n = len(prompts)
        limits = [max_tokens] * n if isinstance(max_tokens, int) else list(max_tokens)
        salts = list(cache_salt) if isinstance(cache_salt, (list, tuple)) else [cache_salt] * n
        prios = list(priority) if priority is not None else [0] * n
        keep = list(retention) if isinstance(retention, (list, tuple)) else [retention] * n
        hints = list(hint) if isinstance(hint, (list, tuple)) else [hint] * n
        marks = list(checkpoints or ())
        if not marks or isinstance(marks[0], int):
            marks = [tuple(marks)] * n                  # the same positions for every prompt
        if not len(limits) == len(salts) == len(prios) == len(keep) == len(hints) == len(marks) == n:
            raise ValueError("max_tokens, cache_salt, priority, retention, hint and checkpoints need "
                             "one entry per prompt")
        public = {"cache_control": params.cache_control, "prompt_cache_key": params.prompt_cache_key,
                  "prompt_cache_retention": params.prompt_cache_retention, "nvext": params.nvext}
        for name, value in public.items():
            per = list(value) if isinstance(value, (list, tuple)) else [value] * n
            if len(per) != n:
                raise ValueError(f"{name} needs one value for every prompt or one per prompt "
                                 f"({n}), got {len(per)}")
            public[name] = per
        for i in range(n):
            body = {k: v[i] for k, v in public.items() if v[i] is not None}
            try:
                hints[i] = public_hint(body, None, hints[i])
            except ValueError as exc:
                raise ValueError(f"prompt {i}: {exc}") from None
        if any(h is not None for h in hints) and not self.kv.hints:
            raise ValueError("hint needs CacheConfig(hints=True) (so do cache_control, prompt_cache_key, "
                             "prompt_cache_retention and nvext); this LLM ignores hints")
        if any(r is not None for r in keep) and not self.kv.uses_retention:
            raise ValueError(f"retention needs CacheConfig(eviction_policy='priority'); this LLM "
                             f"uses eviction_policy={self.kv.eviction_policy!r}, which ignores it")
        stops = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stops |= set(self.eos_token_ids)
        reqs = []
        for i, p in enumerate(prompts):
            rid = f"req-{self._next_id}"
            self._next_id += 1
            core = Request(rid, self.encode(p), RequestCacheParams(
                cache_salt=salts[i], retention=keep[i], hint=hints[i], checkpoints=tuple(marks[i] or ())))
            reqs.append(EngineRequest(core, int(limits[i]), priority=int(prios[i]),
                                      arrival_time=float(self._next_id), stop_token_ids=stops))
        for r in reqs:
            self.engine.add_request(r)
        return reqs

    def collect(self, reqs: Sequence[EngineRequest]) -> list[GenerationOutput]:
        """Outputs of finished requests, in the given order."""
        unfinished = [r.request_id for r in reqs if not r.status.finished]
        if unfinished:
            raise ValueError(f"requests {unfinished} have not finished; step the engine first")
        return [self._output(r) for r in reqs]

    def _output(self, r: EngineRequest) -> GenerationOutput:
        ids = r.output_token_ids
        reason = r.status.value.removeprefix("finished_")
        record = self.engine.records.pop(r.request_id, None)
        return GenerationOutput(
            request_id=r.request_id,
            prompt_token_ids=list(r.request.token_ids[:r.num_prompt_tokens]),
            token_ids=ids,
            text=self.tokenizer.decode(ids) if self.tokenizer is not None else None,
            finish_reason=reason,
            num_cached_tokens=max(r.num_cached_tokens, 0),
            num_preemptions=r.request.num_preemptions,
            logits=record.stacked() if record is not None else None,
            num_external_tokens=r.num_external_tokens,
        )

    # ---- introspection ------------------------------------------------------------------------
    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    def prefix_cache_stats(self) -> dict[str, float]:
        s = self.kv.stats()
        return {"requests": s.requests, "queries": s.queries, "hits": s.hits,
                "hit_rate": s.hit_rate, "preempted_requests": s.preempted_requests,
                "preempted_hits": s.preempted_hits, "evictions": s.evictions}

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()

    def close(self) -> None:
        """Publish the last KV events and stop the publisher this LLM started (if any)."""
        if self.kv_events is not None:
            self.kv_events.close()

    def __repr__(self) -> str:
        spec = f", spec={self.spec.method}:{self.spec.num_speculative_tokens}" if self.spec else ""
        return (f"LLM({str(self.model_dir)!r}, {self.model.config.model_type}, "
                f"{len(self.kv_config.groups)} KV groups, {self.kv_config.num_blocks} blocks{spec})")
