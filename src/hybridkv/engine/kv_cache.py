"""Paged KV-cache tensors laid out exactly as :class:`~hybridkv.core.specs.KVCacheConfig` counts them.

Memory layout (one byte buffer per *layer slot*; see ``core/specs.py``)::

    slot s:  [block 0 | block 1 | block 2 | ...]      each block = max_page_bytes bytes
                 \\__ page of layer s of whichever group owns that block id

    layer j of group g  ->  slot j; its tensor is a strided view of slot j:
        GQA layer:  [2, num_blocks, block_size, num_kv_heads, head_dim]   (K = [0], V = [1])
        MLA layer:  [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]

Layers of different groups share memory, just as the block manager's accounting assumes: one
block id is owned by one group at a time, so a correct manager never lets two groups collide,
and an incorrect one shows up as wrong logits. Block 0 is the *null block*: the engine never
writes it and never reads it (:mod:`hybridkv.engine.metadata` refuses such slots).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hybridkv.core.specs import AttentionSpec, KVCacheConfig, KVCacheGroup, is_state

NULL_BLOCK = 0

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a spec dtype name; raises ValueError for names torch cannot store."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"cache dtype {name!r} has no torch storage type; use one of {', '.join(TORCH_DTYPES)}"
        ) from None


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PagedKVCache:
    """Per-layer paged KV tensors for one :class:`KVCacheConfig`.

    Args:
        config: the groups (layer names, specs, block sizes) and ``num_blocks``.
        device: where to allocate (default CPU).

    Attributes:
        config: the KV-cache config.
        num_blocks: pages per layer, including the null block 0.
        device: the allocation device.
    """

    def __init__(self, config: KVCacheConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.num_blocks: int = int(config.num_blocks)  # type: ignore[arg-type]
        self.device = torch.device(device)
        page = config.max_page_bytes
        self._slots = [
            torch.zeros(self.num_blocks * page, dtype=torch.uint8, device=self.device)
            for _ in range(config.layer_slots)
        ]
        self._layers: dict[str, torch.Tensor] = {}
        self._group_of: dict[str, int] = {}
        for gi, group in enumerate(config.groups):
            if is_state(group.spec):  # flat byte pages, read through state_pages()
                continue
            for slot, name in enumerate(group.layer_names):
                self._layers[name] = self._view(self._slots[slot], group.spec, page)
                self._group_of[name] = gi

    def _view(self, buffer: torch.Tensor, spec: AttentionSpec, page: int) -> torch.Tensor:
        if spec.compress_ratio != 1:
            raise ValueError(
                f"{type(spec).__name__} compress_ratio={spec.compress_ratio} is not supported by "
                "the reference engine; use 1")
        dtype = torch_dtype(spec.dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if page % itemsize:
            raise ValueError(f"max page size {page} bytes is not a multiple of {dtype} ({itemsize} bytes)")
        pages = buffer.view(self.num_blocks, page)[:, : spec.page_size_bytes].view(dtype)
        bs = spec.block_size
        if spec.kv_parts == 1:                          # one latent per token (MLA)
            return pages.view(self.num_blocks, bs, -1)
        kv = pages.view(self.num_blocks, 2, bs, spec.num_kv_heads, spec.head_dim)
        return kv.permute(1, 0, 2, 3, 4)

    # ------------------------------------------------------------------ lookups
    @property
    def layer_names(self) -> tuple[str, ...]:
        """Every layer with a cache, in group order."""
        return tuple(self._layers)

    def layer(self, name: str) -> torch.Tensor:
        """The cache tensor of layer ``name`` (a view; writes go to the shared pool)."""
        try:
            return self._layers[name]
        except KeyError:
            raise KeyError(f"no KV cache for layer {name!r}; layers: {list(self._layers)}") from None

    def group_index(self, layer_name: str) -> int:
        """Index in ``config.groups`` of the group that holds ``layer_name``."""
        self.layer(layer_name)
        return self._group_of[layer_name]

    def group(self, layer_name: str) -> KVCacheGroup:
        return self.config.groups[self.group_index(layer_name)]

    def state_pages(self, group: int) -> list[torch.Tensor]:
        """Per layer of state group ``group`` (in ``layer_names`` order), its layer slot as
        ``[num_blocks, max_page_bytes]`` uint8: a state is the bytes of an extent's pages
        of that slot, concatenated (:mod:`hybridkv.engine.state_pages`)."""
        g = self.config.groups[group]
        if not is_state(g.spec):
            raise ValueError(f"group {g.name!r} is not a state group")
        page = self.config.max_page_bytes
        return [self._slots[slot].view(self.num_blocks, page) for slot in range(len(g.layer_names))]

    @property
    def nbytes(self) -> int:
        """Bytes allocated: ``num_blocks * config.block_bytes``."""
        return sum(s.numel() for s in self._slots)

    # ------------------------------------------------------------------ debugging helpers
    def fill_blocks(self, block_ids: Iterable[int], value: float, layers: Iterable[str] | None = None) -> None:
        """Fill whole pages (every layer, or ``layers``) with ``value``; e.g. NaN-poison block 0
        to prove it is never read."""
        ids = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        for name in self._layers if layers is None else layers:
            t = self._layers[name]
            if t.dim() == 5:
                t[:, ids] = value
            else:
                t[ids] = value
