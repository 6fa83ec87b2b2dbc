"""KV tiers below the GPU in the simulator: what they are (sizes, links, write policy).

A :class:`TierConfig` names up to three tiers, fastest first, each with a capacity in tokens of
the model's KV (all groups counted, as ``--cache-tokens`` counts the GPU pool) and a link:

========  ==============================================  =======================================
tier      link (a :class:`~hybridkv.cost.transfer.TransferModel`)   default and its source
========  ==============================================  =======================================
cpu       host memory <-> GPU over PCIe (loads from disk  :data:`~hybridkv.cost.transfer.DEFAULT_TRANSFER`
          and remote take this hop too)                   (measured on an H100 machine) or the
                                                          ``transfer`` section of a profile
disk      local NVMe <-> host memory                      :data:`DISK_LINK`
remote    a remote KV store (Mooncake Store) <-> host     :data:`REMOTE_LINK`
========  ==============================================  =======================================

A link's ``h2d_bw`` is the direction toward the GPU (a read from the tier), ``d2h_bw`` the
direction away from it (a write to the tier). What the tiers hold and how blocks move between
them is :class:`hybridkv.tiers.TierHierarchy`'s (the write policies ``write-through``,
``offload-on-evict`` and ``lazy-offload``, the ``admit_after`` admission filter); how long moving takes, and what of it a step waits for, is
:mod:`hybridkv.sim.tiers.runtime`'s.

Limits: a tier's bytes (tokens x the preset's KV bytes per token) must be addressable: host
memory at most 2^47 bytes (128 TiB, the user address space of x86-64 with 4-level paging), a
disk or remote store at most 2^63 - 1 bytes (a signed 64-bit file offset / object size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hybridkv.cost.transfer import TransferModel
from hybridkv.tiers import TIER_POLICIES, WRITE_THROUGH

__all__ = ["ADDRESSABLE_BYTES", "DISK_LINK", "FREE_LINK", "REMOTE_LINK", "TIER_NAMES", "TierConfig",
           "link_with"]

TIER_NAMES = ("cpu", "disk", "remote")
"""The tiers, fastest first."""

ADDRESSABLE_BYTES = {"cpu": 1 << 47, "disk": (1 << 63) - 1, "remote": (1 << 63) - 1}
"""The most bytes a tier can address (module docstring)."""

DISK_LINK = TransferModel(
    h2d_bw=6.8e9, d2h_bw=5.6e9, latency_s=100e-6, per_copy_s=0.0, pageable_h2d_bw=6.8e9,
    source="one PCIe 4.0 NVMe SSD: 6.8 GB/s sequential read, 5.6 GB/s write (Micron 7450 "
           "family, the vendor's launch figures); 100 us per load or write batch (the order of "
           "a TLC flash read; an assumption, not measured)")
"""The disk tier's link: one local NVMe drive (its ``source`` says where each number comes
from). A load's blocks are read as one batch: one latency, then bandwidth."""

REMOTE_LINK = TransferModel(
    h2d_bw=21.75e9, d2h_bw=21.75e9, latency_s=500e-6, per_copy_s=0.0, pageable_h2d_bw=21.75e9,
    source="Mooncake Store over one 200 Gb/s RDMA NIC: 21.75 GB/s, the per-NIC share of the "
           "87 GB/s Mooncake reports for 4 x 200 Gb/s; 500 us per batch for the store's "
           "metadata round trip (an assumption, not measured)")
"""The remote tier's link: a Mooncake Store reached over one RDMA NIC (its ``source`` says
where each number comes from)."""

FREE_LINK = TransferModel(h2d_bw=math.inf, d2h_bw=math.inf, latency_s=0.0, per_copy_s=0.0,
                          pageable_h2d_bw=math.inf, source="free transfers (no time)")
"""A link that takes no time: the hierarchy's hit rate alone (``--free-transfers``)."""


def link_with(base: TransferModel, bandwidth: float | None = None,
              latency_s: float | None = None) -> TransferModel:
    """``base`` with its bandwidth (both ways, bytes/s) and/or its latency (per copy call and
    per batch, seconds) replaced; the source says so."""
    if bandwidth is None and latency_s is None:
        return base
    changes: dict = {}
    notes = []
    if bandwidth is not None:
        changes.update(h2d_bw=bandwidth, d2h_bw=bandwidth, pageable_h2d_bw=bandwidth)
        notes.append(f"bandwidth {bandwidth / 1e9:g} GB/s")
    if latency_s is not None:
        changes.update(latency_s=latency_s, per_copy_s=min(base.per_copy_s, latency_s))
        notes.append(f"latency {latency_s * 1e6:g} us")
    return replace(base, **changes, source=f"{base.source}; given: {', '.join(notes)}", points=())


@dataclass(frozen=True, slots=True)
class TierConfig:
    """The tiers of one simulation (module docstring).

    Args:
        cpu_cache_tokens, disk_cache_tokens, remote_cache_tokens: each tier's capacity in
            tokens of the preset's KV (0: no such tier).
        policy: ``write-through``, ``offload-on-evict`` or ``lazy-offload``
            (:mod:`hybridkv.tiers.hierarchy`).
        admit_after: write a block only at its N-th sighting (the frequency admission filter,
            :class:`~hybridkv.tiers.admission.FrequencyAdmission`; 1: every block).
        contention: the share of each transfer's time that the engine step it overlaps loses
            to it (0: the copy engines run beside compute untouched, the default; 1: every copy
            serializes with compute, as a gather issued on the compute stream does). Charged by
            :mod:`hybridkv.sim.tiers.runtime` to the requests decoding in that step (their ITL).
        cpu_link: host memory <-> GPU; None: the profile's ``transfer`` section where the
            simulation has a profile, else :data:`~hybridkv.cost.transfer.DEFAULT_TRANSFER`.
        disk_link, remote_link: the other tiers' links to host memory.

    Raises:
        ValueError: a capacity that is not an integer >= 0, an unknown policy, an
            ``admit_after`` below 1, a ``contention`` outside [0, 1], a link that is not a
            TransferModel (a TransferModel itself refuses a bandwidth that is not > 0).
    """

    cpu_cache_tokens: int = 0
    disk_cache_tokens: int = 0
    remote_cache_tokens: int = 0
    policy: str = WRITE_THROUGH
    cpu_link: TransferModel | None = None
    disk_link: TransferModel = DISK_LINK
    remote_link: TransferModel = REMOTE_LINK
    admit_after: int = 1
    contention: float = 0.0

    def __post_init__(self) -> None:
        for name in TIER_NAMES:
            field_name = f"{name}_cache_tokens"
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field_name}={value!r} is not a size: the {name} tier's "
                                 "capacity must be a whole number of tokens >= 0 (0: no tier)")
        if self.policy not in TIER_POLICIES:
            raise ValueError(f"unknown tier policy {self.policy!r}; valid: {', '.join(TIER_POLICIES)}")
        a = self.admit_after
        if isinstance(a, bool) or not isinstance(a, int) or a < 1:
            raise ValueError(f"admit_after={a!r}: a block is admitted at its N-th sighting, N an "
                             "integer >= 1 (1: every block)")
        c = self.contention
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c <= 1.0:
            raise ValueError(f"contention={c!r} must be a share in [0, 1] of a transfer's time "
                             "that the step it overlaps loses")
        for name in TIER_NAMES:
            link = getattr(self, f"{name}_link")
            if not (link is None and name == "cpu") and not isinstance(link, TransferModel):
                raise ValueError(f"{name}_link must be a TransferModel (bandwidth and latency), "
                                 f"got {link!r}")

    @property
    def names(self) -> tuple[str, ...]:
        """The tiers present (capacity > 0), fastest first."""
        return tuple(n for n in TIER_NAMES if getattr(self, f"{n}_cache_tokens") > 0)

    def capacity_tokens(self, name: str) -> int:
        return getattr(self, f"{name}_cache_tokens")

    def check(self, bytes_per_token: int, preset_name: str = "the model") -> None:
        """Refuse a tier whose bytes its medium cannot address (:data:`ADDRESSABLE_BYTES`)."""
        for name in self.names:
            tokens = self.capacity_tokens(name)
            limit = ADDRESSABLE_BYTES[name]
            if tokens * bytes_per_token > limit:
                medium = "host memory" if name == "cpu" else f"a {name} store"
                raise ValueError(
                    f"{name}_cache_tokens={tokens} is larger than {medium} can address: "
                    f"{tokens:,} tokens x {bytes_per_token:,} B of {preset_name} KV per token "
                    f"= {tokens * bytes_per_token:.3g} B > {limit:.3g} B; give at most "
                    f"{limit // bytes_per_token:,} tokens")

    def link(self, name: str, default_cpu: TransferModel) -> TransferModel:
        """The link of tier ``name`` (the CPU tier's falls back to ``default_cpu``)."""
        link = getattr(self, f"{name}_link")
        return default_cpu if link is None else link

    def to_json(self, default_cpu: TransferModel) -> dict:
        """The configuration as JSON (links without their measured points)."""
        def link_json(model: TransferModel) -> dict:   # null bandwidth: unlimited (JSON has no inf)
            d = model.to_json()
            d.pop("points", None)
            return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                    for k, v in d.items()}
        return {"policy": self.policy, "admit_after": self.admit_after, "contention": self.contention,
                "tiers": {n: {"capacity_tokens": self.capacity_tokens(n),
                              "link": link_json(self.link(n, default_cpu))} for n in self.names},
                "cpu_link": link_json(self.link("cpu", default_cpu))}
