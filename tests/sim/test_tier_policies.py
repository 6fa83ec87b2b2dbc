"""Tier write and admission policies and what copies cost the steps they overlap: the
frequency admission filter, lazy offload (written on eviction, kept on a load, waited for by no
step), ``contention`` priced into the step against its formula, ITL percentiles reported."""

from __future__ import annotations

import pytest

from hybridkv.sched import SchedulerConfig
from hybridkv.sim import SimConfig, Simulator
from hybridkv.cost.presets import get_preset
from hybridkv.sim.tiers.runtime import entry_bytes
from hybridkv.sim.tiers import TierConfig
from hybridkv.cost.transfer import DEFAULT_TRANSFER
from hybridkv.tiers import LAZY_OFFLOAD, OFFLOAD_ON_EVICT, WRITE_THROUGH, FrequencyAdmission, TierHierarchy
from tests.sim.test_tiers import H100, _blocks, _evict_then_reuse

PRESET = get_preset("llama-3.1-8b").with_block_size(512)
ENTRY = entry_bytes(PRESET.kv_config(num_blocks=2))[0]


def _run(**tiers):
    items = _evict_then_reuse(PRESET, 8192, 512)          # A (16 blocks), B (16), C = A + 512
    cfg = SimConfig(PRESET, H100, _blocks(PRESET, 9216), tiers=TierConfig(cpu_cache_tokens=100_000, **tiers),
                    sched=SchedulerConfig(max_num_batched_tokens=16384))
    sim = Simulator(cfg)
    return sim, sim.run(items)


def test_frequency_admission_admits_at_the_nth_sighting_and_forgets_the_oldest() -> None:
    f = FrequencyAdmission(2, max_tracked=2)
    assert [f.see(k) for k in ("a", "a", "a", "b")] == [False, True, True, False]
    assert f.see("c") is False                 # tracks b, c: a is forgotten
    assert f.see("a") is False and f.refused == 4
    assert all(FrequencyAdmission(1).see(k) for k in "xyz")
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        FrequencyAdmission(0)


def test_the_hierarchy_applies_the_filter_to_saves_and_offloads() -> None:
    wt = TierHierarchy([10_000], [100], WRITE_THROUGH, admit_after=2)
    assert wt.save([(0, b"x")]) == [0] and wt.save([(0, b"x")]) == [100]
    ev = TierHierarchy([10_000], [100], LAZY_OFFLOAD, admit_after=2)
    assert ev.offload(0, b"y") == [0] and ev.offload(0, b"y") == [100]


@pytest.mark.parametrize("policy, kept", [(LAZY_OFFLOAD, True), (OFFLOAD_ON_EVICT, False)])
def test_lazy_offload_keeps_the_tier_copy_on_a_load(policy, kept) -> None:
    h = TierHierarchy([10_000], [100], policy)
    h.offload(0, b"z")
    assert h.load([(0, b"z")]).ok and ((0, b"z") in h.tiers[0]) is kept


def test_admit_after_two_writes_only_what_the_gpu_computed_twice() -> None:
    """A's 16 blocks and B's 16 are computed once (not written: 32 refused). B left A's first 2
    blocks on the GPU (the pool holds 17 usable blocks; LRU evicts a chain tail first): C hits
    them there, recomputes A's other 14 (written now, their second sighting) and its own last
    block (once: refused). No load, 14 entries written (and copied: a refused block is not), 33
    refused."""
    _, res = _run(admit_after=2)
    t = res.tiers
    assert res.hit_tokens == 2 * 512
    assert (t.loads, t.hit_tokens["cpu"], t.written_bytes["cpu"], t.admission_refused) == (0, 0, 14 * ENTRY, 33)
    assert t.offload_s_total == pytest.approx(DEFAULT_TRANSFER.copy_time(ENTRY, 14, "d2h"), rel=1e-12)


def test_lazy_offload_writes_evicted_blocks_and_no_step_waits_for_them() -> None:
    """B evicts A's 16 blocks: written, as offload-on-evict writes them, but ahead of the
    eviction, so the only wait is C's load (offload-on-evict's B also waits for its copies);
    after C's load the tier still holds A's blocks the GPU holds again (inclusive)."""
    sim, lazy = _run(policy=LAZY_OFFLOAD)
    _, evict = _run(policy=OFFLOAD_ON_EVICT)
    assert lazy.tiers.hit_tokens == evict.tiers.hit_tokens and lazy.tiers.loads == 1
    assert lazy.tiers.written_bytes == evict.tiers.written_bytes
    assert 0 < lazy.tiers.load_wait_s_total < evict.tiers.load_wait_s_total
    held = set(sim.tiers.hierarchy.keys(0))
    assert any((0, h) in held for h in sim.kv.pool.index[0])


def test_contention_adds_its_share_of_the_copies_to_the_step_that_computes() -> None:
    """Write-through, contention c: C's load step computes nothing, so the step that computes C
    pays c x (B's save of 16 blocks + C's load of n blocks) on top of its forward C, and the
    layer-by-layer wait of the load comes after (the formula of test_tiers, with C + extra as
    its first term)."""
    sim0, base = _run()
    for c in (0.25, 1.0):
        sim, res = _run(contention=c)
        n = res.tiers.hit_tokens["cpu"] // 512
        D = DEFAULT_TRANSFER.copy_time(ENTRY, n, "h2d")
        S = DEFAULT_TRANSFER.copy_time(ENTRY, 16, "d2h")
        C = sim.cost.step_time([(512, 8192)])
        L = PRESET.num_layers
        assert res.ttft_s[-1] == pytest.approx(max(C + c * (S + D), D + C / L, D / L + C), rel=1e-9)
        assert res.ttft_s[-1] > base.ttft_s[-1]
        assert res.tiers.contention_s_total > 0
    assert base.tiers.contention_s_total == 0


def test_itl_percentiles_are_reported() -> None:
    _, res = _run()
    d = res.to_json()
    assert d["itl_p50_s"] is None and d["itl_p99_s"] is None          # one output token each
    assert d["tiers"]["admit_after"] == 1 and d["tiers"]["contention"] == 0.0


def test_a_sliding_window_group_loads_only_its_window_and_is_priced_so(monkeypatch) -> None:
    """gpt-oss-120b (full attention beside a 128-token window, 16-token blocks): C re-reads A's
    2048 tokens from the CPU tier. The load names every full-attention block past the local hit
    (n of them) but only the window's 8 = cdiv(127, 16) blocks of the sliding group (the hit
    rule's span), and the copy time and bytes are those blocks' alone: 8 sliding blocks, not n
    (llm-d's HMA-aware offload: only the last 128 tokens of each SWA group move)."""
    from hybridkv.sim.tiers import runtime as tier_runtime
    preset = get_preset("gpt-oss-120b")
    loads = []
    real = tier_runtime.TierRuntime._load

    def spy(self, load, t):
        loads.append([b.group for b in load.blocks])
        return real(self, load, t)
    monkeypatch.setattr(tier_runtime.TierRuntime, "_load", spy)
    items = _evict_then_reuse(preset, 2048, 64)
    sim = Simulator(SimConfig(preset, H100, _blocks(preset, 2048 + 256), tiers=TierConfig(cpu_cache_tokens=100_000),
                              sched=SchedulerConfig(max_num_batched_tokens=16384)))
    res = sim.run(items)
    assert len(loads) == 1
    n, w = loads[0].count(0), loads[0].count(1)
    assert (n, w) == (128, 8)
    full, swa = entry_bytes(preset.kv_config(num_blocks=2))
    assert res.tiers.loaded_bytes["cpu"] == n * full + w * swa
    assert res.tiers.load_s_total == pytest.approx(
        DEFAULT_TRANSFER.copy_time(full, n, "h2d") + DEFAULT_TRANSFER.copy_time(swa, w, "h2d"), rel=1e-12)
