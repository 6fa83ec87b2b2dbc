"""Decode hybridkv's payloads with vLLM 0.33's own ``KVEventBatch`` decoder, and the reverse.

vLLM runs in its own interpreter: this one if it imports vLLM, else the optional vLLM venv
``.venv-vllm`` in the repository root (BENCHMARKS.md's parity section), else
``HYBRIDKV_VLLM_PYTHON``; without any the module skips. One subprocess decodes every payload
with ``msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch)`` and encodes the
decoded structs again with vLLM's encoder. A field vLLM's decoder does not read under that
name (msgspec drops unknown fields) or reads with another value is missing or different in the
re-encoding. It is not the only proof of the format: tests/events/test_wire.py decodes with an
independent decoder written from the contract.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

pytest.importorskip("msgspec")
pytest.importorskip("msgpack")

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, LoRA,  # noqa: E402
                      MultiModalItem, Request, SlidingWindow, SpecDecode)
from hybridkv.events.wire import (AllBlocksCleared, BlockRemoved, BlockStored, EventBatch,  # noqa: E402
                                  WireMapper, decode_batch, encode_batch)
from tests.events.spec_decoder import decode_payload  # noqa: E402
from tests.events.test_wire import EVERY_REMOVED_FIELD, EVERY_STORED_FIELD  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

VLLM_ROUND_TRIP = """
import base64, json, sys
import msgspec
from vllm.distributed.kv_events import KVEventBatch
decoder, encoder = msgspec.msgpack.Decoder(KVEventBatch), msgspec.msgpack.Encoder()
out = []
for text in json.load(sys.stdin):
    batch = decoder.decode(base64.b64decode(text))
    out.append(base64.b64encode(encoder.encode(batch)).decode())
json.dump(out, sys.stdout)
"""


def vllm_python() -> str | None:
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    for candidate in (os.environ.get("HYBRIDKV_VLLM_PYTHON"), str(ROOT / ".venv-vllm/bin/python")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def stream_payloads() -> list[bytes]:
    """What the manager publishes for a sliding-window hybrid with EAGLE lookahead: plain
    requests, one with a LoRA adapter, an image and a salt, evictions and a reset."""
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(block_size=16), ("l0",)),
                         KVCacheGroup("swa", SlidingWindow(block_size=16, window=64), ("l1",))),
                        num_blocks=40)
    kv = KVCacheManager(cfg, CacheOptions(
        spec_decode=SpecDecode("eagle", 1), hash_algo="sha256", enable_events=True))
    mapper = WireMapper(cfg)
    payloads = []
    reqs = [Request("a", list(range(300))), Request("b", list(range(1000, 1300))),
            Request("c", list(range(2000, 2100)), RequestCacheParams(
                lora=LoRA("sql", "/a/sql"), cache_salt="t", mm_items=[MultiModalItem("img", 20, 30)]))]
    for req in reqs:
        hit = kv.lookup(req)
        assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        kv.free(req)
        payloads.append(encode_batch(mapper.batch(kv.take_events(), ts=3.5, data_parallel_rank=1)))
    kv.reset_prefix_cache()
    payloads.append(encode_batch(mapper.batch(kv.take_events(), ts=4.0, data_parallel_rank=1)))
    return payloads


@pytest.fixture(scope="module")
def through_vllm():
    """``(ours, vLLM's re-encoding)`` for every payload, from one vLLM subprocess."""
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM is not installed here (nor in .venv-vllm, nor HYBRIDKV_VLLM_PYTHON)")
    every = encode_batch(EventBatch(4.5, [BlockStored(**EVERY_STORED_FIELD),
                                          BlockRemoved(**EVERY_REMOVED_FIELD), AllBlocksCleared()], 6))
    ours = [every, *stream_payloads()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([python, "-c", VLLM_ROUND_TRIP], input=json.dumps(
        [base64.b64encode(p).decode() for p in ours]), capture_output=True, text=True, env=env,
        timeout=300)
    if res.returncode and "No module named 'vllm" in res.stderr:
        pytest.skip(f"{python} does not import vLLM")
    assert res.returncode == 0, res.stderr[-2000:]
    return ours, [base64.b64decode(t) for t in json.loads(res.stdout)]


def test_vllm_reads_every_field_of_ours(through_vllm) -> None:
    """vLLM's decoder reads every field we send, under its name and with its value: its
    re-encoding of what it decoded is the same document, field by field (the independent
    decoder reads both), for every field set and for a real stream with LoRA, an image, a salt,
    lookahead tokens, two group kinds, removals and a reset."""
    ours, theirs = through_vllm
    assert len(theirs) == len(ours) == 5
    for a, b in zip(ours, theirs):
        x, y = decode_payload(a), decode_payload(b)
        assert (x.ts, x.data_parallel_rank) == (y.ts, y.data_parallel_rank)
        assert [(e.kind, e.fields) for e in x.events] == [(e.kind, e.fields) for e in y.events]
    every = decode_payload(theirs[0]).events[0]
    assert set(every.fields) == set(EVERY_STORED_FIELD)        # nothing vLLM reads was dropped
    stored = [e for p in theirs[1:] for e in decode_payload(p).events if e.kind == "BlockStored"]
    assert {e.get("kv_cache_spec_kind") for e in stored} == {"full_attention", "sliding_window"}
    assert all(e.get("lookahead_token_ids") for e in stored)
    # request c: 16-token blocks (+1 lookahead token), an image on [20, 50), the salt in block 0
    assert [e.get("extra_keys")[:3] for e in stored if e.get("lora_name") == "sql"] == [
        [["sql", "t"], ["sql", ["img", 4]], ["sql", ["img", -12]]],                  # full
        [["sql", ["img", 4]], ["sql", ["img", -12]], ["sql", ["img", -28]]]]         # window


def test_vllms_encoding_decodes_with_ours(through_vllm) -> None:
    """The reverse: what vLLM's encoder writes decodes with hybridkv's decoder into the structs
    we encoded."""
    ours, theirs = through_vllm
    for a, b in zip(ours, theirs):
        x, y = decode_batch(a), decode_batch(b)
        assert (y.ts, y.events, y.data_parallel_rank) == (x.ts, x.events, x.data_parallel_rank)
