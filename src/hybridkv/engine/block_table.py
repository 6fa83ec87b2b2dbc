"""Persistent block-table rows, as a GPU model runner keeps them.

A GPU runner does not rebuild block tables every step: it keeps one int tensor per KV-cache
group with a row per batch slot, writes a request's block ids into its row when the manager
hands them out, and lets kernels compute slots straight from the row. A row is *not* cleared
when its request leaves, so entries past the new occupant's blocks hold the previous
occupant's block ids::

    row 1 while request X runs:   [ 7][ 8][ 9][10][11]          X's table (5 blocks)
    row 1 after A takes it:       [ 3][ 4][ 9][10][11]          A's table is [3, 4]
                                           ^^^^^^^^^^^^ stale: X's blocks, now free or reused

A write at a position whose block index is past the request's own table therefore lands in a
block that may now belong to another request. The manager's lookahead reservation is what
keeps draft writes inside the table: k slots for a draft model, **k + 1** for DFlash (bonus
query + k draft queries). :class:`BlockTableRows` reproduces this layout so the engine fails
the way a GPU engine would when that reservation is wrong, and ``row(..., valid_only=True)``
gives the checked view that makes the same mistake raise instead.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from hybridkv.core.validation import check_int


class BlockTableRows:
    """One ``[rows, width]`` int64 table per KV-cache group; rows are reused, never cleared.

    Args:
        num_groups: KV-cache groups.
        num_rows: batch slots (the scheduler's ``max_num_seqs``).
        width: initial entries per row (grown on demand; growth keeps old contents).
    """

    def __init__(self, num_groups: int, num_rows: int, width: int = 16) -> None:
        check_int("num_rows", num_rows, 1)
        self.num_rows = num_rows
        self.tables = [torch.zeros((num_rows, max(width, 1)), dtype=torch.long) for _ in range(num_groups)]
        self._free = list(range(num_rows))
        self._row_of: dict[object, int] = {}
        self._valid: dict[object, list[int]] = {}

    def row_of(self, request_id: object) -> int | None:
        return self._row_of.get(request_id)

    def assign(self, request_id: object) -> int:
        """The request's row: its current one, else the lowest free row (contents untouched)."""
        row = self._row_of.get(request_id)
        if row is not None:
            return row
        if not self._free:
            raise RuntimeError(f"no free block-table row for request {request_id!r}: all "
                               f"{self.num_rows} rows are in use (raise max_num_seqs)")
        row = heapq.heappop(self._free)
        self._row_of[request_id] = row
        self._valid[request_id] = [0] * len(self.tables)
        return row

    def release(self, request_id: object) -> None:
        """Give the row back (its entries stay as they are). Unknown ids: no-op."""
        row = self._row_of.pop(request_id, None)
        if row is not None:
            self._valid.pop(request_id, None)
            heapq.heappush(self._free, row)

    def write(self, request_id: object, tables: Sequence[Sequence[int]]) -> None:
        """Copy the request's block tables (one per group) into its row's first entries."""
        row = self.assign(request_id)
        valid = self._valid[request_id]
        for g, table in enumerate(tables):
            n = len(table)
            buf = self.tables[g]
            if n > buf.shape[1]:
                grown = torch.zeros((buf.shape[0], max(n, 2 * buf.shape[1])), dtype=torch.long)
                grown[:, :buf.shape[1]] = buf
                self.tables[g] = buf = grown
            if n:
                buf[row, :n] = torch.as_tensor(list(table), dtype=torch.long)
            valid[g] = n

    def num_valid(self, request_id: object, group: int) -> int:
        """Entries of the row that hold the request's own blocks."""
        return self._valid[request_id][group]

    def row(self, request_id: object, group: int, valid_only: bool = False) -> torch.Tensor:
        """The request's row for ``group``: the whole row (stale tail included, what a kernel
        sees) or only the entries it owns (``valid_only``)."""
        r = self._row_of[request_id]
        buf = self.tables[group]
        return buf[r, :self._valid[request_id][group]] if valid_only else buf[r]
