"""The KV-tier options of ``simulate`` and ``sweep`` -> a :class:`~hybridkv.sim.tiers.config.TierConfig`.

``--cpu-cache-tokens N`` / ``--disk-cache-tokens N`` / ``--remote-cache-tokens N`` add a tier
of N tokens (0: none), or ``--cpu-cache-gb G`` / ``--disk-cache-gb G`` one of G GB per GPU
(:func:`tier_tokens`); ``--tier-policy`` picks write-through (default) or offload-on-evict;
``--TIER-bandwidth GB/s`` and ``--TIER-latency-us US`` override a tier's link (the CPU tier's
is the host <-> GPU link every load takes); ``--free-transfers`` makes every move take no time
(the hierarchy's hit rate alone). ``sweep --cpu-cache-tokens-list 0,10M,30M,100M`` sweeps the
CPU tier's size at one GPU size (``--cache-tokens`` / ``--num-blocks``, default: what the GPUs
leave).

Each value is checked where it is parsed (a count >= 0, a bandwidth > 0, a latency >= 0); the
rules that involve the preset or other options (a tier its medium cannot address, an override
of a tier that is absent, tiers on a preset with recurrent-state groups) in
:func:`check_tier_options` and :func:`tier_config`, before the trace is read.
"""

from __future__ import annotations

import argparse
import math

from hybridkv.cli.options import non_negative_number, parse_count
from hybridkv.sim.tiers.config import DISK_LINK, FREE_LINK, REMOTE_LINK, TIER_NAMES, TierConfig, link_with
from hybridkv.cost.transfer import DEFAULT_TRANSFER
from hybridkv.tiers import TIER_POLICIES, WRITE_THROUGH

__all__ = ["GB_TIERS", "TIER_OPTION_NAMES", "add_tier_options", "check_tier_options", "has_tiers",
           "parse_count_list_with_zero", "tier_config", "tier_tokens"]

#: The TierConfig field names as options (library errors speak in options).
TIER_OPTION_NAMES = {f"{t}_cache_tokens": f"--{t}-cache-tokens" for t in TIER_NAMES}

_DEFAULT_LINKS = {"cpu": DEFAULT_TRANSFER, "disk": DISK_LINK, "remote": REMOTE_LINK}


def positive_bandwidth(text: str) -> float:
    """GB/s > 0 (``inf``: no transfer time) -> bytes/s."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a bandwidth: {text!r} (GB/s, e.g. 55)") from None
    if not value > 0:         # NaN too
        raise argparse.ArgumentTypeError(f"a tier needs a bandwidth > 0 GB/s (inf: free), got {text!r}")
    return value * 1e9


def latency_us(text: str) -> float:
    """Microseconds >= 0 -> seconds (below one second)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a latency: {text!r} (microseconds, e.g. 100)") from None
    if not (math.isfinite(value) and 0 <= value < 1e6):
        raise argparse.ArgumentTypeError(f"must be in [0, 1000000) microseconds, got {text!r}")
    return value * 1e-6


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r} (e.g. 2)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def share(text: str) -> float:
    """A number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (a share in [0, 1], e.g. 0.5)") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1], got {text!r}")
    return value


def parse_count_list_with_zero(text: str) -> list[int]:
    """``"0,10M,30M"`` -> sizes >= 0 (0: no tier); an empty item is named."""
    out = []
    for i, item in enumerate(text.split(","), 1):
        if not item.strip():
            raise argparse.ArgumentTypeError(f"item {i} of {text!r} is empty (example: 0,10M,30M,100M)")
        try:
            out.append(parse_count(item))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"item {i} of {text!r}: {exc}") from None
    return out


def add_tier_options(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """The tier options (``sweep``: plus ``--cpu-cache-tokens-list``; ``simulate``: plus
    ``--no-baseline``)."""
    g = p.add_argument_group(
        "KV tiers below the GPU",
        "a hit in a lower tier is loaded (PCIe, plus the tier's own link for disk and remote), "
        "overlapped layer by layer with compute; defaults: cpu = measured H100 PCIe (or the "
        "profile's transfer section), disk = one PCIe 4.0 NVMe drive, remote = Mooncake Store "
        "over one 200 Gb/s RDMA NIC (sources: hybridkv.sim.tiers.config)")
    if sweep:
        g.add_argument("--cpu-cache-tokens-list", type=parse_count_list_with_zero, metavar="N,N,...",
                       help="sweep the CPU tier's size (0: none), e.g. 0,10M,30M,100M, at the GPU "
                            "size --cache-tokens (default: what the GPUs leave); prints hit rate "
                            "and TTFT per size")
    for t in TIER_NAMES:
        g.add_argument(f"--{t}-cache-tokens", type=parse_count, metavar="N",
                       help=f"a {t} tier of N tokens of the model's KV (0: none)")
    for t in GB_TIERS:
        g.add_argument(f"--{t}-cache-gb", type=non_negative_number, metavar="GB",
                       help=f"the {t} tier as GB per GPU instead (x --gpus, divided by the model's "
                            f"KV bytes per token: whole tokens; 0: none)")
    g.add_argument("--tier-policy", choices=TIER_POLICIES,
                   help="write-through (default: every cached block is written to every tier, as "
                        "SGLang HiCache and hybridkv's connector), offload-on-evict (a block "
                        "moves down when evicted, as TensorRT-LLM's host cache) or lazy-offload "
                        "(written just before the GPU evicts it, copy kept on a load: LMCache's "
                        "eviction-aware lazy offload)")
    g.add_argument("--tier-admit-after", type=positive_int, metavar="N",
                   help="admission filter: write a block to the tiers only at its N-th sighting "
                        "(cached, or evicted, N times; default 1: every block)")
    g.add_argument("--tier-contention", type=share, metavar="F",
                   help="the share in [0, 1] of each host <-> GPU copy's time that the step it "
                        "overlaps loses (default 0: copies run beside compute; 1: serialized with "
                        "it); decoding requests pay it in ITL")
    for t in TIER_NAMES:
        g.add_argument(f"--{t}-bandwidth", type=positive_bandwidth, metavar="GB/s",
                       help=f"the {t} tier's link bandwidth, both ways (default "
                            f"{_DEFAULT_LINKS[t].h2d_bw / 1e9:.3g} GB/s toward the GPU)")
        link = _DEFAULT_LINKS[t]
        floor = f"; a call takes at least {link.per_copy_s * 1e6:.3g} us" if link.per_copy_s else ""
        g.add_argument(f"--{t}-latency-us", type=latency_us, metavar="US",
                       help=f"the {t} tier's latency per {'copy call' if t == 'cpu' else 'batch'} "
                            f"(default {link.latency_s * 1e6:.3g} us{floor})")
    g.add_argument("--free-transfers", action="store_true",
                   help="moves between tiers take no time (the hierarchy's hit rate alone)")
    if not sweep:
        g.add_argument("--no-baseline", action="store_true",
                       help="skip the run without tiers (or without --hints) that gives hit rate "
                            "and TTFT without them")


#: Tiers whose size may be given in GB per GPU (``--cpu-cache-gb``, ``--disk-cache-gb``): the
#: host memory and local drives scale with the GPUs of a node; a remote store does not.
GB_TIERS = ("cpu", "disk")


def _sized(args: argparse.Namespace, t: str) -> bool:
    return bool(getattr(args, f"{t}_cache_tokens", None) or getattr(args, f"{t}_cache_gb", None))


def tier_tokens(args: argparse.Namespace, preset, t: str) -> int:
    """Tier ``t``'s size in tokens: ``--T-cache-tokens``, or ``--T-cache-gb`` GB per GPU as
    ``floor(GB * 1e9 * gpus / KV bytes per token)`` (``gpus``: ``--gpus``, 1 before it is
    planned), 0 when neither is given."""
    gb = getattr(args, f"{t}_cache_gb", None)
    if gb:
        per_token = preset.kv_bytes_per_token()["total"]
        return int(gb * 1e9 * (getattr(args, "gpus", None) or 1) // per_token)
    return getattr(args, f"{t}_cache_tokens", None) or 0


def has_tiers(args: argparse.Namespace) -> bool:
    """Whether the options ask for any tier (a sweep's list counts)."""
    return bool(getattr(args, "cpu_cache_tokens_list", None)) or any(
        _sized(args, t) for t in TIER_NAMES)


def _given(args: argparse.Namespace, t: str) -> list[str]:
    out = []
    for what in ("bandwidth", "latency_us"):
        if getattr(args, f"{t}_{what}", None) is not None:
            out.append(f"--{t}-{what.replace('_', '-')}")
    return out


def check_tier_options(args: argparse.Namespace, preset) -> None:
    """The rules that involve several options or the preset (``ValueError``, one line)."""
    listed = getattr(args, "cpu_cache_tokens_list", None)
    if listed is not None and args.cpu_cache_tokens is not None:
        raise ValueError(f"--cpu-cache-tokens {args.cpu_cache_tokens} and --cpu-cache-tokens-list: "
                         "give one (the list sweeps the CPU tier's size)")
    for t in GB_TIERS:
        gb = getattr(args, f"{t}_cache_gb", None)
        if gb is not None and getattr(args, f"{t}_cache_tokens", None) is not None:
            raise ValueError(f"--{t}-cache-tokens {getattr(args, f'{t}_cache_tokens')} and "
                             f"--{t}-cache-gb {gb:g}: give one")
        if gb is not None and t == "cpu" and listed is not None:
            raise ValueError(f"--cpu-cache-gb {gb:g} and --cpu-cache-tokens-list: give one (the "
                             "list sweeps the CPU tier's size)")
    for t in TIER_NAMES:
        present = _sized(args, t) or (t == "cpu" and bool(listed))
        given = _given(args, t)
        if given and not present:
            gb = f" or --{t}-cache-gb G" if t in GB_TIERS else ""
            raise ValueError(f"{given[0]} has no effect without --{t}-cache-tokens N (N > 0){gb}")
        if given and args.free_transfers:
            raise ValueError(f"{given[0]} and --free-transfers: give one (free transfers take no time)")
    if not has_tiers(args):
        for option, value in (("--tier-policy", args.tier_policy),
                              ("--tier-admit-after", args.tier_admit_after),
                              ("--tier-contention", args.tier_contention),
                              ("--free-transfers", args.free_transfers or None)):
            if value is not None:
                raise ValueError(f"{option} has no effect without a tier (--cpu-cache-tokens, "
                                 "--disk-cache-tokens or --remote-cache-tokens)")
        return
    if preset.kv_config(num_blocks=2).has_state:
        raise ValueError(f"KV tiers hold attention blocks only and {preset.name} has recurrent-state "
                         "groups (the core keeps no checkpoint in a tier); drop the tier options")
    for size in listed or [None]:
        tier_config(args, preset, cpu_tokens=size)          # sizes its media can address


def tier_config(args: argparse.Namespace, preset, cpu_tokens: int | None = None) -> TierConfig | None:
    """The TierConfig of the options (``cpu_tokens`` overrides ``--cpu-cache-tokens``); None
    without tiers. Refuses a tier its medium cannot address."""
    sizes = {t: tier_tokens(args, preset, t) for t in TIER_NAMES}
    if cpu_tokens is not None:
        sizes["cpu"] = cpu_tokens
    if not any(sizes.values()):
        return None
    links: dict = {}
    for t in TIER_NAMES:
        if getattr(args, "free_transfers", False):
            links[f"{t}_link"] = FREE_LINK
            continue
        bw, lat = getattr(args, f"{t}_bandwidth", None), getattr(args, f"{t}_latency_us", None)
        if t == "cpu" and bw is None and lat is None:
            links["cpu_link"] = None          # the profile's transfer section, else the default
        else:
            base = getattr(args, "profile", None)
            base = getattr(base, "transfer", None) if t == "cpu" else None
            links[f"{t}_link"] = link_with(base or _DEFAULT_LINKS[t], bw, lat)
    cfg = TierConfig(cpu_cache_tokens=sizes["cpu"], disk_cache_tokens=sizes["disk"],
                     remote_cache_tokens=sizes["remote"],
                     policy=getattr(args, "tier_policy", None) or WRITE_THROUGH,
                     admit_after=getattr(args, "tier_admit_after", None) or 1,
                     contention=getattr(args, "tier_contention", None) or 0.0,
                     **links)
    cfg.check(preset.kv_bytes_per_token()["total"], preset.name)
    return cfg
