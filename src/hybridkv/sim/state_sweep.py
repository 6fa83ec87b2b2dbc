"""Hit rate against checkpoint memory for a model with recurrent-state groups
(docs/state-groups.md): what ``hybridkv sweep --retention-intervals`` measures for such a
preset, with vLLM 0.33's "align" mode as the baseline in the same run.

For a state group the retention interval says where checkpoints are written (the promised
hit ends). Every configuration gets the same KV memory in bytes (``--cache-tokens`` of
attention KV):

* ``N`` in the list: hybridkv's default mode, checkpoint granularity = the preset's block size
  (16 tokens), a checkpoint every N tokens plus the replay boundaries and the shared-prefix
  junction (N = 0: only those); ``none``: one at every aligned end.
* the baseline: the preset with vLLM's forced block size (:func:`~hybridkv.cost.presets.
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

import dataclasses

from hybridkv.core.specs import is_state
from hybridkv.sim.simulator import SimConfig, Simulator
from hybridkv.sim.traffic.workitems import WorkItem


@dataclasses.dataclass(slots=True)
class CheckpointRow:
    """One configuration of the sweep (JSON keys = the field names)."""

    label: str
    retention_interval: int | None
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
    ttft_p50_s: float | None = None


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
    states = [i for i, g in enumerate(kv_cfg.groups) if is_state(g.spec)]
    written = [0]

    def stored(group: int, hashes: list, blocks: list) -> None:
        if group == states[0]:          # sibling state groups write the same positions
            written[0] += len(blocks)

    sim.kv.add_cached_listener(stored)
    res = sim.run(items)
    per_state = sum(kv_cfg.extent_blocks(i) for i in states) * kv_cfg.block_bytes
    return CheckpointRow(
        label=label, retention_interval=cfg.retention_interval, block_size=cfg.preset.block_size,
        vllm_compat=cfg.vllm_compat, token_hit_rate=res.hit_rate, hit_tokens=res.hit_tokens,
        prompt_tokens=res.prompt_tokens, checkpoints_written=written[0],
        checkpoint_bytes_written=written[0] * per_state,
        checkpoint_bytes_mean=sum(samples) / len(samples) if samples else 0.0,
        checkpoint_bytes_peak=max(samples, default=0), checkpoint_bytes_per_state=per_state,
        pool_bytes=(cfg.num_blocks - 1) * kv_cfg.block_bytes, evictions=res.evictions,
        preemptions=res.preemptions, wall_s=res.wall_s, ttft_p50_s=res.to_json()["ttft_p50_s"])


__all__ = ["CheckpointRow", "checkpoint_bytes", "run_checkpoint_config"]
