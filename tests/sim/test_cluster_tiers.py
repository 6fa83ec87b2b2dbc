"""KV tiers in a cluster: per-instance GPU + CPU tiers, their counts combined, and the
``tier-aware`` router, which scores the prefix an instance's GPU *or* its tiers hold."""

from __future__ import annotations

from hybridkv.events.index import KVEventIndex
from hybridkv.sim.cluster import ClusterSimulator
from hybridkv.sim.cluster.routing import InstanceLoad, RouterSetup, make_router
from hybridkv.sim.tiers import TierConfig
from tests.sim.test_cluster import _blocks, chat, config


def _router(gpu: dict[int, int], tier: dict[int, set[int]], hs: list[bytes]):
    """Instance i's GPU holds the first ``gpu[i]`` blocks of ``hs``, its tiers the blocks at
    positions ``tier[i]``; no load-skew bound."""
    index = KVEventIndex()
    for inst, n in gpu.items():
        index.add(inst, 0, hs[:n])
    held = {(i, hs[j]) for i, js in tier.items() for j in js}
    return make_router("tier-aware", RouterSetup(
        num_instances=2, block_size=16, capacity_blocks=100, index=index, group=0,
        overlap_weight=1.0, max_skew=None, tier_holds=lambda i, g, h: g == 0 and (i, h) in held))


def test_a_prefix_held_in_a_tier_counts_like_one_on_the_gpu() -> None:
    """A 160-token prompt (10 blocks; 9 may hit: the last token is computed). Instance 0's GPU
    holds blocks 0-3; instance 1's GPU holds 0-1 and its CPU tier 2-6: tier-aware sees 7 blocks
    on instance 1 (112 tokens) and sends it there; kv-aware, reading the events alone, sees 2
    and picks instance 0. A tier block after a gap (instance 0's tier holding block 5) adds
    nothing: the prefix must be unbroken."""
    hs = _blocks(1, 10)
    idle = [InstanceLoad(0, 0, 0), InstanceLoad(1, 0, 0)]
    d = _router({0: 4, 1: 2}, {0: {5}, 1: {2, 3, 4, 5, 6}}, hs).route(hs, 160, idle)
    assert (d.instance, d.predicted_hit_tokens) == (1, 112)
    index = KVEventIndex()
    index.add(0, 0, hs[:4])
    index.add(1, 0, hs[:2])
    kv = make_router("kv-aware", RouterSetup(num_instances=2, block_size=16, capacity_blocks=100,
                                              index=index, overlap_weight=1.0, max_skew=None))
    assert kv.route(hs, 160, idle) == type(d)(0, 64)
    # tiers alone, nothing on either GPU: the tier's prefix wins
    assert _router({}, {0: {0, 1}, 1: set()}, hs).route(hs, 160, idle).predicted_hit_tokens == 32


def test_without_tiers_tier_aware_routes_as_kv_aware() -> None:
    items = chat(n=16, turns=3)
    a = ClusterSimulator(config(1200), 2, "kv-aware").run(items)
    b = ClusterSimulator(config(1200), 2, "tier-aware").run(items)
    assert a.routed_requests == b.routed_requests and a.overall.hit_tokens == b.overall.hit_tokens


def test_each_instance_has_its_tiers_and_the_cluster_adds_them_up() -> None:
    """Two instances, each with a CPU tier: every instance's hit tokens are its GPU's plus its
    tier's; the overall counts are their sums, and the tiers' report is the per-tier sum."""
    items = chat(n=16, turns=3)
    cfg = config(600, tiers=TierConfig(cpu_cache_tokens=40_000))
    res = ClusterSimulator(cfg, 2, "tier-aware").run(items)
    per = res.instances
    assert all(r.tiers is not None for r in per)
    for r in per:
        assert r.hit_tokens == r.gpu_hit_tokens + sum(r.tiers.hit_tokens.values())
    o = res.overall
    assert o.hit_tokens == sum(r.hit_tokens for r in per)
    assert o.tiers.hit_tokens["cpu"] == sum(r.tiers.hit_tokens["cpu"] for r in per) > 0
    assert o.tiers.loads == sum(r.tiers.loads for r in per)
    assert o.to_json()["hit_rate_by_tier"]["cpu"] > 0
    assert res.config["tiers"]["tiers"]["cpu"]["capacity_tokens"] == 40_000


def test_a_remote_tier_is_one_store_every_instance_reads() -> None:
    """Round-robin sends A (8,192 tokens) to instance 0 and, later, A + 512 to instance 1:
    with a remote tier, instance 1 loads A's 16 blocks that instance 0 wrote there (Mooncake
    Store: one store behind all instances); a CPU tier is an instance's own, so instance 1
    finds nothing in it. The bound counts the shared store once."""
    import numpy as np

    from hybridkv.sched import SchedulerConfig
    from hybridkv.sim import SimConfig, items_from_trace
    from hybridkv.cost.presets import get_gpu, get_preset
    from hybridkv.sim.traffic.traces import TraceRequest
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    a = np.random.default_rng(0).integers(0, 50_000, 8192)
    items = items_from_trace([TraceRequest("A", 0.0, a, 1),
                              TraceRequest("C", 100.0, np.concatenate([a, np.arange(512)]), 1)])
    blocks = preset.kv_config(memory_bytes=10_000 * preset.kv_bytes_per_token()["total"]).num_blocks + 1
    hits = {}
    for tier in ("remote", "cpu"):
        cfg = SimConfig(preset, get_gpu("h100"), blocks, optimum=False,
                        sched=SchedulerConfig(max_num_batched_tokens=16384),
                        tiers=TierConfig(**{f"{tier}_cache_tokens": 100_000}))
        sim = ClusterSimulator(cfg, 2, "round-robin")
        res = sim.run(items)
        assert res.routed_requests == [1, 1]
        hits[tier] = res.instances[1].tiers.hit_tokens[tier]
        one = sim.instances[0].sim
        per = one.optimum_capacity
        shared = one.tiers.key_capacity_blocks("remote")
        assert shared == (100_000 // 512 if tier == "remote" else 0)
        assert sim._optimum_capacity() == 2 * per - (shared if tier == "remote" else 0)
    assert hits == {"remote": 8192, "cpu": 0}
