"""What one simulation runs: :class:`SimConfig` (model, GPU, cache, policy, hints, tiers,
deployment, ...) and :class:`PrefixRetention` (a shared system prompt pinned by priority).
The simulator (:mod:`hybridkv.sim.simulator`) takes the record whole."""

from __future__ import annotations

from dataclasses import dataclass, field


from hybridkv.core.hints import RETENTION_KINDS
from hybridkv.core.retention_config import RetentionConfig, TokenRange
from hybridkv.core.spec_decode import SpecDecode
from hybridkv.sched import SchedulerConfig
from hybridkv.cost.deployment import Deployment
from hybridkv.cost.presets import GpuPreset, ModelPreset
from hybridkv.cost.profile import Profile
from hybridkv.sim.tiers.config import TierConfig
from hybridkv.sim.traffic.hint_synthesis import HintSpec

__all__ = ["PrefixRetention", "SimConfig"]


@dataclass(frozen=True, slots=True)
class PrefixRetention:
    """Every request's first ``tokens`` prompt tokens get ``priority`` for ``ttl_s`` seconds
    after each release (None: no expiry): pins a workload's shared system prompt. The CLI
    spelling is ``TOKENS:PRIORITY[:TTL_S]`` (:meth:`parse`, :meth:`__str__`)."""

    tokens: int
    priority: int
    ttl_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"prefix retention tokens must be a positive integer, got {self.tokens!r}")
        TokenRange(0, self.tokens, self.priority, self.ttl_s)     # priority and TTL checks

    @classmethod
    def parse(cls, text: str) -> PrefixRetention:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"prefix retention must be TOKENS:PRIORITY[:TTL_S] (e.g. 2048:100:600), "
                             f"got {text!r}")
        try:
            tokens, priority = int(parts[0]), int(parts[1])
            ttl = float(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ValueError(f"prefix retention must be TOKENS:PRIORITY[:TTL_S] with integer tokens "
                             f"and priority and a number of seconds, got {text!r}") from None
        return cls(tokens, priority, ttl)

    def __str__(self) -> str:
        ttl = "" if self.ttl_s is None else f":{self.ttl_s:g}"
        return f"{self.tokens}:{self.priority}{ttl}"

    def config(self, prompt_len: int) -> RetentionConfig:
        """The request's retention config (the range is clipped to its prompt)."""
        return RetentionConfig((TokenRange(0, min(self.tokens, prompt_len), self.priority, self.ttl_s),))


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate.

    Args:
        preset: the model (KV groups and cost).
        gpu: the accelerator of the cost model.
        num_blocks: pool size in blocks (including the null block).
        retention_interval: where later hits may end (None: every block; 0: where requests
            ended; N: every N tokens too): sliding-window groups keep a window before each,
            recurrent-state groups write a checkpoint at each.
        spec: speculative decoding, or None.
        acceptance_rate: per-draft acceptance probability of the seeded acceptance model.
        sched: batching limits.
        sequential: one request at a time, no timing.
        seed: seeds the acceptance model.
        vllm_compat: run the manager in vLLM-0.33-compatible mode.
        max_model_len: per-request token cap (None: none).
        optimum: compute the offline (Belady) bound.
        timeline_points: at most this many samples of the timeline.
        num_gpus: GPUs of one instance (the cost model splits their work ideally; ``deployment``
            adds the communication).
        hash_algo, hash_seed: the manager's hashing (instances of a cluster share a seed, so
            an index built from their events matches a router's own hashes; published events
            use sha256, which a consumer can recompute). None: :data:`~hybridkv.sim.simulator.SIM_HASH_SEED`, the same
            in every process, so a run is reproducible (the hint layer and the policies'
            shadows sample blocks by hash; xxh3's own default seed is random per hasher).
        enable_events: record KV events (for a publisher or an index; see ``step_hooks``).
        parallel_optimum: compute a large workload's optimum in a forked child while the
            simulation runs (a second core); False computes it inline (sweep workers).
        eviction_policy: the manager's eviction policy (``hybridkv.core.eviction.POLICIES``).
        prefix_retention: give every request this retention config for its first tokens
            (needs ``eviction_policy="priority"``); TTLs run on the simulated clock (sequential
            mode: the requests' arrival times).
        cost_model: ``"calibrated"`` (measured step times; :func:`hybridkv.cost.profile.cost_model`)
            or ``"roofline"``.
        profile: a measured profile whose constants time the steps (None: the shipped default
            for ``gpu``).
        tiers: KV tiers below the GPU (:class:`~hybridkv.sim.tiers.config.TierConfig`), or None.
        hints: synthesise application hints from the workload's own future at this accuracy
            (:class:`~hybridkv.sim.traffic.hint_synthesis.HintSpec`); the manager then takes hints.
        trace_hints: serve the hints the workload's requests carry (``TraceRequest.hint``, a
            trace line's ``"hint"``); a workload with hints is refused without it (or ``hints``).
        deployment: how the model is laid out over GPUs (:class:`~hybridkv.cost.deployment.Deployment`:
            tensor, data and expert parallelism, priced with their communication); None: one
            engine over ``num_gpus``, no communication.
        retention: ``"hard"`` or ``"soft"``: every pin of the hints served is made that kind
            (:attr:`hybridkv.core.hints.Hint.soft`; the what-if of soft against hard retention
            on the same hints); None: as the hints say.
        drop_trace_hints: serve a workload whose requests carry hints without them (the
            baseline of a hint what-if) instead of refusing it.
        checkpoint_marks: give each request the checkpoint positions its workload marks
            (``TraceRequest.checkpoints``, a trace line's ``"checkpoints"``: promised hit ends,
            so state groups write a checkpoint there); False ignores them.
    """

    preset: ModelPreset
    gpu: GpuPreset
    num_blocks: int
    retention_interval: int | None = 0
    spec: SpecDecode | None = None
    acceptance_rate: float = 0.7
    sched: SchedulerConfig = field(default_factory=SchedulerConfig)
    sequential: bool = False
    seed: int = 0
    vllm_compat: bool = False
    max_model_len: int | None = None
    optimum: bool = True
    timeline_points: int = 2000
    num_gpus: int = 1
    hash_algo: str = "xxh3_128"
    hash_seed: str | None = None
    enable_events: bool = False
    parallel_optimum: bool = True
    eviction_policy: str = "lru"
    prefix_retention: PrefixRetention | None = None
    cost_model: str = "calibrated"
    profile: Profile | None = None
    tiers: TierConfig | None = None
    hints: HintSpec | None = None
    trace_hints: bool = False
    deployment: Deployment | None = None
    retention: str | None = None
    drop_trace_hints: bool = False
    checkpoint_marks: bool = False

    def __post_init__(self) -> None:
        if self.retention not in (None, *RETENTION_KINDS):
            raise ValueError(f"retention must be None or one of {', '.join(RETENTION_KINDS)}, "
                             f"got {self.retention!r}")

    @property
    def takes_hints(self) -> bool:
        """Whether the manager takes hints (synthesised or the trace's)."""
        return self.hints is not None or self.trace_hints

    @property
    def manager_hints(self) -> bool | str:
        """The manager's ``hints`` argument: ``"force"`` for synthesised hints spelled
        ``:force``, else :attr:`takes_hints`."""
        return "force" if self.hints is not None and self.hints.force else self.takes_hints

    @property
    def cache_tokens(self) -> int:
        """Tokens the pool holds (the null block excluded), at the preset's bytes per token."""
        k = self.preset.kv_config(num_blocks=self.num_blocks)
        return (self.num_blocks - 1) * k.block_bytes // self.preset.kv_bytes_per_token()["total"]
