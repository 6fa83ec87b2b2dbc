"""The wire format: what hybridkv encodes, decoded by an independent decoder (tests/events/
spec_decoder.py, plain msgpack), and hashes recomputed from token_ids with hashlib alone."""

from __future__ import annotations

import hashlib
import struct

import pytest

pytest.importorskip("msgspec")
pytest.importorskip("msgpack")
import msgpack  # noqa: E402

from hybridkv import (MLA, ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup,  # noqa: E402
                      KVCacheManager, Request, SlidingWindow)
from hybridkv.events import recompute_block_hashes  # noqa: E402
from hybridkv.events.wire import (AllBlocksCleared, BlockRemoved, BlockStored, EventBatch,  # noqa: E402
                                  WireMapper, decode_batch, encode_batch)
from tests.events.spec_decoder import decode_payload  # noqa: E402


def serve(kv: KVCacheManager, rid: str, tokens: list[int], decode: int = 0) -> Request:
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
    req.num_computed_tokens = req.num_tokens
    for k in range(decode):
        req.append_tokens([90_000 + k])
        assert kv.allocate(req, 1) is not None
        req.num_computed_tokens += 1
    kv.free(req)
    return req


def hybrid_config(num_blocks: int = 64) -> KVCacheConfig:
    return KVCacheConfig((
        KVCacheGroup("full", FullAttention(block_size=16), ("l0",)),
        KVCacheGroup("swa", SlidingWindow(block_size=32, window=64), ("l1",)),
        KVCacheGroup("chunk", ChunkedLocal(block_size=16, chunk_size=64), ("l2",)),
    ), num_blocks=num_blocks)


def independent_hashes(parent: bytes | None, token_ids: list[int], block_size: int,
                       hash_block: int) -> list[bytes]:
    """sha256(parent + tokens as <int64) chained per hash block, root sha256(seed)."""
    h = parent if parent is not None else hashlib.sha256(b"hybridkv-none-hash").digest()
    out = []
    for j in range(len(token_ids) // block_size):
        block = token_ids[j * block_size:(j + 1) * block_size]
        for k in range(0, block_size, hash_block):
            sub = block[k:k + hash_block]
            h = hashlib.sha256(h + struct.pack(f"<{len(sub)}q", *sub)).digest()
        out.append(h)
    return out


def test_batch_is_an_array_and_events_are_tagged_maps_in_vllm_field_order() -> None:
    cfg = hybrid_config(num_blocks=64)
    kv = KVCacheManager(cfg, hash_algo="sha256", enable_events=True)
    serve(kv, "a", list(range(200)), decode=3)
    serve(kv, "b", list(range(1000, 1300)))       # evicts some of a's blocks
    assert kv.reset_prefix_cache()
    events = kv.take_events()
    payload = encode_batch(WireMapper(cfg).batch(events, ts=12.5, data_parallel_rank=3))
    raw = msgpack.unpackb(payload, raw=False)
    assert isinstance(raw, list) and raw[0] == 12.5 and raw[2] == 3
    batch = decode_payload(payload)                # raises on any deviation from the contract
    kinds = [e.kind for e in batch.events]
    assert kinds.count("BlockStored") >= 3 and "BlockRemoved" in kinds
    assert kinds[-1] == "AllBlocksCleared" and batch.events[-1].fields == {}
    assert len(batch.events) == len(events)
    for core, ev in zip(events, batch.events):
        if ev.kind == "BlockStored":
            assert ev.get("block_hashes") == list(core.block_hashes)
            assert ev.get("lora_id") is None and "lora_id" in ev.fields   # required, so present
            assert ev.get("medium") == "GPU" and ev.get("group_idx") == core.group_idx
            kind, window = {0: ("full_attention", None), 1: ("sliding_window", 64),
                            2: ("chunked_local_attention", None)}[core.group_idx]
            assert ev.get("kv_cache_spec_kind") == kind
            assert ev.get("kv_cache_spec_sliding_window") == window
            assert ("kv_cache_spec_sliding_window" in ev.fields) == (window is not None)
            assert "extra_keys" not in ev.fields and "session_id" not in ev.fields  # defaults omitted
        elif ev.kind == "BlockRemoved":
            assert ev.get("block_hashes") == list(core.block_hashes)
            assert ev.get("group_idx") == core.group_idx


def test_stored_hashes_are_recomputable_from_token_ids() -> None:
    cfg = hybrid_config()
    kv = KVCacheManager(cfg, hash_algo="sha256", enable_events=True)
    serve(kv, "a", list(range(7, 300)), decode=20)
    serve(kv, "b", list(range(7, 200)) + list(range(5000, 5100)))
    batch = decode_payload(encode_batch(WireMapper(cfg).batch(kv.take_events(), ts=0.0)))
    stored = [e for e in batch.events if e.kind == "BlockStored"]
    assert {e.get("group_idx") for e in stored} == {0, 1, 2}
    for ev in stored:
        want = independent_hashes(ev.get("parent_block_hash"), ev.get("token_ids"),
                                  ev.get("block_size"), cfg.hash_block_size)
        assert ev.get("block_hashes") == want


def test_recompute_helper_with_lookahead_and_coarse_blocks() -> None:
    from hybridkv import SpecDecode
    cfg = hybrid_config()
    kv = KVCacheManager(cfg, spec_decode=SpecDecode("eagle", 2), hash_algo="sha256",
                        enable_events=True)
    serve(kv, "a", list(range(300)), decode=10)
    mapper = WireMapper(cfg)
    n = 0
    for core in kv.take_events():
        ev = mapper.map(core)
        if isinstance(ev, BlockStored):
            assert ev.lookahead_token_ids and len(ev.lookahead_token_ids[0]) == 1
            assert recompute_block_hashes(ev, cfg.hash_block_size) == ev.block_hashes
            n += 1
    assert n >= 2


def test_mla_kinds() -> None:
    cfg = KVCacheConfig((KVCacheGroup("mla", MLA(block_size=64), ("l0",)),), num_blocks=16)
    kv = KVCacheManager(cfg, hash_algo="sha256", enable_events=True)
    serve(kv, "a", list(range(200)))
    batch = decode_payload(encode_batch(WireMapper(cfg).batch(kv.take_events(), ts=1.0)))
    assert {e.get("kv_cache_spec_kind") for e in batch.events} == {"mla_attention"}


def test_decodes_a_payload_built_by_hand_in_vllm_form() -> None:
    """A payload written with plain msgpack the way vLLM's msgspec encoder lays it out (int
    hashes, optional fields absent) decodes into the typed structs, and re-encodes to it."""
    stored = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
              "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
              "lora_name": None, "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
              "kv_cache_spec_sliding_window": 4096}
    removed = {"type": "BlockRemoved", "block_hashes": [b"\x01" * 16], "medium": "CPU"}
    payload = msgpack.packb([1.25, [stored, removed, {"type": "AllBlocksCleared"}], 2])
    b = decode_batch(payload)
    assert b.ts == 1.25 and b.data_parallel_rank == 2
    s, r, c = b.events
    assert isinstance(s, BlockStored) and s.block_hashes == [11, 12] and s.group_idx == 1
    assert s.kv_cache_spec_sliding_window == 4096 and s.extra_keys is None
    assert isinstance(r, BlockRemoved) and r.group_idx is None and r.medium == "CPU"
    assert isinstance(c, AllBlocksCleared)
    # and the reverse: our encoding of the same structs is the same msgpack document (keys in the
    # same order; msgspec may pick a wider map header than msgpack does, so bytes can differ)
    ours = msgpack.unpackb(encode_batch(EventBatch(1.25, [s, r, c], 2)), raw=False)
    theirs = msgpack.unpackb(payload, raw=False)
    assert ours == theirs
    assert [list(e) for e in ours[1]] == [list(e) for e in theirs[1]]
    # a two-item batch (no rank) is accepted too
    assert decode_batch(msgpack.packb([0.5, []])).data_parallel_rank is None


def test_malformed_payloads_raise() -> None:
    import msgspec
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x93\x01")
    with pytest.raises(msgspec.ValidationError):
        decode_batch(msgpack.packb([1.0, [{"type": "Nope"}], 0]))
