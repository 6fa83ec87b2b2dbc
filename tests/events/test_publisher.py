"""The ZMQ publisher against real pyzmq sockets on 127.0.0.1 / ipc only: no loss for a
subscriber already listening, replay of exactly the buffered batches, bad endpoints, a
subscriber that goes away, a full queue. Payloads are decoded by the independent decoder."""

from __future__ import annotations

import time

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")
pytest.importorskip("msgpack")

from hybridkv.events.publisher import (END_SEQ, KVEventsConfig, ZmqEventPublisher,  # noqa: E402
                                       check_endpoint, is_bind_endpoint, offset_endpoint)
from hybridkv.events.wire import BlockRemoved, BlockStored, EventBatch  # noqa: E402
from tests.events.spec_decoder import Listener, decode_message, decode_payload  # noqa: E402


def batch(i: int) -> EventBatch:
    h = i.to_bytes(16, "big")
    return EventBatch(float(i), [BlockStored([h], None, list(range(16)), 16, None, "GPU", None,
                                             group_idx=0, kv_cache_spec_kind="full_attention"),
                                 BlockRemoved([h], "GPU", group_idx=0)])


def bound_sub(ctx) -> tuple[object, str]:
    """A SUB bound on an ephemeral loopback port, subscribed to everything."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.bind("tcp://127.0.0.1:0")
    return sub, sub.getsockopt_string(zmq.LAST_ENDPOINT)


def wait_published(pub: ZmqEventPublisher, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pub.published < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pub.published == n


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_connecting_publisher_loses_nothing_for_a_bound_subscriber(ctx) -> None:
    sub, endpoint = bound_sub(ctx)
    assert not is_bind_endpoint(endpoint)                    # 127.0.0.1: the publisher connects
    listener = Listener(sub, 400)
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=endpoint, topic="kv@test", subscriber_wait_s=10))
    for i in range(400):                                     # before any subscription arrived
        pub.publish(batch(i))
    pub.shutdown()
    assert pub.published == 400 and pub.dropped == 0 and pub.subscribed
    got = listener.join()
    assert len(got) == 400
    for i, frames in enumerate(got):
        topic, seq, b = decode_message(frames)
        assert topic == b"kv@test" and seq == i
        assert b.ts == float(i) and b.data_parallel_rank == 0
        assert [e.kind for e in b.events] == ["BlockStored", "BlockRemoved"]


def test_binding_publisher_loses_nothing_for_a_connected_subscriber(ctx, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/kv.sock"
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=endpoint, subscriber_wait_s=10))
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    listener = Listener(sub, 300)
    for i in range(300):
        pub.publish(batch(i))
    pub.shutdown()
    got = listener.join()
    assert [decode_message(f)[1] for f in got] == list(range(300))


def test_replay_returns_exactly_the_buffered_batches(ctx, tmp_path) -> None:
    sub, endpoint = bound_sub(ctx)
    replay_ep = f"ipc://{tmp_path}/replay.sock"
    listener = Listener(sub, 30)
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=endpoint, replay_endpoint=replay_ep,
                                           buffer_steps=20, subscriber_wait_s=10))
    try:
        for i in range(30):
            pub.publish(batch(i))
        wait_published(pub, 30)
        live = {decode_message(f)[1]: f[2] for f in listener.join()}
        assert sorted(live) == list(range(30))
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_ep)

        def replay(start: int) -> list[tuple[int, bytes]]:
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            out = []
            while True:
                assert dealer.poll(10_000), "replay did not answer"
                empty, topic, seq, payload = dealer.recv_multipart()
                assert empty == b""
                if seq == END_SEQ:
                    assert topic == b"" and payload == b""
                    return out
                out.append((int.from_bytes(seq, "big"), payload))

        assert replay(5) == [(s, live[s]) for s in range(10, 30)]     # the last 20 are buffered
        assert replay(25) == [(s, live[s]) for s in range(25, 30)]
        assert replay(30) == []
        dealer.send_multipart((b"", b"bad"))                            # malformed: ignored
        assert replay(28) == [(28, live[28]), (29, live[29])]
        for _, payload in replay(0):
            decode_payload(payload)
    finally:
        pub.shutdown()


@pytest.mark.parametrize("endpoint", ["", "tcp://", "tcp://host", "tcp://*:99999", "udp://*:5557",
                                      "ipc://", "tcp://*:port", "127.0.0.1:5557", 5557])
def test_malformed_endpoints_are_named(endpoint) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        KVEventsConfig(endpoint=endpoint)


def test_bad_options_and_connect_style_replay_endpoint(tmp_path) -> None:
    with pytest.raises(ValueError, match="replay_endpoint 'tcp://127.0.0.1:5558' must be one"):
        KVEventsConfig(endpoint=f"ipc://{tmp_path}/a", replay_endpoint="tcp://127.0.0.1:5558")
    with pytest.raises(ValueError, match="buffer_steps must be an integer >= 1, got 0"):
        KVEventsConfig(endpoint=f"ipc://{tmp_path}/a", buffer_steps=0)
    assert check_endpoint("tcp://*:5557") == "tcp://*:5557"


def test_port_in_use_is_a_clear_error(ctx) -> None:
    holder = ctx.socket(zmq.PUB)
    holder.bind("tcp://127.0.0.1:0")
    port = holder.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1]
    # a wildcard bind of a port taken on loopback fails at once (nothing is exposed)
    with pytest.raises(ValueError, match=rf"cannot bind KV events endpoint 'tcp://\*:{port}' "
                                         r"\(address already in use\)"):
        ZmqEventPublisher(KVEventsConfig(endpoint=f"tcp://*:{port}"))


def test_vllm_default_config_and_dp_offsets() -> None:
    c = KVEventsConfig()
    assert (c.endpoint, c.buffer_steps, c.hwm, c.topic) == ("tcp://*:5557", 10_000, 100_000, "")
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("tcp://*:0", 2) == "tcp://*:0"
    assert offset_endpoint("inproc://kv", 1) == "inproc://kv_dp1"
    assert is_bind_endpoint("tcp://*:5557") and is_bind_endpoint("tcp://0.0.0.0:1")
    assert is_bind_endpoint("ipc://hybridkv-test.ipc") and not is_bind_endpoint("tcp://10.0.0.1:5557")


def test_a_subscriber_that_disconnects_never_blocks_the_engine(ctx) -> None:
    sub, endpoint = bound_sub(ctx)
    listener = Listener(sub, 10)
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=endpoint, hwm=50, subscriber_wait_s=10,
                                           linger_s=0.2))
    for i in range(10):
        pub.publish(batch(i))
    assert len(listener.join()) == 10
    sub.close(linger=0)                                      # gone mid-run
    t0 = time.monotonic()
    for i in range(10, 3000):
        pub.publish(batch(i))
    publish_s = time.monotonic() - t0
    pub.shutdown()
    assert pub.published == 3000 and pub.dropped == 0
    assert not pub._thread.is_alive()
    assert publish_s < 5.0                                   # generous: publish only enqueues


def test_full_queue_drops_and_counts_instead_of_blocking(tmp_path) -> None:
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=f"ipc://{tmp_path}/q", max_queue_size=1,
                                           subscriber_wait_s=0.5))
    for i in range(10):                    # the thread waits for a subscriber: the queue fills
        pub.publish(batch(i))
    assert pub.dropped == 9
    pub.shutdown()                         # no subscriber: publishes after the wait, drains
    assert pub.published == 1
    with pytest.raises(RuntimeError, match="shut down"):
        pub.publish(batch(0))
