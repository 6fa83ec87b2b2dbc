"""Recurrent states in the paged pool: live states and checkpoints as extents.

The core (docs/state-groups.md §2.9) gives each running request, per state group, a *live*
extent (``k = config.extent_blocks(g)`` block ids) and asks for *checkpoint* extents at some
positions. Each layer of a state group stores one state in its own layer slot of those ``k``
pages, as one flat byte buffer ``cat(pages)[:page_size_bytes]`` = conv state, then recurrent
state, in the spec's dtypes. :class:`StatePages` reads and writes those buffers.

:class:`PooledStates` drives a state model's step from them; the pool is the only place a
request's state lives between steps (the model's
:class:`~hybridkv.engine.models.recurrent.RecurrentStateStore` only holds the step's working
copies):

* :meth:`PooledStates.begin` (before the forward pass): a request whose step starts at its
  cache hit starts from the checkpoint ``restore_from`` (the live extent then gets the state
  after the step, the checkpoint stays immutable); any other request at ``start > 0`` starts
  from its live extent; ``start == 0`` from zeros. A hit on a checkpoint that an earlier
  request of the same batch exports in this very step is served from that request's snapshot
  inside the forward pass (``RequestState.sources``). Returns the export positions per
  sequence, which the layers then snapshot (``SequenceInput.state_marks``).
* :meth:`PooledStates.finish` (after verification): writes every export's state into its
  checkpoint extent and the state at the accepted length into the live extent, then drops the
  working copy. Exports are never beyond the accepted tokens (the core only asks for
  positions ``<= request.num_tokens``, which excludes drafts), and a missing state raises
  :class:`~hybridkv.engine.models.recurrent.StateMissingError` instead of writing a wrong one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from hybridkv.core.specs import StateSpec, is_state
from hybridkv.sched.scheduler import ScheduledRequest

from .kv_cache import PagedKVCache, torch_dtype
from .models.recurrent import RecurrentStateStore, RequestState

Tensors = dict[int, torch.Tensor]


class _StateGroup(NamedTuple):
    spec: StateSpec
    layers: tuple[tuple[int, torch.Tensor], ...]   # (model layer index, [num_blocks, page] uint8)


class StatePages:
    """The state groups of a :class:`PagedKVCache` as flat per-layer byte buffers.

    Args:
        cache: the paged cache (its config's state groups are used).
        layer_index: model layer index of every state layer name.
    """

    def __init__(self, cache: PagedKVCache, layer_index: Mapping[str, int]) -> None:
        self.device = cache.device
        self.groups: dict[int, _StateGroup] = {}
        for g, group in enumerate(cache.config.groups):
            if is_state(group.spec):
                pages = cache.state_pages(g)
                self.groups[g] = _StateGroup(group.spec, tuple(
                    (layer_index[name], pages[j]) for j, name in enumerate(group.layer_names)))

    def _ids(self, extent: Sequence[int]) -> torch.Tensor:
        if not extent or 0 in extent:
            raise ValueError(f"a state extent needs real block ids, got {tuple(extent)}")
        return torch.tensor(list(extent), dtype=torch.long, device=self.device)

    def read(self, group: int, extent: Sequence[int]) -> tuple[Tensors, Tensors]:
        """Every layer's ``(conv, ssm)`` stored in ``extent`` (ssm as fp32, conv in its dtype)."""
        spec, layers = self.groups[group]
        ids = self._ids(extent)
        cb, total = spec.conv_bytes, spec.page_size_bytes
        conv: Tensors = {}
        ssm: Tensors = {}
        for li, pages in layers:
            flat = pages[ids].reshape(-1)
            conv[li] = flat[:cb].clone().view(torch_dtype(spec.conv_dtype)).view(spec.conv_shape)
            ssm[li] = flat[cb:total].clone().view(torch_dtype(spec.state_dtype)).view(spec.state_shape).float()
        return conv, ssm

    def write(self, group: int, extent: Sequence[int], conv: Mapping[int, torch.Tensor],
              ssm: Mapping[int, torch.Tensor]) -> None:
        """Store every layer's ``(conv, ssm)`` into ``extent`` (cast to the spec's dtypes)."""
        spec, layers = self.groups[group]
        ids = self._ids(extent)
        for li, pages in layers:
            c, s = conv[li], ssm[li]
            if tuple(c.shape) != spec.conv_shape or tuple(s.shape) != spec.state_shape:
                raise ValueError(f"layer {li}: state shapes {tuple(c.shape)}, {tuple(s.shape)} do not match "
                                 f"the spec's {spec.conv_shape}, {spec.state_shape}")
            flat = torch.cat((c.to(torch_dtype(spec.conv_dtype)).contiguous().view(-1).view(torch.uint8),
                              s.to(torch_dtype(spec.state_dtype)).contiguous().view(-1).view(torch.uint8)))
            buf = flat.new_zeros(ids.numel() * pages.shape[1])
            buf[:flat.numel()] = flat
            pages[ids] = buf.view(ids.numel(), pages.shape[1])

    def copy(self, group: int, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy the state in extent ``src`` into extent ``dst`` (every layer of the group)."""
        a, b = self._ids(src), self._ids(dst)
        if a.numel() != b.numel():
            raise ValueError(f"extents of different sizes: {tuple(src)} -> {tuple(dst)}")
        for _, pages in self.groups[group][1]:
            pages[b] = pages[a]


class PooledStates:
    """A state model's per-step bridge between the pool and its working states (module doc)."""

    def __init__(self, pages: StatePages, store: RecurrentStateStore) -> None:
        self.pages = pages
        self.store = store

    def begin(self, scheduled: Sequence[ScheduledRequest]) -> list[tuple[int, ...]]:
        """Load every scheduled request's state at its ``start``; returns, per request, the
        positions this step exports (to be snapshotted by the layers)."""
        exporting: dict[int, tuple[object, int]] = {}     # checkpoint head -> (request id, position)
        marks: list[tuple[int, ...]] = []
        for s in scheduled:
            key = s.req.request_id
            state = RequestState(s.start)
            for sb in s.state_blocks:
                layers = [li for li, _ in self.pages.groups[sb.group].layers]
                if sb.restore_from:
                    if sb.restore_position != s.start:
                        raise RuntimeError(f"request {key!r} starts at {s.start} but restores the "
                                           f"checkpoint after {sb.restore_position} tokens")
                    src = exporting.get(sb.restore_from[0])
                    if src is not None:                  # written by an earlier request this step
                        state.sources.update({li: src for li in layers})
                        continue
                    conv, ssm = self.pages.read(sb.group, sb.restore_from)
                elif s.start > 0:
                    conv, ssm = self.pages.read(sb.group, sb.live)
                else:
                    continue
                state.conv.update(conv)
                state.ssm.update(ssm)
            for sb in s.state_blocks:
                for e in sb.exports:
                    exporting[e.blocks[0]] = (key, e.position)
            if s.start > 0:
                self.store.commit(key, state)
            else:
                self.store.release(key)
            marks.append(tuple(sorted({e.position for sb in s.state_blocks for e in sb.exports})))
        return marks

    def finish(self, s: ScheduledRequest, position: int) -> None:
        """After the step (and verification): write the exports and the live state after
        ``position`` tokens (the accepted length) into the pool; drop the working copy."""
        key = s.req.request_id
        state = self.store.get(key)
        for sb in s.state_blocks:
            for e in sb.exports:
                if e.position > position:
                    raise RuntimeError(f"request {key!r}: checkpoint at {e.position} lies beyond the "
                                       f"{position} accepted tokens")
                self.pages.write(sb.group, e.blocks, *state.at(e.position))
            self.pages.write(sb.group, sb.live, *state.at(position))
        self.store.release(key)
