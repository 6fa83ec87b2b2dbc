"""``hybridkv sweep --checkpoint-intervals``: hit rate against checkpoint memory for a model
with recurrent-state groups (docs/state-groups.md), with vLLM 0.33's "align" mode as the
baseline in the same run. Kept out of :mod:`hybridkv.sim.commands` but for two hooks.

Every configuration gets the same KV memory in bytes (``--cache-tokens`` of attention KV):

* ``N`` in the list: hybridkv's default mode, checkpoint granularity = the preset's block size
  (16 tokens), a checkpoint every N tokens plus the replay boundaries and the shared-prefix
  junction (N = 0: only those); ``none``: one at every aligned end.
* the baseline: the preset with vLLM's forced block size (:func:`~hybridkv.sim.presets.
  vllm_align_block_size`, 1056 tokens for Qwen3-Next) for attention and state alike, in
  vLLM-compatible mode with retention 0 (checkpoints at replay boundaries and the junction,
  one state per attention page).

Checkpoint memory, two ways: *written* = every checkpoint the write path cached (exports and
final-length states), ``extent blocks x block bytes`` each, i.e. the copy traffic and the
memory the checkpoints claim; *resident* = the bytes of checkpoints the pool holds, sampled
after every step (cached checkpoints live in otherwise free memory and are evicted first-come
by LRU, so residency mostly shows how much free memory they fill).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from hybridkv.core.specs import StateSpec
from hybridkv.sim.presets import vllm_align_block_size
from hybridkv.sim.simulator import SimConfig, Simulator, WorkItem


@dataclasses.dataclass(slots=True)
class CheckpointRow:
    """One configuration of the sweep (JSON keys = the field names)."""

    label: str
    checkpoint_interval: int | None
    block_size: int
    vllm_compat: bool
    token_hit_rate: float
    hit_tokens: int
    prompt_tokens: int
    checkpoints_written: int
    checkpoint_bytes_written: int
    checkpoint_bytes_mean: float
    checkpoint_bytes_peak: int
    checkpoint_bytes_per_state: int
    pool_bytes: int
    evictions: int
    preemptions: int
    wall_s: float


def checkpoint_bytes(sim: Simulator) -> int:
    """Bytes of the checkpoints the simulator's pool holds now (hashed state extents)."""
    kv = sim.kv
    cfg = kv.config
    total = 0
    for g in kv.coordinator.state_groups:
        n = sum(1 if v.__class__ is int else len(v) for v in kv.pool.index[g].values())
        total += n * cfg.extent_blocks(g)
    return total * cfg.block_bytes


def run_checkpoint_config(label: str, cfg: SimConfig, items: list[WorkItem]) -> CheckpointRow:
    """Simulate ``cfg`` (timed) and measure hit rate and checkpoint memory."""
    sim = Simulator(cfg)
    samples: list[int] = []
    sim.step_hooks.append(lambda start, end, out: samples.append(checkpoint_bytes(sim)))
    kv_cfg = sim.kv.config
    states = [i for i, g in enumerate(kv_cfg.groups) if isinstance(g.spec, StateSpec)]
    written = [0]

    def stored(group: int, hashes: list, blocks: list) -> None:
        if group == states[0]:          # sibling state groups write the same positions
            written[0] += len(blocks)

    sim.kv.add_cached_listener(stored)
    res = sim.run(items)
    per_state = sum(kv_cfg.extent_blocks(i) for i in states) * kv_cfg.block_bytes
    return CheckpointRow(
        label=label, checkpoint_interval=cfg.retention_interval, block_size=cfg.preset.block_size,
        vllm_compat=cfg.vllm_compat, token_hit_rate=res.hit_rate, hit_tokens=res.hit_tokens,
        prompt_tokens=res.prompt_tokens, checkpoints_written=written[0],
        checkpoint_bytes_written=written[0] * per_state,
        checkpoint_bytes_mean=sum(samples) / len(samples) if samples else 0.0,
        checkpoint_bytes_peak=max(samples, default=0), checkpoint_bytes_per_state=per_state,
        pool_bytes=(cfg.num_blocks - 1) * kv_cfg.block_bytes, evictions=res.evictions,
        preemptions=res.preemptions, wall_s=res.wall_s)


def sweep_checkpoints(args: argparse.Namespace, items: list[WorkItem], build_config,
                      capacity_blocks, cache_tokens: int) -> int:
    """Run the sweep of ``args.checkpoint_intervals`` plus the vLLM baseline; print the table,
    write JSON if asked. ``build_config`` / ``capacity_blocks`` are commands.py's."""
    from hybridkv.sim.presets import get_preset
    if args.sequential:
        raise ValueError("--checkpoint-intervals samples checkpoint memory per timed step; "
                         "drop --sequential")
    if args.vllm_compat:
        raise ValueError("--checkpoint-intervals runs the vLLM-compatible baseline itself; "
                         "drop --vllm-compat")
    preset = get_preset(args.preset)
    if args.block_size is not None:
        preset = preset.with_block_size(args.block_size)
    if not any(isinstance(g.spec, StateSpec) for g in preset.groups):
        names = "qwen3-next-80b-a3b, nemotron-h-8b"
        raise ValueError(f"--checkpoint-intervals needs a preset with recurrent-state groups "
                         f"({names}); {preset.name!r} has none")
    args.no_optimum = True
    runs: list[tuple[str, SimConfig]] = []
    blocks = capacity_blocks(args, preset, cache_tokens)
    for n in args.checkpoint_intervals:
        runs.append((f"N={'every ' + str(preset.block_size) if n is None else n}",
                     build_config(args, num_blocks=blocks, retention=n)))
    align = vllm_align_block_size(preset)
    saved = args.block_size, args.vllm_compat
    args.block_size, args.vllm_compat = align, True
    try:
        base = build_config(args, num_blocks=capacity_blocks(args, preset.with_block_size(align),
                                                             cache_tokens), retention=0)
    finally:
        args.block_size, args.vllm_compat = saved
    runs.append((f"vLLM align (block {align})", base))
    print(f"{preset.name}: {len(items)} requests, {cache_tokens:,} tokens of attention KV "
          f"memory per configuration")
    head = (f"  {'configuration':<26} {'token hit rate':>14} {'checkpoints':>11} "
            f"{'GB written':>11} {'GB resident mean':>17} {'peak':>7} {'GB/state':>9} "
            f"{'evictions':>10}")
    print(head, flush=True)
    rows = []
    for label, cfg in runs:
        row = run_checkpoint_config(label, cfg, items)
        rows.append(dataclasses.asdict(row))
        print(f"  {label:<26} {row.token_hit_rate:>14.4f} {row.checkpoints_written:>11} "
              f"{row.checkpoint_bytes_written / 1e9:>11.1f} {row.checkpoint_bytes_mean / 1e9:>17.2f} "
              f"{row.checkpoint_bytes_peak / 1e9:>7.2f} {row.checkpoint_bytes_per_state / 1e9:>9.4f} "
              f"{row.evictions:>10}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def add_sweep_option(p: argparse.ArgumentParser, parse_list) -> None:
    p.add_argument("--checkpoint-intervals", type=parse_list, metavar="N,N,...",
                   help="state-group presets: sweep the checkpoint interval N (tokens; 0 = replay "
                        "boundaries and junction only, none = every block) against checkpoint "
                        "memory, with vLLM's forced-block 'align' mode as the baseline")


__all__ = ["CheckpointRow", "add_sweep_option", "checkpoint_bytes", "run_checkpoint_config",
           "sweep_checkpoints"]
