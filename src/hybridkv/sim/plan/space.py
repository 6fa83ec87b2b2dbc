"""What a plan searches: deployments, the options each runs with, and their order by cost.

A :class:`Candidate` is a :class:`Deployment` (which GPUs, how they are split) and the
:class:`Options` it runs with. It is exactly one ``hybridkv simulate`` command
(:meth:`Candidate.flags` after the workload's own options), so every number a plan reports
can be reproduced by running that command.

Deployments today are *replicas*: ``instances`` engine instances of ``gpus_per_instance`` GPUs
each (tensor parallelism inside an instance, its communication priced: ``simulate --tp``)
behind a router (``--dp``, ``--router``). ``kind`` names that split, so other deployment models
(tensor / data / expert parallel, prefill-decode disaggregation) become new kinds with their
own flags without changing the record's users.

The simulator serves KV tiers and hints on one instance only, so a candidate with a CPU tier
or hints has one instance, and a router only comes with several (:func:`candidates`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

#: The features a plan prices by searching again without them (:func:`feature_on`).
FEATURES = ("cpu-tier", "hints", "kv-routing")


@dataclass(frozen=True, slots=True)
class Deployment:
    """Which GPUs serve the traffic and how they are split (module docstring)."""

    gpu: str
    gpus_per_instance: int = 1
    instances: int = 1
    kind: str = "replicas"

    def __post_init__(self) -> None:
        if self.kind != "replicas":
            raise ValueError(f"unknown deployment kind {self.kind!r}; valid: replicas")
        for name in ("gpus_per_instance", "instances"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")

    @property
    def gpus(self) -> int:
        return self.gpus_per_instance * self.instances

    def flags(self) -> list[str]:
        return ["--gpu", self.gpu, "--tp", str(self.gpus_per_instance), "--dp", str(self.instances)]

    def label(self) -> str:
        """``4 x h100 (2x2)``: GPUs in all, then instances x GPUs per instance."""
        return f"{self.gpus} x {self.gpu} ({self.instances}x{self.gpus_per_instance})"

    def to_json(self) -> dict:
        return {"kind": self.kind, "gpu": self.gpu, "gpus_per_instance": self.gpus_per_instance,
                "instances": self.instances, "gpus": self.gpus}


@dataclass(frozen=True, slots=True)
class Options:
    """How a deployment runs: its cache share of GPU memory, a CPU tier (GB per GPU, 0: none),
    the eviction policy, synthesised hints (``simulate --hints`` text, None: none) and the
    router of a multi-instance deployment (None with one instance)."""

    memory_fraction: float = 0.9
    cpu_cache_gb: float = 0.0
    eviction_policy: str = "lru"
    hints: str | None = None
    router: str | None = None

    def flags(self) -> list[str]:
        out = ["--gpu-memory-fraction", f"{self.memory_fraction:g}"]
        if self.cpu_cache_gb:
            out += ["--cpu-cache-gb", f"{self.cpu_cache_gb:g}"]
        if self.eviction_policy != "lru":
            out += ["--eviction-policy", self.eviction_policy]
        if self.hints is not None:
            out += ["--hints", self.hints]
        if self.router is not None:
            out += ["--router", self.router]
        return out

    def label(self) -> str:
        """``mem 0.9, lru, cpu 200 GB, hints session-end, kv-aware``."""
        parts = [f"mem {self.memory_fraction:g}", self.eviction_policy]
        if self.cpu_cache_gb:
            parts.append(f"cpu {self.cpu_cache_gb:g} GB")
        if self.hints is not None:
            parts.append(f"hints {self.hints}")
        if self.router is not None:
            parts.append(self.router)
        return ", ".join(parts)

    def to_json(self) -> dict:
        return {"gpu_memory_fraction": self.memory_fraction, "cpu_cache_gb": self.cpu_cache_gb,
                "eviction_policy": self.eviction_policy, "hints": self.hints, "router": self.router}


@dataclass(frozen=True, slots=True)
class Candidate:
    """A deployment with its options: one ``simulate`` command (:meth:`flags`)."""

    deployment: Deployment
    options: Options = field(default_factory=Options)

    def flags(self, rate_scale: float = 1.0) -> list[str]:
        """The ``simulate`` options of this candidate (after the workload's own), without the
        offline optimum (a plan does not need it); ``--rate-scale`` when not 1."""
        out = self.deployment.flags() + self.options.flags() + ["--no-optimum"]
        return out + (["--rate-scale", f"{rate_scale:g}"] if rate_scale != 1 else [])

    def label(self) -> str:
        return f"{self.deployment.label()}: {self.options.label()}"


@dataclass(frozen=True, slots=True)
class Space:
    """The candidates a plan may pick from.

    Args:
        gpus: GPU kind -> GPUs per instance to try (each a count the weights fit).
        max_gpus: the most GPUs of one deployment.
        memory_fractions, cpu_cache_gb, eviction_policies, hints, routers: the option values
            (``cpu_cache_gb`` 0 and ``hints`` None mean none; a CPU tier and hints apply to one
            instance, routers to several).
        prices: USD per GPU-hour by GPU kind.
        kv_routers: the routers that score cached prefixes (KV-aware routing).
    """

    gpus: Mapping[str, Sequence[int]]
    max_gpus: int
    prices: Mapping[str, float]
    memory_fractions: Sequence[float] = (0.9,)
    cpu_cache_gb: Sequence[float] = (0.0,)
    eviction_policies: Sequence[str] = ("lru",)
    hints: Sequence[str | None] = (None,)
    routers: Sequence[str] = ("kv-aware",)
    kv_routers: frozenset[str] = frozenset({"kv-aware", "approximate"})

    def __post_init__(self) -> None:
        if not self.gpus:
            raise ValueError("a plan needs at least one GPU kind")
        for kind in self.gpus:
            if kind not in self.prices:
                raise ValueError(f"no GPU-hour price for {kind!r}; priced: "
                                 f"{', '.join(sorted(self.prices))}")
        if self.max_gpus < 1:
            raise ValueError(f"max GPUs must be >= 1, got {self.max_gpus}")

    def cost(self, c: Candidate) -> float:
        """USD per hour of ``c``'s GPUs: what orders candidates (at one window every
        candidate's bill and $/M tokens are this times one constant)."""
        return c.deployment.gpus * self.prices[c.deployment.gpu]

    def candidates(self) -> list[Candidate]:
        """Every candidate, cheapest first (ties: fewer instances, then the order the values
        were given in)."""
        out: list[Candidate] = []
        for kind, sizes in self.gpus.items():
            for per in sizes:
                for n in range(1, self.max_gpus // per + 1):
                    out.extend(Candidate(Deployment(kind, per, n), o) for o in self._options(n))
        order = {c: i for i, c in enumerate(out)}
        return sorted(out, key=lambda c: (round(self.cost(c), 9), c.deployment.instances, order[c]))

    def _options(self, instances: int) -> Iterator[Options]:
        single = instances == 1
        tiers = self.cpu_cache_gb if single else (0.0,)
        hints = self.hints if single else (None,)
        routers: Sequence[str | None] = (None,) if single else self.routers
        seen = set()
        for frac, tier, policy, hint, router in itertools.product(
                self.memory_fractions, tiers, self.eviction_policies, hints, routers):
            o = Options(frac, tier, policy, hint, router)
            if o not in seen:
                seen.add(o)
                yield o

    def levels(self, candidates: Sequence[Candidate]) -> list[list[Candidate]]:
        """``candidates`` (cheapest first) grouped by equal cost."""
        out: list[list[Candidate]] = []
        for _, group in itertools.groupby(candidates, key=lambda c: round(self.cost(c), 9)):
            out.append(list(group))
        return out

    def feature_on(self, feature: str, c: Candidate) -> bool:
        """Whether ``c`` uses ``feature`` (:data:`FEATURES`)."""
        if feature == "cpu-tier":
            return c.options.cpu_cache_gb > 0
        if feature == "hints":
            return c.options.hints is not None
        if feature == "kv-routing":
            return c.options.router in self.kv_routers
        raise ValueError(f"unknown feature {feature!r}; valid: {', '.join(FEATURES)}")

    def searches(self, feature: str) -> bool:
        """Whether the space holds ``feature`` both on and off, so a search without it measures
        what it saves: a CPU tier size 0 and one above, hints none and some, a KV-aware router
        and another one (with at least two instances allowed)."""
        if feature == "cpu-tier":
            return any(g > 0 for g in self.cpu_cache_gb) and 0 in self.cpu_cache_gb
        if feature == "hints":
            return any(h is not None for h in self.hints) and None in self.hints
        if feature == "kv-routing":
            multi = any(self.max_gpus // min(s) >= 2 for s in self.gpus.values() if s)
            kv = [r in self.kv_routers for r in self.routers]
            return multi and any(kv) and not all(kv)
        raise ValueError(f"unknown feature {feature!r}; valid: {', '.join(FEATURES)}")


__all__ = ["Candidate", "Deployment", "FEATURES", "Options", "Space"]
