"""Logical blocks of the block manager versus the kernel blocks of the attention backends.

The manager hands out *logical* blocks of ``L`` tokens per group. An attention backend may only
run on pages of certain sizes (a FlashAttention build on 16/32/64-token pages, an MLA kernel on
64-token pages, ...). When ``L`` is not a size every backend of the engine takes, the paged cache
is allocated in *kernel* blocks of ``K`` tokens, ``K`` dividing ``L``, and one logical block is
``L // K`` consecutive kernel blocks::

    logical block b (L = 64 tokens)             kernel blocks (K = 32 tokens)
    +--------------------------------+          +----------------+----------------+
    |             b                  |   --->   |     2b         |     2b + 1     |
    +--------------------------------+          +----------------+----------------+

    kernel ids of logical b = b * (L // K) ... b * (L // K) + L // K - 1

The connector moves whole logical blocks (their hashes are what the manager and the stores
know), but it addresses the cache tensors in kernel blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hybridkv.core.specs import KVCacheConfig
from hybridkv.core.validation import check_int

__all__ = ["KernelBlockMap", "choose_kernel_block_size", "plan_kernel_blocks"]


def _positive_sizes(backend: str, sizes: Iterable[int]) -> list[int]:
    out = sorted(set(sizes))
    if not out:
        raise ValueError(f"backend {backend!r} lists no supported kernel block sizes")
    for s in out:
        check_int(f"backend {backend!r}: a kernel block size", s, 1)
    return out


def choose_kernel_block_size(
    logical_block_size: int, backend_block_sizes: Mapping[str, Iterable[int]], group: str = ""
) -> int:
    """The largest kernel block size that every backend supports and that divides the logical one.

    Args:
        logical_block_size: tokens per block of the manager's group.
        backend_block_sizes: per attention backend (e.g. ``"target"``, ``"draft"``), the page
            sizes (tokens) it can run on.
        group: the group's name, only used in error messages.

    Raises:
        ValueError: no backends, an invalid size, or no common size divides the logical size
            (the message names the logical size and every backend's sizes).
    """
    where = f" of group {group!r}" if group else ""
    check_int(f"logical block size{where}", logical_block_size, 1)
    if not backend_block_sizes:
        raise ValueError("backend_block_sizes is empty; give at least one backend's sizes")
    per_backend = {name: _positive_sizes(name, sizes)
                   for name, sizes in backend_block_sizes.items()}
    common = set.intersection(*(set(s) for s in per_backend.values()))
    fitting = [s for s in common if logical_block_size % s == 0]
    if not fitting:
        listed = ", ".join(f"{name} supports {sizes}" for name, sizes in per_backend.items())
        raise ValueError(
            f"logical block size {logical_block_size}{where} is not a multiple of any kernel "
            f"block size that every backend supports ({listed}; common sizes: "
            f"{sorted(common) or 'none'}); choose a logical block size that one of the common "
            "sizes divides"
        )
    return max(fitting)


@dataclass(frozen=True, slots=True)
class KernelBlockMap:
    """How one group's logical blocks map onto kernel blocks.

    Attributes:
        logical_block_size: tokens per logical block (the manager's block size).
        kernel_block_size: tokens per kernel block; divides ``logical_block_size``.
    """

    logical_block_size: int
    kernel_block_size: int

    def __post_init__(self) -> None:
        for name in ("logical_block_size", "kernel_block_size"):
            check_int(f"KernelBlockMap.{name}", getattr(self, name), 1)
        if self.logical_block_size % self.kernel_block_size:
            raise ValueError(
                f"kernel block size {self.kernel_block_size} does not divide logical block size "
                f"{self.logical_block_size}"
            )

    @classmethod
    def identity(cls, block_size: int) -> KernelBlockMap:
        """Kernel blocks equal to the logical blocks."""
        return cls(block_size, block_size)

    @property
    def ratio(self) -> int:
        """Kernel blocks per logical block."""
        return self.logical_block_size // self.kernel_block_size

    def kernel_range(self, logical_id: int) -> range:
        """The kernel block ids of logical block ``logical_id``, in token order."""
        r = self.ratio
        return range(logical_id * r, logical_id * r + r)

    def kernel_ids(self, logical_ids: Iterable[int]) -> list[int]:
        """Kernel block ids of the given logical blocks, concatenated in order."""
        r = self.ratio
        if r == 1:
            return list(logical_ids)
        return [b * r + k for b in logical_ids for k in range(r)]

    def logical_id(self, kernel_id: int) -> int:
        """The logical block that holds kernel block ``kernel_id``."""
        return kernel_id // self.ratio

    def num_kernel_blocks(self, num_logical_blocks: int) -> int:
        """Kernel blocks a cache of ``num_logical_blocks`` logical blocks has."""
        return num_logical_blocks * self.ratio

    def kernel_block_table(self, table: Sequence[Sequence[int]]) -> list[list[int]]:
        """Expand each row of a logical block table into kernel block ids (for the kernels)."""
        return [self.kernel_ids(row) for row in table]


def plan_kernel_blocks(
    config: KVCacheConfig,
    backend_block_sizes: Mapping[str, Iterable[int]],
    group_backends: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, KernelBlockMap]:
    """A :class:`KernelBlockMap` per group of ``config``, checked once at start-up.

    Args:
        config: the KV-cache config (its groups' block sizes are the logical sizes).
        backend_block_sizes: per backend, the kernel block sizes it supports, e.g.
            ``{"target": [16, 32, 64], "draft": [16, 32]}``.
        group_backends: per group name, the backends that run its layers. Groups not listed
            (or all groups when None) must suit *every* backend, the safe choice when one
            block table is shared by the target model and the drafter.

    Raises:
        ValueError: a group's block size has no common kernel size (see
            :func:`choose_kernel_block_size`), or ``group_backends`` names an unknown group or
            backend.
    """
    sizes = {name: list(s) for name, s in backend_block_sizes.items()}
    names = {g.name for g in config.groups}
    assigned: dict[str, list[str]] = {}
    for group, backends in (group_backends or {}).items():
        if group not in names:
            raise ValueError(
                f"group_backends names unknown group {group!r}; groups: {sorted(names)}")
        backends = list(backends)
        unknown = [b for b in backends if b not in sizes]
        if unknown or not backends:
            raise ValueError(
                f"group {group!r} is assigned backends {backends}; known backends: {sorted(sizes)}"
            )
        assigned[group] = backends
    plan: dict[str, KernelBlockMap] = {}
    for g in config.groups:
        chosen = {b: sizes[b] for b in assigned.get(g.name, sizes)}
        k = choose_kernel_block_size(g.spec.block_size, chosen, g.name)
        plan[g.name] = KernelBlockMap(g.spec.block_size, k)
    return plan
