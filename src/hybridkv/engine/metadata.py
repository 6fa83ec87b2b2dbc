"""Per-step inputs and the attention metadata derived from block tables.

A step packs the new tokens of several sequences into one flat batch of ``T`` tokens::

    packed tokens:  [ seq 0 new tokens | seq 1 new tokens | ... ]      T = sum(len(new))
    seq i:          cached tokens [0, start)  +  new tokens [start, start + n)

For every KV-cache group ``g`` (block size ``bs``; its hit rule, :mod:`hybridkv.core.rules`,
says which keys a query at q reads: ``[first_key(q), q]``) the metadata holds:

* ``write_blocks/write_offsets`` ``[T]``: where each new token's K/V goes,
  ``block = table[pos // bs]``, ``offset = pos % bs`` (slot ``block * bs + offset``);
* per sequence, the key positions it reads, ``[lo, start + n)`` with
  ``lo = max(0, first_key(start))`` (0 for full attention, ``start - W + 1`` for a sliding
  window, the chunk start for chunked-local attention), their pages, and the mask
  ``first_key(q) <= k <= q``.

Contract with the block manager: every table entry that covers a written or read position must
be a real block (``1 <= id < num_blocks``); entries for positions no query reads (before ``lo``)
may be the null block 0 and are never touched. Violations raise ValueError naming the sequence,
group and position, so a manager bug fails loudly instead of reading garbage.

``check_blocks=False`` models a GPU kernel instead: slots are computed from whatever the table
holds (a persistent block-table row may carry stale ids past the request's blocks) and only the
table length is checked. Drafters use it so that a too-small lookahead reservation corrupts
memory exactly as it would on a GPU (see :mod:`hybridkv.engine.block_table`).

A sequence with ``causal=False`` lets its new tokens see each other in both directions (they
still see every cached token before ``start``): the query block of a DFlash drafter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hybridkv.core.rules import make_rule
from hybridkv.core.specs import KVCacheConfig

from .kv_cache import NULL_BLOCK

BlockTables = Sequence[Sequence[int]] | Mapping[str, Sequence[int]]


@dataclass(frozen=True)
class SequenceInput:
    """One sequence's share of a step.

    Attributes:
        token_ids: the new tokens to run (non-empty).
        start: tokens of this sequence already in the cache (= position of ``token_ids[0]``).
        block_tables: per KV-cache group, that group's block table for this sequence: either a
            sequence ordered like ``KVCacheConfig.groups`` or a mapping from group name.
            Entry ``j`` holds tokens ``[j * bs, (j + 1) * bs)``; 0 = null (never read). A table
            may be a 1-D integer tensor.
        causal: False lets the new tokens attend to each other bidirectionally.
        state_key: the owner of the sequence's recurrent state in a state model (the request
            id; :mod:`hybridkv.engine.models.recurrent`); ignored by attention-only models.
        snapshot_from: a verify step's first acceptable length: state models keep their state
            after every length in ``[snapshot_from, end)`` so rejected drafts can be dropped.
        state_marks: more lengths after which a state model keeps its state this step (the
            checkpoints the step exports, :mod:`hybridkv.engine.state_pages`).
    """

    token_ids: Sequence[int]
    start: int
    block_tables: BlockTables
    causal: bool = True
    state_key: object = None
    snapshot_from: int | None = None
    state_marks: tuple[int, ...] = ()

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class SequenceAttention:
    """What one sequence reads in one group.

    Attributes:
        rows: the sequence's rows in the packed batch (``slice``).
        key_blocks / key_offsets: ``[L]`` pages and in-page offsets of the keys read.
        mask: ``[n, L]`` bool, True where query ``i`` may attend key ``j``.
    """

    rows: slice
    key_blocks: torch.Tensor
    key_offsets: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True)
class GroupMetadata:
    """Write slots and per-sequence reads of one KV-cache group for one step."""

    block_size: int
    window: int | None
    write_blocks: torch.Tensor
    write_offsets: torch.Tensor
    sequences: tuple[SequenceAttention, ...]
    chunk: int | None = None

    @property
    def slot_mapping(self) -> torch.Tensor:
        """``[T]`` flat slots ``block * block_size + offset`` of the new tokens."""
        return self.write_blocks * self.block_size + self.write_offsets


@dataclass(frozen=True)
class StepMetadata:
    """Everything a forward pass needs besides the weights and the cache."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    groups: tuple[GroupMetadata | None, ...]
    seq_rows: tuple[slice, ...]
    starts: tuple[int, ...] = ()
    state_keys: tuple[object, ...] = ()
    snapshot_from: tuple[int | None, ...] = ()
    state_marks: tuple[tuple[int, ...], ...] = ()


def _table_for(seq: SequenceInput, config: KVCacheConfig, gi: int, si: int) -> Sequence[int]:
    tables = seq.block_tables
    if isinstance(tables, Mapping):
        name = config.groups[gi].name
        if name not in tables:
            raise ValueError(f"sequence {si}: no block table for group {name!r}")
        return tables[name]
    if len(tables) != len(config.groups):
        raise ValueError(
            f"sequence {si}: {len(tables)} block tables for {len(config.groups)} KV-cache groups"
        )
    return tables[gi]


def _pages(table: torch.Tensor, lo: int, hi: int, bs: int, num_blocks: int,
           what: str, si: int, group: str, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Pages and offsets of positions ``[lo, hi)``; raises on missing, null or out-of-range blocks
    (with ``check=False`` only on missing entries)."""
    positions = torch.arange(lo, hi)
    entries = positions // bs
    if hi > 0 and (hi - 1) // bs >= len(table):
        raise ValueError(
            f"sequence {si}, group {group!r}: block table has {len(table)} entries but "
            f"{what} position {hi - 1} needs entry {(hi - 1) // bs}"
        )
    blocks = table[entries]
    if not check:
        return blocks, positions % bs
    bad = (blocks <= NULL_BLOCK) | (blocks >= num_blocks)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"sequence {si}, group {group!r}: {what} position {int(positions[i])} maps to block "
            f"{int(blocks[i])} (table entry {int(entries[i])}); need a real block in [1, {num_blocks})"
        )
    return blocks, positions % bs


def _as_table(table: Sequence[int] | torch.Tensor) -> torch.Tensor:
    if isinstance(table, torch.Tensor):
        return table.to(device="cpu", dtype=torch.long)
    return torch.tensor([int(b) for b in table], dtype=torch.long)


def build_step_metadata(
    seqs: Sequence[SequenceInput], config: KVCacheConfig, device: torch.device | str = "cpu",
    group_indices: Sequence[int] | None = None, check_blocks: bool = True,
) -> StepMetadata:
    """Turn the sequences of one step into packed tokens, positions and per-group metadata.

    Args:
        seqs: the step's sequences.
        config: the KV-cache config the tables index into.
        device: where the tensors go.
        group_indices: build metadata only for these groups (the others are None in
            ``StepMetadata.groups``); default all. A mapping table needs only these groups.
        check_blocks: refuse null or out-of-range blocks (default); False: trust the tables.

    Raises:
        ValueError: empty batch or sequence, negative start, missing table entry, or (when
            checking) a null / out-of-range block where a token is written or read.
    """
    if not seqs:
        raise ValueError("a step needs at least one sequence")
    num_blocks = int(config.num_blocks)  # type: ignore[arg-type]
    tokens: list[int] = []
    positions: list[int] = []
    rows: list[slice] = []
    for si, seq in enumerate(seqs):
        if len(seq.token_ids) == 0:
            raise ValueError(f"sequence {si} has no new tokens")
        if seq.start < 0:
            raise ValueError(f"sequence {si}: start must be >= 0, got {seq.start}")
        rows.append(slice(len(tokens), len(tokens) + len(seq.token_ids)))
        tokens.extend(int(t) for t in seq.token_ids)
        positions.extend(range(seq.start, seq.end))

    wanted = range(len(config.groups)) if group_indices is None else sorted(set(group_indices))
    groups: list[GroupMetadata | None] = [None] * len(config.groups)
    for gi in wanted:
        group = config.groups[gi]
        rule = make_rule(group.spec)
        bs = rule.block_size
        write_blocks: list[torch.Tensor] = []
        write_offsets: list[torch.Tensor] = []
        per_seq: list[SequenceAttention] = []
        for si, seq in enumerate(seqs):
            table = _as_table(_table_for(seq, config, gi, si))
            wb, wo = _pages(table, seq.start, seq.end, bs, num_blocks, "written", si, group.name,
                            check_blocks)
            write_blocks.append(wb)
            write_offsets.append(wo)
            lo = max(0, rule.first_key(seq.start))
            rb, ro = _pages(table, lo, seq.end, bs, num_blocks, "read", si, group.name, check_blocks)
            q = torch.arange(seq.start, seq.end, device=device)[:, None]
            k = torch.arange(lo, seq.end, device=device)[None, :]
            # causal: key <= query; a non-causal block sees every new token of its sequence
            mask = k <= q if seq.causal else k < seq.end
            if not rule.downward_closed:
                mask &= k >= rule.first_key(q)
            per_seq.append(SequenceAttention(
                rows=rows[si],
                key_blocks=rb.to(device),
                key_offsets=ro.to(device),
                mask=mask,
            ))
        blocks, offsets = torch.cat(write_blocks), torch.cat(write_offsets)
        if torch.unique(blocks * bs + offsets).numel() != blocks.numel():
            raise ValueError(f"group {group.name!r}: two new tokens of this step map to the same slot")
        groups[gi] = GroupMetadata(
            block_size=bs,
            window=rule.window,
            chunk=rule.chunk,
            write_blocks=blocks.to(device),
            write_offsets=offsets.to(device),
            sequences=tuple(per_seq),
        )
    return StepMetadata(
        token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        groups=tuple(groups),
        seq_rows=tuple(rows),
        starts=tuple(seq.start for seq in seqs),
        state_keys=tuple(seq.state_key for seq in seqs),
        snapshot_from=tuple(seq.snapshot_from for seq in seqs),
        state_marks=tuple(seq.state_marks for seq in seqs),
    )
