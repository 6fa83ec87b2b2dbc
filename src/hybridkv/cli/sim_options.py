"""The options ``simulate`` and ``sweep`` share, and how they become a workload and a
:class:`~hybridkv.sim.simulator.SimConfig`.

The hardware and cache-size options (``--gpu``, ``--gpus``, ``--gpu-memory-fraction``,
``--cache-tokens``, ``--num-blocks``) and how they give the pool size are
:mod:`hybridkv.cli.capacity`'s.

Every option is validated where it is parsed (:mod:`hybridkv.cli.options`: one argparse type per
kind of value, each naming the bad value and the valid range) or, for rules that involve
several options, in :func:`check_options` before anything runs. Errors are ``ValueError`` (a
usage error: exit status 2).
"""

from __future__ import annotations

import argparse
import sys

from hybridkv.cli.options import (MAX_BLOCK_SIZE, AllPolicies, fraction, int_in, name_options,
                                  parse_block_size, parse_policy, parse_prefix_retention, parse_retention,
                                  positive_count, positive_number, profile_argument, spec_argument)
from hybridkv.cli.capacity import add_hardware_options, capacity_blocks, plan_from_options
from hybridkv.cli.hint_options import check_hint_options
from hybridkv.cli.output import check_output_path, check_plot_path
from hybridkv.cli.tier_options import TIER_OPTION_NAMES, check_tier_options, tier_config
from hybridkv.core.spec_decode import SPEC_OFF, SpecDecode
from hybridkv.core.specs import is_state
from hybridkv.sched import SchedulerConfig
from hybridkv.cost.presets import MODEL_PRESETS, get_preset
from hybridkv.sim.simulator import SimConfig
from hybridkv.sim.traffic.traces import (BUNDLED_TRACES, TraceWarning, load_token_trace,
                                 mooncake_block_warning, resolve_trace, trace_format)
from hybridkv.sim.traffic.workloads import WORKLOADS, get_workload, workload_keys
from hybridkv.sim.traffic.workitems import (WorkItem, first_seconds, items_from_mooncake,
                                           items_from_trace, scale_rate)

DEFAULT_PRESET = "deepseek-v4-style"
DEFAULT_WORKLOAD = "chat"
DEFAULT_ACCEPTANCE_RATE = 0.7

#: The simulator's config field names as ``simulate`` / ``sweep`` options, for the errors of the
#: layers below (:func:`hybridkv.cli.options.name_options`).
OPTION_NAMES = {"num_blocks": "--num-blocks or --cache-tokens", "block_size": "--block-size",
                "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
                "max_num_seqs": "--max-num-seqs", "retention_interval": "--retention-interval",
                "vllm_compat": "--vllm-compat", "eviction_policy": "--eviction-policy",
                **TIER_OPTION_NAMES}


def add_common_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``simulate`` and ``sweep``."""
    from hybridkv.core.eviction import POLICIES, RECOMMENDED, RECOMMENDED_HYBRID
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"model preset (default {DEFAULT_PRESET}; see `hybridkv presets`)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", help=f"built-in workload: {', '.join(WORKLOADS)} (default {DEFAULT_WORKLOAD})")
    p.add_argument("--workload-param", type=parse_workload_param, action="append", metavar="KEY=VALUE",
                   help="a parameter of the built-in workload (repeat for more), e.g. "
                        "--workload agentic --workload-param num_agents=64 --workload-param "
                        "tool_tokens=512-4096 (N-M: a range drawn uniformly; none: None); an "
                        "unknown key lists the workload's")
    src.add_argument("--trace", help="a bundled trace (" + ", ".join(BUNDLED_TRACES) + "; see "
                     "`hybridkv traces`) or a JSONL file (.gz/.xz too): Mooncake format (hash_ids) "
                     "or token ids (prompt_token_ids)")
    p.add_argument("--limit", type=positive_count, help="use only the first N requests of the trace")
    p.add_argument("--duration", type=positive_number, metavar="SECONDS",
                   help="use only the requests arriving within SECONDS of the first (after --limit)")
    p.add_argument("--rate-scale", type=positive_number, default=1.0, metavar="X",
                   help="offer the workload X times as fast: arrival times (from the first) "
                        "divided by X (default 1; 2: twice the requests per second)")
    add_hardware_options(p)
    add_cost_model_options(p)
    p.add_argument("--block-size", type=parse_block_size,
                   help=f"tokens per block of the main group, a power of two in [1, {MAX_BLOCK_SIZE}] "
                        "(preset default otherwise)")
    p.add_argument("--retention-interval", type=parse_retention, default=0,
                   help="where later hits may end: none (every block), 0 (where requests ended: "
                        "replay boundaries; default) or N (every N tokens too); sliding-window "
                        "groups keep a window before each, recurrent-state groups write a "
                        "checkpoint at each (the checkpoint interval)")
    p.add_argument("--spec", type=spec_argument,
                   help="speculative decoding METHOD:K, e.g. eagle:3 (default: the preset's, "
                        "e.g. mtp:1 for deepseek-v4-style); none turns it off")
    p.add_argument("--drafter-group", choices=("own", "shared"), default=None,
                   help="with --spec eagle3:K, where the preset's EAGLE-3 drafter layer keeps its "
                        "KV: own (default, a group of its own, as vLLM groups it) or shared (in "
                        "the target group with its spec: no block ids of its own)")
    p.add_argument("--acceptance-rate", type=fraction(lo_open=False),
                   help=f"per-draft acceptance probability in [0, 1] of the seeded acceptance model "
                        f"(default {DEFAULT_ACCEPTANCE_RATE}); needs speculative decoding")
    p.add_argument("--max-num-batched-tokens", type=int_in(1), default=8192,
                   help="token budget per engine step (default 8192)")
    p.add_argument("--max-num-seqs", type=int_in(1), default=256,
                   help="requests running at once (default 256)")
    p.add_argument("--max-model-len", type=int_in(2),
                   help="tokens per request (prompt + output); a request whose prompt reaches it is "
                        "rejected and counted, the others' outputs are cut to fit")
    p.add_argument("--sequential", action="store_true", help="one request at a time, no timing")
    p.add_argument("--vllm-compat", action="store_true", help="run the manager in vLLM-0.33-compatible mode")
    p.add_argument("--checkpoint-marks", action="store_true",
                   help="serve the checkpoint positions the workload marks (the system-prompt "
                        "workload marks its system prompt's end; a token trace's \"checkpoints\"): "
                        "promised hit ends, where recurrent-state groups write a checkpoint; with "
                        "sweep --retention-intervals on a state preset, one more row (N=0 + marks) "
                        "beside intervals without them")
    p.add_argument("--no-optimum", action="store_true", help="skip the offline (Belady) bound")
    p.add_argument("--seed", type=int_in(0), default=0, help="seed of generators and the acceptance model (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--eviction-policy", type=parse_policy, default="lru", metavar="NAME",
                   help=f"order cached free blocks are reused in: {', '.join(POLICIES)} "
                        f"(default lru, vLLM's; recommended = {RECOMMENDED}, on hybrid "
                        f"models {RECOMMENDED_HYBRID})")
    p.add_argument("--prefix-retention", type=parse_prefix_retention, metavar="TOKENS:PRIORITY[:TTL_S]",
                   help="give every request's first TOKENS prompt tokens PRIORITY (0..100, default "
                        "35; lower is evicted first) for TTL_S simulated seconds after each use "
                        "(none: no expiry), e.g. 2048:100:600 pins a system prompt for 10 minutes; "
                        "needs --eviction-policy priority")


def add_cost_model_options(p: argparse.ArgumentParser) -> None:
    """``--profile`` and ``--cost-model`` (simulate, sweep, cost)."""
    from hybridkv.cost.profile import COST_MODELS
    p.add_argument("--profile", type=profile_argument, metavar="FILE",
                   help="step times from this profile (`hybridkv profile`): its fitted constants on "
                        "its device's peaks (default: the shipped H100 calibration; --gpu still "
                        "sizes memory)")
    p.add_argument("--cost-model", choices=COST_MODELS, default="calibrated",
                   help="calibrated (measured step times, default) or roofline (peak FLOP/s and "
                        "bandwidth at fixed efficiencies)")


def cost_source(cfg: SimConfig) -> str:
    """Where the step times of ``cfg`` come from, in words (printed under a run's header)."""
    from hybridkv.cost.profile import cost_model
    return cost_model(cfg.preset, cfg.gpu, cfg.num_gpus, cfg.profile, cfg.cost_model, cfg.deployment).source


def profile_warning(profile, preset) -> str | None:
    """The warning when ``--profile`` was measured on another model than ``preset`` (its
    constants are then applied to ``preset`` as they are), else None."""
    if profile is None:
        return None
    measured = profile.model["preset"]
    if measured == preset.name:
        return None
    return (f"--profile {profile.label!r} was measured on {measured}, not {preset.name}: its fitted "
            f"constants are applied to {preset.name} as they are (profile {preset.name} with "
            f"`hybridkv profile` for step times of its own)")


def check_cost_model_options(args: argparse.Namespace) -> None:
    if getattr(args, "profile", None) is not None and args.cost_model == "roofline":
        raise ValueError("--profile applies to the calibrated cost model; drop --cost-model roofline")


STATE_POLICY = "lru"


def _state_policies_why(preset) -> str:
    """Why only LRU runs on ``preset`` (it has recurrent-state groups): the eviction-policy
    contract (``hybridkv.core.eviction.base``) orders single blocks, and a checkpoint is an
    extent of many, evicted whole."""
    k = preset.kv_config(num_blocks=2)
    blocks = max(k.extent_blocks(i) for i in range(len(k.groups)))
    return (f"its checkpoints are extents of {blocks} blocks, evicted whole in LRU order (vLLM's); "
            "the other policies rank single blocks and are not defined on them")


def _reads_retention(name: str) -> bool:
    from hybridkv.core.eviction import make_policy
    policy = make_policy(name)
    return policy is not None and policy.uses_retention


def check_policy_options(args: argparse.Namespace) -> None:
    """The eviction-policy rules: the core's (a name, and vLLM-compatible mode), then that
    ``--prefix-retention`` needs a policy that reads retention."""
    from hybridkv.core.eviction import POLICIES, resolve_policy
    names = getattr(args, "eviction_policies", None) or [args.eviction_policy]
    for name in names:
        resolve_policy(name, args.vllm_compat)
    preset = get_preset(args.preset)
    if any(is_state(g.spec) for g in preset.groups):
        if isinstance(names, AllPolicies):         # all: the ones this preset runs
            args.eviction_policies = names = AllPolicies(n for n in names if n == STATE_POLICY)
            print(f"hybridkv {args.command}: --eviction-policies all on {preset.name} runs "
                  f"{STATE_POLICY} only: {_state_policies_why(preset)}", file=sys.stderr)
        bad = [n for n in names if resolve_policy(n) != STATE_POLICY]
        if bad:
            option = "--eviction-policies" if getattr(args, "eviction_policies", None) else "--eviction-policy"
            got = ", ".join(n if resolve_policy(n) == n else f"{n} (= {resolve_policy(n)})" for n in bad)
            raise ValueError(f"{option} {got}: {preset.name} has recurrent-state groups and "
                             f"{_state_policies_why(preset)}; use {option} {STATE_POLICY}")
    if getattr(args, "prefix_retention", None) is not None:
        readers = [n for n in POLICIES if resolve_policy(n) == n and _reads_retention(n)]
        if not all(_reads_retention(resolve_policy(n)) for n in names):
            raise ValueError(f"--prefix-retention needs --eviction-policy {' or '.join(readers)} "
                             f"(the only policy that reads retention); got {', '.join(names)}")


def parse_workload_param(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` (argparse type): VALUE an integer, a number, ``N-M`` (a ``(N, M)`` token
    range) or ``none``."""
    import re
    key, sep, value = str(text).partition("=")
    key, value = key.strip().replace("-", "_"), value.strip()
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r} (e.g. num_agents=64)")
    if value.lower() == "none":
        return key, None
    m = re.fullmatch(r"(\d+)-(\d+)", value)
    if m:
        return key, (int(m[1]), int(m[2]))
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"{key}: expected an integer, a number, N-M or none, got {value!r}")


def workload_params(name: str, params: list[tuple[str, object]] | None) -> dict:
    """``--workload-param`` pairs as keyword overrides of workload ``name``'s generator;
    ValueError naming an unknown key and the valid ones (``seed`` is ``--seed``'s)."""
    if not params:
        return {}
    if name not in WORKLOADS:
        return {}                                  # get_workload names the valid workloads
    valid = workload_keys(name)
    out: dict = {}
    for key, value in params:
        if key not in valid:
            where = "--seed sets it" if key == "seed" else f"valid: {', '.join(valid)}"
            raise ValueError(f"--workload-param {key}: workload {name!r} has no such parameter ({where})")
        out[key] = value
    return out


def check_options(args: argparse.Namespace) -> None:
    """Rules involving several options, checked before anything runs (``ValueError``)."""
    if getattr(args, "workload_param", None) and getattr(args, "trace", None) is not None:
        raise ValueError("--workload-param sets a built-in --workload's parameters; a --trace "
                         "has none")
    check_policy_options(args)
    check_hint_options(args)
    check_cost_model_options(args)
    check_tier_options(args, options_preset(args))
    if getattr(args, "num_blocks", None) is not None and args.num_blocks < 2:
        raise ValueError(f"--num-blocks must be >= 2, got {args.num_blocks}")
    group = getattr(args, "drafter_group", None)
    if group is not None:
        preset = get_preset(args.preset)
        if getattr(args.spec, "method", None) != "eagle3" or preset.eagle3_drafter is None:
            have = [n for n, make in MODEL_PRESETS.items() if make().eagle3_drafter is not None]
            raise ValueError(f"--drafter-group {group} places the EAGLE-3 drafter's KV: it needs "
                             f"--spec eagle3:K and a preset that records the drafter "
                             f"({', '.join(have)}); got --preset {args.preset} --spec "
                             f"{'the preset default' if args.spec is None else _spell(args.spec)}")
    check_output_path(getattr(args, "json", None), "--json", allow_stdout=True)
    check_plot_path(getattr(args, "plot", None), {"--json": getattr(args, "json", None)})
    if args.acceptance_rate is not None:
        preset = get_preset(args.preset)
        if args.spec == SPEC_OFF or (args.spec is None and preset.spec_decode is None):
            why = ("--spec none turns it off" if args.spec == SPEC_OFF
                   else f"{preset.name} has no default method")
            raise ValueError(f"--acceptance-rate {args.acceptance_rate} has no effect without "
                             f"speculative decoding ({why}); add --spec METHOD:K, e.g. eagle:3")


def check_spec_fits(cfg: SimConfig) -> None:
    """Refuse a speculative decoding whose lookahead slots alone cannot fit (before allocating)."""
    spec = cfg.spec
    if spec is None:
        return
    need = sum(-(-(spec.num_speculative_tokens + 1) // g.spec.block_size) for g in cfg.preset.groups)
    if need > cfg.num_blocks - 1:
        raise ValueError(
            f"--spec {spec.method}:{spec.num_speculative_tokens}: one request's lookahead needs "
            f"{need} blocks but the pool has {cfg.num_blocks - 1}; use fewer speculative tokens "
            "or a larger cache")
    max_len = cfg.max_model_len
    if max_len is not None and spec.num_speculative_tokens + 1 >= max_len:
        raise ValueError(
            f"--spec {spec.method}:{spec.num_speculative_tokens} needs more than "
            f"--max-model-len {max_len} tokens per request")


def warn(args: argparse.Namespace, message: str) -> None:
    """One warning line on stderr: ``hybridkv COMMAND: warning: message``."""
    print(f"hybridkv {getattr(args, 'command', None) or 'simulate'}: warning: {message}",
          file=sys.stderr)


def load_items(args: argparse.Namespace) -> list[WorkItem]:
    """The workload of the options: a trace file or a built-in generator. The loaders'
    :class:`~hybridkv.sim.traffic.traces.TraceWarning` s are printed as one warning line each."""
    import warnings
    limit = args.limit
    if args.trace is not None:
        path = resolve_trace(args.trace)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TraceWarning)
            if trace_format(path) == "mooncake":
                items = items_from_mooncake(str(path), limit)
                cut = mooncake_block_warning(options_preset(args).block_size)
                if cut:
                    warn(args, name_options(cut, OPTION_NAMES))
            else:
                items = items_from_trace(load_token_trace(path))
        for w in caught:
            if issubclass(w.category, TraceWarning):
                warn(args, str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    else:
        name = args.workload or DEFAULT_WORKLOAD
        items = items_from_trace(get_workload(name, seed=args.seed,
                                              **workload_params(name, getattr(args, "workload_param", None))))
    items = items[:limit] if limit is not None else items
    if getattr(args, "duration", None) is not None:
        items = first_seconds(items, args.duration)
    if not items:
        raise ValueError("the workload has no requests")
    return scale_rate(items, getattr(args, "rate_scale", 1.0))


def options_preset(args: argparse.Namespace):
    """The ``--preset`` with ``--weight-dtype`` and ``--block-size`` applied, and with ``--spec
    eagle3:K`` the drafter's KV group the preset records
    (:meth:`~hybridkv.cost.presets.ModelPreset.with_drafter`)."""
    preset = get_preset(args.preset).with_weight_dtype(getattr(args, "weight_dtype", None))
    preset = preset if args.block_size is None else preset.with_block_size(args.block_size)
    spec = getattr(args, "spec", None)
    return preset.with_drafter(getattr(spec, "method", None),
                               shared=getattr(args, "drafter_group", None) == "shared")


def _spell(spec) -> str:
    return "none" if spec == SPEC_OFF else f"{spec.method}:{spec.num_speculative_tokens}"


def build_config(args: argparse.Namespace, num_blocks: int | None = None,
                 retention: object = "args") -> SimConfig:
    """A :class:`SimConfig` from parsed options (``num_blocks``/``retention`` override them)."""
    preset = options_preset(args)
    gpu = args.gpu
    if args.gpus is None:
        plan_from_options(args, preset)
    if num_blocks is None:
        num_blocks = capacity_blocks(args, preset)
    spec = args.spec
    if spec is None and preset.spec_decode is not None:
        spec = SpecDecode(*preset.spec_decode)
    elif spec == SPEC_OFF:
        spec = None
    sched = SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                            max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    rate = args.acceptance_rate if args.acceptance_rate is not None else DEFAULT_ACCEPTANCE_RATE
    cfg = SimConfig(preset=preset, gpu=gpu, num_blocks=num_blocks,
                    retention_interval=args.retention_interval if retention == "args" else retention,
                    spec=spec, acceptance_rate=rate, sched=sched,
                    sequential=args.sequential, seed=args.seed, vllm_compat=args.vllm_compat,
                    max_model_len=args.max_model_len, optimum=not args.no_optimum,
                    num_gpus=args.gpus, eviction_policy=args.eviction_policy,
                    prefix_retention=args.prefix_retention, cost_model=args.cost_model,
                    profile=args.profile, tiers=tier_config(args, preset),
                    deployment=getattr(args, "deployment", None),
                    retention=pins if isinstance(pins := getattr(args, "pins", None), str) else None,
                    checkpoint_marks=bool(getattr(args, "checkpoint_marks", False)))
    check_spec_fits(cfg)
    return cfg
