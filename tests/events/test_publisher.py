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


def test_replay_returns_exactly_the_buffered_batches(ctx, tmp_path, caplog) -> None:
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
            dealer.send_multipart((b"", start.to_bytes(8, "big", signed=True)))
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
        assert [s for s, _ in replay(-1)] == list(range(10, 30))        # the start is signed
        deadline = time.monotonic() + 10                # counted after the marker is sent
        while pub.replays_served < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.replays_served == 6                  # the malformed request is not one
        assert "KV events: ignoring a malformed replay request of 3 frames" in [
            r.getMessage() for r in caplog.records]
    finally:
        pub.shutdown()


def test_replay_frames_carry_the_topic_and_the_end_marker_an_empty_one(ctx, tmp_path) -> None:
    """With a non-empty topic the replay's frames are vLLM's ``(empty, topic, seq, payload)``
    per batch and ``(empty, b"", -1, b"")`` at the end: the topic frame is the publisher's
    topic, never the empty delimiter (with the default empty topic the two are the same bytes,
    so only a topic tells them apart). The live stream carries the same topic, and a data
    parallel rank offsets the endpoints and is stamped on every batch."""
    endpoint, replay_ep = f"ipc://{tmp_path}/kv.sock", f"ipc://{tmp_path}/replay.sock"
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=endpoint, replay_endpoint=replay_ep,
                                           topic="kv@engine-1", subscriber_wait_s=10,
                                           data_parallel_rank=2))
    assert (pub.endpoint, pub.replay_endpoint) == (endpoint + "_dp2", replay_ep + "_dp2")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(pub.endpoint)
    listener = Listener(sub, 3)
    try:
        for i in range(3):
            pub.publish(batch(i))
        wait_published(pub, 3)
        live = listener.join()
        assert [(f[0], decode_message(f)[1]) for f in live] == [(b"kv@engine-1", i) for i in range(3)]
        assert {decode_message(f)[2].data_parallel_rank for f in live} == {2}
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart((b"", (1).to_bytes(8, "big")))
        frames = []
        while not frames or frames[-1][2] != END_SEQ:
            assert dealer.poll(10_000), "replay did not answer"
            frames.append(dealer.recv_multipart())
        assert frames == [[b"", b"kv@engine-1", (1).to_bytes(8, "big"), live[1][2]],
                          [b"", b"kv@engine-1", (2).to_bytes(8, "big"), live[2][2]],
                          [b"", b"", END_SEQ, b""]]
        assert END_SEQ == b"\xff" * 8
        deadline = time.monotonic() + 10                # counted after the marker is sent
        while pub.replays_served < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.replays_served == 1
    finally:
        pub.shutdown()


@pytest.mark.parametrize("endpoint", ["", "tcp://", "tcp://host", "tcp://*:99999", "udp://*:5557",
                                      "ipc://", "tcp://*:port", "127.0.0.1:5557", 5557])
def test_malformed_endpoints_are_named(endpoint) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        KVEventsConfig(endpoint=endpoint)


def test_bad_options_and_connect_style_replay_endpoint(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"^replay_endpoint 'tcp://127.0.0.1:5558' must be one this "
                                         r"process can bind \(tcp://\*:PORT, tcp://0.0.0.0:PORT, "
                                         r"ipc://PATH or inproc://NAME\)$"):
        KVEventsConfig(endpoint=f"ipc://{tmp_path}/a", replay_endpoint="tcp://127.0.0.1:5558")
    with pytest.raises(ValueError, match="buffer_steps must be an integer >= 1, got 0"):
        KVEventsConfig(endpoint=f"ipc://{tmp_path}/a", buffer_steps=0)
    assert check_endpoint("tcp://*:5557") == "tcp://*:5557"
    with pytest.raises(ValueError, match=r"^malformed KV events endpoint 'x': expected tcp://HOST:PORT "
                                         r"\(PORT 0-65535; HOST \* binds every interface\), "
                                         r"ipc://PATH or inproc://NAME$"):
        check_endpoint("x")
    # an ipc path or inproc name is taken as given, "://" inside it included
    for endpoint in ("ipc://://b", "ipc://b://", "inproc://a://b"):
        assert check_endpoint(endpoint) == endpoint


@pytest.mark.parametrize("endpoint", ["tcp://*:0", "tcp://*:65535", "tcp://127.0.0.1:5557",
                                      "tcp://[::1]:5557", "tcp://[::]:1", "tcp://my-host.example:80",
                                      "ipc:///tmp/x.sock", "ipc://@abstract", "inproc://kv"])
def test_well_formed_endpoints_are_accepted_as_given(endpoint) -> None:
    """The grammar's ends: port 0 and the top port 65535, IPv6 literals in brackets, host
    names, any non-empty ipc path or inproc name."""
    assert check_endpoint(endpoint) == endpoint
    assert KVEventsConfig(endpoint=endpoint).endpoint == endpoint


@pytest.mark.parametrize("endpoint, bind", [
    ("tcp://*:5557", True), ("tcp://0.0.0.0:5557", True), ("tcp://[::]:5557", True),
    ("tcp://[::1]:5557", True), ("ipc:///tmp/a", True), ("inproc://a", True),
    ("tcp://127.0.0.1:5557", False), ("tcp://10.0.0.1:5557", False), ("tcp://host:0", False)])
def test_bind_or_connect_follows_vllms_rule(endpoint, bind) -> None:
    """vLLM's rule: ``*``, ``::``, ipc and inproc bind (plus 0.0.0.0); anything else connects."""
    assert is_bind_endpoint(endpoint) is bind


def test_data_parallel_offsets_follow_vllms_rule() -> None:
    assert offset_endpoint(None, 3) is None
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://10.0.0.1:6000", 1) == "tcp://10.0.0.1:6001"
    assert offset_endpoint("tcp://[::1]:6000", 5) == "tcp://[::1]:6005"
    assert offset_endpoint("ipc:///tmp/kv", 2) == "ipc:///tmp/kv_dp2"
    with pytest.raises(ValueError, match="malformed KV events endpoint 'udp://x:1'"):
        offset_endpoint("udp://x:1", 1)


@pytest.mark.parametrize("field, value, message", [
    ("endpoint", "tcp://*:65536", r"malformed KV events endpoint 'tcp://\*:65536': expected tcp://HOST:PORT \(PORT 0-65535"),
    ("replay_endpoint", "tcp://host:1", "replay_endpoint 'tcp://host:1' must be one this process can bind"),
    ("replay_endpoint", "nope", "malformed KV events replay_endpoint 'nope'"),
    ("hwm", 0, "KVEventsConfig.hwm must be an integer >= 1, got 0"),
    ("max_queue_size", 0, "KVEventsConfig.max_queue_size must be an integer >= 1, got 0"),
    ("data_parallel_rank", -1, "KVEventsConfig.data_parallel_rank must be an integer >= 0, got -1"),
    ("subscriber_wait_s", -0.5, r"KVEventsConfig.subscriber_wait_s must be a number >= 0, got -0.5"),
    ("drain_timeout_s", "1", "KVEventsConfig.drain_timeout_s must be a number >= 0, got '1'"),
    ("linger_s", -1, "KVEventsConfig.linger_s must be a number >= 0, got -1"),
])
def test_bad_config_values_are_named(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        KVEventsConfig(**{field: value})
    ok = KVEventsConfig(endpoint="inproc://ok", replay_endpoint="tcp://*:0", hwm=1, max_queue_size=1,
                        buffer_steps=1, data_parallel_rank=0, subscriber_wait_s=0, drain_timeout_s=0,
                        linger_s=0)
    assert ok.replay_endpoint == "tcp://*:0"


def test_publish_stamps_the_rank_only_on_batches_without_one(ctx, tmp_path, caplog) -> None:
    """A batch without a rank gets the publisher's; one with a rank keeps it. A full queue
    logs its warning once, however many batches it drops; shutdown is idempotent."""
    endpoint = f"ipc://{tmp_path}/kv.sock"
    pub = ZmqEventPublisher(endpoint=endpoint, data_parallel_rank=1, subscriber_wait_s=10)
    assert pub.endpoint == endpoint + "_dp1"
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    listener = Listener(sub, 2)
    own = batch(1)
    own.data_parallel_rank = 5
    pub.publish(batch(0))
    pub.publish(own)
    pub.shutdown()
    pub.shutdown()
    assert [decode_message(f)[2].data_parallel_rank for f in listener.join()] == [1, 5]
    with pytest.raises(TypeError, match="either a KVEventsConfig or keyword options"):
        ZmqEventPublisher(KVEventsConfig(endpoint=endpoint), hwm=5)
    full = ZmqEventPublisher(KVEventsConfig(endpoint=f"ipc://{tmp_path}/full", max_queue_size=2,
                                            subscriber_wait_s=0.5, drain_timeout_s=0, linger_s=0))
    with caplog.at_level("WARNING", logger="hybridkv.events.publisher"):
        for i in range(6):
            full.publish(batch(i))
    assert full.dropped == 4
    assert [r.getMessage() for r in caplog.records] == [
        "KV events queue full (2 batches): dropping batches"]
    full.shutdown()


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
    with pytest.raises(RuntimeError, match="^KV events publisher is shut down$"):
        pub.publish(batch(0))


def test_a_failed_bind_names_the_endpoint_and_only_a_taken_port_gets_the_hint(tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/missing-dir/kv.sock"
    with pytest.raises(ValueError, match=rf"^cannot bind KV events endpoint '{endpoint}': No such"):
        ZmqEventPublisher(KVEventsConfig(endpoint=endpoint))
    with pytest.raises(TypeError, match="^pass either a KVEventsConfig or keyword options, not both$"):
        ZmqEventPublisher(KVEventsConfig(), topic="x")


def test_a_batch_that_cannot_be_encoded_is_logged_and_the_next_one_is_published(ctx, tmp_path, caplog) -> None:
    """The publisher runs on a named daemon thread (a process may exit without shutting it
    down); nothing has subscribed before a subscriber connects; a batch that fails to encode is
    logged and skipped, and the thread goes on publishing."""
    import threading
    endpoint = f"ipc://{tmp_path}/kv.sock"
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=endpoint, subscriber_wait_s=10))
    try:
        assert pub.subscribed is False
        assert [t.daemon for t in threading.enumerate() if t.name == "hybridkv-kv-events"] == [True]
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        listener = Listener(sub, 1)
        pub.publish(EventBatch(0.0, [object()]))             # not a wire event: cannot encode
        pub.publish(batch(1))
        wait_published(pub, 1)
        (frames,) = listener.join()
        assert decode_message(frames)[1] == 0                 # seq stays contiguous from 0
        assert decode_message(frames)[2].ts == 1.0
        assert "KV events: failed to publish a batch" in [r.getMessage() for r in caplog.records]
    finally:
        pub.shutdown()


def test_shutdown_never_waits_past_its_deadline(tmp_path, monkeypatch, caplog) -> None:
    """A publisher thread stuck in one batch: ``shutdown`` waits drain + subscriber wait + 1 s
    (here 0 + 0 + 1), then warns how many batches were left unsent and returns, leaving the
    daemon thread its sockets."""
    import threading

    import hybridkv.events.publisher as publisher
    entered, release = threading.Event(), threading.Event()
    real = publisher.encode_batch

    def stuck(b):
        entered.set()
        release.wait(10)
        return real(b)
    monkeypatch.setattr(publisher, "encode_batch", stuck)
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=f"ipc://{tmp_path}/kv.sock", subscriber_wait_s=0,
                                           drain_timeout_s=0))
    pub.publish(batch(0))
    pub.publish(batch(1))
    assert entered.wait(10)
    t0 = time.monotonic()
    pub.shutdown()
    waited = time.monotonic() - t0
    release.set()
    pub._thread.join(10)
    assert 0.9 <= waited < 5
    assert "KV events publisher did not drain within 0.0 s; 1 batches unsent" in [
        r.getMessage() for r in caplog.records]
