"""``LLM``: batch generation on the reference engine, driven by the shared scheduler.

    llm = LLM("path/to/hf_dir", block_size=16, num_blocks=512, spec="ngram:3")
    outs = llm.generate([[1, 2, 3], "a prompt"], max_tokens=32)
    outs[0].token_ids, outs[0].num_cached_tokens

Everything lives in one process: the model (plain torch, CPU or CUDA), a
:class:`~hybridkv.core.manager.KVCacheManager` whose groups are the model's layer kinds (plus
the drafter's, marked ``is_draft``), a :class:`~hybridkv.engine.kv_cache.PagedKVCache` sized
from that config, a :class:`~hybridkv.sched.Scheduler` and an
:class:`~hybridkv.engine.runner.EngineCore`. The prefix cache persists across ``generate``
calls. Sampling is greedy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
from hybridkv.core.spec_decode import SpecDecode
from hybridkv.core.specs import KVCacheConfig
from hybridkv.sched import EngineRequest, Scheduler, SchedulerConfig

from .drafters import DFlashDrafter, DraftModelDrafter, Drafter, NgramDrafter
from .kv_cache import PagedKVCache, default_device
from .kv_config import kv_cache_groups
from .models import load_model
from .models.dflash import load_dflash
from .runner import EngineCore, EngineStats

ENGINE_SPEC_METHODS = ("ngram", "draft_model", "dflash")
_SPEC_ALIASES = {"draft": "draft_model", "draft-model": "draft_model", "draftmodel": "draft_model"}
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
DEFAULT_KV_CACHE_BYTES = 128 << 20


def parse_spec(spec: str | SpecDecode | None) -> SpecDecode | None:
    """``"METHOD:K"`` (ngram, draft_model, dflash) -> SpecDecode; None stays None."""
    if spec is None or isinstance(spec, SpecDecode):
        if isinstance(spec, SpecDecode) and spec.method not in ENGINE_SPEC_METHODS:
            raise ValueError(f"the reference engine drafts with {', '.join(ENGINE_SPEC_METHODS)}; "
                             f"{spec.method!r} is not implemented")
        return spec
    method, sep, k = str(spec).partition(":")
    method = _SPEC_ALIASES.get(method.strip().lower(), method.strip().lower())
    if not sep or not k.strip().isdigit():
        raise ValueError(f"speculative decoding is METHOD:K (e.g. ngram:3, draft_model:4, dflash:7), "
                         f"got {spec!r}")
    if method not in ENGINE_SPEC_METHODS:
        raise ValueError(f"unknown speculative method {method!r}; the engine implements "
                         f"{', '.join(ENGINE_SPEC_METHODS)}")
    return SpecDecode(method, int(k))


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
            from transformers import AutoTokenizer  # lazy: the engine does not need transformers

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


class LLM:
    """Greedy batch generation with paged attention, prefix caching and speculative decoding.

    Args:
        model: an HF-format directory (``config.json`` + ``*.safetensors``).
        spec: speculative decoding, ``"ngram:K"``, ``"draft_model:K"`` or ``"dflash:K"`` (or a
            :class:`SpecDecode`); draft_model and dflash need ``draft_model``.
        draft_model: the drafter's directory: a small causal LM with the target's vocabulary
            (draft_model) or a DFlash drafter (dflash).
        block_size: tokens per block, for every group or per layer kind ("full", "sliding",
            "mla"); drafter groups use the "full" size (or the smallest).
        num_blocks: pool size including the null block; default from ``kv_cache_bytes``.
        kv_cache_bytes: KV budget when ``num_blocks`` is not given (default 128 MiB).
        max_model_len: tokens per request; default ``min(max_position_embeddings, 4096)``
            reduced to what one request can hold in the pool.
        max_num_batched_tokens, max_num_seqs, enable_chunked_prefill,
        long_prefill_token_threshold, policy: the scheduler's limits.
        enable_prefix_caching, retention_interval, hash_algo, vllm_compat: the manager's options
            (``hash_algo`` defaults to xxh3_128, or sha256 when a ``kv_store`` is shared).
        ngram_sizes: (min n, max n) of the n-gram drafter.
        device: default CUDA when available, else CPU.
        dtype: weight / compute dtype (default: the checkpoint's); the KV cache uses it too
            unless ``kv_cache_dtype`` is given.
        record_logits: keep every computed position's logits (``GenerationOutput.logits``).
        check_draft_slots: make a draft write outside a request's blocks raise (default: it
            lands wherever the persistent block-table row points, as on a GPU).
        kv_store: an external KV tier (``LocalCPUStore``, ``MooncakeStore``): computed blocks
            are saved to it and prefixes found in it are loaded instead of recomputed.
        kv_namespace: what must match for two engines to share KV (default: a digest of the
            model directory's config and weight files).
        hash_seed: the block-hash seed; engines sharing a store need the same one (default
            with a store: a fixed seed; without: a random one).
        kv_load, kv_save: load from / save to the store.
        kv_events: publish KV events after every step in vLLM 0.33's ZMQ format: a
            ``hybridkv.events.KVEventsConfig`` (a publisher is started; :meth:`close` stops
            it), or any object with ``publish(batch)``. Hashes default to sha256 then.
    """

    def __init__(self, model: str | Path, *, spec: str | SpecDecode | None = None,
                 draft_model: str | Path | None = None,
                 block_size: int | Mapping[str, int] = 16, num_blocks: int | None = None,
                 kv_cache_bytes: int | None = None, max_model_len: int | None = None,
                 max_num_batched_tokens: int = 2048, max_num_seqs: int = 64,
                 enable_chunked_prefill: bool = True, long_prefill_token_threshold: int = 0,
                 policy: str = "fcfs", enable_prefix_caching: bool = True,
                 retention_interval: int | None = 0, hash_algo: str | None = None,
                 vllm_compat: bool = False, ngram_sizes: tuple[int, int] = (1, 4),
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 kv_cache_dtype: str | None = None, record_logits: bool = False,
                 check_draft_slots: bool = False, kv_store: KVStore | None = None,
                 kv_namespace: str | None = None, hash_seed: str | None = None,
                 kv_load: bool = True, kv_save: bool = True, kv_events: Any = None) -> None:
        self.model_dir = Path(model)
        self.device = torch.device(device) if device is not None else default_device()
        self.model = load_model(self.model_dir, device=self.device, dtype=dtype)
        self.spec = parse_spec(spec)
        self.drafter = self._make_drafter(self.spec, draft_model, ngram_sizes, dtype)
        kinds = set(self.model.config.layer_kinds)
        if isinstance(block_size, Mapping):
            sizes = {k: int(v) for k, v in block_size.items()}
        else:
            sizes = {kind: int(block_size) for kind in kinds | {"full"}}
        cache_dtype = kv_cache_dtype or _DTYPE_NAMES.get(self.model.dtype, "float32")
        groups = kv_cache_groups(self.model, sizes, cache_dtype)
        if self.drafter is not None:
            groups = groups + self.drafter.kv_cache_groups(sizes, cache_dtype)
        if num_blocks is None:
            probe = KVCacheConfig(groups, num_blocks=2)
            num_blocks = max(2, (kv_cache_bytes or DEFAULT_KV_CACHE_BYTES) // probe.block_bytes)
        self.kv_config = KVCacheConfig(groups, num_blocks=int(num_blocks))
        if max_model_len is None:
            cap = min(self.model.config.max_position_embeddings, 4096)
            max_model_len = max_len_that_fits(self.kv_config, cap, retention_interval=retention_interval,
                                              vllm_compat=vllm_compat)
            if max_model_len < 2:
                raise ValueError(f"the pool of {num_blocks} blocks cannot hold even a 2-token request")
        self.max_model_len = max_model_len
        if hash_seed is None and kv_store is not None:
            hash_seed = SHARED_HASH_SEED
        if hash_algo is None:  # keys shared across processes and tenants: a cryptographic hash
            hash_algo = "sha256" if kv_store is not None or kv_events is not None else "xxh3_128"
        self.kv = KVCacheManager(self.kv_config, spec_decode=self.spec, retention_interval=retention_interval,
                                 enable_caching=enable_prefix_caching, hash_algo=hash_algo,
                                 hash_seed=hash_seed, max_model_len=max_model_len,
                                 vllm_compat=vllm_compat, enable_events=kv_events is not None)
        self.cache = PagedKVCache(self.kv_config, device=self.device)
        self.connector: KVConnector | None = None
        if kv_store is not None:
            layout = KVLayout.register({n: self.cache.layer(n) for n in self.cache.layer_names},
                                       self.kv_config)
            transfer = KVTransfer(layout, kv_store,
                                  namespace=kv_namespace if kv_namespace is not None
                                  else model_namespace(self.model_dir))
            self.connector = KVConnector(self.kv, transfer, load=kv_load, save=kv_save)
        self.scheduler = Scheduler(self.kv, SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold, policy=policy),
            connector=self.connector)
        self.engine = EngineCore(self.model, self.kv, self.scheduler, self.cache, self.drafter,
                                 record_logits=record_logits, check_draft_slots=check_draft_slots,
                                 connector=self.connector)
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        self.eos_token_ids = eos_token_ids(self.model_dir)
        self._next_id = 0
        self.kv_events = None
        if kv_events is not None:
            from hybridkv.events.stream import attach_kv_events
            self.kv_events = attach_kv_events(self.kv, self.engine.step_hooks, kv_events)

    def _make_drafter(self, spec: SpecDecode | None, draft_dir: str | Path | None,
                      ngram_sizes: tuple[int, int], dtype: torch.dtype | None) -> Drafter | None:
        if spec is None:
            if draft_dir is not None:
                raise ValueError("draft_model needs spec='draft_model:K' or 'dflash:K'")
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
        if small.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"draft model vocab_size {small.config.vocab_size} differs from the "
                             f"target's {self.model.config.vocab_size}")
        return DraftModelDrafter(small)

    # ---- generation ---------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{str(self.model_dir)!r} has no tokenizer; pass token ids instead of text")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def generate(self, prompts: Sequence[str | Sequence[int]] | str, max_tokens: int | Sequence[int] = 16,
                 *, cache_salt: str | None | Sequence[str | None] = None,
                 stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                 priority: Sequence[int] | None = None) -> list[GenerationOutput]:
        """Generate greedily for every prompt (one batch, continuous batching); outputs in order.

        Args:
            prompts: token-id lists or strings (strings need a tokenizer), or one string.
            max_tokens: output tokens per request (one value or one per prompt).
            cache_salt: per-request (or shared) salt; requests only share cache within a salt.
            stop_token_ids: extra stop tokens; the model's EOS ids stop too unless ``ignore_eos``.
            priority: per-request priority (``policy="priority"``).
        """
        reqs = self.submit(prompts, max_tokens, cache_salt=cache_salt, stop_token_ids=stop_token_ids,
                           ignore_eos=ignore_eos, priority=priority)
        self.engine.run()
        return self.collect(reqs)

    def submit(self, prompts: Sequence[str | Sequence[int]] | str, max_tokens: int | Sequence[int] = 16,
               *, cache_salt: str | None | Sequence[str | None] = None,
               stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
               priority: Sequence[int] | None = None) -> list[EngineRequest]:
        """Queue requests without running them (drive ``llm.engine.step()`` yourself, then
        :meth:`collect`). Arguments as for :meth:`generate`."""
        if isinstance(prompts, str):
            prompts = [prompts]
        n = len(prompts)
        limits = [max_tokens] * n if isinstance(max_tokens, int) else list(max_tokens)
        salts = list(cache_salt) if isinstance(cache_salt, (list, tuple)) else [cache_salt] * n
        prios = list(priority) if priority is not None else [0] * n
        if not len(limits) == len(salts) == len(prios) == n:
            raise ValueError("max_tokens, cache_salt and priority need one entry per prompt")
        stops = set(stop_token_ids or ())
        if not ignore_eos:
            stops |= set(self.eos_token_ids)
        reqs = []
        for i, p in enumerate(prompts):
            rid = f"req-{self._next_id}"
            self._next_id += 1
            core = Request(rid, self.encode(p), cache_salt=salts[i])
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
