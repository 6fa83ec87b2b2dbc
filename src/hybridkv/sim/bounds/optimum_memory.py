"""How much memory the offline optimum needs, known before the run.

The bounds (:class:`~hybridkv.sim.bounds.optimum_job.OptimumJob`) hold, per prompt block of every
request, its chained key hash (a Python bytes object) and the key stream's arrays
(:mod:`hybridkv.sim.bounds.key_stream`: its id and neighbours, a few int64 each), about
:data:`BYTES_PER_BLOCK` bytes per block. At a small block size a long trace needs GBs (the
whole Mooncake conversation trace at block 16: 9.1 million blocks, ~2.4 GB; its first 1,500
requests: 1.3 million blocks, ~340 MB, where the bounds added 312 MiB at peak), and a forked
child killed by the kernel's out-of-memory killer ends the run with
:class:`~hybridkv.sim.failures.ChildProcessDied`. ``simulate`` warns before the run when the
estimate is large (:func:`is_large`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hybridkv.core.rules import make_rule
from hybridkv.sim.traffic.workitems import WorkItem

__all__ = ["BYTES_PER_BLOCK", "OptimumMemory", "available_memory_bytes", "estimate", "is_large",
           "key_block_size"]

#: Bytes per prompt block, rounded up from measurements of the bounds over the Mooncake
#: conversation trace (242 to 252 B per block at block sizes 16 and 64, 300 to 4,000 requests:
#: the peak resident memory the bounds added, divided by the blocks;
#: ``benchmarks/bound_memory.py``).
BYTES_PER_BLOCK = 260


@dataclass(frozen=True, slots=True)
class OptimumMemory:
    """The estimate: ``blocks`` prompt blocks of ``block_size`` tokens, ``bytes`` in all."""

    blocks: int
    block_size: int
    bytes: int


def key_block_size(kv_config) -> int:
    """The block size of the optimum's keys (the simulator's ``key_block``): the largest block
    size of the full-attention-type groups, or the config's alignment when there are none."""
    full = [g.spec.block_size for g in kv_config.groups if make_rule(g.spec).downward_closed]
    return max(full) if full else kv_config.alignment


def estimate(items: Sequence[WorkItem], block_size: int) -> OptimumMemory:
    """The optimum's memory over ``items`` at ``block_size`` tokens per key block:

    ``bytes = BYTES_PER_BLOCK x sum over requests of ceil(prompt_len / block_size)``.

    An estimate of what the bound adds (a forked child's copies of pages it shares with the
    parent come on top); requests later rejected as too long are counted too.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size}")
    blocks = sum(-(-it.prompt_len // block_size) for it in items)
    return OptimumMemory(blocks, block_size, BYTES_PER_BLOCK * blocks)


def is_large(need: OptimumMemory, available: int | None) -> bool:
    """Whether the estimate deserves a warning: more than half the ``available`` bytes
    (strictly); never when ``available`` is unknown (None)."""
    return available is not None and 2 * need.bytes > available


def available_memory_bytes() -> int | None:
    """The memory available now (``MemAvailable`` of ``/proc/meminfo``, in bytes); None where
    it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
