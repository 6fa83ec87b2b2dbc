"""Where each KV block lives in the engine's cache tensors, found from bytes, not from shapes.

A connector that reads ``block_len = tensor.shape[k]`` for some fixed ``k`` breaks the day a
backend lays its cache out differently (MLA has no K/V axis, FlashInfer puts the block axis
first, FlashAttention puts K/V first, a kernel block is smaller than a logical one; this was
vLLM/Mooncake issue #39596). :class:`KVLayout` instead takes, per layer, the number of bytes one
block must have from the group's *spec* (``spec.page_size_bytes``) and finds those bytes in the
tensor from its storage, strides and element size:

* GQA / sliding / EAGLE-draft layers store K and V: one block is **two** runs of
  ``page_size_bytes / 2`` bytes (or one run of ``page_size_bytes`` when K and V of a block are
  stored together, e.g. ``[num_blocks, block_size, 2, heads, dim]``);
* MLA layers store one latent per token: one block is **one** run of ``page_size_bytes``.

The search sorts the tensor's dimensions by stride, grows a dense run from the innermost one
until it is exactly one run long, and requires the dimensions left over to be the K/V axis
(size 2) and the block axis (size ``num_blocks``), or just the block axis. A tensor of the wrong
dtype, block size, head shape or number of blocks cannot pass and is rejected with the bytes
expected and found. Layouts handled include::

    [2, num_blocks, block_size, heads, dim]   K/V first (FlashAttention; this project's engine,
                                              where K and V of a block are adjacent in its page)
    [num_blocks, 2, block_size, heads, dim]   block first (FlashInfer)
    [2, num_blocks, heads, block_size, dim]   HND
    [num_blocks, block_size, latent]          MLA

The bytes of one logical block of a group, in *payload order*::

    layer 0: runs of layer 0 sorted by address | layer 1: ... | ... | layer n-1: ...
             (K, V of kernel block 0, K, V of kernel block 1, ... as addresses dictate)

Consecutive runs that touch in memory are merged, which does not change the payload bytes.
:meth:`GroupLayout.gather` / :meth:`GroupLayout.scatter` copy a set of blocks between the cache
and a host buffer of rows (one row per block).

What the payload bytes *mean* is hashed into :attr:`GroupLayout.fingerprint`: the spec, the
kernel block size, and per layer its name, dtype, the order of its runs (K/V, kernel sub-block)
and the order of the elements inside a run (e.g. tokens-heads-dim vs heads-tokens-dim). Where
the blocks sit in memory (pool size, page padding, K/V far apart or adjacent) is left out, so
two workers with different pool sizes share payloads, while an HND and an NHD cache do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import xxhash

from hybridkv.core.specs import AttentionSpec, KVCacheConfig, KVCacheGroup

from .byte_runs import (WORD_DTYPES, LayerLayout, Run, Segment, Storage, accepted_dtypes, describe, host_rows,
                        locate_blocks, word_width)
from .kernel_blocks import KernelBlockMap

__all__ = ["CopyMode", "GroupLayout", "KVLayout", "LayerLayout", "Segment", "accepted_dtypes"]

#: How blocks are copied: ``"python"`` slices memoryviews (CPU caches; one copy per byte run),
#: ``"torch"`` uses index_select / index_copy_ (any device), ``"auto"`` picks python on the CPU.
CopyMode = Literal["auto", "python", "torch"]

class GroupLayout:
    """The registered layout of one KV-cache group.

    Attributes:
        group: the config's group (name, spec, layer names, draft flag).
        kernel: the logical to kernel block map of the group.
        num_blocks: logical blocks (the config's ``num_blocks``).
        block_bytes: payload bytes of one logical block over all layers of the group.
        layers: per layer, where its kernel blocks are.
        device: the device of the cache tensors.
        description: canonical text of the layout (what the fingerprint hashes).
        fingerprint: 64-bit hash of ``description``.
    """

    def __init__(
        self,
        group: KVCacheGroup,
        kernel: KernelBlockMap,
        num_blocks: int,
        layers: Sequence[LayerLayout],
        storages: Sequence[Storage],
        device: torch.device,
    ) -> None:
        self.group = group
        self.kernel = kernel
        self.num_blocks = num_blocks
        self.layers = tuple(layers)
        self.device = device
        self._storages = list(storages)
        r = kernel.ratio
        # uncoalesced segments of logical block 0, payload order: (layer index, storage, offset, n)
        segs: list[tuple[int, int, int, int]] = []
        desc_layers = []
        for li, lay in enumerate(self.layers):
            rel = sorted(
                (k * lay.block_stride + p * lay.part_stride, k, p)
                for k in range(r) for p in range(lay.parts)
            )
            segs.extend((li, lay.storage_id, lay.origin + o, lay.run_bytes) for o, _, _ in rel)
            # what the payload bytes mean, independent of where blocks sit in memory: the runs'
            # order (K/V part, kernel sub-block) and the element order inside a run
            order = ",".join(("KV"[p] if lay.parts == 2 else "B") + str(k) for _, k, p in rel)
            desc_layers.append(
                f"{lay.name}:{str(lay.dtype).removeprefix('torch.')}:{order}:"
                + "x".join(map(str, lay.inner))
            )
        self._segments0 = segs
        strides = [r * lay.block_stride for lay in self.layers]
        runs: list[Run] = []
        poff = 0
        for li, sid, off, n in segs:
            stride = strides[li]
            last = runs[-1] if runs else None
            if last is not None and last.storage_id == sid and last.stride == stride \
                    and last.base + last.nbytes == off:
                runs[-1] = Run(sid, last.base, stride, last.nbytes + n, last.payload_offset)
            else:
                runs.append(Run(sid, off, stride, n, poff))
            poff += n
        self._runs = tuple(runs)
        self.block_bytes = poff
        self.description = (
            f"hybridkv-layout/1;group={group.name};spec={group.spec!r};draft={group.is_draft};"
            f"logical={kernel.logical_block_size};kernel={kernel.kernel_block_size};"
            f"bytes={poff};layers=[{';'.join(desc_layers)}]"
        )
        self.fingerprint = xxhash.xxh3_64_intdigest(self.description.encode())
        self._py_runs = [
            (self._storages[run.storage_id].mv, run.base, run.stride, run.nbytes,
             run.payload_offset)
            for run in self._runs
        ]
        self._width = word_width(
            [x for run in self._runs
             for x in (run.base, run.stride, run.nbytes, run.payload_offset)]
            + [self._storages[run.storage_id].nbytes for run in self._runs]
            + [self._storages[run.storage_id].ptr for run in self._runs]
        )
        self._columns: dict[int, list[tuple[torch.Tensor, int, int]]] = {}

    # ------------------------------------------------------------------ facts
    @property
    def name(self) -> str:
        return self.group.name

    @property
    def spec(self) -> AttentionSpec:
        return self.group.spec

    @property
    def num_runs(self) -> int:
        """Contiguous byte runs one logical block is copied as (after merging neighbours)."""
        return len(self._runs)

    def _check_ids(self, block_ids: Sequence[int]) -> list[int]:
        ids = [int(b) for b in block_ids]
        for b in ids:
            if not 0 <= b < self.num_blocks:
                raise ValueError(
                    f"block id {b} out of range for group {self.name!r} "
                    f"(0 <= id < {self.num_blocks})"
                )
        return ids

    def block_segments(self, block_id: int) -> list[Segment]:
        """The byte runs of logical block ``block_id`` in payload order, not merged: per layer
        (in group order), every kernel block's K and V runs (GQA) or latent run (MLA)."""
        (b,) = self._check_ids([block_id])
        out = []
        for li, sid, off, n in self._segments0:
            lay = self.layers[li]
            shift = b * self.kernel.ratio * lay.block_stride
            out.append(Segment(lay.name, self._storages[sid].flat, off + shift, n))
        return out

    # ------------------------------------------------------------ copy: rows
    def _mode(self, mode: CopyMode) -> str:
        if mode == "auto":
            return "python" if self.device.type == "cpu" else "torch"
        if mode == "python" and self.device.type != "cpu":
            raise ValueError(f"copy mode 'python' needs a CPU cache, the cache is on {self.device}")
        if mode not in ("python", "torch"):
            raise ValueError(f"copy mode must be 'auto', 'python' or 'torch', got {mode!r}")
        return mode

    @staticmethod
    def _check_rows(rows: torch.Tensor, n: int, need: int) -> None:
        if rows.device.type != "cpu" or rows.dtype != torch.uint8 or rows.dim() != 2 \
                or rows.stride(1) != 1 or rows.shape[0] != n or rows.shape[1] < need:
            raise ValueError(
                f"rows must be a CPU uint8 tensor of shape [{n}, >= {need}] with contiguous rows, "
                f"got {rows.dtype} {tuple(rows.shape)} strides {rows.stride()} on {rows.device}"
            )

    def gather(self, block_ids: Sequence[int], out: torch.Tensor | None = None,
               mode: CopyMode = "auto") -> torch.Tensor:
        """Copy blocks into host rows: ``out[i, :block_bytes]`` = payload of ``block_ids[i]``.

        Args:
            block_ids: logical block ids.
            out: a CPU ``uint8`` tensor ``[len(block_ids), >= block_bytes]`` whose rows are
                contiguous (row stride free); allocated when None.
            mode: see :data:`CopyMode`.

        Returns:
            ``out``.
        """
        ids = self._check_ids(block_ids)
        if out is None:
            out = torch.empty((len(ids), self.block_bytes), dtype=torch.uint8)
        self._check_rows(out, len(ids), self.block_bytes)
        if ids:
            if self._mode(mode) == "python":
                self._gather_python(ids, *host_rows(out))
            else:
                self._gather_torch(ids, out)
        return out

    def scatter(self, block_ids: Sequence[int], rows: torch.Tensor,
                mode: CopyMode = "auto") -> None:
        """Copy host rows into the cache: payload ``rows[i, :block_bytes]`` to ``block_ids[i]``."""
        ids = self._check_ids(block_ids)
        self._check_rows(rows, len(ids), self.block_bytes)
        if ids:
            if self._mode(mode) == "python":
                self._scatter_python(ids, *host_rows(rows))
            else:
                self._scatter_torch(ids, rows)

    # ------------------------------------------------------ python (CPU) copies
    def _gather_python(self, ids: Sequence[int], dst: memoryview, start: int, row: int) -> None:
        for i, b in enumerate(ids):
            o = start + i * row
            for mv, base, stride, n, poff in self._py_runs:
                a = base + b * stride
                dst[o + poff : o + poff + n] = mv[a : a + n]

    def _scatter_python(self, ids: Sequence[int], src: memoryview, start: int, row: int) -> None:
        for i, b in enumerate(ids):
            o = start + i * row
            for mv, base, stride, n, poff in self._py_runs:
                a = base + b * stride
                mv[a : a + n] = src[o + poff : o + poff + n]

    def parts(self, block_id: int) -> list[memoryview]:
        """Zero-copy memoryviews of block ``block_id``'s runs in payload order (CPU cache only);
        ``b"".join(parts)`` is its payload."""
        if self.device.type != "cpu":
            raise ValueError(f"parts() needs a CPU cache, the cache is on {self.device}")
        (b,) = self._check_ids([block_id])
        return [mv[base + b * stride : base + b * stride + n]
                for mv, base, stride, n, _ in self._py_runs]

    def write_payload(self, block_id: int, payload: bytes | bytearray | memoryview) -> None:
        """Copy one payload (``block_bytes`` long, or longer: the rest is ignored) into block
        ``block_id`` (CPU cache only)."""
        if self.device.type != "cpu":
            raise ValueError(f"write_payload() needs a CPU cache, the cache is on {self.device}")
        src = memoryview(payload).cast("B")
        if src.nbytes < self.block_bytes:
            raise ValueError(f"payload of {src.nbytes} bytes is shorter than a block "
                             f"({self.block_bytes} bytes)")
        (b,) = self._check_ids([block_id])
        self._scatter_python([b], src, 0, 0)

    # --------------------------------------------------------- torch copies
    def _cols(self, width: int) -> list[tuple[torch.Tensor, int, int]]:
        """Per run: a [num_blocks, nbytes / width] strided view, its payload offset and length
        (both in words of ``width`` bytes)."""
        cols = self._columns.get(width)
        if cols is None:
            cols = []
            for run in self._runs:
                words = self._storages[run.storage_id].words(width)
                view = words.as_strided(
                    (self.num_blocks, run.nbytes // width), (run.stride // width, 1),
                    run.base // width,
                )
                cols.append((view, run.payload_offset // width, run.nbytes // width))
            self._columns[width] = cols
        return cols

    def _rows_width(self, rows: torch.Tensor) -> int:
        w = self._width
        while w > 1 and (rows.stride(0) % w or rows.data_ptr() % w):
            w //= 2
        return w

    def _gather_torch(self, ids: list[int], out: torch.Tensor) -> None:
        w = self._rows_width(out)
        idx = torch.tensor(ids, dtype=torch.long, device=self.device)
        n_words = self.block_bytes // w
        out_w = out[:, : self.block_bytes].view(WORD_DTYPES[w])
        target = out_w if self.device.type == "cpu" else torch.empty(
            (len(ids), n_words), dtype=WORD_DTYPES[w], device=self.device)
        for view, poff, n in self._cols(w):
            torch.index_select(view, 0, idx, out=target[:, poff : poff + n])
        if target is not out_w:
            out_w.copy_(target)

    def _scatter_torch(self, ids: list[int], rows: torch.Tensor) -> None:
        w = self._rows_width(rows)
        idx = torch.tensor(ids, dtype=torch.long, device=self.device)
        src = rows[:, : self.block_bytes].view(WORD_DTYPES[w])
        if self.device.type != "cpu":
            src = src.to(self.device)
        for view, poff, n in self._cols(w):
            view.index_copy_(0, idx, src[:, poff : poff + n])

    def __repr__(self) -> str:
        return (f"GroupLayout({self.name!r}, layers={len(self.layers)}, blocks={self.num_blocks}, "
                f"block_bytes={self.block_bytes}, kernel={self.kernel.kernel_block_size}/"
                f"{self.kernel.logical_block_size}, runs={self.num_runs})")


class KVLayout:
    """The byte layout of every registered group; build it with :meth:`register`.

    Attributes:
        config: the KV-cache config.
        groups: per group name, its :class:`GroupLayout`.
        device: where the cache tensors are.
    """

    def __init__(self, config: KVCacheConfig, groups: Mapping[str, GroupLayout],
                 device: torch.device) -> None:
        self.config = config
        self.groups = dict(groups)
        self.device = device

    def __getitem__(self, group: str) -> GroupLayout:
        try:
            return self.groups[group]
        except KeyError:
            raise KeyError(
                f"no KV-cache group named {group!r}; groups: {list(self.groups)}") from None

    @property
    def fingerprint(self) -> int:
        """One hash over every group's layout."""
        text = "|".join(g.description for g in self.groups.values())
        return xxhash.xxh3_64_intdigest(text.encode())

    @classmethod
    def register(
        cls,
        kv_caches: Mapping[str, torch.Tensor],
        config: KVCacheConfig,
        kernel_blocks: Mapping[str, KernelBlockMap | int] | None = None,
    ) -> KVLayout:
        """Derive every group's block layout from the cache tensors.

        Args:
            kv_caches: layer name -> cache tensor, exactly the config's layers, all on one device.
            config: the KV-cache config (groups, specs, ``num_blocks``).
            kernel_blocks: per group name, its :class:`KernelBlockMap` (or kernel block size in
                tokens) when the cache is paged in kernel blocks smaller than the group's
                logical blocks (see :func:`~.kernel_blocks.plan_kernel_blocks`); groups not
                listed use kernel block = logical block.

        Raises:
            ValueError: a missing or unknown layer; a tensor whose bytes, dtype or layout
                disagree with its spec (the message names the layer, the bytes expected and
                the bytes found); tensors on several devices; a kernel block map that does not
                fit its group.
        """
        names = {layer for g in config.groups for layer in g.layer_names}
        missing = [layer for layer in sorted(names) if layer not in kv_caches]
        unknown = [layer for layer in kv_caches if layer not in names]
        if missing or unknown:
            raise ValueError(
                f"kv_caches must hold exactly the config's layers: missing {missing}, "
                f"not in any group {unknown}"
            )
        devices = {t.device for t in kv_caches.values()}
        if len(devices) != 1:
            raise ValueError(f"cache tensors are on several devices: {sorted(map(str, devices))}")
        (device,) = devices
        kmaps = dict(kernel_blocks or {})
        unknown_groups = [g for g in kmaps if g not in {grp.name for grp in config.groups}]
        if unknown_groups:
            raise ValueError(f"kernel_blocks names unknown groups {unknown_groups}")
        num_blocks = int(config.num_blocks)  # type: ignore[arg-type]
        storages: list[Storage] = []
        storage_ids: dict[tuple[int, int], int] = {}
        out: dict[str, GroupLayout] = {}
        for group in config.groups:
            spec = group.spec
            km = kmaps.get(group.name, spec.block_size)
            if isinstance(km, int):
                km = KernelBlockMap(spec.block_size, km)
            if km.logical_block_size != spec.block_size:
                raise ValueError(
                    f"kernel block map of group {group.name!r} is for logical block size "
                    f"{km.logical_block_size}, the group's block size is {spec.block_size}"
                )
            ratio = km.ratio
            if spec.page_size_bytes % ratio or km.kernel_block_size % spec.compress_ratio:
                raise ValueError(
                    f"group {group.name!r}: a page of {spec.page_size_bytes} bytes "
                    f"({spec.block_size} tokens) cannot be split into kernel blocks of "
                    f"{km.kernel_block_size} tokens"
                )
            kpage = spec.page_size_bytes // ratio
            nkb = num_blocks * ratio
            parts = spec.kv_parts            # K and V halves, or one latent (MLA)
            layers = []
            for name in group.layer_names:
                t = kv_caches[name]
                where = f"layer {name!r} (group {group.name!r})"
                expected = nkb * kpage
                actual = t.numel() * t.element_size()
                if actual != expected:
                    raise ValueError(
                        f"{where}: expected {expected} bytes = {nkb} blocks x {kpage} bytes "
                        f"({km.kernel_block_size} tokens of {type(spec).__name__} "
                        f"dtype={spec.dtype}), got {actual} bytes ({describe(t)})"
                    )
                allowed = accepted_dtypes(spec.dtype)
                if t.dtype not in allowed:
                    raise ValueError(
                        f"{where}: expected dtype {' or '.join(map(str, allowed))} for spec dtype "
                        f"{spec.dtype!r}, got {t.dtype} (the {actual} bytes match)"
                    )
                if kpage % parts:
                    raise ValueError(
                        f"{where}: a block of {kpage} bytes has no equal K and V halves")
                block_stride, n_parts, part_stride, run, inner = locate_blocks(
                    where, t, parts, kpage // parts, nkb)
                skey = (int(t.untyped_storage().data_ptr()), int(t.untyped_storage().nbytes()))
                if skey not in storage_ids:
                    storage_ids[skey] = len(storages)
                    storages.append(Storage(t))
                layers.append(LayerLayout(
                    name=name, dtype=t.dtype, shape=tuple(t.shape), storage_id=storage_ids[skey],
                    origin=t.storage_offset() * t.element_size(), block_stride=block_stride,
                    parts=n_parts, part_stride=part_stride, run_bytes=run, inner=inner,
                ))
            out[group.name] = GroupLayout(group, km, num_blocks, layers, storages, device)
        return cls(config, out, device)
