"""KV tiers in the simulator: hit rates against oracles, the transfer-time and overlap model
against its formula, the hierarchy's optimum, bad configurations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybridkv.core.spec_decode import SpecDecode
from hybridkv.sched import SchedulerConfig
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.tiers.runtime import entry_bytes
from hybridkv.sim.tiers.config import DISK_LINK, FREE_LINK, TierConfig, link_with
from hybridkv.sim.traffic.traces import TraceRequest
from hybridkv.cost.transfer import DEFAULT_TRANSFER
from hybridkv.sim.traffic.workloads import get_workload
from hybridkv.tiers import OFFLOAD_ON_EVICT, WRITE_THROUGH
from hybridkv.core.cache_options import CacheOptions

H100 = get_gpu("h100")


def _blocks(preset, tokens: int) -> int:
    return preset.kv_config(memory_bytes=tokens * preset.kv_bytes_per_token()["total"]).num_blocks + 1


def _chat():
    return items_from_trace(get_workload("chat", num_conversations=10, turns=4, seed=3))


@pytest.mark.parametrize("preset_name, spec, gpu_tokens, policy", [
    ("llama-3.1-8b", None, 6000, WRITE_THROUGH),
    ("llama-3.1-8b", None, 6000, OFFLOAD_ON_EVICT),
    ("gemma-3-27b", None, 12000, WRITE_THROUGH),
    ("gemma-3-27b", None, 12000, OFFLOAD_ON_EVICT),
    ("deepseek-v4-style", SpecDecode("mtp", 1), 60000, WRITE_THROUGH),
    ("deepseek-v4-style", SpecDecode("mtp", 1), 60000, OFFLOAD_ON_EVICT),
])
def test_a_tier_that_never_evicts_hits_like_an_unbounded_gpu(preset_name, spec, gpu_tokens,
                                                             policy) -> None:
    """Sequential, free transfers: a small GPU over a CPU tier larger than the whole workload
    hits exactly what a GPU pool that never evicts hits, request by request; sliding-window
    and MLA groups included (the tier holds what the write path caches, the external lookup
    runs the same per-type rules; offload-on-evict chains tier blocks with blocks the GPU
    still holds past the local hit)."""
    preset = get_preset(preset_name)
    items = _chat()
    total = sum(it.prompt_len + it.output_len for it in items)
    big = Simulator(SimConfig(preset, H100, _blocks(preset, 4 * total), spec=spec, sequential=True))
    ref = big.run(items)
    assert ref.evictions == 0
    small = Simulator(SimConfig(preset, H100, _blocks(preset, gpu_tokens), spec=spec, sequential=True,
                                tiers=TierConfig(cpu_cache_tokens=4 * total, policy=policy,
                                                 cpu_link=FREE_LINK)))
    res = small.run(items)
    assert res.evictions > 0 and res.tiers.loads > 0 and res.tiers.loads_failed == 0
    assert small._online.hit_blocks == big._online.hit_blocks
    assert res.hit_tokens == ref.hit_tokens
    d = res.to_json()
    assert math.isclose(sum(d["hit_rate_by_tier"].values()), d["hit_rate"])
    assert d["hit_rate_by_tier"]["cpu"] > 0 and d["load_s_total"] == 0.0


def test_without_a_tier_hits_drop_and_the_hierarchy_optimum_bounds_the_tiered_run() -> None:
    preset = get_preset("llama-3.1-8b")
    items = _chat()
    nb = _blocks(preset, 6000)
    alone = Simulator(SimConfig(preset, H100, nb, sequential=True)).run(items)
    tiered = Simulator(SimConfig(preset, H100, nb, sequential=True,
                                 tiers=TierConfig(cpu_cache_tokens=200_000))).run(items)
    assert alone.block_hit_rate < tiered.block_hit_rate <= tiered.optimal_block_hit_rate
    assert alone.optimal_block_hit_rate < tiered.optimal_block_hit_rate   # bound of GPU + CPU
    assert tiered.to_json()["hit_rate_by_tier"]["gpu"] == pytest.approx(alone.hit_rate, abs=0.02)


def _evict_then_reuse(preset, prefix: int, tail: int, gap_s: float = 100.0) -> list:
    """A (prefix), then B (unrelated, evicts A from a pool that holds one of them), then
    C = A's prompt + tail; far apart in time (no queueing), one output token each."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 50_000, prefix)
    b = rng.integers(50_000, 100_000, prefix)
    c = np.concatenate([a, rng.integers(100_000, 150_000, tail)])
    return items_from_trace([TraceRequest(n, i * gap_s, p, 1)
                             for i, (n, p) in enumerate((("A", a), ("B", b), ("C", c)))])


@pytest.mark.parametrize("tier", ["cpu", "disk"])
def test_a_load_overlaps_compute_layer_by_layer_as_the_docstring_says(tier: str) -> None:
    """C's TTFT = its load (issued at its arrival, in a step with nothing to compute) overlapped
    with the forward of its 512 new tokens: max(C, f + C/L, s + D/L + C) from the arrival,
    with D priced by the TransferModel (disk: read into host memory first, then PCIe)."""
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    prefix, tail = 8192, 512
    items = _evict_then_reuse(preset, prefix, tail)
    sizes = {"cpu_cache_tokens": 100_000} if tier == "cpu" else {"disk_cache_tokens": 100_000}
    cfg = SimConfig(preset, H100, _blocks(preset, prefix + 1024), tiers=TierConfig(**sizes),
                    sched=SchedulerConfig(max_num_batched_tokens=16384))
    sim = Simulator(cfg)
    res = sim.run(items)
    loaded = res.tiers.hit_tokens[tier]
    assert res.tiers.loads == 1 and loaded >= prefix // 2
    assert sim._online.hit_blocks[-1] * 512 == prefix          # GPU + tier: all of A
    entry = entry_bytes(preset.kv_config(num_blocks=2))[0]
    n = loaded // 512
    D = DEFAULT_TRANSFER.copy_time(entry, n, "h2d")
    ready = 0.0 if tier == "cpu" else DISK_LINK.copy_time(n * entry, 1, "h2d")
    C = sim.cost.step_time([(tail, prefix)])
    L = preset.num_layers
    expected = max(C, ready + D + C / L, ready + D / L + C)
    assert res.ttft_s[-1] == pytest.approx(expected, rel=1e-9)
    assert res.tiers.load_s_total == pytest.approx(D + ready, rel=1e-9)
    # the buyer's point: loading beat recomputing the prefix
    recompute = Simulator(SimConfig(preset, H100, cfg.num_blocks, sched=cfg.sched)).run(items)
    assert recompute.ttft_s[-1] > res.ttft_s[-1]


@pytest.mark.parametrize("gpus", [2, 4])
def test_on_several_gpus_each_copies_its_share_of_a_block_over_its_own_link(gpus: int) -> None:
    """Tensor parallelism splits every block's KV heads: G GPUs load one block as G parallel
    calls of entry / G bytes, so the PCIe time is one call of that share per block (the disk's
    read, one device, does not scale); the overlap formula is unchanged."""
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    prefix, tail = 8192, 512
    items = _evict_then_reuse(preset, prefix, tail)
    cfg = SimConfig(preset, H100, _blocks(preset, prefix + 1024), num_gpus=gpus,
                    tiers=TierConfig(cpu_cache_tokens=100_000),
                    sched=SchedulerConfig(max_num_batched_tokens=16384))
    sim = Simulator(cfg)
    res = sim.run(items)
    n = res.tiers.hit_tokens["cpu"] // 512
    assert res.tiers.loads == 1 and n >= prefix // 1024
    entry = entry_bytes(preset.kv_config(num_blocks=2))[0]
    D = DEFAULT_TRANSFER.copy_time(-(-entry // gpus), n, "h2d")
    assert D < DEFAULT_TRANSFER.copy_time(entry, n, "h2d")
    assert res.tiers.load_s_total == pytest.approx(D, rel=1e-9)
    C = sim.cost.step_time([(tail, prefix)])
    L = preset.num_layers
    assert res.ttft_s[-1] == pytest.approx(max(C, D + C / L, D / L + C), rel=1e-9)


def test_free_transfers_take_no_time_and_the_load_costs_only_compute() -> None:
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    items = _evict_then_reuse(preset, 8192, 512)
    cfg = SimConfig(preset, H100, _blocks(preset, 9216), sched=SchedulerConfig(max_num_batched_tokens=16384),
                    tiers=TierConfig(cpu_cache_tokens=100_000, cpu_link=FREE_LINK))
    sim = Simulator(cfg)
    res = sim.run(items)
    assert res.ttft_s[-1] == pytest.approx(sim.cost.step_time([(512, 8192)]), rel=1e-12)
    assert res.tiers.load_s_total == 0 and res.tiers.load_wait_s_total == 0


def test_offload_on_evict_moves_blocks_down_on_eviction_and_up_on_a_hit() -> None:
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    items = _evict_then_reuse(preset, 8192, 512)
    cfg = SimConfig(preset, H100, _blocks(preset, 9216), sched=SchedulerConfig(max_num_batched_tokens=16384),
                    tiers=TierConfig(cpu_cache_tokens=100_000, policy=OFFLOAD_ON_EVICT))
    sim = Simulator(cfg)
    res = sim.run(items)
    entry = entry_bytes(preset.kv_config(num_blocks=2))[0]
    assert res.tiers.hit_tokens["cpu"] + res.gpu_hit_tokens == 8192
    # only evicted blocks were written (A's, when B came; B's, when C came), never a save
    assert res.tiers.written_bytes["cpu"] % entry == 0 and res.tiers.written_bytes["cpu"] >= 16 * entry
    held = set(sim.tiers.hierarchy.keys(0))
    assert not any((0, h) in held for h in sim.kv.pool.index[0])         # exclusive
    # B's step waited for the copies of A's evicted blocks to host memory
    assert res.tiers.load_wait_s_total > 0


def test_a_load_that_cannot_fit_alone_is_computed_instead_of_waiting_forever() -> None:
    """The scheduler falls back to computing past the local hit when a request's load does not
    fit the pool even with nothing else running (rather than retrying the load every step)."""
    from tests.support.tier_workload import tier_groups, tier_workload
    from hybridkv import KVCacheManager, Request
    from hybridkv.core.specs import KVCacheConfig
    from hybridkv.sched import EngineRequest, Scheduler
    from hybridkv.sim.tiers.runtime import TierGeometry, TierRuntime
    config = KVCacheConfig(tier_groups(3), num_blocks=24)
    kv = KVCacheManager(config, CacheOptions(hash_seed="same", retention_interval=0, max_in_flight_tokens=16))
    tiers = TierRuntime(kv, TierConfig(cpu_cache_tokens=6 * (7 * 160 + 5 * 416)),
                        TierGeometry(1, 5, 4, block_bytes=(160, 416)), DEFAULT_TRANSFER)
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2), tiers)
    work, answers, steps = tier_workload(0, 40), {}, 0
    while work or sched.has_unfinished():
        while work and len(sched.requests) < 4:
            rid, p, a = work.pop(0)
            answers[rid] = a
            sched.add_request(EngineRequest(Request(rid, p), max_tokens=len(a)))
        out = sched.schedule()
        steps += 1
        assert steps < 3000, "the scheduler stopped making progress"
        _, loaded = tiers.run_step(out, 0.0, 0.0, timed=False)
        sched.update(out, {x.req.request_id: [answers[x.req.request_id][x.req.num_output_tokens]]
                           for x in out.scheduled if x.samples}, loaded)
    assert tiers.report.loads > 0


def test_hybrid_tiers_keep_only_reachable_window_blocks() -> None:
    """gemma-3-27b on the replay workload (A, unrelated B, A again): the sliding group's tier
    entries are the blocks its write path cached (the promised windows), far fewer than the
    full group's, and A's return still hits all of A from the tier."""
    preset = get_preset("gemma-3-27b")
    sim = Simulator(SimConfig(preset, H100, _blocks(preset, 14_000), sequential=True,
                              tiers=TierConfig(cpu_cache_tokens=10**6, cpu_link=FREE_LINK)))
    res = sim.run(items_from_trace(get_workload("replay")))
    held = sim.tiers.hierarchy.keys(0)
    full = sum(1 for g, _ in held if g == 0)
    swa = sum(1 for g, _ in held if g == 1)
    assert full == 1024 and 0 < swa < full / 4
    assert res.tiers.hit_tokens["cpu"] == 8192 - 16 and res.gpu_hit_tokens == 0


def test_state_presets_refuse_tiers() -> None:
    preset = get_preset("qwen3-next-80b-a3b")
    with pytest.raises(ValueError, match="recurrent-state"):
        Simulator(SimConfig(preset, H100, 4000, tiers=TierConfig(cpu_cache_tokens=10**6)))


@pytest.mark.parametrize("kwargs, message", [
    (dict(cpu_cache_tokens=-1), "cpu_cache_tokens=-1 is not a size"),
    (dict(disk_cache_tokens=1.5), "disk_cache_tokens=1.5 is not a size"),
    (dict(cpu_cache_tokens=1, policy="write-back"), "unknown tier policy 'write-back'"),
    (dict(cpu_cache_tokens=1, disk_link="fast"), "disk_link must be a TransferModel"),
])
def test_bad_tier_configs_name_the_value(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TierConfig(**kwargs)


def test_a_tier_larger_than_its_medium_can_address_is_refused() -> None:
    preset = get_preset("llama-3.1-8b")          # 128 KiB per token: 2^47 B is 2^30 tokens
    TierConfig(cpu_cache_tokens=1 << 30).check(131072, preset.name)
    with pytest.raises(ValueError, match=r"cpu_cache_tokens=1073741825 is larger than host memory "
                                         r"can address.*at most 1,073,741,824 tokens"):
        Simulator(SimConfig(preset, H100, 1000, tiers=TierConfig(cpu_cache_tokens=(1 << 30) + 1)))


def test_a_link_without_bandwidth_is_refused() -> None:
    with pytest.raises(ValueError, match="h2d_bw must be > 0"):
        link_with(DISK_LINK, bandwidth=0.0)


def test_a_profiles_transfer_section_prices_the_cpu_tier_unless_a_link_is_given() -> None:
    import dataclasses

    from hybridkv.cost.profile import default_profile
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    items = _evict_then_reuse(preset, 8192, 512)
    slow = link_with(DEFAULT_TRANSFER, bandwidth=5e9)
    profile = dataclasses.replace(default_profile(), transfer=slow)
    cfg = SimConfig(preset, H100, _blocks(preset, 9216), sched=SchedulerConfig(max_num_batched_tokens=16384),
                    tiers=TierConfig(cpu_cache_tokens=100_000), profile=profile)
    res = Simulator(cfg).run(items)
    entry = entry_bytes(preset.kv_config(num_blocks=2))[0]
    n = res.tiers.loaded_tokens["cpu"] // 512
    assert n > 0 and res.tiers.load_s_total == pytest.approx(slow.copy_time(entry, n, "h2d"))
    assert res.tiers.config["cpu_link"]["h2d_bw"] == 5e9
    given = dataclasses.replace(cfg, tiers=TierConfig(cpu_cache_tokens=100_000, cpu_link=FREE_LINK))
    assert Simulator(given).run(items).tiers.load_s_total == 0.0
