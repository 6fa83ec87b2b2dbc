"""Decode hybridkv's payloads with vLLM 0.33's own ``KVEventBatch`` decoder.

Runs only where vLLM is importable (the optional vLLM venv of BENCHMARKS.md's parity section);
it skips otherwise and is not the proof of the format: tests/events/test_wire.py and
test_publisher.py decode with an independent decoder written from the contract.
"""

from __future__ import annotations

import pytest

kv_events = pytest.importorskip("vllm.distributed.kv_events")
import msgspec  # noqa: E402

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,  # noqa: E402
                      SlidingWindow, SpecDecode)
from hybridkv.events.wire import WireMapper, encode_batch  # noqa: E402


def test_vllm_decodes_our_batches() -> None:
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(block_size=16), ("l0",)),
                         KVCacheGroup("swa", SlidingWindow(block_size=16, window=64), ("l1",))),
                        num_blocks=40)
    kv = KVCacheManager(cfg, spec_decode=SpecDecode("eagle", 1), hash_algo="sha256",
                        enable_events=True)
    for rid, toks in (("a", list(range(300))), ("b", list(range(1000, 1300)))):
        req = Request(rid, toks)
        hit = kv.lookup(req)
        assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        kv.free(req)
    kv.reset_prefix_cache()
    events = kv.take_events()
    ours = WireMapper(cfg).batch(events, ts=3.5, data_parallel_rank=1)
    theirs = msgspec.msgpack.Decoder(kv_events.KVEventBatch).decode(encode_batch(ours))
    assert theirs.ts == 3.5 and theirs.data_parallel_rank == 1
    assert [type(e).__name__ for e in theirs.events] == [type(e).__name__ for e in ours.events]
    for a, b in zip(ours.events, theirs.events):
        for f in a.__struct_fields__:
            if hasattr(b, f):
                assert getattr(b, f) == getattr(a, f), f
    stored = [e for e in theirs.events if isinstance(e, kv_events.BlockStored)]
    assert {e.kv_cache_spec_kind for e in stored} == {"full_attention", "sliding_window"}
    assert all(e.lookahead_token_ids for e in stored)
    # and the reverse: vLLM's encoding of its own structs decodes with ours
    from hybridkv.events.wire import decode_batch
    back = decode_batch(msgspec.msgpack.Encoder().encode(theirs))
    assert (back.ts, back.events, back.data_parallel_rank) == (ours.ts, ours.events, 1)
