"""What a :class:`~hybridkv.core.manager.KVCacheManager` does with its pool: one frozen record,
built once where the options come in (the engine's ``CacheConfig``, the simulator's
``SimConfig``, a Python caller) and passed down whole.

Every check that needs only the options themselves runs here, at construction, with a message
naming the bad value and the valid ones; checks against the cache's groups (the retention
interval's alignment, that a request fits the pool) run when the manager is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.core.eviction import resolve_policy
from hybridkv.core.spec_decode import SpecDecode

__all__ = ["CacheOptions"]


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """The options of one KV-cache manager.

    Attributes:
        spec_decode: speculative decoding, if any (lookahead slots, boundary proof).
        retention_interval: sliding-window retention: None (dense), 0 (replay boundaries
            only, the default) or N (a window tail every N tokens plus replay boundaries).
        enable_caching: prefix caching on (hashing, lookup, caching).
        hash_algo: "xxh3_128" (default) or "sha256".
        hash_seed: the hash chain's seed; give one to share hashes across processes.
        max_model_len: cap on tokens per request: a step that would take a request past it
            is refused (ValueError), and lookahead slots past it are not allocated; also
            checked against the pool: one request of this length must fit.
        enable_events: record KV events for ``take_events``.
        vllm_compat: reproduce vLLM 0.33's semantics (hit lengths, cached blocks, eviction
            and block-id order): full groups cache every block and no extra boundaries.
        max_in_flight_tokens: vLLM's ``max_in_flight_tokens`` (tokens scheduled but not yet
            computed; its scheduler's token budget): caps a window group's compat-mode
            admission reservation. None: only max_model_len caps it.
        eviction_policy: the order cached free blocks are reused in, one of
            :data:`hybridkv.core.eviction.POLICIES` (``lru``, the default, is vLLM's order;
            ``recommended`` resolves to :data:`~hybridkv.core.eviction.RECOMMENDED`, on a
            hybrid config :data:`~hybridkv.core.eviction.RECOMMENDED_HYBRID`; the
            manager's ``eviction_policy`` is the resolved name). Only ``lru`` is allowed with
            vllm_compat. ``priority`` orders by the requests' retention configs
            (``Request(retention=...)``); the other policies refuse a request that carries one.
        hints: take per-request hints (``Request(hint=...)``, :mod:`hybridkv.core.hints`): the
            pool runs the hint layer (:mod:`hybridkv.core.eviction.hint_layer`) in front of the
            eviction policy (``lru`` becomes an exact-LRU policy object), which follows each
            hint kind only while it pays; ``"force"``: every hint, untested. False (the
            default): a request with a hint is refused.
    """

    spec_decode: SpecDecode | None = None
    retention_interval: int | None = 0
    enable_caching: bool = True
    hash_algo: str = "xxh3_128"
    hash_seed: str | None = None
    max_model_len: int | None = None
    enable_events: bool = False
    vllm_compat: bool = False
    max_in_flight_tokens: int | None = None
    eviction_policy: str = "lru"
    hints: bool | str = False

    def __post_init__(self) -> None:
        if self.spec_decode is not None and not isinstance(self.spec_decode, SpecDecode):
            raise ValueError(f"spec_decode must be a SpecDecode or None, got {self.spec_decode!r}")
        for name in ("max_in_flight_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be None or a positive integer, got {value!r}")
        resolve_policy(self.eviction_policy, self.vllm_compat)
        if not (isinstance(self.hints, bool) or self.hints == "force"):
            raise ValueError(f"hints must be True, False or 'force', got {self.hints!r}")
        if self.hints and self.vllm_compat:
            raise ValueError("vllm_compat pins vLLM's LRU order; hints=True needs vllm_compat=False")
