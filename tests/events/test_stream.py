"""End to end: the real scheduler and manager (the simulator) publish over ZMQ; a consumer
decodes with the independent decoder, checks the stream's invariants event by event, and at the
end its mirror equals exactly what the manager's pool holds. The index is fed the same way."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hybridkv.core.cache_options import CacheOptions

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")
pytest.importorskip("msgpack")

from hybridkv.events import KVEventIndex  # noqa: E402
from hybridkv.events.publisher import KVEventsConfig, ZmqEventPublisher  # noqa: E402
from hybridkv.events.stream import KVEventStream, attach_kv_events  # noqa: E402
from hybridkv.events.wire import decode_batch  # noqa: E402
from hybridkv.cost.presets import get_gpu, get_preset  # noqa: E402
from hybridkv.sim import SimConfig, Simulator, items_from_trace  # noqa: E402
from hybridkv.core.rules import make_rule  # noqa: E402
from hybridkv.sim.traffic.workloads import get_workload  # noqa: E402
from tests.events.spec_decoder import Listener, decode_message  # noqa: E402


class MirrorConsumer:
    """A consumer's view built only from decoded messages, with the stream's invariants."""

    def __init__(self, full_groups: set[int]) -> None:
        self.full_groups = full_groups
        self.held: Counter = Counter()      # (group, hash) -> copies stored and not removed
        self.stores = self.removes = self.clears = 0

    def apply(self, ev) -> None:
        if ev.kind == "BlockStored":
            g = ev.get("group_idx")
            parent = ev.get("parent_block_hash")
            if g in self.full_groups and parent is not None:
                assert (g, parent) in self.held, "a stored block's parent was not stored before"
            hashes = ev.get("block_hashes")
            assert len(ev.get("token_ids")) == len(hashes) * ev.get("block_size")
            for h in hashes:
                self.held[(g, h)] += 1
            self.stores += len(hashes)
        elif ev.kind == "BlockRemoved":
            g = ev.get("group_idx")
            for h in ev.get("block_hashes"):
                assert self.held[(g, h)] > 0, "a removal names a block that is not stored"
                self.held[(g, h)] -= 1
                if not self.held[(g, h)]:
                    del self.held[(g, h)]
            self.removes += len(ev.get("block_hashes"))
        else:
            self.held.clear()
            self.clears += 1


def pool_contents(kv) -> Counter:
    pool = kv.pool
    return Counter((pool.block_group[b], pool.block_hash[b]) for b in range(1, len(pool.block_hash))
                   if pool.block_hash[b] is not None)


@pytest.mark.parametrize("preset,blocks", [("llama-3.1-8b", 900), ("gemma-3-27b", 1200)])
def test_simulator_stream_over_zmq_mirrors_the_pool(preset, blocks, tmp_path) -> None:
    items = items_from_trace(get_workload("chat", num_conversations=12, turns=4, seed=3))
    cfg = SimConfig(preset=get_preset(preset), gpu=get_gpu("h100"), num_blocks=blocks,
                    optimum=False, enable_events=True, hash_algo="sha256")
    sim = Simulator(cfg)
    full = {i for i, g in enumerate(sim.kv.config.groups) if make_rule(g.spec).downward_closed}
    endpoint = f"ipc://{tmp_path}/kv.sock"
    pub = ZmqEventPublisher(KVEventsConfig(endpoint=endpoint, subscriber_wait_s=10))
    ctx = zmq.Context()
    listener = None
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.connect(endpoint)
        stream = KVEventStream(sim.kv, pub)
        sim.step_hooks.append(lambda start, end, out: stream.flush(end))
        listener = Listener(sub, 10**9)
        res = sim.run(items)
        pub.shutdown()
        assert pub.published == stream.batches > 0 and pub.dropped == 0
        frames = _collect(listener, stream.batches)
    finally:
        if listener is not None:
            listener.stop()
        ctx.destroy(linger=0)
    consumer = MirrorConsumer(full)
    index = KVEventIndex()
    last_ts = -1.0
    for i, f in enumerate(frames):
        _, seq, batch = decode_message(f)
        assert seq == i                                         # none lost, in order
        assert batch.ts >= last_ts
        last_ts = batch.ts
        for ev in batch.events:
            consumer.apply(ev)
        assert index.apply_batch("engine-0", decode_batch(f[2]), seq)
    assert res.evictions > 0 and consumer.removes > 0             # the run evicted
    assert consumer.held == pool_contents(sim.kv)
    index.check()
    want = {k for k in consumer.held}
    for g, h in want:
        assert index.holders(g, h) == {"engine-0"}
    assert index.num_blocks("engine-0") == len(want)


def _collect(listener: Listener, n: int) -> list:
    import time
    deadline = time.monotonic() + 30
    while len(listener.frames) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(listener.frames) == n
    return list(listener.frames)


def test_attach_kv_events_to_a_step_loop() -> None:
    """What LLM(cache=CacheConfig(kv_events=...)) does: a sink object gets one batch per step with events."""
    class Sink:
        def __init__(self) -> None:
            self.batches = []

        def publish(self, batch) -> None:
            self.batches.append(batch)

    items = items_from_trace(get_workload("chat", num_conversations=3, turns=2, seed=1))
    cfg = SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=400,
                    optimum=False, enable_events=True)
    sim = Simulator(cfg)
    hooks: list = []
    sink = Sink()
    attached = attach_kv_events(sim.kv, hooks, sink)
    sim.step_hooks.append(lambda start, end, out: [h() for h in hooks])
    sim.run(items)
    attached.close()
    assert sink.batches and attached.published == len(sink.batches)
    assert all(b.events for b in sink.batches)
    with pytest.raises(ValueError, match="kv_events must be"):
        attach_kv_events(sim.kv, hooks, 42)
    off = Simulator(dataclasses.replace(cfg, enable_events=False))
    with pytest.raises(ValueError, match="enable_events=True"):
        KVEventStream(off.kv, sink)


class _Sink:
    def __init__(self) -> None:
        self.batches: list = []

    def publish(self, batch) -> None:
        self.batches.append(batch)


def _manager_with_events():
    from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(block_size=4), ("l0",)),), num_blocks=16)
    kv = KVCacheManager(cfg, CacheOptions(hash_algo="sha256", enable_events=True))

    def serve(rid: str, n: int) -> None:
        req = Request(rid, list(range(100 * len(rid), 100 * len(rid) + n)))
        assert kv.allocate(req, n, kv.lookup(req)) is not None
        req.num_computed_tokens = n
        kv.free(req)
    return kv, serve


def test_a_stream_counts_what_it_flushes_and_stamps_the_clock_or_the_given_time() -> None:
    """``flush`` publishes one batch of every event since the last flush, returns how many
    there were (0, and nothing published, when there were none), and stamps the batch with
    ``ts`` when given, else with the clock; ``batches`` and ``events`` add up over flushes."""
    kv, serve = _manager_with_events()
    sink = _Sink()
    stream = KVEventStream(kv, sink, clock=lambda: 7.5)
    assert (stream.flush(), stream.batches, stream.events, sink.batches) == (0, 0, 0, [])
    serve("a", 8)                                               # two blocks stored: one event
    n1 = stream.flush()
    serve("bb", 12)
    n2 = stream.flush(ts=2.25)
    assert n1 >= 1 and n2 >= 1
    assert [b.ts for b in sink.batches] == [7.5, 2.25]
    assert [len(b.events) for b in sink.batches] == [n1, n2]
    assert (stream.batches, stream.events) == (2, n1 + n2)
    assert stream.flush() == 0 and stream.batches == 2
    from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager
    off = KVCacheManager(KVCacheConfig((KVCacheGroup("f", FullAttention(block_size=4), ("l0",)),),
                                       num_blocks=4))
    with pytest.raises(ValueError, match=r"^KVEventStream needs a KVCacheManager built with "
                                         r"enable_events=True$"):
        KVEventStream(off, sink)


def test_attach_starts_owns_and_shuts_down_a_publisher_for_an_endpoint_or_a_config(tmp_path) -> None:
    """An endpoint string or a ``KVEventsConfig`` starts a publisher on that endpoint that the
    attachment owns: the hook flushes into it, ``published`` is its count, and ``close`` (safe
    to call twice) flushes what is left and shuts it down. A sink object is used as given and
    not owned."""
    import time
    kv, serve = _manager_with_events()
    hooks: list = []
    endpoint = f"ipc://{tmp_path}/a.sock"
    attached = attach_kv_events(kv, hooks, endpoint)
    pub = attached.publisher
    assert isinstance(pub, ZmqEventPublisher) and pub.endpoint == endpoint
    attached.close()
    attached.close()
    assert not pub._thread.is_alive()
    cfg = KVEventsConfig(endpoint=f"ipc://{tmp_path}/b.sock", subscriber_wait_s=0, topic="t")
    attached = attach_kv_events(kv, hooks, cfg)
    pub = attached.publisher
    assert isinstance(pub, ZmqEventPublisher) and pub.config is cfg
    serve("a", 8)
    for hook in hooks[1:]:
        hook()
    deadline = time.monotonic() + 20
    while pub.published < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert attached.published == pub.published == 1 and attached.stream.batches == 1
    serve("bb", 8)
    attached.close()                                   # flushes the last step's events
    assert attached.stream.batches == 2 and not pub._thread.is_alive()
    sink = _Sink()
    attached = attach_kv_events(kv, hooks, sink)
    assert attached.publisher is None
    serve("ccc", 8)
    hooks[-1]()
    assert len(sink.batches) == 1 and attached.published == 1
    attached.close()
