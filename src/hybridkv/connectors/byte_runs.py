"""The byte runs of one KV block in one cache tensor, found from its storage and strides.

:func:`locate_blocks` finds a tensor's block axis from the bytes one block must have (the
search :mod:`hybridkv.connectors.layout` documents); :class:`LayerLayout` records what it
found, :class:`Segment` is one run of one block, :class:`Storage` a flat view of a storage
shared by layers. :func:`accepted_dtypes` maps a spec's dtype name to the torch dtypes a cache
tensor may have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["WORD_DTYPES", "LayerLayout", "Run", "Segment", "Storage", "accepted_dtypes", "describe", "host_rows",
           "locate_blocks", "word_width"]

_SPEC_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "float32": (torch.float32,),
    "float16": (torch.float16,),
    "bfloat16": (torch.bfloat16,),
    "float8_e4m3fn": (torch.float8_e4m3fn,),
    "float8_e5m2": (torch.float8_e5m2,),
    "fp8": (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8),
    "int8": (torch.int8,),
    "uint8": (torch.uint8,),
    "fp4": (torch.uint8, torch.int8),  # two values packed per byte
}

WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def accepted_dtypes(spec_dtype: str) -> tuple[torch.dtype, ...]:
    """Torch dtypes a cache tensor may have for a spec dtype name."""
    try:
        return _SPEC_DTYPES[spec_dtype]
    except KeyError:
        raise ValueError(
            f"spec dtype {spec_dtype!r} has no torch storage type; known: {sorted(_SPEC_DTYPES)}"
        ) from None


@dataclass(frozen=True, slots=True)
class Segment:
    """One contiguous byte run of one block in one layer.

    Attributes:
        layer: the layer name.
        storage: a flat ``uint8`` tensor over the layer tensor's whole storage.
        offset: byte offset of the run in ``storage``.
        nbytes: length of the run.
    """

    layer: str
    storage: torch.Tensor
    offset: int
    nbytes: int

    @property
    def ptr(self) -> int:
        """Address of the run (device memory for a CUDA cache)."""
        return int(self.storage.data_ptr()) + self.offset

    def view(self) -> torch.Tensor:
        """The run as a ``uint8`` tensor sharing the cache's memory (no copy)."""
        return self.storage[self.offset : self.offset + self.nbytes]


@dataclass(frozen=True, slots=True)
class LayerLayout:
    """Where one layer keeps each kernel block.

    Kernel block ``k`` of this layer is the runs ``origin + k * block_stride + p * part_stride``
    (``p`` < ``parts``), each ``run_bytes`` long; all offsets are bytes into the storage.
    ``inner`` lists the sizes of the dimensions inside a run, innermost first (``(dim, heads,
    tokens)`` for ``[.., tokens, heads, dim]``), i.e. the order of the elements in a run.
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    storage_id: int
    origin: int
    block_stride: int
    parts: int
    part_stride: int
    run_bytes: int
    inner: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Run:
    """A byte run repeated per logical block: block b's copy starts at ``base + b * stride``."""

    storage_id: int
    base: int
    stride: int
    nbytes: int
    payload_offset: int


class Storage:
    """A flat view of one storage shared by layers: uint8 tensor, word views, host memoryview."""

    __slots__ = ("flat", "mv", "nbytes", "ptr", "_words")

    def __init__(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        self.nbytes = int(storage.nbytes())
        self.flat = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(
            storage, 0, (self.nbytes,), (1,)
        )
        self.ptr = int(self.flat.data_ptr())
        self.mv = memoryview(self.flat.numpy()) if tensor.device.type == "cpu" else None
        self._words: dict[int, torch.Tensor] = {1: self.flat}

    def words(self, width: int) -> torch.Tensor:
        """The storage as 1-D words of ``width`` bytes (int64 for 8, ...)."""
        w = self._words.get(width)
        if w is None:
            w = torch.empty(0, dtype=WORD_DTYPES[width], device=self.flat.device).set_(
                self.flat.untyped_storage(), 0, (self.nbytes // width,), (1,)
            )
            self._words[width] = w
        return w


def word_width(values: Sequence[int]) -> int:
    for w in (8, 4, 2):
        if all(v % w == 0 for v in values):
            return w
    return 1


def host_rows(rows: torch.Tensor) -> tuple[memoryview, int, int]:
    """(memoryview of the storage, byte offset of row 0, row stride) of a CPU uint8 2-D tensor."""
    storage = Storage(rows)
    return storage.mv, rows.storage_offset(), rows.stride(0)  # type: ignore[return-value]


def describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, strides {t.stride()} (elements), {t.dtype}"


def locate_blocks(
    where: str, t: torch.Tensor, parts: int, run_bytes: int, num_kernel_blocks: int
) -> tuple[int, int, int, int, tuple[int, ...]]:
    """Find the block axis of ``t``.

    Returns:
        (block_stride, parts, part_stride, run_bytes) in bytes, and the sizes of the dimensions
        inside one run, innermost first (the element order within a run).

    The dense run grows over dimensions sorted by stride; a block is found when either the run
    is ``run_bytes`` long and the dimensions left are {2, num_blocks} (K/V apart), or it is
    ``parts * run_bytes`` long and only the block dimension is left (the whole block together).
    """
    item = t.element_size()
    dims = sorted(((t.stride(i), t.size(i), i) for i in range(t.dim()) if t.size(i) > 1),
                  key=lambda d: (d[0], -d[2]))
    if any(s == 0 for s, _, _ in dims) or len({s for s, _, _ in dims}) < len(dims):
        raise ValueError(f"{where}: tensor overlaps itself ({describe(t)})")
    acc = item
    i = 0
    while True:
        rest = dims[i:]
        if parts == 2 and acc == run_bytes and len(rest) == 2 \
                and sorted(s for _, s, _ in rest) == sorted((2, num_kernel_blocks)):
            (s1, n1, _), (s2, n2, _) = rest
            if n1 == n2:
                raise ValueError(
                    f"{where}: with {num_kernel_blocks} blocks the K/V dimension and the block "
                    f"dimension both have size 2 and cannot be told apart ({describe(t)}); "
                    "allocate at least 3 blocks"
                )
            kv, blk = ((s1, n1), (s2, n2)) if n1 == 2 else ((s2, n2), (s1, n1))
            part_stride, block_stride = kv[0] * item, blk[0] * item
            small, n_small, big = (part_stride, 2, block_stride) if part_stride < block_stride \
                else (block_stride, num_kernel_blocks, part_stride)
            if small < run_bytes or big < small * (n_small - 1) + run_bytes:
                raise ValueError(f"{where}: blocks overlap in memory ({describe(t)})")
            return block_stride, 2, part_stride, run_bytes, tuple(n for _, n, _ in dims[:i])
        if acc == parts * run_bytes and len(rest) == 1 and rest[0][1] == num_kernel_blocks:
            block_stride = rest[0][0] * item
            if block_stride < acc:
                raise ValueError(f"{where}: blocks overlap in memory ({describe(t)})")
            return block_stride, 1, 0, acc, tuple(n for _, n, _ in dims[:i])
        if i == len(dims) or dims[i][0] * item != acc or acc > parts * run_bytes:
            kinds = ("two contiguous runs of {0} bytes (K and V) or one run of {1} bytes"
                     if parts == 2 else "one contiguous run of {1} bytes")
            raise ValueError(
                f"{where}: expected each of {num_kernel_blocks} blocks to be "
                + kinds.format(run_bytes, parts * run_bytes)
                + f", but the tensor ({describe(t)}) has no such layout; if the attention "
                "backend pages the cache in smaller kernel blocks, register with kernel_blocks"
            )
        acc *= dims[i][1]
        i += 1
