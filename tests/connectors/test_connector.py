"""Scheduler + manager + KVConnector over a real store, with a KV-content oracle (no model).

Each "forward pass" writes, at every computed position p of a request, the value
f(tokens[:p+1]) into every layer of every group. Before computing, the oracle checks that every
position attention will read (the whole prefix for full attention, the window for sliding
attention) holds f of its prefix: whatever came from a local hit, an external load, or this
request's own earlier chunks. A wrong block, a stale load or a foreign payload shows up as a
wrong value.
"""

from __future__ import annotations

import zlib

import pytest

from hybridkv import KVCacheManager, Request
from hybridkv.connectors.connector import KVConnector
from hybridkv.connectors.layout import KVLayout
from hybridkv.connectors.stores.local import LocalCPUStore
from hybridkv.connectors.transfer import KVTransfer
from hybridkv.core.specs import FullAttention, KVCacheConfig, KVCacheGroup, SlidingWindow
from hybridkv.engine import PagedKVCache
from hybridkv.sched import EngineRequest, RequestStatus, Scheduler, SchedulerConfig
from hybridkv.core.cache_options import CacheOptions
from hybridkv.connectors.transfer import TransferOptions

BS, WINDOW = 4, 8


def _config(num_blocks: int = 64) -> KVCacheConfig:
    return KVCacheConfig((
        KVCacheGroup("full", FullAttention(block_size=BS, num_kv_heads=1, head_dim=4, dtype="float32"), ("l0",)),
        KVCacheGroup("swa", SlidingWindow(block_size=BS, num_kv_heads=1, head_dim=4, dtype="float32",
                                          window=WINDOW), ("l1", "l2")),
    ), num_blocks=num_blocks)


def f(prefix) -> float:
    return float(zlib.crc32(bytes(str(list(prefix)), "ascii")) % 100_000)


class Engine:
    """A scheduler, a manager, a paged cache and a connector; forward = write f(prefix)."""

    def __init__(self, store: LocalCPUStore, num_blocks: int = 64, load: bool = True) -> None:
        self.config = _config(num_blocks)
        self.kv = KVCacheManager(self.config, CacheOptions(hash_seed="shared", retention_interval=0))
        self.cache = PagedKVCache(self.config)
        layers = {n: self.cache.layer(n) for n in self.cache.layer_names}
        for t in layers.values():
            t.fill_(-1.0)
        layout = KVLayout.register(layers, self.config)
        self.transfer = KVTransfer(layout, store, TransferOptions(namespace="tiny"))
        self.connector = KVConnector(self.kv, self.transfer, load=load)
        self.sched = Scheduler(self.kv, SchedulerConfig(max_num_batched_tokens=16), self.connector)
        self.layers = layers
        self.before_load = None  # test hook: called with the step's loads

    def _value(self, g: int, table: list[int], p: int) -> float:
        group = self.config.groups[g]
        t = self.layers[group.layer_names[0]]
        return float(t[0, table[p // BS], p % BS, 0, 0])

    def _check_reads(self, req: Request, start: int) -> None:
        tables = self.kv.block_ids(req)
        toks = list(req.token_ids)
        for g, group in enumerate(self.config.groups):
            lo = 0 if g == 0 else max(0, start - WINDOW + 1)
            for p in range(lo, start):
                assert self._value(g, tables[g], p) == f(toks[:p + 1]), \
                    f"{req.request_id}: group {group.name} position {p} holds wrong KV"

    def step(self) -> list[EngineRequest]:
        out = self.sched.schedule()
        self.connector.run_saves(out.saves_before)
        if self.before_load:
            self.before_load(out.loads)
        loaded = self.connector.run_loads(out.loads)
        sampled = {}
        for s in out.scheduled:
            req = s.req.request
            self._check_reads(req, s.start)
            tables = self.kv.block_ids(req)
            toks = list(req.token_ids)
            for p in range(s.start, s.start + s.num_new_tokens):
                for g, group in enumerate(self.config.groups):
                    for layer in group.layer_names:
                        self.layers[layer][:, tables[g][p // BS], p % BS] = f(toks[:p + 1])
            if s.samples:
                sampled[s.req.request_id] = [1000 + len(toks)]
        self.connector.run_saves(out.saves_after)
        return self.sched.update(out, sampled, loaded)

    def serve(self, rid: str, tokens: list[int], max_tokens: int = 3) -> EngineRequest:
        r = EngineRequest(Request(rid, tokens), max_tokens)
        self.sched.add_request(r)
        while self.sched.has_unfinished():
            self.step()
            self.kv.check_integrity()
        self.connector.flush()
        assert r.status is RequestStatus.FINISHED_LENGTH
        return r


PROMPT = list(range(1, 41))


def test_a_second_engine_loads_what_the_first_computed() -> None:
    store = LocalCPUStore(64 << 20)
    a, b = Engine(store), Engine(store)
    ra = a.serve("a", PROMPT)
    assert ra.num_external_tokens == 0 and a.transfer.stats.saved > 0
    rb = b.serve("b", PROMPT + [77, 78])
    # b had nothing locally; it loaded 40 tokens' worth (the core's rules: full + window)
    assert rb.num_cached_tokens == 0 and rb.num_external_tokens == 40
    assert b.connector.stats.loads_ok == 1 and b.transfer.stats.loaded > 0
    # a's output continued identically on b (same values written, checked on every read)
    assert rb.output_token_ids == [1000 + 42, 1000 + 43, 1000 + 44]
    # the loaded blocks are b's own now: a third request hits them locally
    rc = b.serve("c", PROMPT + [90])
    assert rc.num_cached_tokens == 40 and rc.num_external_tokens == 0


def test_a_block_evicted_between_lookup_and_load_is_recomputed() -> None:
    store = LocalCPUStore(64 << 20)
    a, b = Engine(store), Engine(store)
    a.serve("a", PROMPT)

    def evict(loads):
        for load in loads:
            g, _, h = load.blocks[-1]
            store.remove([b.transfer.key(b.config.groups[g].name, h)])
    b.before_load = evict
    rb = b.serve("b", PROMPT + [77])
    assert rb.num_external_tokens == 0 and b.connector.stats.loads_failed == 1
    assert b.transfer.stats.load_failed > 0


def test_a_corrupted_payload_is_rejected_and_recomputed() -> None:
    store = LocalCPUStore(64 << 20)
    a, b = Engine(store), Engine(store)
    a.serve("a", PROMPT)

    def corrupt(loads):
        for load in loads:
            g, _, h = load.blocks[0]
            key = b.transfer.key(b.config.groups[g].name, h)
            data = bytearray(store._entries.peek(key)[0])
            data[5] ^= 0xFF
            store._entries.put(key, bytes(data), len(data))
    b.before_load = corrupt
    rb = b.serve("b", PROMPT + [77])
    assert rb.num_external_tokens == 0 and b.transfer.stats.corrupt >= 1


def test_a_full_store_drops_saves_and_serving_stays_correct() -> None:
    store = LocalCPUStore(150)       # smaller than one payload: every save is refused
    a, b = Engine(store), Engine(store)
    a.serve("a", PROMPT)
    assert a.transfer.stats.save_dropped > 0 and a.transfer.stats.saved == 0
    rb = b.serve("b", PROMPT + [5])  # nothing to load: recomputed, every read checked
    assert rb.num_external_tokens == 0 and b.connector.stats.loads_ok == 0


def test_a_tiny_pool_with_preemption_and_external_loads_stays_correct() -> None:
    store = LocalCPUStore(64 << 20)
    a = Engine(store)
    for i in range(4):
        a.serve(f"w{i}", PROMPT[:20 + 4 * i] + [200 + i] * 5)
    b = Engine(store, num_blocks=30)
    rs = [EngineRequest(Request(f"q{i}", PROMPT[:20 + 4 * i] + [300 + i] * 6), 6) for i in range(4)]
    for r in rs:
        b.sched.add_request(r)
    while b.sched.has_unfinished():
        b.step()
        b.kv.check_integrity()
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in rs)
    assert sum(r.num_external_tokens for r in rs) > 0


def test_the_oracle_catches_a_load_reported_ok_that_was_not() -> None:
    """Sanity check of the oracle: if a failed load were committed, the reads go wrong."""
    store = LocalCPUStore(64 << 20)
    a, b = Engine(store), Engine(store)
    a.serve("a", PROMPT)
    real = b.connector.run_loads

    def lying_loads(loads):
        for load in loads:
            g, _, h = load.blocks[-1]
            store.remove([b.transfer.key(b.config.groups[g].name, h)])
        result = real(loads)
        return {rid: True for rid in result}
    b.connector.run_loads = lying_loads
    with pytest.raises(AssertionError, match="holds wrong KV"):
        b.serve("b", PROMPT + [77])


def test_admit_after_two_saves_only_what_was_computed_twice() -> None:
    """With the frequency filter at 2, a's first computation of PROMPT saves nothing (b finds
    nothing and recomputes); a computes it again after its prefix cache is reset, which saves
    it, and a fresh engine c then loads the 40 tokens."""
    store = LocalCPUStore(64 << 20)
    a, b = Engine(store), Engine(store)
    a.connector = KVConnector(a.kv, a.transfer, admit_after=2)
    a.sched = Scheduler(a.kv, SchedulerConfig(max_num_batched_tokens=16), a.connector)
    a.serve("a", PROMPT)
    assert a.transfer.stats.saved == 0 and a.connector.admission.refused > 0
    assert b.serve("b", PROMPT + [77]).num_external_tokens == 0
    assert a.kv.reset_prefix_cache()
    a.serve("a2", PROMPT)
    assert a.transfer.stats.saved > 0
    assert Engine(store).serve("c", PROMPT + [78]).num_external_tokens == 40
