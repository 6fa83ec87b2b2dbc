"""The contract every per-type hit rule fulfils.

A rule is built from one attention spec (and, for EAGLE drop mode, a boundary-proof flag) and
answers every per-type question the rest of hybridkv asks; no other module switches on a
spec's type. Positions are in the group's own blocks (``e`` = a hit of ``e * block_size``
tokens) or tokens (``c``, ``q``), as each method says.

Read and write mask (one definition, :meth:`HitRule.lo` and :meth:`HitRule.span`)::

    a hit ending at block boundary e needs the cached run [lo(e), e + proof)
    lo is non-decreasing in e; proof = 1 in EAGLE drop mode for draft groups (the block
    after the hit proves the token the drafter read at e*bs - 1), else 0

    read  (lookup):  longest_hit(probe, e_max, step) = the largest aligned e whose run is cached
    write (caching): the union of span(e) over the promised ends e (core/retention.py)

Window release (no query at or after ``c`` reads the first ``skipped_tokens(c)`` tokens, so
those blocks go back to the pool; ``next_skip_growth`` is when that count next grows by a
block, which is what lets the coordinator's decode fast path skip the check).

Other consumers: :meth:`first_key` and :meth:`key_pairs` (cost model, engine attention mask),
:meth:`max_blocks` (pool sizing), :meth:`recompute_cost` (a hint for eviction policies),
:attr:`window` / :attr:`chunk` (the engine's attention parameters).

The type's facts are class attributes, so a new type states them where it is registered and
nobody else switches on it: :attr:`kind` (its name in reports, events and logs),
:attr:`cost_kind` (which calibrated time multiplier the step-time model applies to it),
:attr:`wire_kind` / :attr:`windowed_wire_kind` (vLLM's ``KVCacheSpecKind`` in KV events);
what one cached position stores is the spec's own fact (:attr:`AttentionSpec.storage`).
``tests/core/test_attention_types.py`` checks that every registered type has every fact.

Adding a type: subclass :class:`HitRule` in a new module of this package, implement
:meth:`lo` (and whatever the defaults below get wrong for it), and register it for its spec
class in ``hybridkv/core/rules/__init__.py``. A recurrent-state group (issue 13, "a hit at t
needs a checkpoint exactly at t") is ``lo(e) = e - 1`` over checkpoint slots, releases every
slot below the latest one, and reads one state per query.
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar

from hybridkv.core.registry import Registry
from hybridkv.core.specs import AttentionSpec


def probe_flags(probe: Callable[[int], object]) -> list[bool] | None:
    """The list of bools behind ``probe`` when it is that list's ``__getitem__`` (a scan may
    then use C-level slicing, ``all`` and ``index``), else None."""
    flags = getattr(probe, "__self__", None)
    return flags if type(flags) is list else None


class HitRule:
    """The hit rule of one group (or of identical sibling groups looked up together).

    Args:
        spec: the group's attention spec (its block size and type parameters).
        proof: True for draft groups in EAGLE drop mode (the block after a hit is required).

    Subclasses implement :meth:`lo` and :meth:`key_pairs` and may override the rest.
    Every method is pure.
    """

    #: the type's name in reports, events and logs
    kind: ClassVar[str] = ""
    #: the step-time model's attention kind (``hybridkv.cost.calibration.ATTENTION_KINDS``) a
    #: layer of this type is timed as
    cost_kind: ClassVar[str] = ""
    #: vLLM's ``KVCacheSpecKind`` value for this type's groups in KV events, and the one used
    #: when the spec has a window (``window_tokens``), if that differs ("" = the same)
    wire_kind: ClassVar[str] = ""
    windowed_wire_kind: ClassVar[str] = ""
    #: lo(e) == 0 for every e: every aligned prefix of a servable hit is servable, so the
    #: lookup scans once, the write path caches every aligned block as it is computed (no
    #: retention: the request holds those blocks anyway), and no block ever leaves the table.
    downward_closed: ClassVar[bool] = False
    #: a recurrent-state group (:mod:`~hybridkv.core.rules.state`): table entries are sparse
    #: checkpoints, each an extent of the pool, plus one live state per request outside the
    #: table; never given a proof block (no drafter has recurrent layers)
    sparse: ClassVar[bool] = False

    __slots__ = ("spec", "block_size", "proof")

    def __init__(self, spec: AttentionSpec, proof: bool = False) -> None:
        self.spec = spec
        self.block_size: int = spec.block_size
        self.proof = int(proof)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, proof={bool(self.proof)})"

    # ---- engine attention parameters --------------------------------------------------------
    @property
    def window(self) -> int | None:
        """Sliding-window size in tokens (a query at q reads ``(q - window, q]``), else None."""
        return None

    @property
    def chunk(self) -> int | None:
        """Chunk size in tokens (a query reads only its own chunk), else None."""
        return None

    # ---- read and write mask ----------------------------------------------------------------
    def lo(self, e: int) -> int:
        """First block a hit ending at block boundary ``e`` needs (non-decreasing in e)."""
        raise NotImplementedError

    def span(self, e: int) -> tuple[int, int]:
        """The blocks ``[lo, hi)`` a hit ending at block boundary e needs cached."""
        return self.lo(e), e + self.proof

    def longest_hit(self, probe: Callable[[int], object], e_max: int, step: int) -> int:
        """The largest e <= e_max, e a multiple of ``step``, whose run is cached (0 if none).

        ``probe(i)`` returns a truthy value iff block i is cached; e_max must already respect
        the blocks that exist (``e_max + proof <= number of hashed blocks``). Each block is
        probed at most once. This default scans each candidate's run right to left and jumps
        past a miss. A probe that is a ``list``'s ``__getitem__`` over bools (the
        coordinator's) is scanned in C (:func:`probe_flags`), with the same answer; there a
        candidate whose last block misses is passed without reading its run.
        """
        proof = self.proof
        e = e_max // step * step
        flags = probe_flags(probe)
        while e > 0:
            lo = self.lo(e)
            j = e + proof - 1
            if flags is not None and len(run := flags[lo:j + 1]) == j + 1 - lo:
                if all(run):
                    return e
                run.reverse()
                j -= run.index(False)                 # the rightmost miss, found in C
            else:
                while j >= lo and probe(j):
                    j -= 1
                if j < lo:
                    return e
            # block j misses: every candidate whose run contains j fails; runs only move
            # left as e shrinks, so the next candidate must end (with its proof) at or below j.
            e = (j - proof) // step * step
            if flags is not None:
                # a candidate whose last block misses fails too (its run holds that block, as
                # lo(e) <= e + proof - 1): pass it without reading its whole run
                while e > 0 and e + proof <= len(flags) and not flags[e + proof - 1] \
                        and self.lo(e) < e + proof:
                    e -= step
        return 0

    # ---- window release ---------------------------------------------------------------------
    def skipped_tokens(self, num_computed: int, hold: int = 0) -> int:
        """Leading tokens that no query at or after position ``num_computed`` reads.

        ``hold`` keeps that many more tokens: the write path caches an end's run only once
        every group's run for it is complete, which a proof block delays (one block), and
        the final-length promise needs one alignment unit more.
        """
        return 0

    def next_skip_growth(self, num_computed: int, hold: int = 0) -> float:
        """The smallest ``c > num_computed`` whose ``skipped_tokens(c) // block_size`` is
        larger (``inf`` if it never grows): below it, no block leaves the window."""
        return math.inf

    def max_blocks(self, length: int, hold: int = 0) -> int:
        """Blocks one request of ``length`` tokens holds at once at most (pool sizing).

        Local rules add two blocks to their reach: one chunked-prefill step in flight.
        """
        return -(-length // self.block_size)

    def admission_cap(self, max_in_flight_tokens: int | None, max_len: float) -> int | None:
        """vLLM 0.33's per-request admission cap in blocks (``max_admission_blocks_per_request``
        of its spec), used by compat mode's full-sequence reservation; None: uncapped.
        ``max_in_flight_tokens`` None: only ``max_len`` (max_model_len, or inf) caps it."""
        return None

    # ---- cost: which keys a query reads -----------------------------------------------------
    def first_key(self, q: Any) -> Any:
        """The first key position a query at position ``q`` reads (<= 0 means 0).

        Pure arithmetic, so ``q`` may be an int, a numpy array or a torch tensor.
        """
        return q * 0

    def key_pairs(self, x: Any) -> Any:
        """(query, key) pairs of the queries at positions ``[0, x)``: ``Σ_{q<x} (q + 1 -
        max(0, first_key(q)))``. Pure arithmetic (ints exact; arrays elementwise)."""
        raise NotImplementedError

    def attention_keys(self, new: Any, context: Any) -> Any:
        """(query, key) pairs one layer computes for the queries ``[context, context + new)``."""
        return self.key_pairs(context + new) - self.key_pairs(context)

    def kv_span(self, new: Any, context: Any) -> Any:
        """Distinct KV positions the queries ``[context, context + new)`` read in one layer."""
        f = self.first_key(context)
        return context + new - f * (f > 0)

    def attention_keys_sum(self, new: list[int], context: list[int]) -> int:
        """``sum(attention_keys(n, c))`` over a batch's requests (lists of ints: exact)."""
        return sum(map(self.attention_keys, new, context))

    def kv_span_sum(self, new: list[int], context: list[int]) -> int:
        """``sum(kv_span(n, c))`` over a batch's requests (lists of ints: exact)."""
        return sum(map(self.kv_span, new, context))

    def span_sum_max(self, new: list[int], context: list[int]) -> tuple[int, int]:
        """The sum and the maximum of ``kv_span(n, c) + n`` (the positions one layer reads and
        writes) over a batch of at least one request (lists of ints: exact)."""
        span = [k + n for k, n in zip(map(self.kv_span, new, context), new)]
        return sum(span), max(span)

    def recompute_cost(self, j: int) -> int:
        """Eviction hint: (query, key) pairs to recompute block ``j``'s tokens given its
        prefix (attention work only; the per-token linear work is the same for every block).
        Unused by LRU; a cost-aware policy weighs it against the block's bytes."""
        bs = self.block_size
        return int(self.attention_keys(bs, j * bs))


#: Spec type -> its rule class; a subclass of a registered spec type inherits its parent's rule.
RULES: Registry[type[HitRule]] = Registry("hit rule", by_type=True, key_base=AttentionSpec,
                                          value_base=HitRule)
