r"""How long one collective takes: all-reduce, all-gather and all-to-all over one kind of link.

A :class:`Link` holds the published measurements of one link kind and the model turns them into
a time for ``S`` bytes over a group of ``n`` GPUs (``n = 1``: no communication, 0 s)::

    all_reduce(S, n) = table_n(S)                                     S <= last table size
                     = table_n(S_last) + (S - S_last) * 2(n-1)/n / busbw     beyond it
    all_gather(S, n) = alpha + S * (n-1)/n / ring_bw        S: the gathered (output) bytes
    all_to_all(S, n) = alpha + S / a2a_bw(n)                S: the bytes one GPU sends, its
                                                            own share included (DeepEP's
                                                            "logical" bandwidth)

``table_n`` is an all-reduce latency table measured by message size (interpolated linearly
between its points; below its first size, its first time), for the nearest group size the table
has at or below ``n`` (a larger group pays at least what a smaller one does). Beyond the table,
the bytes run at the bus bandwidth ``busbw`` nccl-tests reports (its ``2(n-1)/n`` convention).
All-gather and all-to-all are one startup latency plus bytes over a bandwidth.

Every number below names its source. Where a number is derived (scaled from another GPU, or
combined from two sources) the derivation is stated beside it. Nothing here overlaps
communication with compute: vLLM and SGLang issue the tensor-parallel all-reduces on the
compute stream (no overlap), and the expert-parallel all-to-all overlaps only with SGLang's
opt-in two-batch overlap, which is not modelled.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

from hybridkv.core.validation import check_int

__all__ = ["LINKS", "Link", "all_gather_s", "all_reduce_s", "all_to_all_s", "get_link"]


@dataclass(frozen=True, slots=True)
class Link:
    """One link kind's collective constants (model: module docstring).

    Attributes:
        name: the link's name (``LINKS`` key).
        ar_table: ``{n: ((bytes, seconds), ...)}`` measured all-reduce times by group size,
            sizes increasing.
        busbw: all-reduce bus bandwidth (bytes/s) for messages beyond the table.
        ring_bw: bus bandwidth of the other collectives (all-gather), bytes/s.
        alpha_s: startup latency of an all-gather or all-to-all, seconds.
        a2a_bw: ``((max_group, dispatch bytes/s, combine bytes/s), ...)``: the all-to-all
            bandwidth for groups up to ``max_group`` GPUs (the last entry for any larger one).
        source: where the numbers come from.
    """

    name: str
    ar_table: Mapping[int, tuple[tuple[float, float], ...]]
    busbw: float
    ring_bw: float
    alpha_s: float
    a2a_bw: tuple[tuple[int, float, float], ...]
    source: str

    def __post_init__(self) -> None:
        if not self.ar_table or any(len(t) < 1 for t in self.ar_table.values()):
            raise ValueError(f"link {self.name!r} needs an all-reduce table")
        for value, what in ((self.busbw, "busbw"), (self.ring_bw, "ring_bw")):
            if not value > 0:
                raise ValueError(f"link {self.name!r}: {what} must be > 0, got {value!r}")
        if not self.alpha_s >= 0:
            raise ValueError(f"link {self.name!r}: alpha_s must be >= 0, got {self.alpha_s!r}")

    def table(self, n: int) -> tuple[tuple[float, float], ...]:
        """The all-reduce table of the largest measured group size <= ``n`` (else the smallest)."""
        sizes = sorted(self.ar_table)
        below = [k for k in sizes if k <= n]
        return self.ar_table[below[-1] if below else sizes[0]]

    def a2a(self, n: int) -> tuple[float, float]:
        """(dispatch, combine) bandwidth of an all-to-all over ``n`` GPUs."""
        for top, dispatch, combine in self.a2a_bw:
            if n <= top:
                return dispatch, combine
        return self.a2a_bw[-1][1], self.a2a_bw[-1][2]


US = 1e-6
GB = 1e9
MIB = 2**20

# SGLang pull request #2904 (github.com/sgl-project/sglang/pull/2904, "optimize custom allreduce
# kernel", January 2025): custom all-reduce latency on H100 without CUDA graph, by tensor-parallel
# size 2 / 4 / 8 and message size (bytes -> ms): 512: 0.0037/0.0048/0.0059, 4096:
# 0.0039/0.0037/0.0057, 32768: 0.0045/0.0048/0.0078, 262144: 0.0079/0.0139/0.0167, 524288:
# 0.0125/0.0202/0.0221, 1048576: 0.0199/0.0311/0.0338. The tables keep them (the 4096-byte TP-4
# point, below the 512-byte one, is raised to it so a table never falls with size).
_H100_AR = {
    2: ((512, 3.7 * US), (4096, 3.9 * US), (32768, 4.5 * US), (262144, 7.9 * US),
        (524288, 12.5 * US), (MIB, 19.9 * US)),
    4: ((512, 4.8 * US), (4096, 4.8 * US), (32768, 4.8 * US), (262144, 13.9 * US),
        (524288, 20.2 * US), (MIB, 31.1 * US)),
    8: ((512, 5.9 * US), (4096, 5.9 * US), (32768, 7.8 * US), (262144, 16.7 * US),
        (524288, 22.1 * US), (MIB, 33.8 * US)),
}

# NCCL issue #1244 (github.com/NVIDIA/nccl/issues/1244): all_reduce_perf over 2 nodes x 8 H20,
# one CX7 NDR (400 Gb/s) NIC per GPU, NCCL_ALGO=NVLSTree: 46.3-47.8 us for every size from 4 B to
# 512 B. That is the latency floor of a collective that crosses InfiniBand.
_IB_ALPHA = 46.3 * US
# nccl-tests issue #290 (github.com/NVIDIA/nccl-tests/issues/290), NVIDIA's answer: "For NDR @
# 400Gbps you should see 46-48GB/s per NIC". A ring over nodes with one NIC per GPU crosses the
# network on every GPU's NIC in parallel, so its bus bandwidth is the NICs of a node together
# (8 x 47 GB/s) or the NVLink ring bandwidth inside the node, whichever is lower (below).
_NIC_BW = 47 * GB
# nccl-tests issue #212 (github.com/NVIDIA/nccl-tests/issues/212), NVIDIA's answer: "With the
# protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" (H100 ring,
# non-all-reduce collectives) and "On 8 GPUs, you should reach a peak busBw of ~480GB/s" for
# all-reduce with NVLink SHARP.
_H100_RING = 370 * GB
# DeepEP (github.com/deepseek-ai/DeepEP), docs/legacy.md: normal kernels on H800 (NVLink ~160 GB/s
# maximum): intranode EP 8 dispatch 153 GB/s, combine 158 GB/s (FP8 dispatch, BF16 combine,
# 4096 tokens, hidden 7168, top-8). H100's NVLink is 450 GB/s per direction (NVIDIA H100
# datasheet: 900 GB/s bidirectional): scaled by 153/160 and 158/160 that is 430 / 444 GB/s.
_H100_A2A_NVLINK = (8, 450 * GB * 153 / 160, 450 * GB * 158 / 160)
# DeepEP README (V2, SM90 with CX7): "EP 8 x 2" dispatch 90 GB/s, combine 81 GB/s; "EP 8 x 4"
# 61 GB/s both (logical bandwidth, the local rank's traffic included). Beyond 32 GPUs, DeepEP's
# legacy low-latency table (docs/legacy.md, H800 + CX7): EP 64 43 / 46 GB/s, EP 128 and 256
# 39 GB/s.
_IB_A2A = ((16, 90 * GB, 81 * GB), (32, 61 * GB, 61 * GB), (64, 43 * GB, 46 * GB), (1 << 20, 39 * GB, 39 * GB))

# NVIDIA H800 SXM5: NVLink 400 GB/s bidirectional where H100 SXM5 has 900 GB/s (H100 datasheet;
# H800's figure as NVIDIA's H800 specification gives it, quoted in e.g. philisun.com "NVIDIA H800
# vs H100: a technical deep dive"); the derived H800 entry scales H100's bandwidths by it.
_H800_RATIO = 400 / 900

LINKS: dict[str, Link] = {
    # 8 x H100 SXM over NVSwitch: all-reduce small messages from the SGLang table; large ones at
    # nccl-tests' 476 GB/s busbw (nccl-tests issue #290: "476GB/s looks to be in the expected
    # range for H100", NVIDIA); all-gather at the 370 GB/s ring bandwidth (issue #212).
    "nvlink-h100": Link("nvlink-h100", _H100_AR, 476 * GB, _H100_RING, _H100_AR[8][0][1],
                        (_H100_A2A_NVLINK,),
                        "SGLang PR #2904 (all-reduce by size, H100); nccl-tests #290 (476 GB/s busbw), "
                        "#212 (370 GB/s ring); DeepEP legacy intranode 153/158 GB/s of 160, scaled to 450"),
    # 8 x H200 SXM: the same NVLink 4 and NVSwitch as H100 (NVIDIA H200 datasheet: 900 GB/s
    # NVLink); nccl-tests issue #272 (github.com/NVIDIA/nccl-tests/issues/272): 8 x H200
    # all_reduce_perf peak busbw 475 GB/s. The small-message table is H100's (same fabric).
    "nvlink-h200": Link("nvlink-h200", _H100_AR, 475 * GB, _H100_RING, _H100_AR[8][0][1],
                        (_H100_A2A_NVLINK,),
                        "H100's NVLink 4 tables (same fabric); nccl-tests #272 (475 GB/s busbw, 8 x H200)"),
    # 8 x H800 SXM: NVLink 4 cut to 400 GB/s bidirectional (_H800_RATIO; H100: 900). Derived from the H100 entry by the bandwidth ratio 400 / 900: all-reduce busbw
    # 476 -> 211.6 GB/s, ring 370 -> 164.4 GB/s (DeepEP's legacy table, measured on H800,
    # calls its NVLink "~160 GB/s maximum": the same figure). All-to-all: DeepEP's own H800
    # measurement, intranode EP 8 dispatch 153 GB/s, combine 158 GB/s (docs/legacy.md). The
    # small-message all-reduce table is H100's (latency-bound below 32 KiB; above it a lower
    # bound, as no H800 table was found).
    "nvlink-h800": Link("nvlink-h800", _H100_AR, 476 * GB * _H800_RATIO, _H100_RING * _H800_RATIO,
                        _H100_AR[8][0][1], ((8, 153 * GB, 158 * GB),),
                        "H100's NVLink 4 tables x 400/900 (H800 NVLink 400 GB/s): 211.6 GB/s busbw, "
                        "164.4 GB/s ring; DeepEP legacy intranode EP8 on H800 153/158 GB/s; "
                        "H100's small-message table"),
    # 8 x B200 (NVLink 5, 1.8 TB/s bidirectional): NCCL issue #1807
    # (github.com/NVIDIA/nccl/issues/1807): 8 x B200 all_reduce_perf "Ours is 830+" GB/s busbw.
    # DeepEP README (V2): SM100 EP 8 over NVLink dispatch 726 GB/s, combine 740 GB/s. No published
    # small-message table was found: H100's is used (an upper bound: NVLink 5 is not slower).
    # Ring bandwidth: H100's 370 GB/s scaled by the NVLink ratio 1800 / 900.
    "nvlink-b200": Link("nvlink-b200", _H100_AR, 830 * GB, 2 * _H100_RING, _H100_AR[8][0][1],
                        ((8, 726 * GB, 740 * GB),),
                        "NCCL #1807 (830 GB/s busbw, 8 x B200); DeepEP V2 SM100 EP8 726/740 GB/s; "
                        "H100's small-message table"),
    # Across nodes, one 400 Gb/s NDR NIC per GPU (DGX/HGX H100 and B200 reference designs): the
    # latency floor of NCCL #1244 at every size of the table, bandwidth as in the comments above.
    "ib-ndr": Link("ib-ndr", {2: ((1, _IB_ALPHA),)}, min(8 * _NIC_BW, _H100_RING),
                   min(8 * _NIC_BW, _H100_RING), _IB_ALPHA, _IB_A2A,
                   "NCCL #1244 (46.3 us, 2 x 8 GPUs over NDR); nccl-tests #290 (47 GB/s per NIC), "
                   "#212 (370 GB/s NVLink ring); DeepEP V2 EP 8x2 / 8x4 and legacy EP 64+"),
}
"""Link kinds by name (their sources in the comments and ``source``)."""

NVLINK_OF_GPU = {"h100": "nvlink-h100", "h800": "nvlink-h800", "h200": "nvlink-h200", "b200": "nvlink-b200"}
"""The NVLink kind inside a node of each GPU preset."""


def get_link(name: str) -> Link:
    """The link ``name``; ValueError listing the valid ones."""
    try:
        return LINKS[name]
    except KeyError:
        raise ValueError(f"unknown link {name!r}; valid: {', '.join(LINKS)}") from None


def _check(nbytes: float, n: int) -> None:
    check_int("collective group size", n, 1)
    if not nbytes >= 0:
        raise ValueError(f"collective message size must be >= 0 bytes, got {nbytes!r}")


def all_reduce_s(link: Link, nbytes: float, n: int) -> float:
    """Seconds an all-reduce of ``nbytes`` bytes over ``n`` GPUs takes on ``link`` (0 for n = 1
    or no bytes)."""
    _check(nbytes, n)
    if n == 1 or nbytes == 0:
        return 0.0
    table = link.table(n)
    sizes = [s for s, _ in table]
    if nbytes <= sizes[0]:
        return table[0][1]
    last_size, last_t = table[-1]
    if nbytes >= last_size:
        return last_t + (nbytes - last_size) * 2.0 * (n - 1) / n / link.busbw
    i = bisect.bisect_left(sizes, nbytes)
    (s0, t0), (s1, t1) = table[i - 1], table[i]
    return t0 + (t1 - t0) * (nbytes - s0) / (s1 - s0)


def all_gather_s(link: Link, nbytes: float, n: int) -> float:
    """Seconds an all-gather whose result is ``nbytes`` bytes on every GPU takes over ``n`` GPUs."""
    _check(nbytes, n)
    if n == 1 or nbytes == 0:
        return 0.0
    return link.alpha_s + nbytes * (n - 1) / n / link.ring_bw


def all_to_all_s(link: Link, dispatch_bytes: float, combine_bytes: float, n: int) -> float:
    """Seconds an expert-parallel dispatch of ``dispatch_bytes`` and combine of ``combine_bytes``
    (what one GPU sends in each, its own share included) take over ``n`` GPUs: two all-to-alls."""
    _check(dispatch_bytes, n)
    _check(combine_bytes, n)
    if n == 1 or dispatch_bytes + combine_bytes == 0:
        return 0.0
    bw_d, bw_c = link.a2a(n)
    return 2 * link.alpha_s + dispatch_bytes / bw_d + combine_bytes / bw_c
