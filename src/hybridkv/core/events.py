"""KV-cache events in vLLM's schema, and prefix-cache statistics.

Events let an external indexer (Dynamo, llm-d, Mooncake Conductor) mirror which blocks an
engine holds. The field names follow vLLM's ``kv_events`` schema, so a consumer written for
vLLM reads these unchanged; ``extra_keys`` and ``lookahead_token_ids`` carry what is needed to
recompute the hashes (:meth:`hybridkv.core.hashing.BlockHasher.hash_block`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks of one group were cached, as one contiguous run of a request's blocks.

    ``block_hashes[i]`` is the chained hash of block i of the run (at the group's block size);
    ``parent_block_hash`` is the hash of the block before the run (None for block 0);
    ``token_ids`` are the run's tokens; ``extra_keys[i]`` the extra keys of each block in
    untagged form (LoRA name, ``(mm identifier, offset)``, cache salt), ``None`` if none;
    ``lookahead_token_ids[i]`` the tokens after block i that its hash covers.
    """

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None
    medium: str
    group_idx: int
    extra_keys: list[tuple[object, ...] | None] | None = None
    lookahead_token_ids: list[list[int]] | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks of one group were evicted (their hashes dropped)."""

    block_hashes: list[bytes]
    medium: str
    group_idx: int


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every cached block was dropped (prefix-cache reset)."""

    medium: str = "GPU"


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def untag_extra_keys(keys: tuple[tuple[object, ...], ...]) -> tuple[object, ...] | None:
    """vLLM's event form of extra keys: ``("mm", id, off)`` -> ``(id, off)``, LoRA -> name."""
    out: list[object] = []
    for key in keys:
        kind = key[0]
        if kind == "mm":
            out.append((key[1], key[2]))
        elif kind == "lora":
            out.append(key[1])
        else:
            out.append(key[1])
    return tuple(out) or None


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache counters in tokens, as vLLM's ``vllm:prefix_cache_queries/hits``.

    A request is counted once, when it is first admitted with a lookup; requests re-admitted
    after preemption are counted separately.

    Per KV group g (first admissions only, in g's own blocks): ``group_query_blocks[g]`` sums
    the blocks a hit could cover (``(num_tokens - 1) // block_size_g``: the last token
    is always recomputed) and ``group_hit_blocks[g]`` the
    blocks of g's *own* hit (:attr:`~hybridkv.core.coordinator.CacheHit.group_tokens`: what g's
    rule alone would serve, a multiple of the alignment). A group whose rate sits below the
    others is the one that cut the common hit: a correct EAGLE drop costs each group at most
    one alignment unit per request, a broken write mask leaves one group at 0.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evictions: int = 0
    group_query_blocks: tuple[int, ...] = ()
    group_hit_blocks: tuple[int, ...] = ()

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def block_hit_rate_by_group(self) -> tuple[float, ...]:
        """Per KV group, ``group_hit_blocks / group_query_blocks`` (0.0 where nothing was queried)."""
        return tuple(h / q if q else 0.0 for h, q in zip(self.group_hit_blocks, self.group_query_blocks))
