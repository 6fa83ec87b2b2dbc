"""KV events on the wire: vLLM 0.33's msgpack schema, and the mapping from the core's events.

The contract (``vllm/distributed/kv_events.py`` in vLLM 0.33.0, read from its source)::

    payload   = msgpack( [ts, [event, ...], data_parallel_rank] )     EventBatch is array-like
    event     = msgpack map {"type": "BlockStored", field: value, ...}  events are tagged maps
    multipart = (topic, seq as 8-byte big-endian, payload)            on a PUB socket

Events are msgspec structs with ``tag=True`` (the tag field ``"type"`` holds the class name)
and ``omit_defaults=True``: a field is left out of the map when it equals its default, so
``extra_keys``, ``group_idx``, ``kv_cache_spec_kind`` ... appear only when set, while the
required fields (``lora_id``, ``medium``, ``lora_name`` ...) are always present, even when
None. ``EventBatch`` is ``array_like``: always three items (msgspec writes a None rank as nil);
the publisher stamps the rank (0 by default), as vLLM's does. Field order below is vLLM's
declaration order (it fixes the map's key order and the batch's array positions).

Block hashes are the manager's raw digests (``bytes``; vLLM's default ``ExternalBlockHash``
form). How a consumer recomputes them from ``token_ids`` is stated in :mod:`hybridkv.events`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from hybridkv.core import events as core_events
from hybridkv.core.rules import rule_class
from hybridkv.core.specs import AttentionSpec, KVCacheConfig

MEDIUM_GPU = "GPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events: encoded as the array ``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged event maps (tag key ``"type"``, tag value the class name)."""


class BlockStored(KVCacheEvent):
    """A run of consecutive blocks of one group was cached (fields in vLLM's order)."""

    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Cached blocks of one group were evicted."""

    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """Every cached block was dropped."""


class KVEventBatch(EventBatch):
    """The typed batch a consumer decodes into."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: EventBatch) -> bytes:
    """The msgpack payload of one batch."""
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode a payload (ours or vLLM's); raises ``msgspec.DecodeError`` on malformed input."""
    return _decoder.decode(payload)


def spec_kind(spec: AttentionSpec) -> tuple[str, int | None]:
    """``(kv_cache_spec_kind, kv_cache_spec_sliding_window)`` of a group's attention spec: its
    rule's ``wire_kind`` (vLLM's ``KVCacheSpecKind`` value), or ``windowed_wire_kind`` when
    the spec has a window and its type names one, and the window in tokens (None without)."""
    rule = rule_class(spec)
    window = spec.window_tokens
    kind = rule.windowed_wire_kind if window and rule.windowed_wire_kind else rule.wire_kind
    return kind, window


class WireMapper:
    """Turns the core's events (:mod:`hybridkv.core.events`) into wire events for one config.

    Stored events are annotated with the group's spec kind and window, as vLLM's
    ``KVCacheManager.take_events`` does; removals carry only hashes and ``group_idx``.
    """

    __slots__ = ("_kinds", "medium")

    def __init__(self, config: KVCacheConfig, medium: str = MEDIUM_GPU) -> None:
        self._kinds = [spec_kind(g.spec) for g in config.groups]
        self.medium = medium

    def map(self, event: core_events.KVEvent) -> WireEvent:
        if isinstance(event, core_events.BlockStored):
            kind, window = self._kinds[event.group_idx]
            return BlockStored(
                block_hashes=list(event.block_hashes), parent_block_hash=event.parent_block_hash,
                token_ids=event.token_ids, block_size=event.block_size,
                lora_id=None, medium=event.medium or self.medium, lora_name=event.lora_name,
                extra_keys=list(event.extra_keys) if event.extra_keys is not None else None,
                group_idx=event.group_idx, kv_cache_spec_kind=kind,
                kv_cache_spec_sliding_window=window,
                lookahead_token_ids=event.lookahead_token_ids)
        if isinstance(event, core_events.BlockRemoved):
            return BlockRemoved(block_hashes=list(event.block_hashes),
                                medium=event.medium or self.medium, group_idx=event.group_idx)
        if isinstance(event, core_events.AllBlocksCleared):
            return AllBlocksCleared()
        raise TypeError(f"not a KV event: {event!r}")

    def batch(self, events: list[core_events.KVEvent], ts: float,
              data_parallel_rank: int | None = None) -> EventBatch:
        return EventBatch(ts=ts, events=[self.map(e) for e in events],
                          data_parallel_rank=data_parallel_rank)
