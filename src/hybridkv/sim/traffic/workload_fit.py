"""Whether a workload's longest request fits the pool on its own, checked before a run.

A request that cannot fit even alone stops a run (the scheduler raises once it meets it), so
``simulate`` looks first. The bound is one request at its final length (prompt + output, cut
by ``max_model_len``) with a whole prefill chunk of ``max_num_batched_tokens`` in flight: full
and MLA groups hold every token, local groups their window (or chunk) plus the chunk, plus the
lookahead slots of speculative decoding. It is each group's hit rule's ``max_blocks``, so it
errs high, by a few percent: on the default preset, conversation request 11 (87,571 tokens)
runs alone from 1,857 blocks (bisected) and the bound says 1,902; ``tests/test_bad_inputs.py``
checks that the bound suffices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from hybridkv.core.rules import make_rule
from hybridkv.sim.simulator import SimConfig
from hybridkv.sim.traffic.workitems import WorkItem


@dataclass(frozen=True, slots=True)
class Need:
    """The largest request of a workload and what it needs of the pool."""

    request_id: str
    tokens: int          # its final length (prompt + output, cut by max_model_len)
    blocks: int          # pool blocks it may hold at once, alone (the bound above)
    cache_tokens: int    # the same as a cache size in tokens of the preset
    chunk_blocks: int    # of those, what the prefill chunk adds (local-attention groups)
    bytes: int = 0       # ``blocks`` as pool memory


def largest_need(cfg: SimConfig, items: Sequence[WorkItem]) -> Need | None:
    """The request that needs the most blocks (None when every request is rejected)."""
    max_len = cfg.max_model_len
    longest: WorkItem | None = None
    length = 0
    for it in items:
        if max_len is not None and it.prompt_len >= max_len:
            continue                        # rejected, never allocated
        n = it.prompt_len + it.output_len
        if max_len is not None:
            n = min(n, max_len)
        if n > length:
            longest, length = it, n
    if longest is None:
        return None
    blocks = _blocks(cfg, length, cfg.sched.max_num_batched_tokens)
    per_token = cfg.preset.kv_bytes_per_token()["total"]
    block_bytes = cfg.preset.kv_config(num_blocks=cfg.num_blocks).block_bytes
    return Need(longest.request_id, length, blocks, -(-blocks * block_bytes // per_token),
                chunk_blocks=blocks - _blocks(cfg, length, 0), bytes=(blocks + 1) * block_bytes)


def _blocks(cfg: SimConfig, length: int, chunk: int) -> int:
    """Blocks one request of ``length`` tokens holds at most, with ``chunk`` tokens in flight."""
    config = cfg.preset.kv_config(num_blocks=cfg.num_blocks)
    hold = 0 if cfg.vllm_compat or cfg.retention_interval is None else config.alignment
    slots = cfg.spec.lookahead_slots if cfg.spec is not None else 0
    return sum(make_rule(g.spec).max_blocks(length + slots, hold + chunk) for g in config.groups)


def round_up(n: int) -> str:
    """``n`` rounded up to two significant digits, written as ``--cache-tokens`` takes it."""
    for unit, scale in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= scale:
            step = 10 ** max(len(str(n)) - 2, 0)
            up = -(-n // step) * step
            text = f"{up / scale:g}"
            return f"{text}{unit}"
    return str(n)


def check_fits(cfg: SimConfig, items: Sequence[WorkItem], default_capacity: bool,
               more: Callable[[Need], str] | None = None) -> str | None:
    """Refuse (``ValueError``) a default cache when the longest request cannot fit it alone,
    saying how to get a larger one (``more(need)``, default: the ``--cache-tokens`` to give);
    for a size the user chose, return a warning instead (the bound errs high, so the run goes
    ahead). None when it fits."""
    need = largest_need(cfg, items)
    usable = cfg.num_blocks - 1
    if need is None or need.blocks <= usable:
        return None
    what = (f"request {need.request_id!r} ({need.tokens:,} tokens with its output) needs up to "
            f"{need.blocks:,} blocks of {cfg.preset.name} alone")
    size = round_up(need.cache_tokens)
    if default_capacity:
        chunk = (f"; a smaller --max-num-batched-tokens helps too (its prefill chunk is "
                 f"{need.chunk_blocks:,} of those blocks)" if need.chunk_blocks else "")
        how = more(need) if more is not None else f"give --cache-tokens {size} or more"
        raise ValueError(
            f"the default cache ({cfg.cache_tokens:,} tokens, {usable:,} blocks) is too small for "
            f"this workload: {what}; {how}{chunk}, or drop long requests with --limit or "
            "--max-model-len")
    return (f"warning: {what} and the cache has {usable:,}; if the run stops on it, give "
            f"--cache-tokens {size} or more")


def context_warning(preset, items: Sequence[WorkItem], max_model_len: int | None) -> str | None:
    """A warning when the workload asks more of the model than its context allows, else None.

    With ``preset.context_len`` known (None: never a warning): ``max_model_len`` above it, or,
    without ``max_model_len``, prompts that reach it (``prompt_len >= context_len``, the rule
    a ``max_model_len`` would reject them by). The simulator still runs them (a real engine
    would refuse them); the message says how many, the longest, and the option that rejects
    them (``max_model_len``, named ``--max-model-len`` on the command line).
    """
    ctx = getattr(preset, "context_len", None)
    if ctx is None:
        return None
    if max_model_len is not None:
        if max_model_len > ctx:
            return (f"max_model_len={max_model_len} is beyond {preset.name}'s context of "
                    f"{ctx:,} tokens: the real model cannot run requests that long")
        return None
    over = [it.prompt_len for it in items if it.prompt_len >= ctx]
    if not over:
        return None
    return (f"{len(over):,} of {len(items):,} requests have prompts of at least {preset.name}'s "
            f"context of {ctx:,} tokens (the longest: {max(over):,}); the real model cannot run "
            f"them, the simulation does: max_model_len={ctx} rejects them")
