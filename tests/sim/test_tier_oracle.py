"""A differential oracle for the simulator's KV tiers, and hand-computed tier scenarios.

:class:`TierOracle` is a slow, obviously-correct, event-by-event model of what
``hybridkv.sim.tiers.runtime`` documents, written from the docstrings only (the oracle uses nothing
of ``hybridkv.tiers`` nor of the runtime; the hand-computed scenarios below drive the runtime): each tier a plain list of ``(key, bytes)`` oldest
first; each link direction and each lower tier a first-come-first-served queue; every copy
priced ``copies * max(per_copy_s, latency_s + bytes / bandwidth)``; a host <-> GPU move one copy
call of one GPU's share per block and group; a lower tier one batch per load or write; a step's
forward ends at ``max(start + C, f + C / L, s + D / L + C)`` over the loads and evict offloads
it waits for. It runs beside the simulator on the same scheduler outputs (the GPU's own
contents, ``holds_cached``, are its only other input) and every step's end, and the report's
bytes and seconds per tier and direction, must agree (``rel=1e-9``: sums of the same terms in
another order).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hybridkv.sched import SchedulerConfig
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.tiers.config import DISK_LINK, REMOTE_LINK, TierConfig, link_with
from hybridkv.sim.traffic.traces import TraceRequest
from hybridkv.cost.transfer import DEFAULT_TRANSFER, TransferModel

H100 = get_gpu("h100")
REL = 1e-9                       # sums of the same float terms, possibly in another order
FAR = 1.0e6                      # a clock far from 0: times must be relative to the step


# ---- the oracle -----------------------------------------------------------------------------
def price(link: TransferModel, nbytes: int, copies: int, direction: str) -> float:
    """The transfer module's docstring formula, by hand."""
    if nbytes == 0 or copies == 0:
        return 0.0
    bw = link.h2d_bw if direction == "h2d" else link.d2h_bw
    return copies * max(link.per_copy_s, link.latency_s + nbytes / bw)


class Tier:
    """A byte-budget LRU as a list, oldest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[list] = []         # [key, size]

    def used(self) -> int:
        return sum(s for _, s in self.items)

    def index(self, key):
        for i, (k, _) in enumerate(self.items):
            if k == key:
                return i
        return None

    def has(self, key) -> bool:
        return self.index(key) is not None

    def remove(self, key) -> None:
        i = self.index(key)
        if i is not None:
            del self.items[i]

    def touch(self, key) -> None:
        i = self.index(key)
        self.items.append(self.items.pop(i))

    def insert(self, key, size: int):
        if size > self.capacity:
            return False, []
        self.remove(key)
        evicted = []
        while self.used() + size > self.capacity:
            evicted.append(tuple(self.items.pop(0)))
        self.items.append([key, size])
        return True, evicted


class Queue:
    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy = 0.0

    def run(self, t: float, seconds: float):
        start = max(t, self.free_at)
        self.free_at = start + seconds
        self.busy += seconds
        return start, self.free_at


class TierOracle:
    def __init__(self, names, capacities_bytes, entry, policy, links, cpu_link, layers, gpus,
                 key_group, key_block) -> None:
        self.names = list(names)
        self.tiers = [Tier(c) for c in capacities_bytes]
        self.entry = list(entry)
        self.share = [math.ceil(e / gpus) for e in entry]
        self.policy = policy
        self.links = links                              # per tier: None for cpu
        self.cpu = cpu_link
        self.L = layers
        self.key_group, self.key_block = key_group, key_block
        self.h2d, self.d2h = Queue(), Queue()
        self.lower = {n: Queue() for n in self.names if n != "cpu"}
        self.pending_groups = [0] * len(entry)           # evicted blocks not yet copied out
        self.pending_written = {n: 0 for n in self.names}
        self.due = {}
        zero = dict.fromkeys(self.names, 0)
        self.written, self.loaded_bytes, self.loaded_tokens = dict(zero), dict(zero), dict(zero)
        self.loads = self.failed = 0
        self.load_s = self.offload_s = self.wait_s = 0.0
        self.saved_refs: list = []
        self.gpu_tokens = 0                 # tokens of loads copied within the GPU

    # a block the GPU evicted (offload-on-evict): into tier 0, each tier's victims one down
    def on_evicted(self, group: int, h: bytes) -> None:
        moving = [((group, h), self.entry[group])]
        wrote = False
        for name, tier in zip(self.names, self.tiers):
            nxt = []
            for key, size in moving:
                ok, victims = tier.insert(key, size)
                if ok:
                    self.pending_written[name] += size
                    wrote = True
                    nxt += victims
                else:
                    nxt.append((key, size))
            moving = nxt
            if not moving:
                break
        if wrote:
            self.pending_groups[group] += 1

    def pcie(self, per_group, direction) -> float:
        return sum(price(self.cpu, self.share[g], n, direction) for g, n in enumerate(per_group))

    def write_lower(self, written: dict, t: float) -> None:
        for name in self.names:
            n = written.get(name, 0)
            if not n:
                continue
            self.written[name] += n
            if name != "cpu":
                sec = price(self.links[self.names.index(name)], n, 1, "d2h")
                self.lower[name].run(t, sec)
                self.offload_s += sec

    def save(self, refs, t: float) -> None:
        if not refs:
            return
        self.saved_refs += [(r.group, r.block_hash) for r in refs]
        written = dict.fromkeys(self.names, 0)
        for r in sorted(refs, key=lambda r: r.group):        # group order, stable
            size = self.entry[r.group]
            for name, tier in zip(self.names, self.tiers):
                if tier.insert((r.group, r.block_hash), size)[0]:
                    written[name] += size
        counts = [0] * len(self.entry)
        for r in refs:
            counts[r.group] += 1
        sec = self.pcie(counts, "d2h")
        _, f = self.d2h.run(t, sec)
        self.offload_s += sec
        self.write_lower(written, f)

    def load(self, load, t: float, on_gpu) -> bool:
        self.loads += 1
        keys = [(b.group, b.block_hash) for b in load.blocks]
        served = []
        ok = True
        i = 0
        while i < len(keys):                               # runs of one group
            j = i
            while j < len(keys) and keys[j][0] == keys[i][0]:
                j += 1
            bad = False
            for key in keys[i:j]:
                where = next((n for n, tier in enumerate(self.tiers) if tier.has(key)), None)
                if where is not None:
                    self.tiers[where].touch(key)
                    served.append(where)
                elif self.policy == "offload-on-evict" and on_gpu(*key):
                    served.append("gpu")
                else:
                    served.append(None)
                    bad = True
            if bad:
                ok = False
                break
            i = j
        if not ok:
            self.failed += 1
            return False
        promoted = dict.fromkeys(self.names, 0)
        for key, where in zip(keys, served):
            if where == "gpu":
                continue
            if self.policy == "offload-on-evict":
                self.tiers[where].remove(key)
            else:
                for n in range(where):
                    if self.tiers[n].insert(key, self.entry[key[0]])[0]:
                        promoted[self.names[n]] += self.entry[key[0]]
        ready = t
        pcie_counts = [0] * len(self.entry)
        for n, name in enumerate(self.names):
            nbytes = sum(self.entry[k[0]] for k, w in zip(keys, served) if w == n)
            for k, w in zip(keys, served):
                if w == n:
                    pcie_counts[k[0]] += 1
            self.loaded_bytes[name] += nbytes
            if name != "cpu" and nbytes:
                sec = price(self.links[n], nbytes, 1, "h2d")
                _, f = self.lower[name].run(t, sec)
                self.load_s += sec
                ready = max(ready, f)
        sec = self.pcie(pcie_counts, "h2d")
        s, f = self.h2d.run(ready, sec)
        self.load_s += sec
        self.due[load.req.request_id] = (s, f)
        self.write_lower(promoted, f)
        # tokens: the key group's blocks at key_block each; the rest to the slowest tier used
        ext = load.external
        total = ext.num_tokens - ext.local_tokens
        tokens = dict.fromkeys([*self.names, "gpu"], 0)
        for k, w in zip(keys, served):
            if k[0] == self.key_group:
                tokens["gpu" if w == "gpu" else self.names[w]] += self.key_block
        rest = total - sum(tokens.values())
        if rest:
            tiers_used = [w for w in served if w != "gpu"]
            tokens[self.names[max(tiers_used)] if tiers_used else "gpu"] += rest
        for name in self.names:
            self.loaded_tokens[name] += tokens[name]
        self.gpu_tokens += tokens["gpu"]
        return True

    def step(self, out, start: float, compute: float, on_gpu):
        waits = []
        if any(self.pending_groups):
            sec = self.pcie(self.pending_groups, "d2h")
            s, f = self.d2h.run(start, sec)
            self.offload_s += sec
            waits.append((s, f))
            self.write_lower(self.pending_written, f)
            self.pending_groups = [0] * len(self.entry)
            self.pending_written = dict.fromkeys(self.names, 0)
        self.save(out.saves_before, start)
        loaded = {ld.req.request_id: self.load(ld, start, on_gpu) for ld in out.loads}
        for r in out.requests:
            if r.request_id in self.due:
                waits.append(self.due.pop(r.request_id))
        end = start + compute
        if compute > 0:
            for s, f in waits:
                end = max(end, f + compute / self.L, s + (f - s) / self.L + compute)
        self.wait_s += end - (start + compute)
        self.save(out.saves_after, end)
        return end, loaded


# ---- running both ---------------------------------------------------------------------------
def run_both(preset, gpu_tokens: int, items, tiers: TierConfig, num_gpus: int = 1,
             max_batched: int = 2048, sequential: bool = False, spec=None):
    nb = preset.kv_config(memory_bytes=gpu_tokens * preset.kv_bytes_per_token()["total"]).num_blocks + 1
    sim = Simulator(SimConfig(preset, H100, nb, tiers=tiers, num_gpus=num_gpus, optimum=False,
                              sched=SchedulerConfig(max_num_batched_tokens=max_batched),
                              sequential=sequential, spec=spec))
    rt = sim.tiers
    per_token = preset.kv_bytes_per_token()["total"]
    entry = [g.spec.page_size_bytes * len(g.layer_names) for g in sim.kv.config.groups]
    names = [n for n in ("cpu", "disk", "remote") if getattr(tiers, f"{n}_cache_tokens") > 0]
    cpu_link = tiers.cpu_link or DEFAULT_TRANSFER
    links = [None if n == "cpu" else getattr(tiers, f"{n}_link") for n in names]
    from hybridkv.core.specs import MLA, FullAttention
    key_group = next((g for g, grp in enumerate(sim.kv.config.groups)       # full attention (or
                      if isinstance(grp.spec, (FullAttention, MLA))           # MLA) at the key
                      and grp.spec.block_size == sim.key_block), None)        # block size
    oracle = TierOracle(names, [getattr(tiers, f"{n}_cache_tokens") * per_token for n in names],
                        entry, tiers.policy, links, cpu_link, preset.num_layers, num_gpus,
                        key_group, sim.key_block)
    if tiers.policy == "offload-on-evict":
        sim.kv.add_evicted_listener(oracle.on_evicted)
    cached: list = []
    sim.kv.add_cached_listener(lambda g, hs, bs: cached.extend((g, h) for h in hs))
    steps = []
    real = rt.run_step

    def run_step(out, start, compute, timed=True):
        want_end, want_loaded = oracle.step(out, start, compute, sim.kv.holds_cached)
        end, loaded = real(out, start, compute, timed)
        steps.append((start, compute, end, want_end))
        assert loaded == want_loaded
        assert end == pytest.approx(want_end, rel=REL, abs=1e-12)
        return end, loaded

    rt.run_step = run_step
    res = sim.run(items)
    rep = res.tiers
    if tiers.policy == "write-through":       # every block the GPU cached was saved, in order
        assert oracle.saved_refs == cached[:len(oracle.saved_refs)]
    assert rep.loads == oracle.loads and rep.loads_failed == oracle.failed
    assert rep.written_bytes == oracle.written
    assert rep.loaded_bytes == oracle.loaded_bytes
    assert rep.loaded_tokens == oracle.loaded_tokens
    assert rep.load_s_total == pytest.approx(oracle.load_s, rel=REL, abs=1e-15)
    assert rep.offload_s_total == pytest.approx(oracle.offload_s, rel=REL, abs=1e-15)
    if sequential:                     # untimed: no waits, and the report says so
        assert rep.load_wait_s_total is None
    else:
        assert rep.load_wait_s_total == pytest.approx(oracle.wait_s, rel=REL, abs=1e-12)
    busy = {"h2d": oracle.h2d.busy, "d2h": oracle.d2h.busy,
            **{n: q.busy for n, q in oracle.lower.items()}}
    assert rep.link_busy_s == pytest.approx(busy, rel=REL, abs=1e-15)
    for n, tier in zip(names, oracle.tiers):              # the same blocks, in the same LRU order
        assert rt.hierarchy.keys(names.index(n)) == [k for k, _ in tier.items]
    if res.preemptions == 0:
        assert rep.hit_tokens == oracle.loaded_tokens
        assert rep.gpu_hit_tokens == oracle.gpu_tokens
    return sim, res, oracle, steps


def random_items(rng: random.Random, n: int, t0: float = FAR, scale: int = 1):
    stems = [[rng.randrange(1000) for _ in range(scale * rng.randrange(8, 200))] for _ in range(4)]
    history: list[list[int]] = []
    t = t0
    reqs = []
    for i in range(n):
        t += rng.choice([0.0, 0.001, 0.05, 2.0, 30.0])
        if history and rng.random() < 0.5:
            prompt = rng.choice(history) + [rng.randrange(1000) for _ in range(scale * rng.randrange(1, 40))]
        else:
            prompt = rng.choice(stems) + [rng.randrange(1000) for _ in range(scale * rng.randrange(0, 60))]
        out = rng.randrange(1, 12)
        history.append(prompt + [5000 + rng.randrange(1000) for _ in range(out)])
        reqs.append(TraceRequest(f"r{i}", t, np.array(prompt), out))
    return items_from_trace(reqs)


def random_link(rng: random.Random, base: TransferModel) -> TransferModel:
    return rng.choice([
        base,
        TransferModel(h2d_bw=rng.choice([1e8, 2e9, 5e10]), d2h_bw=rng.choice([5e7, 1e9, 3e10]),
                      latency_s=rng.choice([0.0, 5e-6, 2e-4]), per_copy_s=rng.choice([0.0, 1e-5, 1e-3]),
                      pageable_h2d_bw=1e9),
        link_with(base, bandwidth=rng.choice([1e8, 1e10]), latency_s=rng.choice([0.0, 1e-3])),
    ])


def random_case(seed: int):
    """A random dense run: policy, tiers (sizes, links on both sides of their floors), GPUs,
    pool size, batch budget and a chat-like workload far from clock 0."""
    rng = random.Random(seed)
    policy = rng.choice(["write-through", "offload-on-evict"])
    sizes = {}
    for n in ("cpu", "disk", "remote"):
        if rng.random() < 0.6:
            sizes[f"{n}_cache_tokens"] = rng.choice([200, 700, 1500, 5000])
    if not sizes:
        sizes["cpu_cache_tokens"] = 900
    tiers = TierConfig(**sizes, policy=policy,
                       cpu_link=random_link(rng, DEFAULT_TRANSFER) if rng.random() < 0.7 else None,
                       disk_link=random_link(rng, DISK_LINK), remote_link=random_link(rng, REMOTE_LINK))
    gpus = rng.choice([1, 2, 3, 8])
    items = random_items(rng, 40)
    return run_both(get_preset("llama-3.1-8b"), rng.choice([500, 900, 1600]), items, tiers, gpus,
                    max_batched=rng.choice([256, 2048]))


SEEDS = range(16)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_simulators_tiers_agree_with_the_event_by_event_oracle(seed: int) -> None:
    _, res, oracle, steps = random_case(seed)
    assert res.requests == 40
    assert all(s >= FAR for s, *_ in steps)


@pytest.mark.parametrize("seed", range(4))
def test_the_oracle_agrees_on_a_hybrid_preset_with_a_sliding_group(seed: int) -> None:
    """gemma-3-27b: two groups (full and sliding), entries of different sizes, the rest of a
    load's tokens credited to the slowest tier used."""
    rng = random.Random(100 + seed)
    preset = get_preset("gemma-3-27b")
    policy = ["write-through", "offload-on-evict"][seed % 2]
    tiers = TierConfig(cpu_cache_tokens=rng.choice([300, 1200]), disk_cache_tokens=rng.choice([0, 3000]),
                       policy=policy, cpu_link=random_link(rng, DEFAULT_TRANSFER),
                       disk_link=random_link(rng, DISK_LINK))
    _, res, oracle, _ = run_both(preset, 700, random_items(rng, 20), tiers, rng.choice([1, 4]))
    assert res.requests == 20


@pytest.mark.parametrize("seed", range(4))
def test_the_oracle_agrees_on_mla_with_two_window_sizes_and_mtp(seed: int) -> None:
    """deepseek-v4-style: an MLA group of 256-token blocks (the key group), sliding groups of 64
    and 8, an MTP draft group; 2 or 8 GPUs."""
    from hybridkv.core.spec_decode import SpecDecode
    rng = random.Random(200 + seed)
    tiers = TierConfig(cpu_cache_tokens=rng.choice([2000, 6000]), remote_cache_tokens=rng.choice([0, 20000]),
                       policy=["write-through", "offload-on-evict"][seed % 2],
                       cpu_link=random_link(rng, DEFAULT_TRANSFER), remote_link=random_link(rng, REMOTE_LINK))
    items = random_items(rng, 30, scale=6)
    _, res, oracle, _ = run_both(get_preset("deepseek-v4-style"), 16000, items, tiers, rng.choice([2, 8]),
                                 spec=SpecDecode("mtp", 1), max_batched=512)
    assert res.requests == 30 and oracle.loads > 0


@pytest.mark.parametrize("seed", range(3))
def test_the_oracle_agrees_on_a_sequential_run(seed: int) -> None:
    """Sequential (untimed) runs move the same blocks; no time is waited."""
    rng = random.Random(300 + seed)
    tiers = TierConfig(cpu_cache_tokens=700, disk_cache_tokens=2000,
                       policy=["write-through", "offload-on-evict"][seed % 2])
    _, res, oracle, _ = run_both(get_preset("llama-3.1-8b"), 600, random_items(rng, 30), tiers,
                                 sequential=True)
    assert oracle.loads > 0 and res.requests == 30


def test_the_random_workloads_exercise_every_path() -> None:
    """The differential test means something only if its runs load from every tier, fail
    loads, wait for loads and for evict offloads, and promote (write-through): counted over
    the seeds above."""
    seen = dict.fromkeys(["loads", "failed", "disk", "remote", "promoted", "wait", "oe_wait"], 0)
    for seed in SEEDS:
        sim, res, oracle, _ = random_case(seed)
        seen["loads"] += oracle.loads
        seen["failed"] += oracle.failed
        seen["disk"] += oracle.loaded_bytes.get("disk", 0)
        seen["remote"] += oracle.loaded_bytes.get("remote", 0)
        seen["wait"] += oracle.wait_s
        if oracle.policy == "offload-on-evict":
            seen["oe_wait"] += oracle.wait_s
        else:
            seen["promoted"] += sum(oracle.written.values()) - len(oracle.saved_refs) * oracle.entry[0] * len(oracle.names)
    print(seen)
    assert all(v > 0 for v in seen.values()), seen
    assert seen["loads"] > 50


# ---- hand-computed scenarios ----------------------------------------------------------------
# The runtime driven directly with one full-attention group whose tier entry is E = 1 MB and
# 1 byte per token (a tier's capacity in tokens is then its bytes), on links with round numbers.
# Times are near T = 1e6 s, where one ulp is ~1.2e-10 s: absolute tolerance 1e-9 s there.
from types import SimpleNamespace  # noqa: E402

from hybridkv import KVCacheManager  # noqa: E402
from hybridkv.core.blockref import BlockRef  # noqa: E402
from hybridkv.core.specs import FullAttention, KVCacheConfig, KVCacheGroup  # noqa: E402
from hybridkv.sim.tiers.runtime import TierGeometry, TierRuntime  # noqa: E402

E = 1_000_000
T = FAR
TOL = dict(rel=0, abs=1e-9)
CPU = TransferModel(h2d_bw=1e9, d2h_bw=5e8, latency_s=1e-4, per_copy_s=5e-4, pageable_h2d_bw=1e9)
DISK = TransferModel(h2d_bw=2e8, d2h_bw=1e8, latency_s=1e-3, per_copy_s=0.0, pageable_h2d_bw=2e8)
REMOTE = TransferModel(h2d_bw=4e8, d2h_bw=2e8, latency_s=5e-4, per_copy_s=0.0, pageable_h2d_bw=4e8)


def h(i: int) -> bytes:
    return bytes([i]) * 16


def make_runtime(policy: str, gpus: int = 1, layers: int = 4, **sizes) -> TierRuntime:
    spec = FullAttention(block_size=4, num_kv_heads=1, head_dim=4, dtype="float32")
    kv = KVCacheManager(KVCacheConfig((KVCacheGroup("full", spec, ("l0",)),), num_blocks=8))
    cfg = TierConfig(policy=policy, cpu_link=CPU, disk_link=DISK, remote_link=REMOTE, **sizes)
    geometry = TierGeometry(1, layers, 4, block_bytes=(E,), num_gpus=gpus)
    return TierRuntime(kv, cfg, geometry, DEFAULT_TRANSFER)


def step(saves=(), loads=(), computing=(), saves_after=()):
    return SimpleNamespace(saves_before=[BlockRef(0, i, h(i)) for i in saves],
                           saves_after=[BlockRef(0, i, h(i)) for i in saves_after],
                           loads=[SimpleNamespace(req=SimpleNamespace(request_id=rid),
                                                  external=SimpleNamespace(num_tokens=4 * len(ids),
                                                                           local_tokens=0),
                                                  blocks=[BlockRef(0, i, h(i)) for i in ids])
                                  for rid, ids in loads],
                           requests=[SimpleNamespace(request_id=r) for r in computing])


def held(rt: TierRuntime, tier: int) -> list[int]:
    return [k[1][0] for k in rt.hierarchy.keys(tier)]


def test_write_through_saves_loads_promotes_and_waits_byte_by_byte_and_second_by_second() -> None:
    rt = make_runtime("write-through", cpu_cache_tokens=2 * E, disk_cache_tokens=4 * E)
    rep = rt.report
    # step 1 at T: blocks 1, 2 saved. PCIe d2h: 2 calls x max(5e-4, 1e-4 + 1e6/5e8 = 2.1e-3)
    # = 4.2e-3 s on [T, T+4.2e-3]; then the disk write of 2 MB as one batch: 1e-3 + 2e6/1e8
    # = 0.021 s on [T+4.2e-3, T+0.0252]. Nothing waits: the step ends at T + C.
    end, loaded = rt.run_step(step(saves=[1, 2]), T, 0.01)
    assert end == pytest.approx(T + 0.01, **TOL) and loaded == {}
    assert rep.written_bytes == {"cpu": 2 * E, "disk": 2 * E}
    assert rep.offload_s_total == pytest.approx(4.2e-3 + 0.021, rel=1e-12)
    assert rt.d2h.free_at == pytest.approx(T + 4.2e-3, **TOL)
    assert rt.queues[1].free_at == pytest.approx(T + 0.0252, **TOL)
    # step 2 at T+0.5: block 3 (saved after the forward, at its end T+0.51): the CPU tier
    # (2 entries) drops block 1, the disk keeps 1, 2, 3.
    end, _ = rt.run_step(step(saves_after=[3]), T + 0.5, 0.01)
    assert held(rt, 0) == [2, 3] and held(rt, 1) == [1, 2, 3]
    assert rt.d2h.free_at == pytest.approx(T + 0.51 + 2.1e-3, **TOL)
    assert rt.queues[1].free_at == pytest.approx(T + 0.5121 + 1e-3 + 1e6 / 1e8, **TOL)
    # step 3 at T+1: r1 loads 1 (disk) and 2 (cpu). Disk read 1e-3 + 1e6/2e8 = 6e-3 s, so the
    # PCIe copies start at T+1.006: 2 x max(5e-4, 1e-4 + 1e6/1e9 = 1.1e-3) = 2.2e-3 s. Block 1
    # is promoted into the CPU tier (which drops 3: 2 was made newest by the load).
    end, loaded = rt.run_step(step(loads=[("r1", [1, 2])]), T + 1.0, 0.0)
    assert loaded == {"r1": True} and end == T + 1.0
    assert rep.loaded_bytes == {"cpu": E, "disk": E} and rep.loaded_tokens == {"cpu": 4, "disk": 4}
    assert rep.written_bytes == {"cpu": 4 * E, "disk": 3 * E}
    assert held(rt, 0) == [2, 1]
    assert rep.load_s_total == pytest.approx(6e-3 + 2.2e-3, rel=1e-12)
    # step 4 at T+1.001 computes r1 (C = 4e-3, L = 4 layers) and waits for its load on
    # s = T+1.006, f = T+1.0082: max(T+1.005, f + C/L = T+1.0092, s + D/L + C = T+1.01055).
    end, _ = rt.run_step(step(computing=["r1"]), T + 1.001, 4e-3)
    assert end == pytest.approx(T + 1.01055, **TOL)
    assert rep.load_wait_s_total == pytest.approx(1.01055 - 1.005, abs=1e-9)
    # a load of a block no tier holds fails and changes nothing
    end, loaded = rt.run_step(step(loads=[("r2", [9])]), T + 2, 0.0)
    assert loaded == {"r2": False} and rep.loads == 2 and rep.loads_failed == 1
    assert held(rt, 0) == [2, 1] and rep.loaded_bytes == {"cpu": E, "disk": E}
    busy = rt.finish().link_busy_s
    assert busy == pytest.approx({"h2d": 2.2e-3, "d2h": 4.2e-3 + 2.1e-3,
                                  "disk": 0.021 + 0.011 + 6e-3}, rel=1e-12)


def test_offload_on_evict_moves_down_on_eviction_up_on_a_load_and_the_step_waits_for_it() -> None:
    rt = make_runtime("offload-on-evict", gpus=2, cpu_cache_tokens=2 * E, remote_cache_tokens=8 * E)
    rep = rt.report
    for i in (1, 2, 3):                 # the GPU evicts 1, 2, 3: 1 is pushed on to the remote
        rt._on_evicted(0, h(i))
    assert held(rt, 0) == [2, 3] and held(rt, 1) == [1]
    # the step copies the 3 evicted blocks to host first, each GPU its half (5e5 B):
    # 3 x max(5e-4, 1e-4 + 5e5/5e8 = 1.1e-3) = 3.3e-3 s on [T, T+3.3e-3]; then the remote
    # write of block 1: 5e-4 + 1e6/2e8 = 5.5e-3 s. The forward (C = 2e-3, L = 4) waits:
    # max(T+2e-3, T+3.3e-3+5e-4, T+3.3e-3/4+2e-3) = T+3.8e-3.
    end, _ = rt.run_step(step(), T, 2e-3)
    assert end == pytest.approx(T + 3.8e-3, **TOL)
    assert rep.load_wait_s_total == pytest.approx(1.8e-3, abs=1e-9)
    assert rep.written_bytes == {"cpu": 3 * E, "remote": E}
    assert rep.offload_s_total == pytest.approx(3.3e-3 + 5.5e-3, rel=1e-12)
    # a load of 1 (remote) and 3 (cpu) takes them out of their tiers: remote read
    # 5e-4 + 1e6/4e8 = 3e-3 s, then 2 x max(5e-4, 1e-4 + 5e5/1e9 = 6e-4) = 1.2e-3 s of PCIe
    end, loaded = rt.run_step(step(loads=[("r", [1, 3])]), T + 1, 0.0)
    assert loaded == {"r": True} and held(rt, 0) == [2] and held(rt, 1) == []
    assert rep.load_s_total == pytest.approx(3e-3 + 1.2e-3, rel=1e-12)
    assert rep.loaded_bytes == {"cpu": E, "remote": E} and rep.written_bytes == {"cpu": 3 * E, "remote": E}
    assert rt.h2d.free_at == pytest.approx(T + 1 + 3e-3 + 1.2e-3, **TOL)
    # no evictions, no saves: a step that computes nothing new waits for nothing
    end, _ = rt.run_step(step(computing=["x"]), T + 2, 1e-3)
    assert end == pytest.approx(T + 2 + 1e-3, **TOL)


@pytest.mark.parametrize("gpus, per_block", [
    (1, 1e-4 + 1e6 / 1e9),        # 1.1e-3 > the 5e-4 per-call floor
    (4, 1e-4 + 2.5e5 / 1e9),      # 3.5e-4 < 5e-4: below the floor, still above...
    (8, 5e-4),                    # ... and 1e-4 + 1.25e5/1e9 = 2.25e-4: the floor binds
    (3, 1e-4 + 333_334 / 1e9),    # a share rounds up to whole bytes
])
def test_a_blocks_pcie_time_is_one_call_of_one_gpus_share_above_or_at_the_per_call_floor(
        gpus: int, per_block: float) -> None:
    rt = make_runtime("write-through", gpus=gpus, cpu_cache_tokens=10 * E)
    rt.run_step(step(saves=[1, 2, 3]), T, 0.0)
    rt.run_step(step(loads=[("r", [1, 2, 3])]), T + 1, 0.0)
    expected = max(5e-4, per_block)
    d2h = max(5e-4, 1e-4 + math.ceil(E / gpus) / 5e8)
    assert rt.report.load_s_total == pytest.approx(3 * expected, rel=1e-12)
    assert rt.report.offload_s_total == pytest.approx(3 * d2h, rel=1e-12)


@pytest.mark.parametrize("tier, link, load_s, write_s", [
    # lower tiers: one batch per load or write, latency then bandwidth; then PCIe per block
    ("disk", DISK, (1e-3 + 2e6 / 2e8) + 2 * 1.1e-3, 2 * 2.1e-3 + (1e-3 + 2e6 / 1e8)),
    ("remote", REMOTE, (5e-4 + 2e6 / 4e8) + 2 * 1.1e-3, 2 * 2.1e-3 + (5e-4 + 2e6 / 2e8)),
])
def test_each_lower_tier_reads_and_writes_in_its_own_direction(tier, link, load_s, write_s) -> None:
    rt = make_runtime("write-through", **{f"{tier}_cache_tokens": 10 * E})
    rt.run_step(step(saves=[1, 2]), T, 0.0)
    rt.run_step(step(loads=[("r", [1, 2])]), T + 1, 0.0)
    rep = rt.report
    assert rep.offload_s_total == pytest.approx(write_s, rel=1e-12)
    assert rep.load_s_total == pytest.approx(load_s, rel=1e-12)
    assert rep.loaded_bytes == {tier: 2 * E} and rep.written_bytes == {tier: 2 * E}
    assert rep.loaded_tokens == {tier: 8}


def test_a_busy_link_delays_the_next_transfer_not_the_clock() -> None:
    """FIFO per direction: a load issued while the d2h queue is busy is not delayed (another
    direction); a second load right after the first waits for the h2d queue."""
    rt = make_runtime("write-through", cpu_cache_tokens=10 * E)
    rt.run_step(step(saves=[1, 2, 3]), T, 0.0)                # d2h busy until T + 6.3e-3
    rt.run_step(step(loads=[("a", [1]), ("b", [2, 3])]), T + 1e-3, 0.0)
    assert rt._due["a"] == pytest.approx((T + 1e-3, T + 1e-3 + 1.1e-3), **TOL)
    assert rt._due["b"] == pytest.approx((T + 2.1e-3, T + 2.1e-3 + 2.2e-3), **TOL)
    # b's forward (C = 1e-3, L = 4) starts at T+2e-3: max(T+3e-3, f + 2.5e-4, s + 2.2e-3/4 + 1e-3)
    end, _ = rt.run_step(step(computing=["b"]), T + 2e-3, 1e-3)
    assert end == pytest.approx(T + 4.3e-3 + 2.5e-4, **TOL)


# ---- the copy model and the link options, on both sides of each floor -----------------------
def test_the_default_link_is_the_documented_fit_of_the_h100_points_by_hand() -> None:
    # bandwidth each way: the median rate of the single pinned copies of >= 64 MiB
    h2d = sorted([67108864 / 0.001220243, 268435456 / 0.004871632, 1073741824 / 0.019445184])[1]
    d2h = sorted([67108864 / 0.001220758, 268435456 / 0.004870803, 1073741824 / 0.019460435])[1]
    # latency: the median excess over bytes / bandwidth of the 1, 4, 16 MiB copies (6 points)
    ex = sorted([2.2848e-05 - 1048576 / h2d, 7.9622e-05 - 4194304 / h2d, 0.000307722 - 16777216 / h2d,
                 2.2509e-05 - 1048576 / d2h, 7.929e-05 - 4194304 / d2h, 0.000309242 - 16777216 / d2h])
    latency = (ex[2] + ex[3]) / 2
    # per call: the median time per call of the batched copies of <= 256 KiB (2 points)
    per_copy = (0.013537034 / 1024 + 0.006880939 / 512) / 2
    D = DEFAULT_TRANSFER
    assert D.h2d_bw == pytest.approx(h2d, rel=1e-12) and D.d2h_bw == pytest.approx(d2h, rel=1e-12)
    assert D.latency_s == pytest.approx(latency, rel=1e-9)
    assert D.per_copy_s == pytest.approx(per_copy, rel=1e-12)
    assert D.pageable_h2d_bw == pytest.approx(17.001052644e9, rel=1e-12)
    # latency-bound below ~256 KiB: 100 calls of 256 KiB cost 100 per-call floors ...
    assert latency + 262144 / h2d < per_copy
    assert D.copy_time(262144, 100, "h2d") == pytest.approx(100 * per_copy, rel=1e-12)
    # ... above it, latency plus bandwidth, each way, and pageable at its own bandwidth
    assert D.copy_time(1 << 20, 3, "h2d") == pytest.approx(3 * (latency + (1 << 20) / h2d), rel=1e-9)
    assert D.copy_time(1 << 20, 3, "d2h") == pytest.approx(3 * (latency + (1 << 20) / d2h), rel=1e-9)
    assert D.copy_time(1 << 30, 1, "h2d", pinned=False) == pytest.approx(
        latency + (1 << 30) / 17.001052644e9, rel=1e-9)


@pytest.mark.parametrize("latency, nbytes, expected", [
    # a latency below the link's per-call floor lowers the floor to it: 2 us + 64 KiB / bw
    (2e-6, 65536, lambda D: 2e-6 + 65536 / D.h2d_bw),
    # the same latency on a copy the old floor would have bound: still latency + bytes / bw
    (2e-6, 4096, lambda D: 2e-6 + 4096 / D.h2d_bw),
    # above the floor the floor stays, and loses: latency + bytes / bw
    (50e-6, 65536, lambda D: 50e-6 + 65536 / D.h2d_bw),
    # zero latency: the floor is 0 too, pure bandwidth
    (0.0, 4096, lambda D: 4096 / D.h2d_bw),
])
def test_a_latency_option_on_either_side_of_the_per_call_floor(latency, nbytes, expected) -> None:
    link = link_with(DEFAULT_TRANSFER, latency_s=latency)
    assert link.latency_s == latency and link.per_copy_s == min(DEFAULT_TRANSFER.per_copy_s, latency)
    assert link.copy_time(nbytes, 10, "h2d") == pytest.approx(10 * expected(DEFAULT_TRANSFER), rel=1e-12)
    # bandwidths untouched by a latency option
    assert (link.h2d_bw, link.d2h_bw) == (DEFAULT_TRANSFER.h2d_bw, DEFAULT_TRANSFER.d2h_bw)


def test_the_latency_floor_of_the_default_link_hides_a_small_latency_option_only_if_not_lowered() -> None:
    """Without the floor being lowered, a 2 us latency on 64 KiB copies would cost the 13.3 us
    floor: the option's effect would be hidden. It is not."""
    D = DEFAULT_TRANSFER
    assert 2e-6 + 65536 / D.h2d_bw < D.per_copy_s
    assert link_with(D, latency_s=2e-6).copy_time(65536) < D.per_copy_s


@pytest.mark.parametrize("base", [DISK_LINK, REMOTE_LINK, DEFAULT_TRANSFER])
def test_a_bandwidth_option_sets_every_direction(base) -> None:
    link = link_with(base, bandwidth=2e9)
    assert (link.h2d_bw, link.d2h_bw, link.pageable_h2d_bw) == (2e9, 2e9, 2e9)
    assert (link.latency_s, link.per_copy_s) == (base.latency_s, base.per_copy_s)
    assert link.copy_time(10**9, 1, "d2h") == pytest.approx(max(base.per_copy_s, base.latency_s + 0.5))
    assert link.points == () and "bandwidth 2 GB/s" in link.source
    assert link_with(base) is base


def test_the_lower_tier_links_are_the_documented_numbers() -> None:
    # disk: 6.8 GB/s read, 5.6 GB/s write, 100 us per batch; remote 21.75 GB/s, 500 us
    assert DISK_LINK.copy_time(10**9, 1, "h2d") == pytest.approx(100e-6 + 1e9 / 6.8e9, rel=1e-12)
    assert DISK_LINK.copy_time(10**9, 1, "d2h") == pytest.approx(100e-6 + 1e9 / 5.6e9, rel=1e-12)
    assert REMOTE_LINK.copy_time(10**9, 1, "h2d") == pytest.approx(500e-6 + 1e9 / 21.75e9, rel=1e-12)
    assert REMOTE_LINK.copy_time(10**9, 1, "d2h") == pytest.approx(500e-6 + 1e9 / 21.75e9, rel=1e-12)


# ---- one run of the simulator, worked out block by block ------------------------------------
BLOCK = 512 * 131072                 # llama-3.1-8b at 512 tokens per block: 64 MiB per entry
ROUND = TransferModel(h2d_bw=BLOCK * 1e3, d2h_bw=BLOCK * 500.0, latency_s=0.0, per_copy_s=0.0,
                      pageable_h2d_bw=BLOCK * 1e3)     # 1 ms per block to the GPU, 2 ms back


@pytest.mark.parametrize("policy, written_blocks", [
    # write-through: A's 16 blocks, B's 16, C's one new block (its 14 loaded ones are not saved)
    ("write-through", 16 + 16 + 1),
    # offload-on-evict: A's 14 evicted for B; B's 14 for C's load, 1 more for C's own block
    ("offload-on-evict", 14 + 14 + 1),
])
def test_evict_then_reuse_far_from_clock_zero_by_hand(policy: str, written_blocks: int) -> None:
    """A (16 blocks), B (16 unrelated blocks), C = A + 1 block, 5e5 s apart (C arrives at 1e6 s)
    on an 18-block GPU: B takes the 2 free blocks and evicts A's 14 last blocks (tail first), so
    C finds A's first 2 blocks on the GPU (1024 tokens) and loads 14 (7168 tokens) from the CPU
    tier: 14 ms over a 1 ms/block link, in the step before C computes; C's forward C_s then
    waits layer by layer: TTFT = max(C_s, 14e-3 + C_s/32, 14e-3/32 + C_s). Offload-on-evict:
    the load step copies B's 14 evicted blocks out on [T, T+28 ms] (2 ms each; that step computes
    nothing, so nothing waits), and C's step evicts one more for its own block, queued behind
    them on [T+28 ms, T+30 ms]: C waits for it, TTFT = 28e-3 + 2e-3/32 + C_s."""
    from tests.sim.test_tiers import _blocks, _evict_then_reuse
    from hybridkv.sim.tiers.report import tier_summary
    preset = get_preset("llama-3.1-8b").with_block_size(512)
    items = _evict_then_reuse(preset, 8192, 512, gap_s=5e5)
    cfg = SimConfig(preset, H100, _blocks(preset, 9216), sched=SchedulerConfig(max_num_batched_tokens=16384),
                    tiers=TierConfig(cpu_cache_tokens=100_000, policy=policy, cpu_link=ROUND))
    assert cfg.num_blocks == 19                      # 18 and the null block
    sim = Simulator(cfg)
    res = sim.run(items)
    t = res.tiers
    assert (res.gpu_hit_tokens, t.hit_tokens, t.loaded_tokens) == (1024, {"cpu": 7168}, {"cpu": 7168})
    assert t.loaded_bytes == {"cpu": 14 * BLOCK} and t.written_bytes == {"cpu": written_blocks * BLOCK}
    assert (t.loads, t.loads_failed) == (1, 0)
    assert t.load_s_total == pytest.approx(14e-3, rel=1e-12)
    assert t.offload_s_total == pytest.approx(written_blocks * 2e-3, rel=1e-12)
    assert t.link_busy_s == pytest.approx({"h2d": 14e-3, "d2h": written_blocks * 2e-3}, rel=1e-12)
    C = sim.cost.step_time([(512, 8192)])
    ttft = max(C, 14e-3 + C / 32, 14e-3 / 32 + C)
    if policy == "offload-on-evict":
        ttft = max(ttft, 30e-3 + C / 32, 28e-3 + 2e-3 / 32 + C)
        assert ttft == 28e-3 + 2e-3 / 32 + C
    # what the steps waited: write-through, C's 14e-3/32; offload-on-evict, B's step for A's
    # 14 evicted blocks (28e-3/32: B's forward C_B > 28 ms) and C's step (TTFT - C_s)
    wait = 14e-3 / 32 if policy == "write-through" else 28e-3 / 32 + (28e-3 + 2e-3 / 32)
    assert t.load_wait_s_total == pytest.approx(wait, abs=1e-9)
    assert res.ttft_s[-1] == pytest.approx(ttft, abs=1e-9)     # C's arrival is 1e6: ulp 1.2e-10
    prompt = 8192 + 8192 + 8704
    assert res.hit_tokens == 1024 + 7168 and res.prompt_tokens == prompt
    d = res.to_json()
    assert d["hit_rate_by_tier"] == pytest.approx({"gpu": 1024 / prompt, "cpu": 7168 / prompt}, rel=1e-12)
    # the optimum bounds GPU + tier: 100k tokens of CPU tier hold 195 whole 512-token blocks
    assert sim.tiers.key_capacity_blocks() == 100_000 // 512 == 195
    row = (f"  cpu          100k    {7168 / prompt:.4f}          7,168"
           f"{14 * BLOCK / 1e9:>11.1f}{written_blocks * BLOCK / 1e9:>12.1f}  67.1 GB/s, 0 us")
    lines = tier_summary(res).splitlines()
    assert row in lines
    assert (f"  transfers: loads 0.014 s (1 loads, 0 failed and recomputed), steps waited "
            f"{wait:.4g} s for it; writes {written_blocks * 2e-3:.4g} s") in lines


@pytest.mark.parametrize("preset_name, tokens, key_blocks", [
    ("llama-3.1-8b", 10**6, 10**6 // 16),
    # gemma-3-27b: 507,904 B per token over all groups, priced in full-attention blocks of
    # 16 tokens x 81,920 B = 1,310,720 B: 1e6 x 507904 / 1310720 = 387,500 key blocks
    ("gemma-3-27b", 10**6, 387_500),
])
def test_the_tiers_add_their_bytes_in_key_blocks_to_the_optimums_capacity(preset_name, tokens,
                                                                          key_blocks) -> None:
    preset = get_preset(preset_name)
    cfg = SimConfig(preset, H100, 2000, optimum=False)
    without = Simulator(cfg).optimum_capacity
    import dataclasses
    sim = Simulator(dataclasses.replace(cfg, tiers=TierConfig(disk_cache_tokens=tokens)))
    assert sim.tiers.key_capacity_blocks() == key_blocks
    assert sim.optimum_capacity == without + key_blocks


# ---- the command line's link options, on both sides of the per-call floor --------------------
@pytest.mark.parametrize("latency_us, per_block", [
    # no option: the default link's 13.33 us per-call floor binds (3.49 us + 4.76 us is less)
    (None, DEFAULT_TRANSFER.per_copy_s),
    # 2 us: below the floor, which comes down with it: 2 us + 256 KiB at 55.1 GB/s
    ("2", 2e-6 + 262144 / DEFAULT_TRANSFER.h2d_bw),
    # 50 us: above it
    ("50", 50e-6 + 262144 / DEFAULT_TRANSFER.h2d_bw),
])
def test_cpu_latency_option_on_both_sides_of_the_floor(latency_us, per_block, tmp_path, capsys) -> None:
    """`simulate --workload replay` (A: 8192 tokens, B: 8192 unrelated, A again) on llama-3.1-8b
    over 8 GPUs (a 2 MiB block is 256 KiB a GPU, latency-bound) with a 9000-token GPU pool
    (562 blocks): B takes the 50 free blocks and evicts 462 of A's (tail first); A's return
    finds 50 on the GPU and loads 461 (its last block is recomputed) from the CPU tier.
    Writes: A's 512, B's 512 and A2's recomputed last block."""
    import json
    from hybridkv.cli import main
    js = tmp_path / "r.json"
    argv = ["simulate", "--workload", "replay", "--no-progress", "--preset", "llama-3.1-8b",
            "--gpus", "8", "--cache-tokens", "9000", "--cpu-cache-tokens", "1M", "--no-baseline",
            "--no-optimum", "--json", str(js)]
    if latency_us is not None:
        argv += ["--cpu-latency-us", latency_us]
    assert main(argv) == 0
    capsys.readouterr()
    t = json.loads(js.read_text())["tiers"]
    block = 16 * 131072
    assert t["loaded_bytes"] == {"cpu": 461 * block} and t["written_bytes"] == {"cpu": 1025 * block}
    assert t["load_s_total"] == pytest.approx(461 * per_block, rel=1e-9)
    lat = DEFAULT_TRANSFER.latency_s if latency_us is None else float(latency_us) * 1e-6
    floor = DEFAULT_TRANSFER.per_copy_s if latency_us is None else min(DEFAULT_TRANSFER.per_copy_s, lat)
    d2h = max(floor, lat + 262144 / DEFAULT_TRANSFER.d2h_bw)
    assert t["offload_s_total"] == pytest.approx(1025 * d2h, rel=1e-9)


@pytest.mark.parametrize("seed, pool, gpu_tokens", [(0, 4000, 976), (1, 8000, 4304), (2, 8000, 752)])
def test_the_oracle_agrees_where_loads_copy_blocks_within_the_gpu(seed, pool, gpu_tokens) -> None:
    """gemma-3-27b, offload-on-evict, prompts past the 1024-token window: a load may name
    full-attention blocks the GPU still holds beside sliding blocks it lost (copied within the
    GPU, no transfer)."""
    rng = random.Random(400 + seed)
    tiers = TierConfig(cpu_cache_tokens=rng.choice([3000, 12000]), policy="offload-on-evict")
    _, res, oracle, _ = run_both(get_preset("gemma-3-27b"), pool, random_items(rng, 24, scale=8), tiers,
                                 max_batched=1024)
    assert oracle.gpu_tokens == gpu_tokens
