"""The request: its tokens, its identity for caching, and its progress.

A request carries everything the cache needs to know about it, so manager calls stay short:
token ids (prompt, then appended outputs), the number of tokens whose KV is computed, the
cache salt, the LoRA adapter and the multimodal items that enter its block hashes, and the
block hashes themselves (appended by the manager's :class:`~hybridkv.core.hashing.BlockHasher`
as tokens arrive).

The caller (a scheduler) owns ``num_computed_tokens``: it advances it after each step and
resets it to 0 when the request is preempted.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from hybridkv.core.hints import Hint
from hybridkv.core.retention_config import RetentionConfig

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class LoRA:
    """A LoRA adapter. The path enters the hash so a re-pointed name does not reuse KV."""

    name: str
    path: str = ""


@dataclass(frozen=True, slots=True)
class MultiModalItem:
    """A multimodal input occupying prompt positions ``[offset, offset + length)``.

    ``identifier`` is the content hash of the item (image bytes, audio, ...).
    """

    identifier: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class RequestCacheParams:
    """What the cache needs to know about a request beyond its tokens, passed whole to
    :class:`Request`.

    Hash extras (they enter the block hashes): ``cache_salt``, ``lora``, ``mm_items``.
    Cache policy (how its blocks are looked up and kept): ``skip_prefix_cache``,
    ``retention``, ``hint``, ``checkpoints``. Field meanings are in :class:`Request`.

    The record checks what it can alone (types, order); :class:`Request` checks what needs
    the prompt (ranges inside it) and names the request in every error.
    """

    cache_salt: str | None = None
    lora: LoRA | None = None
    mm_items: Sequence[MultiModalItem] = ()
    skip_prefix_cache: bool = False
    retention: RetentionConfig | None = None
    hint: Hint | None = None
    checkpoints: Sequence[int] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.skip_prefix_cache, bool):
            raise ValueError(f"RequestCacheParams: skip_prefix_cache must be True or False, "
                             f"got {self.skip_prefix_cache!r}")


_NO_PARAMS = RequestCacheParams()


def _as_token_array(token_ids: Iterable[int], what: str) -> array[int]:
    if hasattr(token_ids, "dtype") and hasattr(token_ids, "tobytes"):  # numpy: one memcpy
        ndarray: Any = token_ids                # numpy is not imported here: duck-typed
        kind = ndarray.dtype.kind
        if kind not in "iu":
            raise ValueError(f"{what}: token ids must be integers, got dtype {ndarray.dtype}")
        out = array("q")
        out.frombytes(ndarray.astype("<i8", copy=False).tobytes())
        return out
    try:
        return array("q", token_ids)
    except (TypeError, OverflowError) as exc:
        raise ValueError(
            f"{what}: token ids must be integers in [{INT64_MIN}, {INT64_MAX}] ({exc})"
        ) from None


class Request:
    """One sequence the cache serves.

    Args:
        request_id: unique id (any hashable, usually a string).
        token_ids: the prompt token ids (non-empty).
        params: the :class:`RequestCacheParams` (None: all defaults), whose fields are:
        cache_salt: isolates this request's cache from requests with another salt.
        lora: the LoRA adapter, if any.
        mm_items: multimodal items, sorted by offset, inside the prompt.
        skip_prefix_cache: do not read the prefix cache (e.g. prompt logprobs are requested);
            the request's blocks are still cached for others.
        retention: how long its blocks should stay cached after release (priority + TTL per
            prompt token range, :class:`~hybridkv.core.retention_config.RetentionConfig`);
            needs a manager with ``eviction_policy="priority"``. Ranges must lie in the prompt.
        hint: what the application knows about the request's session (it ends, pin a prefix,
            it resumes soon: :class:`~hybridkv.core.hints.Hint`); needs a manager with
            ``hints=True``, under any eviction policy.
        checkpoints: prompt positions (tokens, 1..prompt length) the application marks as
            worth a hit later, e.g. the end of a shared system prompt (the checkpoint hint,
            vLLM RFC #55697). Default mode promises each, rounded down to the alignment, like
            a replay boundary: recurrent-state groups write a checkpoint there and window
            groups keep the window before it. Compat mode ignores them (vLLM 0.33 has none).
    """

    __slots__ = ("request_id", "token_ids", "num_prompt_tokens", "num_computed_tokens",
                 "cache_salt", "lora", "mm_items", "skip_prefix_cache", "block_hashes",
                 "hasher", "num_preemptions", "retention", "hint", "checkpoints", "__weakref__")

    def __init__(self, request_id: object, token_ids: Iterable[int],
                 params: RequestCacheParams | None = None) -> None:
        if params is None:
            params = _NO_PARAMS
        elif not isinstance(params, RequestCacheParams):
            raise ValueError(f"request {request_id!r}: params must be a RequestCacheParams or None, "
                             f"got {params!r}")
        cache_salt, lora, mm_items = params.cache_salt, params.lora, params.mm_items
        skip_prefix_cache, retention, hint = params.skip_prefix_cache, params.retention, params.hint
        checkpoints = params.checkpoints
        tokens = _as_token_array(token_ids, f"request {request_id!r}")
        if len(tokens) == 0:
            raise ValueError(f"request {request_id!r} has an empty prompt; give at least one token")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"request {request_id!r}: cache_salt must be a str or None, got {cache_salt!r}")
        if lora is not None and not isinstance(lora, LoRA):
            raise ValueError(f"request {request_id!r}: lora must be a LoRA(name, path), got {lora!r}")
        mm = tuple(mm_items)
        prev_end = None
        for item in mm:
            if not isinstance(item, MultiModalItem):
                raise ValueError(f"request {request_id!r}: mm_items must hold MultiModalItem, got {item!r}")
            if item.length <= 0 or item.offset < 0 or item.offset + item.length > len(tokens):
                raise ValueError(
                    f"request {request_id!r}: multimodal item {item.identifier!r} at "
                    f"[{item.offset}, {item.offset + item.length}) must have length > 0 and lie "
                    f"inside the prompt [0, {len(tokens)})"
                )
            if prev_end is not None and item.offset < prev_end:
                raise ValueError(
                    f"request {request_id!r}: multimodal items must be sorted by offset and not "
                    f"overlap; {item.identifier!r} starts at {item.offset} < {prev_end}"
                )
            prev_end = item.offset + item.length
        if retention is not None:
            if not isinstance(retention, RetentionConfig):
                raise ValueError(f"request {request_id!r}: retention must be a RetentionConfig or None, "
                                 f"got {retention!r}")
            retention.check_prompt(len(tokens), f"request {request_id!r}")
        if hint is not None:
            if not isinstance(hint, Hint):
                raise ValueError(f"request {request_id!r}: hint must be a Hint or None, got {hint!r}")
            hint.check_prompt(len(tokens), f"request {request_id!r}")
        marks = tuple(checkpoints)
        for m in marks:
            if isinstance(m, bool) or not isinstance(m, int) or not 0 < m <= len(tokens):
                raise ValueError(f"request {request_id!r}: checkpoint positions must be integers in "
                                 f"[1, {len(tokens)}] (the prompt), got {m!r}")
        self.checkpoints = tuple(sorted(set(marks)))
        self.request_id = request_id
        self.token_ids = tokens  # array('q'): prompt then outputs; grow only via append_tokens
        self.num_prompt_tokens = len(tokens)
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.lora = lora
        self.mm_items = mm
        self.skip_prefix_cache = skip_prefix_cache
        self.block_hashes: list[bytes] = []
        self.hasher: object = None  # the BlockHasher that produced block_hashes (set by the manager)
        self.num_preemptions = 0
        self.retention = retention
        self.hint = hint

    # ---- tokens -------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """``len(token_ids)``: prompt plus appended tokens."""
        return len(self.token_ids)

    def append_tokens(self, token_ids: Iterable[int]) -> None:
        """Append output (or accepted draft) tokens. Hashes follow on the next manager call.

        ``token_ids`` (all tokens, an ``array('q')``) must not be mutated any other way.
        """
        if type(token_ids) is list or type(token_ids) is tuple:
            tokens = self.token_ids
            n = len(tokens)
            try:
                if len(token_ids) == 1:         # a decode step's token: append is cheaper
                    tokens.append(token_ids[0])
                else:
                    tokens.extend(token_ids)
            except (TypeError, OverflowError):
                del tokens[n:]  # undo a partial extend; fall through for the precise error
            else:
                return
        self.token_ids.extend(_as_token_array(token_ids, f"request {self.request_id!r}"))

    # ---- extra keys -----------------------------------------------------------------------
    @property
    def has_extra_keys(self) -> bool:
        return bool(self.cache_salt or self.lora or self.mm_items)

    def extra_keys(self, start: int, end: int) -> tuple[tuple[object, ...], ...]:
        """The extra keys of the token range ``[start, end)``, in the order LoRA, MM, salt."""
        keys: list[tuple[object, ...]] = []
        if self.lora is not None:
            keys.append(("lora", self.lora.name, self.lora.path))
        for item in self.mm_items:
            if item.offset >= end:
                break
            if item.offset + item.length > start:
                keys.append(("mm", item.identifier, item.offset - start))
        if start == 0 and self.cache_salt:
            keys.append(("cache_salt", self.cache_salt))
        return tuple(keys)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, hashes={len(self.block_hashes)})")
