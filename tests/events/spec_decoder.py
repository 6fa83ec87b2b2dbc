"""An independent decoder of vLLM 0.33's KV events, written from the published contract with the
plain ``msgpack`` library (no msgspec, nothing from hybridkv.events):

* a ZMQ message is three frames: topic, seq (8-byte big-endian), payload;
* the payload is a msgpack array ``[ts: float, events: array, data_parallel_rank: int]``;
* an event is a msgpack map whose ``"type"`` key names it; fields equal to their default are
  left out. Required fields: BlockStored ``block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, lora_name``; BlockRemoved ``block_hashes, medium``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import msgpack

STORED_REQUIRED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                   "medium", "lora_name")
STORED_OPTIONAL = ("extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
                   "locality", "ownership", "session_id", "lookahead_token_ids")
REMOVED_REQUIRED = ("block_hashes", "medium")
REMOVED_OPTIONAL = ("group_idx", "locality", "ownership")
# vLLM's declaration order: the key order of an encoded map
STORED_ORDER = ("type",) + STORED_REQUIRED + STORED_OPTIONAL
REMOVED_ORDER = ("type",) + REMOVED_REQUIRED + REMOVED_OPTIONAL


@dataclass
class Event:
    kind: str
    fields: dict = field(default_factory=dict)

    def get(self, name, default=None):
        return self.fields.get(name, default)


@dataclass
class Batch:
    ts: float
    events: list[Event]
    data_parallel_rank: int | None


def decode_payload(payload: bytes) -> Batch:
    raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(raw, list) or not 2 <= len(raw) <= 3:
        raise ValueError(f"EventBatch must be an array of 2-3 items, got {raw!r}")
    ts, events = raw[0], raw[1]
    rank = raw[2] if len(raw) == 3 else None
    if not isinstance(ts, float):
        raise ValueError(f"ts must be a float, got {ts!r}")
    out = []
    for ev in events:
        if not isinstance(ev, dict) or "type" not in ev:
            raise ValueError(f"event must be a tagged map, got {ev!r}")
        kind = ev["type"]
        keys = list(ev)
        if kind == "BlockStored":
            required, order = STORED_REQUIRED, STORED_ORDER
        elif kind == "BlockRemoved":
            required, order = REMOVED_REQUIRED, REMOVED_ORDER
        elif kind == "AllBlocksCleared":
            required, order = (), ("type",)
        else:
            raise ValueError(f"unknown event type {kind!r}")
        missing = [k for k in required if k not in ev]
        if missing:
            raise ValueError(f"{kind} lacks required fields {missing}")
        unknown = [k for k in keys if k not in order]
        if unknown:
            raise ValueError(f"{kind} has unknown fields {unknown}")
        if keys != sorted(keys, key=order.index):
            raise ValueError(f"{kind} fields out of declaration order: {keys}")
        out.append(Event(kind, {k: v for k, v in ev.items() if k != "type"}))
    return Batch(ts, out, rank)


def decode_message(frames: list[bytes]) -> tuple[bytes, int, Batch]:
    if len(frames) != 3 or len(frames[1]) != 8:
        raise ValueError(f"expected (topic, 8-byte seq, payload), got {len(frames)} frames")
    return frames[0], int.from_bytes(frames[1], "big", signed=True), decode_payload(frames[2])


# ---- a subscriber for the tests ----------------------------------------------------------
def receive(sub, n: int, timeout_s: float = 20.0, out: list | None = None,
            stop: threading.Event | None = None) -> list[list[bytes]]:
    """Up to ``n`` messages (appended to ``out`` as they come), within ``timeout_s``."""
    out = [] if out is None else out
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline and not (stop and stop.is_set()):
        if sub.poll(100):
            out.append(sub.recv_multipart())
    return out


class Listener:
    """A subscriber already listening: a thread in a receive loop (ZMQ sends a bound SUB's
    subscription to a new peer only while the owning thread works the socket, as a real
    consumer's loop does)."""

    def __init__(self, sub, n: int) -> None:
        self.frames: list[list[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=receive, args=(sub, n, 20.0, self.frames, self._stop),
                                        daemon=True)
        self._thread.start()

    def join(self) -> list[list[bytes]]:
        self._thread.join(30)
        return self.frames

    def stop(self) -> list[list[bytes]]:
        """Stop listening (before the socket's context goes away)."""
        self._stop.set()
        return self.join()
