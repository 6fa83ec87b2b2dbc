"""One semantics for the engine's CPU tier and the simulator's: the same requests through both.

Engine side: the scheduler with :class:`KVConnector` over a :class:`KVTransfer` of a real paged
cache and a :class:`LocalCPUStore` (bytes saved and loaded, checksummed). Simulator side: the
scheduler with :class:`TierRuntime` over a :class:`TierHierarchy` (no bytes), or the whole
:class:`Simulator`. After every step both tiers must hold the same blocks in the same LRU order,
every load must commit on both or on neither, and every request must reuse as many tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybridkv import KVCacheManager, Request
from hybridkv.connectors.connector import KVConnector
from hybridkv.connectors.layout import KVLayout
from hybridkv.connectors.stores.local import LocalCPUStore
from hybridkv.connectors.transfer import KVTransfer
from hybridkv.core.specs import KVCacheConfig
from hybridkv.engine import PagedKVCache
from hybridkv.sched import EngineRequest, Scheduler, SchedulerConfig
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import ModelPreset, get_gpu
from hybridkv.sim.tiers.runtime import TierGeometry, TierRuntime
from hybridkv.sim.tiers.config import TierConfig
from hybridkv.sim.traffic.traces import TraceRequest
from hybridkv.cost.transfer import DEFAULT_TRANSFER
from tests.support.tier_workload import BS, tier_groups, tier_workload
from hybridkv.core.cache_options import CacheOptions
from hybridkv.connectors.transfer import TransferOptions


def _engine_tier(config: KVCacheConfig, capacity: int, sched_cfg: SchedulerConfig):
    """Manager, scheduler, connector and store of the engine side."""
    kv = KVCacheManager(config, CacheOptions(
        hash_seed="same", retention_interval=0, max_in_flight_tokens=sched_cfg.max_num_batched_tokens))
    cache = PagedKVCache(config)
    layout = KVLayout.register({n: cache.layer(n) for n in cache.layer_names}, config)
    store = LocalCPUStore(capacity)
    connector = KVConnector(kv, KVTransfer(layout, store, TransferOptions(namespace="diff")))
    return kv, Scheduler(kv, sched_cfg, connector), connector, store


def _store_entries(store: LocalCPUStore, config: KVCacheConfig) -> list[tuple[int, bytes]]:
    """The store's keys, oldest first, as (group index, block hash)."""
    names = [g.name for g in config.groups]
    out = []
    for key in store._entries.keys():
        hash_hex, group, _ = key.decode().split("/")
        out.append((names.index(group), bytes.fromhex(hash_hex)))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_connector_and_simulator_tiers_hold_and_hit_the_same(seed: int) -> None:
    """Scheduler level, concurrent requests, a hybrid model with entries of two sizes, a pool
    and a tier small enough to evict all the time."""
    config = KVCacheConfig(tier_groups(3), num_blocks=28)
    sched_cfg = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=3)
    probe = _engine_tier(config, 1, sched_cfg)[2].transfer
    sizes = [probe.payload_bytes(g.name) for g in config.groups]
    assert sizes[0] != sizes[1]
    capacity = 28 * sizes[0] + 20 * sizes[1]
    kv_e, sched_e, conn, store = _engine_tier(config, capacity, sched_cfg)
    kv_s = KVCacheManager(config, CacheOptions(
        hash_seed="same", retention_interval=0, max_in_flight_tokens=sched_cfg.max_num_batched_tokens))
    geometry = TierGeometry(bytes_per_token=1, num_layers=5, key_block=BS, block_bytes=tuple(sizes))
    tiers = TierRuntime(kv_s, TierConfig(cpu_cache_tokens=capacity), geometry, DEFAULT_TRANSFER)
    sched_s = Scheduler(kv_s, sched_cfg, tiers)
    answers = {}
    work = tier_workload(seed, 40)
    loads = hits = 0
    while work or sched_e.has_unfinished():
        while work and len(sched_e.requests) < 4:
            rid, prompt, answer = work.pop(0)
            answers[rid] = answer
            for s in (sched_e, sched_s):
                s.add_request(EngineRequest(Request(rid, prompt), max_tokens=len(answer)))
        out_e, out_s = sched_e.schedule(), sched_s.schedule()
        assert [(x.req.request_id, x.start, x.num_new_tokens) for x in out_e.scheduled] == \
               [(x.req.request_id, x.start, x.num_new_tokens) for x in out_s.scheduled]
        conn.run_saves(out_e.saves_before)
        loaded_e = conn.run_loads(out_e.loads)
        conn.run_saves(out_e.saves_after)
        _, loaded_s = tiers.run_step(out_s, 0.0, 0.0, timed=False)
        assert loaded_e == loaded_s
        loads += sum(loaded_e.values())
        sampled = {}
        for x in out_e.scheduled:
            if x.samples:
                r = x.req
                sampled[r.request_id] = [answers[r.request_id][r.num_output_tokens]]
        done_e = sched_e.update(out_e, sampled, loaded_e)
        done_s = sched_s.update(out_s, sampled, loaded_s)
        assert [(r.request_id, r.num_cached_tokens, r.num_external_tokens) for r in done_e] == \
               [(r.request_id, r.num_cached_tokens, r.num_external_tokens) for r in done_s]
        hits += sum(r.num_external_tokens for r in done_e)
        assert _store_entries(store, config) == tiers.hierarchy.keys(0)
        assert store.used_bytes == tiers.hierarchy.tiers[0].used
    assert loads > 3 and hits > 0        # the tier served loads (the comparison had teeth)
    assert store.stats.evictions > 0


def _tiny_preset() -> ModelPreset:
    """A hybrid preset whose two groups' entries have the same size (so a tier holds the same
    number of entries whether or not each carries the connector's 32-byte trailer)."""
    return ModelPreset(name="tiny-hybrid", groups=tier_groups(2), num_params=10**6, active_params=10**6,
                       num_layers=4, hidden_size=64, attn_width=64)


@pytest.mark.parametrize("seed", range(3))
def test_the_simulator_and_the_connector_tier_agree_request_by_request(seed: int) -> None:
    """The whole Simulator (sequential) against the engine-side scheduler and connector."""
    preset = _tiny_preset()
    entries = 48                   # one entry per (block, group); both groups' entries are equal
    tokens = entries * BS // len(preset.groups)
    cfg = SimConfig(preset, get_gpu("h100"), num_blocks=32, sequential=True, hash_seed="same",
                    optimum=False, sched=SchedulerConfig(max_num_batched_tokens=16),
                    tiers=TierConfig(cpu_cache_tokens=tokens))
    work = tier_workload(seed, 30)
    trace = [TraceRequest(rid, float(i), np.array(p, dtype=np.int64), len(a),
                          output_ids=np.array(a, dtype=np.int64))
             for i, (rid, p, a) in enumerate(work)]
    sim = Simulator(cfg)
    res = sim.run(items_from_trace(trace))

    config = preset.kv_config(num_blocks=32)
    probe = _engine_tier(config, 1, cfg.sched)[2].transfer
    sizes = {probe.payload_bytes(g.name) for g in config.groups}
    assert len(sizes) == 1
    kv, sched, conn, store = _engine_tier(config, sizes.pop() * entries, cfg.sched)
    hit_blocks = []
    for rid, prompt, answer in work:
        sched.add_request(EngineRequest(Request(rid, prompt), max_tokens=len(answer)))
        admitted = None
        while sched.has_unfinished():
            out = sched.schedule()
            conn.run_saves(out.saves_before)
            loaded = conn.run_loads(out.loads)
            conn.run_saves(out.saves_after)
            sampled = {x.req.request_id: [answer[x.req.num_output_tokens]]
                       for x in out.scheduled if x.samples}
            for r in out.admitted + [ld.req for ld in out.loads]:
                admitted = r
            sched.update(out, sampled, loaded)
        hit_blocks.append((admitted.num_cached_tokens + admitted.num_external_tokens) // BS)
    assert sim._online.hit_blocks == hit_blocks
    assert _store_entries(store, config) == sim.tiers.hierarchy.keys(0)
    assert res.tiers.loads > 0 and res.tiers.hit_tokens["cpu"] > 0
    assert res.hit_tokens == res.gpu_hit_tokens + res.tiers.hit_tokens["cpu"]
