"""Speculative drafters: n-gram lookup, a small draft model, and a DFlash-style parallel drafter.

Each step, after the target forward and greedy verification but before the scheduler's
``update``, the engine hands every scheduled request to :meth:`Drafter.propose` as a
:class:`StepRequest` and gets back up to k draft tokens per sampling request. Drafters that
keep KV (draft model, DFlash) bring it up to date for exactly the positions the target
computed this step, so their cache never lags the target's::

    this step (target):     KV for [start, start + n)         n = known tokens + drafts
    verified:               tokens up to N'  (accepted drafts + one bonus token)
    drafter KV after step:  valid for [0, N')      draft model (catch-up over [start, N'))
                            valid for [0, N' - 1)  DFlash (context entries: the target has
                                                   features only for computed positions)

Draft writes past those positions go into the lookahead slots the manager reserved:

* draft model (k slots): decoding d1 .. d_{k-1} writes positions N' .. N'+k-2;
* DFlash (k+1 slots): the query block [bonus, mask x k] writes positions N'-1 .. N'+k-1;
* n-gram (0 slots): no KV.

All draft writes go through the engine's persistent block-table rows
(:class:`~hybridkv.engine.block_table.BlockTableRows`) without a bounds check, as a GPU kernel
would, unless the engine checks them (``check_draft_slots``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from hybridkv.core.specs import KVCacheGroup
from hybridkv.sched import ScheduledRequest

from .block_table import BlockTableRows
from .kv_cache import PagedKVCache
from .metadata import SequenceInput, build_step_metadata

if TYPE_CHECKING:  # pragma: no cover
    from .models.base import PagedCausalLM
    from .models.dflash import DFlashDraftModel


class DraftHost(Protocol):
    """What a drafter reads from the engine it is bound to (``EngineCore`` is one).

    Attributes:
        model: the target model (DFlash embeds tokens and computes logits with it).
        cache: the paged KV tensors of the target and drafter groups.
        rows: the engine's persistent block-table rows (draft writes go through them).
        device: where the step's tensors live.
        check_draft_slots: whether draft writes past a request's blocks must raise.
    """

    model: PagedCausalLM
    cache: PagedKVCache
    rows: BlockTableRows
    device: torch.device
    check_draft_slots: bool


@dataclass
class StepRequest:
    """One scheduled request's view of a finished target step.

    Attributes:
        sched: the scheduler's share of the step.
        rows: the request's rows in the packed target batch.
        tokens: all tokens after this step: the request's tokens, then ``sampled``.
        sampled: accepted drafts + the bonus token (empty for a partial prefill chunk).
        max_drafts: drafts worth proposing for the next step (0: none).
    """

    sched: ScheduledRequest
    rows: slice
    tokens: list[int]
    sampled: list[int] = field(default_factory=list)
    max_drafts: int = 0

    @property
    def request_id(self) -> object:
        return self.sched.req.request_id

    @property
    def start(self) -> int:
        return self.sched.start

    @property
    def num_known(self) -> int:
        """Known (non-draft) tokens the target computed this step."""
        return self.sched.num_new_tokens - self.sched.num_draft_tokens

    @property
    def computed_end(self) -> int:
        """End of the positions whose target KV now holds real tokens: known + accepted."""
        accepted = len(self.sampled) - 1 if self.sampled else 0
        return self.start + self.num_known + accepted

    @property
    def num_tokens(self) -> int:
        """Tokens after this step (N')."""
        return len(self.tokens)


class Drafter(ABC):
    """Proposes draft tokens; may own KV-cache groups (``is_draft=True``) in the shared config.

    Attributes:
        method: the :class:`~hybridkv.core.spec_decode.SpecDecode` method it implements.
        capture_layers: target decoder layers whose outputs the drafter needs each step.
    """

    method: str = ""
    capture_layers: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.engine: DraftHost | None = None

    def kv_cache_groups(self, block_sizes: dict[str, int], dtype: str) -> tuple[KVCacheGroup, ...]:
        """The drafter's KV-cache groups (none by default)."""
        return ()

    def bind(self, engine: DraftHost) -> None:
        """Attach to the engine (its cache, block-table rows, device)."""
        self.engine = engine

    def max_draft_tokens(self) -> int | None:
        """Most drafts one step can propose (None: no limit of its own)."""
        return None

    @abstractmethod
    def propose(self, requests: Sequence[StepRequest], hidden: torch.Tensor,
                captured: Sequence[torch.Tensor]) -> dict[object, list[int]]:
        """Bring draft KV up to date for the step and return drafts per request id.

        Args:
            requests: every scheduled request of the step, in batch order.
            hidden: the target's final hidden states ``[T, hidden]`` of the packed step.
            captured: outputs of the target layers in :attr:`capture_layers`, ``[T, hidden]`` each.
        """

    # ---- helpers for drafters with KV ---------------------------------------------------------
    def _group_ids(self, layer_names: Sequence[str]) -> tuple[int, ...]:
        assert self.engine is not None
        cache = self.engine.cache
        return tuple(sorted({cache.group_index(n) for n in layer_names}))

    def _tables(self, request_id: object, groups: Sequence[int]) -> dict[str, torch.Tensor]:
        """The request's persistent rows for the drafter's groups (stale tail included unless
        the engine checks draft slots)."""
        assert self.engine is not None
        eng = self.engine
        names = eng.cache.config.groups
        return {names[g].name: eng.rows.row(request_id, g, valid_only=eng.check_draft_slots) for g in groups}

    def _metadata(self, seqs: list[SequenceInput], groups: Sequence[int]):
        assert self.engine is not None
        eng = self.engine
        return build_step_metadata(seqs, eng.cache.config, eng.device, group_indices=groups,
                                   check_blocks=eng.check_draft_slots)


class NgramDrafter(Drafter):
    """Prompt-lookup drafting: find the latest earlier occurrence of the last n tokens (n from
    ``max_n`` down to ``min_n``) and propose the tokens that followed it. No KV."""

    method = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        super().__init__()
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the longest suffix n-gram."""
        n_tok = len(tokens)
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            pattern = list(tokens[n_tok - n:])
            for i in range(n_tok - n - 1, -1, -1):
                if list(tokens[i:i + n]) == pattern:
                    return list(tokens[i + n:i + n + k])
        return []

    def propose(self, requests: Sequence[StepRequest], hidden: torch.Tensor,
                captured: Sequence[torch.Tensor]) -> dict[object, list[int]]:
        return {r.request_id: self.lookup(r.tokens, r.max_drafts) for r in requests if r.max_drafts > 0}


class DraftModelDrafter(Drafter):
    """A small causal LM (same vocabulary) drafting k tokens greedily, one token per pass.

    Its layers live in ``draft.*`` KV-cache groups (``is_draft=True``) of the shared config.
    Each step it first runs the positions the target computed plus the verified tokens
    (``[start, N')``, one batched pass over every scheduled request), which yields d1, then
    k - 1 single-token passes writing d1 .. d_{k-1} into the lookahead slots.
    """

    method = "draft_model"

    def __init__(self, model: PagedCausalLM) -> None:
        super().__init__()
        model.kv_prefix = "draft."
        self.model = model

    def kv_cache_groups(self, block_sizes: dict[str, int], dtype: str) -> tuple[KVCacheGroup, ...]:
        from .kv_groups import kv_cache_groups

        fallback = min(block_sizes.values())
        sizes = {kind: block_sizes.get(kind, fallback) for kind in set(self.model.config.layer_kinds)}
        return kv_cache_groups(self.model, sizes, dtype, is_draft=True)

    def propose(self, requests: Sequence[StepRequest], hidden: torch.Tensor,
                captured: Sequence[torch.Tensor]) -> dict[object, list[int]]:
        assert self.engine is not None
        cache = self.engine.cache
        groups = self._group_ids(self.model.layer_names)
        seqs: list[SequenceInput] = []
        drafting: list[tuple[int, StepRequest]] = []
        for r in requests:
            end = r.num_tokens if r.sampled else r.computed_end
            if end <= r.start:
                continue
            if r.sampled and r.max_drafts > 0:
                drafting.append((len(seqs), r))
            seqs.append(SequenceInput(r.tokens[r.start:end], r.start, self._tables(r.request_id, groups)))
        if not seqs:
            return {}
        meta = self._metadata(seqs, groups)
        h = self.model.hidden_states(meta, cache)
        if not drafting:
            return {}
        last = torch.tensor([meta.seq_rows[i].stop - 1 for i, _ in drafting], device=h.device)
        nxt = self.model.compute_logits(h[last]).argmax(-1).tolist()
        drafts = {r.request_id: [t] for (_, r), t in zip(drafting, nxt)}
        active = [r for _, r in drafting if r.max_drafts > 1]
        step = 1
        while active:
            seqs = [SequenceInput([drafts[r.request_id][-1]], r.num_tokens + step - 1,
                                  self._tables(r.request_id, groups)) for r in active]
            logits = self.model(self._metadata(seqs, groups), cache, logits="last")
            for r, row in zip(active, logits):
                drafts[r.request_id].append(int(row[0].argmax()))
            step += 1
            active = [r for r in active if len(drafts[r.request_id]) < r.max_drafts]
        return drafts


class DFlashDrafter(Drafter):
    """DFlash-style parallel drafting (see :mod:`hybridkv.engine.models.dflash`).

    Per step: (1) write context entries for the positions the target computed with real
    tokens, ``[start, N' - 1)``, from the captured target features, for every scheduled
    request at once; (2) for each sampling request run one query block ``[bonus, mask x j]``
    at positions ``N' - 1 .. N' + j - 1`` (its K/V lands in the k+1 lookahead slots) and take
    the j drafts from the mask rows.
    """

    method = "dflash"

    def __init__(self, model: DFlashDraftModel) -> None:
        super().__init__()
        self.model = model
        self.capture_layers = model.target_layer_ids

    def max_draft_tokens(self) -> int | None:
        return self.model.max_draft_tokens

    def kv_cache_groups(self, block_sizes: dict[str, int], dtype: str) -> tuple[KVCacheGroup, ...]:
        return self.model.kv_cache_groups(block_sizes.get("full", min(block_sizes.values())), dtype)

    def select(self, request: StepRequest, logits: torch.Tensor) -> list[int]:
        """Drafts from the mask rows' logits ``[j, vocab]`` (greedy)."""
        return logits.argmax(-1).tolist()

    def propose(self, requests: Sequence[StepRequest], hidden: torch.Tensor,
                captured: Sequence[torch.Tensor]) -> dict[object, list[int]]:
        assert self.engine is not None
        eng = self.engine
        groups = self._group_ids(self.model.layer_names)
        # (1) context entries for every position the target computed with a real token
        seqs, rows = [], []
        for r in requests:
            n = r.computed_end - r.start
            if n <= 0:
                continue
            seqs.append(SequenceInput(r.tokens[r.start:r.computed_end], r.start,
                                      self._tables(r.request_id, groups)))
            rows.append(torch.arange(r.rows.start, r.rows.start + n))
        if seqs:
            idx = torch.cat(rows).to(hidden.device)
            self.model.write_context([f[idx] for f in captured], self._metadata(seqs, groups), eng.cache)
        # (2) one non-causal query block per sampling request
        drafting = [r for r in requests if r.sampled and r.max_drafts > 0]
        if not drafting:
            return {}
        mask = self.model.mask_token_id
        blocks = [SequenceInput([r.tokens[-1]] + [mask] * r.max_drafts, r.num_tokens - 1,
                                self._tables(r.request_id, groups), causal=False) for r in drafting]
        meta = self._metadata(blocks, groups)
        target = eng.model
        h = self.model.block_hidden(target.embed(meta.token_ids), meta, eng.cache)
        out: dict[object, list[int]] = {}
        for r, rs in zip(drafting, meta.seq_rows):
            logits = target.compute_logits(h[rs.start + 1:rs.stop])
            out[r.request_id] = [int(t) for t in self.select(r, logits)]
        return out
