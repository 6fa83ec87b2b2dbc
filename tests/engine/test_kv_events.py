"""LLM(cache=CacheConfig(kv_events=...)): the engine publishes its manager's events after every
step over ZMQ."""

from __future__ import annotations

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")
pytest.importorskip("msgpack")

from hybridkv.engine.llm_options import RequestParams  # noqa: E402
from hybridkv.events import KVEventsConfig, recompute_block_hashes  # noqa: E402
from hybridkv.events.wire import decode_batch  # noqa: E402
from tests.engine.helpers import ARCHS, build, build_llm  # noqa: E402
from tests.events.spec_decoder import Listener, decode_message  # noqa: E402

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens


def test_llm_publishes_recomputable_events(tmp_path) -> None:
    built = build(ARCHS["qwen2_swa"], tmp_path / "model")
    endpoint = f"ipc://{tmp_path}/events.sock"
    ctx = zmq.Context()
    listener = None
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        listener = Listener(sub, 10**6)
        llm = build_llm(built.path, block_size={"full": 16, "sliding": 8}, device="cpu", num_blocks=64,
                        kv_events=KVEventsConfig(endpoint=endpoint, subscriber_wait_s=10))
        prompt = [(7 * i) % 97 + 3 for i in range(70)]
        first, = llm.generate([prompt], max_tokens=4, params=NO_EOS)
        second, = llm.generate([prompt + [5, 6, 7]], max_tokens=2, params=NO_EOS)
        assert second.num_cached_tokens > 0
        pub = llm.kv_events.publisher
        llm.close()                                 # publishes the last events, drains
        assert llm.kv_events.publisher is None and pub.published > 0
        import time
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(listener.frames) < pub.published:
            time.sleep(0.05)
        frames = list(listener.frames)
    finally:
        if listener is not None:
            listener.stop()
        ctx.destroy(linger=0)
    assert len(frames) == pub.published             # none lost
    assert [decode_message(f)[1] for f in frames] == list(range(len(frames)))
    kinds = set()
    hbs = llm.kv_config.hash_block_size
    for f in frames:
        for ev in decode_batch(f[2]).events:
            if type(ev).__name__ == "BlockStored":
                kinds.add((ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window))
                assert recompute_block_hashes(ev, hbs) == ev.block_hashes
    assert ("full_attention", None) in kinds
    assert any(k == "sliding_window" and w for k, w in kinds)
