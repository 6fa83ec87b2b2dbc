"""Attention specs, KV-cache groups and the cache configuration.

A *spec* says how one layer stores KV: its block size (tokens per block), its per-token bytes
and the parameters of its attention type; :mod:`hybridkv.core.rules` maps each spec type to
the *hit rule* every consumer asks (which blocks a hit needs, which keys a query reads). A
*group* is a set of layers that share one block table. The :class:`KVCacheConfig` lists the
groups and the number of blocks of the single pool they all draw from.

Pool layout (one block id = one page in every layer slot)::

    layer slot 0:  [page 0][page 1][page 2] ...   <- layer 0 of whichever group owns block b
    layer slot 1:  [page 0][page 1][page 2] ...
    ...
    slots = max(len(g.layer_names) for g in groups); page bytes = max page over groups

    bytes per block id = slots * max_page_bytes

Every validation error names the bad value and what would be valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce
from typing import ClassVar

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
    "fp4": 0.5,
}


def _check_positive_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype``; raises ValueError naming the valid dtypes."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(
            f"unknown dtype {dtype!r}; valid dtypes: {', '.join(sorted(DTYPE_BYTES))}"
        ) from None


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """Base of every attention spec: storage facts only (sizes, dtype, page layout).

    Each concrete subclass has a hit rule registered in :mod:`hybridkv.core.rules` (which
    holds the type's other facts) and states what one cached position stores in
    :attr:`storage`; no consumer switches on a spec's class.

    Attributes:
        block_size: tokens per KV block of this group (> 0).
        num_kv_heads: KV heads stored per layer (> 0).
        head_dim: size of one K (and one V) head vector (> 0).
        dtype: storage dtype of the cache, one of :data:`DTYPE_BYTES`.
    """

    #: what one cached position stores, one of :data:`STORAGE_KINDS`: ``"kv"`` a K and a V
    #: vector per KV head, ``"latent"`` one compressed latent vector (MLA), ``"state"`` nothing
    #: per token (a fixed-size recurrent state per sequence; memory is per checkpoint)
    storage: ClassVar[str] = "kv"

    block_size: int
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_positive_int(name, "block_size", self.block_size)
        _check_positive_int(name, "num_kv_heads", self.num_kv_heads)
        _check_positive_int(name, "head_dim", self.head_dim)
        dtype_bytes(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token occupies in one layer (K and V)."""
        return int(2 * self.num_kv_heads * self.head_dim * dtype_bytes(self.dtype))

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer."""
        return self.block_size * self.bytes_per_token

    @property
    def window_tokens(self) -> int | None:
        """Tokens before the query that attention can read (None = unbounded)."""
        return None

    @property
    def kv_parts(self) -> int:
        """Page layout: 2 = separate K and V halves (``[2, block_size, heads, head_dim]``),
        1 = one vector per stored position (a latent, or a state's flat bytes)."""
        return 2 if self.storage == "kv" else 1

    @property
    def compress_ratio(self) -> int:
        """Tokens per stored position (MLA compressed attention keeps one per ratio)."""
        return 1


@dataclass(frozen=True, slots=True)
class FullAttention(AttentionSpec):
    """Causal attention over every earlier token: a hit at t needs blocks covering [0, t)."""


@dataclass(frozen=True, slots=True)
class SlidingWindow(AttentionSpec):
    """Sliding-window attention: a query at position t reads tokens [t - window + 1, t].

    A hit ending at token t therefore needs the cached tokens [t - window + 1, t).
    """

    window: int = 4096

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _check_positive_int("SlidingWindow", "window", self.window)

    @property
    def window_tokens(self) -> int | None:
        return self.window


@dataclass(frozen=True, slots=True)
class ChunkedLocal(AttentionSpec):
    """Chunked local attention (Llama 4): a query reads only its own chunk of ``chunk_size``.

    A hit ending at token t needs the cached tokens [floor(t / chunk) * chunk, t).
    """

    chunk_size: int = 8192

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _check_positive_int("ChunkedLocal", "chunk_size", self.chunk_size)
        if self.chunk_size % self.block_size:
            raise ValueError(
                f"ChunkedLocal.chunk_size ({self.chunk_size}) must be a multiple of "
                f"block_size ({self.block_size})"
            )


@dataclass(frozen=True, slots=True)
class MLA(AttentionSpec):
    """Multi-head latent attention (DeepSeek-V2/V3): one compressed latent per token.

    A token stores ``kv_lora_rank + qk_rope_head_dim`` values and no separate V;
    ``num_kv_heads``/``head_dim`` are unused. ``compress_ratio`` > 1 models DeepSeek-V4-style
    compressed attention that keeps one latent per ``compress_ratio`` tokens. The hit rule is
    full attention's. An MLA layer with a sliding window is a :class:`SlidingWindow` whose
    ``num_kv_heads=1`` and ``head_dim`` is the latent width (see the deepseek-v4-style preset).
    """

    storage: ClassVar[str] = "latent"

    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    compress_ratio: int = 1
    num_kv_heads: int = 1
    head_dim: int = 576

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _check_positive_int("MLA", "kv_lora_rank", self.kv_lora_rank)
        if isinstance(self.qk_rope_head_dim, bool) or not isinstance(self.qk_rope_head_dim, int) \
                or self.qk_rope_head_dim < 0:
            raise ValueError(
                f"MLA.qk_rope_head_dim must be a non-negative integer, got {self.qk_rope_head_dim!r}"
            )
        _check_positive_int("MLA", "compress_ratio", self.compress_ratio)
        if self.block_size % self.compress_ratio:
            raise ValueError(
                f"MLA.block_size ({self.block_size}) must be a multiple of "
                f"compress_ratio ({self.compress_ratio})"
            )

    @property
    def latent_dim(self) -> int:
        """Values stored per cached position: kv_lora_rank + qk_rope_head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def bytes_per_token(self) -> int:
        return int(self.latent_dim * dtype_bytes(self.dtype)) // self.compress_ratio

    @property
    def page_size_bytes(self) -> int:
        return (self.block_size // self.compress_ratio) * int(self.latent_dim * dtype_bytes(self.dtype))


@dataclass(frozen=True, slots=True)
class SparseMLA(MLA):
    """DeepSeek-V4 compressed sparse attention (CSA): per layer, one compressed latent per
    ``compress_ratio`` tokens (the whole history, so full attention's hit rule, inherited
    from :class:`MLA`) plus the lightning indexer's keys at the same ratio
    (``index_head_dim`` values of ``index_dtype`` per compressed position), which pick the
    top-k latents each query reads. The indexer keys live in the latents' pages (one block
    table): a hit needs both for ``[0, t)``, like the latents alone.
    """

    index_head_dim: int = 128
    index_dtype: str = "float8_e4m3fn"

    def __post_init__(self) -> None:
        MLA.__post_init__(self)
        _check_positive_int("SparseMLA", "index_head_dim", self.index_head_dim)
        dtype_bytes(self.index_dtype)

    @property
    def index_bytes(self) -> int:
        """Bytes of the indexer's key at one compressed position."""
        return int(self.index_head_dim * dtype_bytes(self.index_dtype))

    @property
    def bytes_per_token(self) -> int:
        return (int(self.latent_dim * dtype_bytes(self.dtype)) + self.index_bytes) // self.compress_ratio

    @property
    def page_size_bytes(self) -> int:
        return (self.block_size // self.compress_ratio) * (
            int(self.latent_dim * dtype_bytes(self.dtype)) + self.index_bytes)


@dataclass(frozen=True, slots=True)
class CompressorState(SlidingWindow):
    """The input buffer of a DeepSeek-V4 KV compressor: the uncompressed projections of the
    last ``window`` tokens, from which the compressor pools each group of ``compress_ratio``
    tokens into one latent (``window`` = 2 x ratio with overlapping groups, as for ratio 4;
    = ratio without, as for ratio 128). A hit at t needs the buffer as it stood at t, i.e.
    the tokens ``[t - window + 1, t)``: a sliding window's rule, inherited from
    :class:`SlidingWindow`. Stored per token: ``num_kv_heads x head_dim`` values (the KV
    and gate projections) of ``dtype``.
    """

    compress_ratio: int = 4

    def __post_init__(self) -> None:
        SlidingWindow.__post_init__(self)
        _check_positive_int("CompressorState", "compress_ratio", self.compress_ratio)
        if self.window < self.compress_ratio:
            raise ValueError(f"CompressorState.window ({self.window}) must hold at least one "
                             f"group of compress_ratio ({self.compress_ratio}) tokens")

    @property
    def bytes_per_token(self) -> int:
        return int(self.num_kv_heads * self.head_dim * dtype_bytes(self.dtype))

    @property
    def kv_parts(self) -> int:
        return 1


#: every :attr:`AttentionSpec.storage` value (what one cached position stores)
STORAGE_KINDS: tuple[str, ...] = ("kv", "latent", "state")

#: dtypes a recurrent state or conv state may be stored in (torch stores them; fp8/fp4 would
#: quantize a state that every later token reads, so they are refused).
STATE_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")


def _check_shape(owner: str, name: str, shape: object) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims: tuple[int, ...] = tuple(shape)  # type: ignore[arg-type]  # any iterable; checked below
    except TypeError:
        dims = ()
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims):
        raise ValueError(f"{owner}.{name} must be a non-empty tuple of positive integers, got {shape!r}")
    return dims


@dataclass(frozen=True, slots=True)
class StateSpec(AttentionSpec):
    """A recurrent layer (gated delta net, Mamba2): one fixed-size state per sequence.

    The layer keeps, per request, a *conv state* (the last ``conv_kernel - 1`` inputs of its
    causal convolution) and a *recurrent state*; neither grows with the sequence. Prefix
    caching keeps *checkpoints*: copies of the state after exactly ``t`` tokens
    (docs/state-groups.md). ``block_size`` is the checkpoint granularity ``a``: a hit of
    ``e * a`` tokens needs the checkpoint at exactly ``e * a`` (:class:`~hybridkv.core.rules.
    state.StateRule`); it is chosen freely, independent of the attention block size.

    ``num_kv_heads``, ``head_dim`` and ``dtype`` of the base are unused.

    Attributes:
        conv_shape: one layer's conv state, e.g. ``(conv_kernel - 1, conv_dim)``.
        conv_dtype: its dtype, one of :data:`STATE_DTYPES`.
        state_shape: one layer's recurrent state, e.g. ``(v_heads, k_dim, v_dim)``.
        state_dtype: its dtype, one of :data:`STATE_DTYPES`.

    ``page_size_bytes`` is one layer's state in bytes (conv + recurrent), independent of
    ``block_size``; ``bytes_per_token`` is 0 (memory is per checkpoint, not per token). In
    the pool a state occupies an *extent* of :meth:`KVCacheConfig.extent_blocks` block ids.
    """

    storage: ClassVar[str] = "state"

    conv_shape: tuple[int, ...] = (3, 8192)
    conv_dtype: str = "bfloat16"
    state_shape: tuple[int, ...] = (32, 128, 128)
    state_dtype: str = "float32"

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        object.__setattr__(self, "conv_shape", _check_shape("StateSpec", "conv_shape", self.conv_shape))
        object.__setattr__(self, "state_shape", _check_shape("StateSpec", "state_shape", self.state_shape))
        for name in ("conv_dtype", "state_dtype"):
            value = getattr(self, name)
            if value not in STATE_DTYPES:
                raise ValueError(
                    f"StateSpec.{name} {value!r} is not supported for a recurrent state; valid "
                    f"dtypes: {', '.join(STATE_DTYPES)}")

    @property
    def bytes_per_token(self) -> int:
        return 0

    @property
    def conv_bytes(self) -> int:
        """Bytes of one layer's conv state."""
        return math.prod(self.conv_shape) * int(dtype_bytes(self.conv_dtype))

    @property
    def state_bytes(self) -> int:
        """Bytes of one layer's recurrent state."""
        return math.prod(self.state_shape) * int(dtype_bytes(self.state_dtype))

    @property
    def page_size_bytes(self) -> int:
        """One layer's whole state (conv + recurrent), bytes."""
        return self.conv_bytes + self.state_bytes


def is_state(spec: AttentionSpec) -> bool:
    """Whether ``spec`` is a recurrent-state spec (its memory is extents, not token pages)."""
    return spec.storage == "state"


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers that share one block table.

    Attributes:
        name: unique group name.
        spec: the attention spec every layer of the group has.
        layer_names: the layers (non-empty, unique across the whole config).
        is_draft: the group holds a speculative drafter's layers (EAGLE/MTP head). Only draft
            groups drop their last block in EAGLE drop mode; if no group is a draft group,
            every group is treated as one (vLLM's fallback).
    """

    name: str
    spec: AttentionSpec
    layer_names: tuple[str, ...]
    is_draft: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"KVCacheGroup.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.spec, AttentionSpec):
            raise ValueError(
                f"KVCacheGroup {self.name!r}: spec must be an AttentionSpec (FullAttention, "
                f"SlidingWindow, ChunkedLocal, MLA, SparseMLA, CompressorState or StateSpec), "
                f"got {type(self.spec).__name__}"
            )
        if isinstance(self.layer_names, str):
            object.__setattr__(self, "layer_names", (self.layer_names,))
        else:
            object.__setattr__(self, "layer_names", tuple(self.layer_names))
        if not self.layer_names:
            raise ValueError(f"KVCacheGroup {self.name!r} has no layers; give at least one layer name")
        if len(set(self.layer_names)) != len(self.layer_names):
            dup = sorted({n for n in self.layer_names if self.layer_names.count(n) > 1})
            raise ValueError(f"KVCacheGroup {self.name!r} lists layers more than once: {dup}")


@dataclass(frozen=True)
class KVCacheConfig:
    """The groups and the size of the shared block pool.

    Give exactly one of ``num_blocks`` (including the null block 0) or ``memory_bytes`` (the
    byte budget; ``num_blocks = memory_bytes // block_bytes``).

    Derived sizes:
        hash_block_size: GCD of the group block sizes; hashes are computed at this size and
            coarser groups read every k-th one.
        alignment: LCM of the group block sizes; every cache hit is a multiple of it.
    """

    groups: tuple[KVCacheGroup, ...]
    # None (not given) is replaced by memory_bytes // block_bytes: read, it is always an int
    num_blocks: int = None  # type: ignore[assignment]
    memory_bytes: int | None = None
    hash_block_size: int = field(init=False)
    alignment: int = field(init=False)

    def __post_init__(self) -> None:
        groups = tuple(self.groups) if not isinstance(self.groups, KVCacheGroup) else (self.groups,)
        object.__setattr__(self, "groups", groups)
        if not groups:
            raise ValueError("KVCacheConfig.groups is empty; give at least one KVCacheGroup")
        for g in groups:
            if not isinstance(g, KVCacheGroup):
                raise ValueError(f"KVCacheConfig.groups must hold KVCacheGroup, got {type(g).__name__}")
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate KV-cache group names: {dup}")
        seen: dict[str, str] = {}
        for g in groups:
            for layer in g.layer_names:
                if layer in seen:
                    raise ValueError(
                        f"layer {layer!r} is in groups {seen[layer]!r} and {g.name!r}; "
                        "each layer belongs to exactly one group"
                    )
                seen[layer] = g.name
        sizes = [g.spec.block_size for g in groups]
        hbs = reduce(math.gcd, sizes)
        lcm = reduce(lambda a, b: a * b // math.gcd(a, b), sizes)
        object.__setattr__(self, "hash_block_size", hbs)
        object.__setattr__(self, "alignment", lcm)
        if (self.num_blocks is None) == (self.memory_bytes is None):
            raise ValueError(
                "give exactly one of KVCacheConfig.num_blocks or memory_bytes, got "
                f"num_blocks={self.num_blocks!r}, memory_bytes={self.memory_bytes!r}"
            )
        if self.memory_bytes is not None:
            _check_positive_int("KVCacheConfig", "memory_bytes", self.memory_bytes)
            object.__setattr__(self, "num_blocks", self.memory_bytes // self.block_bytes)
        if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) or self.num_blocks < 2:
            raise ValueError(
                f"KVCacheConfig needs at least 2 blocks (block 0 is the null block), got "
                f"num_blocks={self.num_blocks!r}"
                + (f" from memory_bytes={self.memory_bytes} at {self.block_bytes} bytes per block"
                   if self.memory_bytes is not None else "")
            )

    def check_state_fits(self) -> None:
        """Raise ValueError unless the pool holds, per state group, one live state and one
        checkpoint being written, plus one block of every other group (a one-token request).
        The manager calls it (a config may be built only to probe its sizes)."""
        states = [i for i, g in enumerate(self.groups) if is_state(g.spec)]
        if not states:
            return
        need = sum(2 * self.extent_blocks(i) if i in states else 1 for i in range(len(self.groups)))
        if need > self.num_blocks - 1:
            i = max(states, key=self.extent_blocks)
            g = self.groups[i]
            raise ValueError(
                f"state group {g.name!r} stores {g.spec.page_size_bytes} B of state per layer, "
                f"{self.extent_blocks(i)} blocks of {self.max_page_bytes} B page each; one request "
                f"needs {need} blocks but the pool has {self.num_blocks - 1} usable blocks; give "
                f"num_blocks >= {need + 1} (memory_bytes >= {(need + 1) * self.block_bytes})")

    @property
    def layer_slots(self) -> int:
        """Layer slots per block id: the largest group's layer count."""
        return max(len(g.layer_names) for g in self.groups)

    @property
    def max_page_bytes(self) -> int:
        """Bytes of one page: the largest attention page (state groups spread a state over an
        extent of pages, :meth:`extent_blocks`); the largest state if there is no attention."""
        pages = [g.spec.page_size_bytes for g in self.groups if not is_state(g.spec)]
        return max(pages) if pages else max(g.spec.page_size_bytes for g in self.groups)

    def extent_blocks(self, group: int) -> int:
        """Block ids one state (or checkpoint) of ``group`` occupies: ``ceil(state bytes /
        page bytes)`` for a state group (each layer's state spans the same layer slot of those
        pages), 1 for any other group."""
        spec = self.groups[group].spec
        if not is_state(spec):
            return 1
        return -(-spec.page_size_bytes // self.max_page_bytes)

    @property
    def has_state(self) -> bool:
        """Whether any group is a recurrent-state group."""
        return any(is_state(g.spec) for g in self.groups)

    @property
    def block_bytes(self) -> int:
        """Bytes one block id occupies across all layer slots."""
        return self.layer_slots * self.max_page_bytes

    @property
    def kv_bytes_per_token(self) -> dict[str, int]:
        """Per group: KV bytes one token costs summed over the group's layers."""
        return {g.name: g.spec.bytes_per_token * len(g.layer_names) for g in self.groups}

    def group_index(self, name: str) -> int:
        for i, g in enumerate(self.groups):
            if g.name == name:
                return i
        raise KeyError(f"no KV-cache group named {name!r}; groups: {[g.name for g in self.groups]}")
