"""The simulator's tiers at run time: the scheduler's connector, what moves, and how long it takes.

:class:`TierRuntime` is to the simulator what :class:`~hybridkv.connectors.KVConnector` is to
the engine, over a :class:`~hybridkv.tiers.TierHierarchy` instead of stored bytes:

* scheduler side (:class:`~hybridkv.sched.scheduler.ExternalKV`): ``match`` asks the core's
  :meth:`~hybridkv.core.manager.KVCacheManager.lookup_external` with "some tier holds the
  block" (the connector's rule), so a hit from a lower tier obeys the same per-type rules as a
  local one (none for recurrent-state groups: the core keeps no checkpoint in a tier);
  ``take_saves`` drains the blocks the manager cached (write-through). Offload-on-evict listens
  to the pool's evictions instead, and since the GPU and the tiers then hold disjoint blocks,
  its ``match`` counts blocks the GPU still holds past the local hit too (copied within the
  GPU, no transfer time; :mod:`hybridkv.tiers.hierarchy`).
* worker side (:meth:`run_step`), in the engine's order: offload this step's evicted blocks,
  ``saves_before``, ``loads``, the forward pass, ``saves_after``.

Time (timed runs). Every copy is priced by a :class:`~hybridkv.cost.transfer.TransferModel`:
host memory <-> GPU as one copy call per block and group (the connector's unit); on ``G`` GPUs
(tensor parallelism splits every block's KV heads) each GPU copies its ``1/G`` share over its
own link at the same time, so a block costs one call of ``entry / G`` bytes; a disk or
remote tier as one batch per load or write (one latency, then bandwidth). Each PCIe direction
is a first-come-first-served queue, and so is each lower tier (reads and writes share it). A
load from a lower tier is staged: read into host memory, then copied to the GPU.

Overlap model: a load issued in step t runs while step t computes (the loading request
computes nothing in t); the first step that computes the request waits for it layer by layer,
as vLLM's ``wait_for_layer_load`` and HiCache's per-layer load stream do: with ``L`` layers,
compute ``C`` starting at ``start``, and the step's loads on the link from ``s`` to ``f``
(``D = f - s``), the forward ends at::

    max(start + C,  f + C / L,  s + D / L + C)

(layer i's compute waits for layer i's KV; the last layer computes after the last load; the
first layer's load comes before any compute). Offload-on-evict copies a step's evicted blocks
to host memory before that step's forward overwrites them, with the same formula on the
device-to-host queue. Lazy offload writes the same evicted blocks, but issued ahead of the
eviction (when the block neared the free queue's end, LMCache's danger depth), so no step waits
for them: they only occupy the device-to-host queue (the lead time is assumed long enough).
Write-through saves and writes to lower tiers wait for nothing and delay only later transfers
on their queues.

Contention (``TierConfig.contention``, default 0). A copy between host memory and the GPU also
costs the step it overlaps: ``contention`` x its seconds are added to the forward of the step
that issues it (a load, an evict offload, a ``saves_before`` save) or, for a ``saves_after``
save, of the next step (a step that computes nothing passes its share on to the next one that
does). The requests decoding in that step pay it in their inter-token latency
(``itl_p50_s`` / ``itl_p99_s``), as a host tier raised ITL p50 by 8.8 % on ROCm/ATOM#2268.
Lower-tier links (disk, remote) move nothing through the GPU and cost no step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.core.blockref import BlockRef
from hybridkv.core.coordinator import CacheHit, ExternalHit
from hybridkv.core.manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.core.rules import make_rule
from hybridkv.core.validation import check_int
from hybridkv.sched.scheduler import KVLoad, SchedulerOutput
from hybridkv.sim.tiers.config import TierConfig
from hybridkv.cost.transfer import TransferModel
from hybridkv.tiers import FROM_GPU, LAZY_OFFLOAD, WRITE_THROUGH, TierHierarchy

__all__ = ["TierGeometry", "TierReport", "TierRuntime", "entry_bytes"]


def entry_bytes(kv_config) -> list[int]:
    """Per group: the bytes of one block over all the group's layers (a tier's entry)."""
    return [g.spec.page_size_bytes * len(g.layer_names) for g in kv_config.groups]


@dataclass(frozen=True)
class TierGeometry:
    """The model and deployment shape a :class:`TierRuntime` sizes and times its tiers with.

    Attributes:
        bytes_per_token: >= 1: KV bytes of one token over all groups (a tier's tokens -> bytes).
        num_layers: >= 0: layers of the model (the overlap model's ``L``; 0 counts as 1).
        key_block: >= 1: the block size hits are counted in; tokens a load brings are credited
            to tiers by the full-attention group of this block size (else to the slowest tier
            used).
        block_bytes: per group, a tier entry's bytes (each >= 1); None: :func:`entry_bytes`.
        num_gpus: >= 1: GPUs sharing every block (each with its own host link; module docstring).
    """

    bytes_per_token: int
    num_layers: int
    key_block: int
    block_bytes: tuple[int, ...] | None = None
    num_gpus: int = 1

    def __post_init__(self) -> None:
        check_int("TierGeometry.bytes_per_token", self.bytes_per_token, 1)
        check_int("TierGeometry.num_layers", self.num_layers, 0)
        check_int("TierGeometry.key_block", self.key_block, 1)
        if self.block_bytes is not None:
            object.__setattr__(self, "block_bytes", tuple(self.block_bytes))
            for b in self.block_bytes:
                check_int("TierGeometry.block_bytes entry", b, 1)
        check_int("TierGeometry.num_gpus", self.num_gpus, 1)


class _Queue:
    """One link direction: transfers run one after another, in the order they are issued."""

    __slots__ = ("free_at", "busy_s")

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy_s = 0.0

    def run(self, t: float, seconds: float) -> tuple[float, float]:
        """A transfer of ``seconds`` issued at ``t``: its start and end."""
        start = t if t > self.free_at else self.free_at
        self.free_at = start + seconds
        self.busy_s += seconds
        return start, self.free_at


@dataclass
class TierReport:
    """What the tiers did in one run (all per tier name, fastest first).

    Attributes:
        hit_tokens: prompt tokens each tier served at requests' first admission (the
            simulation's ``hit_rate`` counts them, beside the GPU's own hits).
        gpu_hit_tokens: prompt tokens of tier hits that the GPU still held (offload-on-evict:
            copied within the GPU), at first admission; the GPU's share of the hit rate.
        loaded_tokens, loaded_bytes: every successful load, re-admissions after preemption
            included.
        written_bytes: bytes written into each tier (saves, offloads, promotions).
        loads, loads_failed: loads issued and loads that found a block missing (recomputed).
        load_s_total: transfer time of all loads (lower-tier reads plus host -> GPU copies).
        load_wait_s_total: step time spent waiting for loads and evict offloads (timed runs;
            None in sequential runs).
        contention_s_total: step time added by copies overlapping the steps (``contention``).
        admission_refused: writes the admission filter refused (``admit_after``).
        offload_s_total: transfer time of all writes (GPU -> host, host -> lower tiers).
        link_busy_s: busy time of each queue (``h2d``, ``d2h``, and each lower tier).
        config: the :class:`TierConfig` as JSON.
    """

    names: tuple[str, ...]
    policy: str
    hit_tokens: dict[str, int] = field(default_factory=dict)
    loaded_tokens: dict[str, int] = field(default_factory=dict)
    loaded_bytes: dict[str, int] = field(default_factory=dict)
    written_bytes: dict[str, int] = field(default_factory=dict)
    loads: int = 0
    loads_failed: int = 0
    gpu_hit_tokens: int = 0
    load_s_total: float = 0.0
    load_wait_s_total: float | None = 0.0
    offload_s_total: float = 0.0
    link_busy_s: dict[str, float] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    contention_s_total: float = 0.0
    admission_refused: int = 0

    @classmethod
    def merge(cls, reports: list[TierReport]) -> TierReport:
        """The reports of several instances' tiers (same tiers) as one: every count and time
        summed per tier and queue (``load_wait_s_total`` None if any is)."""
        first = reports[0]
        out = cls(first.names, first.policy, config=dict(first.config))
        for name in ("hit_tokens", "loaded_tokens", "loaded_bytes", "written_bytes", "link_busy_s"):
            acc: dict = {}
            for r in reports:
                for k, v in getattr(r, name).items():
                    acc[k] = acc.get(k, 0) + v
            setattr(out, name, acc)
        for name in ("loads", "loads_failed", "gpu_hit_tokens", "load_s_total", "offload_s_total",
                     "contention_s_total", "admission_refused"):
            setattr(out, name, sum(getattr(r, name) for r in reports))
        waits = [r.load_wait_s_total for r in reports]
        out.load_wait_s_total = None if any(w is None for w in waits) else sum(waits)
        return out

    def to_json(self) -> dict:
        return {"policy": self.policy, "hit_tokens": dict(self.hit_tokens),
                "loaded_tokens": dict(self.loaded_tokens), "loaded_bytes": dict(self.loaded_bytes),
                "written_bytes": dict(self.written_bytes), "loads": self.loads,
                "loads_failed": self.loads_failed, "load_s_total": self.load_s_total,
                "load_wait_s_total": self.load_wait_s_total,
                "offload_s_total": self.offload_s_total, "link_busy_s": dict(self.link_busy_s),
                "contention_s_total": self.contention_s_total,
                "admission_refused": self.admission_refused,
                **self.config}


class TierRuntime:
    """The tiers of one simulation (module docstring).

    Args:
        kv: the simulation's manager (it subscribes to its cached blocks or its evictions).
        config: the tiers.
        geometry: bytes per token, layers, the key block size, entry bytes and GPUs
            (:class:`TierGeometry`).
        cpu_link: the host <-> GPU link where ``config.cpu_link`` is None.
    """

    def __init__(self, kv: KVCacheManager, config: TierConfig, geometry: TierGeometry,
                 cpu_link: TransferModel) -> None:
        if not config.names:
            raise ValueError("a TierRuntime needs at least one tier with capacity > 0")
        if kv.config.has_state:
            raise ValueError("KV tiers hold attention blocks only: the core keeps no "
                             "recurrent-state checkpoint in a tier; drop the tiers for a preset "
                             "with recurrent-state groups")
        self.kv = kv
        self.config = config
        self.names = config.names
        block_bytes, num_gpus, key_block = geometry.block_bytes, geometry.num_gpus, geometry.key_block
        bytes_per_token, num_layers = geometry.bytes_per_token, geometry.num_layers
        self.entry = list(block_bytes) if block_bytes is not None else entry_bytes(kv.config)
        self.gpu_share = [-(-e // num_gpus) for e in self.entry]     # one GPU's bytes of an entry
        self.capacity_bytes = [config.capacity_tokens(n) * bytes_per_token for n in self.names]
        self.hierarchy = TierHierarchy(self.capacity_bytes, self.entry, config.policy,
                                       config.admit_after)
        self._issued = 0.0                          # host <-> GPU copy seconds not yet charged
        self.cpu_link = config.link("cpu", cpu_link)
        self.links: list[TransferModel | None] = [None if n == "cpu" else config.link(n, cpu_link)
                                                  for n in self.names]
        self.layers = max(1, num_layers)
        groups = kv.config.groups
        self.key_group = next((g for g, grp in enumerate(groups)
                               if make_rule(grp.spec).downward_closed
                               and grp.spec.block_size == key_block), None)
        self.key_block = key_block
        self.h2d, self.d2h = _Queue(), _Queue()
        self.queues = [None if n == "cpu" else _Queue() for n in self.names]
        zero = {n: 0 for n in self.names}
        self.report = TierReport(self.names, config.policy, dict(zero), dict(zero), dict(zero),
                                 dict(zero), config=config.to_json(cpu_link))
        self._saves: list[BlockRef] = []
        self._evicted = [0] * len(groups)           # GPU blocks offloaded this step, per group
        self._evict_written = [0] * len(self.names)
        self._due: dict[object, tuple[float, float]] = {}
        self._tokens: dict[object, dict[str, int]] = {}
        if config.policy == WRITE_THROUGH:
            kv.add_cached_listener(self._on_cached)
            self._on_gpu = None
            self._contains = self.hierarchy.contains
        else:
            kv.add_evicted_listener(self._on_evicted)
            self._on_gpu = kv.holds_cached
            held, on_gpu = self.hierarchy.contains, kv.holds_cached
            self._contains = lambda g, h: held(g, h) or on_gpu(g, h)

    # ---- scheduler side -----------------------------------------------------------------------
    def match(self, request: Request, hit: CacheHit) -> ExternalHit | None:
        """How far the tiers extend ``hit`` (the core's rules)."""
        return self.kv.lookup_external(request, hit, self._contains)

    def take_saves(self) -> list[BlockRef]:
        out, self._saves = self._saves, []
        return out

    def _on_cached(self, group: int, hashes: list[bytes], blocks: list[int]) -> None:
        self._saves.extend(BlockRef(group, b, h) for h, b in zip(hashes, blocks))

    def _on_evicted(self, group: int, block_hash: bytes) -> None:
        written = self.hierarchy.offload(group, block_hash)
        if any(written):
            self._evicted[group] += 1
            acc = self._evict_written
            for i, w in enumerate(written):
                acc[i] += w

    # ---- worker side --------------------------------------------------------------------------
    def run_step(self, out: SchedulerOutput, start: float, compute_s: float,
                 timed: bool = True) -> tuple[float, dict[object, bool]]:
        """Apply one step's moves to the tiers and time them (module docstring). Returns when
        the step's forward ends and, per load, whether it committed."""
        waits: list[tuple[float, float]] = []
        if any(self._evicted):
            seconds = self._pcie(self._evicted, "d2h")
            s, f = self.d2h.run(start, seconds)
            self.report.offload_s_total += seconds
            if self.config.policy != LAZY_OFFLOAD:
                waits.append((s, f))
            self._write_lower(self._evict_written, f)
            self._evicted = [0] * len(self._evicted)
            self._evict_written = [0] * len(self.names)
        self._save(out.saves_before, start)
        loaded = {load.req.request_id: self._load(load, start) for load in out.loads}
        due = self._due
        if due:
            for r in out.requests:
                w = due.pop(r.request_id, None)
                if w is not None:
                    waits.append(w)
        end = start + compute_s
        if self._issued and compute_s > 0:        # a step that computes nothing pays nothing:
            extra = self.config.contention * self._issued    # the next one that computes does
            self._issued = 0.0
            end += extra
            self.report.contention_s_total += extra
        base = end
        if compute_s > 0:
            per_layer = compute_s / self.layers
            for s, f in waits:
                end = max(end, f + per_layer, s + (f - s) / self.layers + compute_s)
        if timed:
            self.report.load_wait_s_total += end - base
        else:
            self.report.load_wait_s_total = None
        self._save(out.saves_after, end)
        return end, loaded

    def credit(self, request_id: object, first_admission: bool) -> dict[str, int]:
        """Tokens per tier the request's load of this step brought; a first admission's count
        as hits of those tiers (a re-admission after preemption is not counted again)."""
        got = self._tokens.pop(request_id, {})
        if first_admission:
            for name, n in got.items():
                if name == "gpu":
                    self.report.gpu_hit_tokens += n
                else:
                    self.report.hit_tokens[name] += n
        return got

    def finish(self) -> TierReport:
        """The report, with the queues' busy time."""
        busy = {"h2d": self.h2d.busy_s, "d2h": self.d2h.busy_s}
        busy.update({n: q.busy_s for n, q in zip(self.names, self.queues) if q is not None})
        self.report.link_busy_s = busy
        self.report.admission_refused = self.hierarchy.admission.refused
        return self.report

    def key_capacity_blocks(self, only: str | None = None) -> int:
        """The tiers' capacity in key blocks (all their bytes in full-attention blocks): what
        the offline bound of the hierarchy adds to the GPU's share (``only``: that tier's)."""
        kv_config = self.kv.config
        per_key = sum(self.entry[g] * max(1, self.key_block // grp.spec.block_size)
                      for g, grp in enumerate(kv_config.groups) if make_rule(grp.spec).downward_closed)
        nbytes = sum(c for n, c in zip(self.names, self.capacity_bytes) if only in (None, n))
        return nbytes // per_key if per_key else 0

    def share_tier(self, name: str, other: TierRuntime) -> None:
        """Use ``other``'s tier ``name`` as this runtime's own (one store several instances
        read and write, as a Mooncake Store is; each keeps its own link and queue to it)."""
        i, j = self.names.index(name), other.names.index(name)
        self.hierarchy.tiers[i] = other.hierarchy.tiers[j]

    # ---- moves --------------------------------------------------------------------------------
    def _pcie(self, per_group: list[int], direction: str) -> float:
        """Host <-> GPU time of ``per_group[g]`` blocks of each group (one copy call each, every
        GPU copying its share in parallel)."""
        link = self.cpu_link
        share = self.gpu_share
        seconds = sum(link.copy_time(share[g], n, direction) for g, n in enumerate(per_group) if n)
        self._issued += seconds
        return seconds

    def _write_lower(self, written: list[int], t: float) -> None:
        """Count ``written[i]`` bytes into each tier; a disk or remote write runs on its queue
        from ``t`` (the bytes are in host memory then)."""
        rep = self.report
        for i, (name, nbytes) in enumerate(zip(self.names, written)):
            if not nbytes:
                continue
            rep.written_bytes[name] += nbytes
            link = self.links[i]
            if link is not None:
                seconds = link.copy_time(nbytes, 1, "d2h")
                self.queues[i].run(t, seconds)          # type: ignore[union-attr]
                rep.offload_s_total += seconds

    def _save(self, refs: list[BlockRef], t: float) -> None:
        if not refs:
            return
        keys = self.hierarchy.admit([(r.group, r.block_hash) for r in refs])
        if not keys:
            return
        written = self.hierarchy.save(keys, admitted=True)
        per_group = [0] * len(self.entry)
        for g, _ in keys:                          # a block the filter refuses is not copied
            per_group[g] += 1
        seconds = self._pcie(per_group, "d2h")
        _, f = self.d2h.run(t, seconds)
        self.report.offload_s_total += seconds
        self._write_lower(written, f)

    def _load(self, load: KVLoad, t: float) -> bool:
        refs = [(b.group, b.block_hash) for b in load.blocks]
        res = self.hierarchy.load(refs, self._on_gpu)
        rep = self.report
        rep.loads += 1
        if not res.ok:
            rep.loads_failed += 1
            return False
        names = self.names
        ngroups = len(self.entry)
        per_tier = [[0] * ngroups for _ in names]
        for (g, _), tier in zip(refs, res.served):
            if tier != FROM_GPU:
                per_tier[tier][g] += 1
        ready = t
        for i, counts in enumerate(per_tier):
            nbytes = sum(c * self.entry[g] for g, c in enumerate(counts))
            rep.loaded_bytes[names[i]] += nbytes
            link = self.links[i]
            if link is not None and nbytes:
                seconds = link.copy_time(nbytes, 1, "h2d")
                _, f = self.queues[i].run(t, seconds)    # type: ignore[union-attr]
                rep.load_s_total += seconds
                ready = max(ready, f)
        seconds = self._pcie([sum(col) for col in zip(*per_tier)], "h2d")
        s, f = self.h2d.run(ready, seconds)
        rep.load_s_total += seconds
        self._due[load.req.request_id] = (s, f)
        self._write_lower(res.written, f)
        self._credit(load.req.request_id, load.external, refs, res.served)
        return True

    def _credit(self, rid: object, ext: ExternalHit, refs: list, served: list[int]) -> None:
        """Tokens of ``ext`` per tier ("gpu" for blocks copied within the GPU): by the key
        group's blocks, else all to the slowest tier used."""
        names = (*self.names, "gpu")
        where = {i: n for i, n in enumerate(self.names)}
        where[FROM_GPU] = "gpu"
        total = ext.num_tokens - ext.local_tokens
        tokens = {n: 0 for n in names}
        if self.key_group is not None:
            kg, bs = self.key_group, self.key_block
            for (g, _), tier in zip(refs, served):
                if g == kg:
                    tokens[where[tier]] += bs
        rest = total - sum(tokens.values())
        if rest:
            tokens[where[max(served)]] += rest
        for n in self.names:
            self.report.loaded_tokens[n] += tokens[n]
        self._tokens[rid] = {n: v for n, v in tokens.items() if v}
