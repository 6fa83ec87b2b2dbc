"""The requests a simulation serves: work items built from traces, and the one rule of
``max_model_len`` (:func:`served_workload`) that the online run and the offline optimum share.

A :class:`WorkItem` keeps its prompt where it came from (a :class:`TraceRequest` in memory, or a
:class:`MooncakeRecord` whose tokens are expanded from its hash ids when the request arrives), so
memory stays per request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from hybridkv.core.hints import Hint
from hybridkv.sim.traffic.traces import (MOONCAKE_BLOCK_TOKENS, MooncakeRecord, TraceRequest,
                                 expand_block_ids, iter_mooncake_records, trace_stem)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request of a workload, with its prompt built on demand (memory stays per-request).

    ``source`` is a :class:`TraceRequest` (tokens in memory) or a :class:`MooncakeRecord`
    (tokens expanded from its hash ids when the request arrives).
    """

    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    source: TraceRequest | MooncakeRecord

    @property
    def hint(self) -> Hint | None:
        """The hint the trace gives this request, if any."""
        return self.source.hint

    @property
    def checkpoints(self) -> tuple[int, ...]:
        """Prompt positions the trace marks for a checkpoint (:attr:`TraceRequest.checkpoints`)."""
        return getattr(self.source, "checkpoints", ())

    @property
    def session(self) -> str | None:
        """The trace's session of this request, if it names one."""
        return self.source.session

    @property
    def output_ids(self) -> np.ndarray | None:
        """The workload's own output tokens, if it has them."""
        src = self.source
        return src.output_ids if isinstance(src, TraceRequest) else None

    def prompt(self) -> np.ndarray:
        src = self.source
        if isinstance(src, TraceRequest):
            return src.prompt
        return expand_block_ids(src.hash_ids, src.input_length, MOONCAKE_BLOCK_TOKENS)


def items_from_trace(requests: Iterable[TraceRequest]) -> list[WorkItem]:
    """Work items of in-memory trace requests, sorted by arrival (stable)."""
    items = [WorkItem(r.request_id, r.arrival_s, r.prompt_len, r.output_len, r) for r in requests]
    items.sort(key=lambda it: it.arrival_s)
    return items


def items_from_mooncake(path: str, limit: int | None = None) -> list[WorkItem]:
    """Work items of a Mooncake JSONL trace; tokens are expanded lazily (512 per hash id)."""
    stem = trace_stem(path)
    items = [WorkItem(f"{stem}-{i}", rec.timestamp_ms / 1000.0, rec.input_length,
                      rec.output_length, rec)
             for i, rec in enumerate(iter_mooncake_records(path, limit))]
    items.sort(key=lambda it: it.arrival_s)
    return items


#: Pseudo output tokens live above every prompt token id: the one at position ``p`` of a request
#: is ``OUTPUT_TOKEN_BASE + p``; a workload's own answer, once used up, continues with
#: ``OUTPUT_TOKEN_BASE``.
OUTPUT_TOKEN_BASE = 1 << 40


@dataclass(frozen=True, slots=True)
class ServedItem:
    """A work item the online run serves, with the output length it is allowed to generate."""

    item: WorkItem
    max_tokens: int


def served_workload(items: Iterable[WorkItem], max_model_len: int | None) -> tuple[list[ServedItem], int]:
    """The requests a run serves and how many it rejects: the one rule for ``max_model_len``.

    A request whose prompt alone reaches ``max_model_len`` (``prompt_len >= max_model_len``) is
    rejected and counted, as a serving engine refuses it; the others generate
    ``min(max(1, output_len), max_model_len - prompt_len)`` tokens. The online run and the
    offline optimum both use this list, so the bound is computed on exactly the served workload.
    """
    global _SERVED
    memo = _SERVED
    if memo is not None and memo[0] is items and memo[1] == max_model_len:
        return memo[2], memo[3]
    served: list[ServedItem] = []
    rejected = 0
    for it in items:
        max_tokens = max(1, it.output_len)
        if max_model_len is not None:
            if it.prompt_len >= max_model_len:
                rejected += 1
                continue
            max_tokens = min(max_tokens, max_model_len - it.prompt_len)
        served.append(ServedItem(it, max_tokens))
    _SERVED = (items, max_model_len, served, rejected) if isinstance(items, list) else None
    return served, rejected


_SERVED: tuple | None = None   # (items, max_model_len, served, rejected) of the last call


def scale_rate(items: list[WorkItem], scale: float) -> list[WorkItem]:
    """``items`` offered ``scale`` times as fast: every arrival's distance from the first one
    divided by ``scale`` (2: twice the requests per second; the requests themselves unchanged).
    ``scale == 1`` returns ``items`` itself. ValueError unless ``scale`` is a finite number > 0."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise ValueError(f"rate scale must be a finite number > 0, got {scale!r}")
    if scale == 1 or not items:
        return items
    t0 = items[0].arrival_s
    return [dataclasses.replace(it, arrival_s=t0 + (it.arrival_s - t0) / scale) for it in items]


def first_seconds(items: list[WorkItem], duration_s: float) -> list[WorkItem]:
    """The requests of ``items`` (in arrival order) arriving within ``duration_s`` seconds of the
    first one (its arrival + ``duration_s`` included). ValueError unless ``duration_s`` > 0."""
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not duration_s > 0:
        raise ValueError(f"duration must be a number of seconds > 0, got {duration_s!r}")
    if not items:
        return items
    end = items[0].arrival_s + duration_s
    return [it for it in items if it.arrival_s <= end]


__all__ = ["OUTPUT_TOKEN_BASE", "ServedItem", "served_output", "WorkItem", "first_seconds",
           "items_from_mooncake", "items_from_trace", "scale_rate", "served_workload"]


def served_output(served: ServedItem) -> list[int]:
    """The output tokens a run appends to ``served`` (its ``max_tokens`` of them): the
    workload's answer when it has one (padded with :data:`OUTPUT_TOKEN_BASE` past its end),
    else pseudo tokens by position (:data:`OUTPUT_TOKEN_BASE`)."""
    it, m = served.item, served.max_tokens
    ids = it.output_ids
    if ids is not None:
        out = [int(t) for t in ids[:m]]
        return out + [OUTPUT_TOKEN_BASE] * (m - len(out))
    return list(range(OUTPUT_TOKEN_BASE + it.prompt_len, OUTPUT_TOKEN_BASE + it.prompt_len + m))
