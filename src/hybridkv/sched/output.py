"""What one scheduler step computes: batch slots in parallel lists, per-request views on demand.

A step's batch is stored as one slot per scheduled request, in batch order, across parallel
lists (:class:`SchedulerOutput`: ``requests``, ``starts``, ``num_new_tokens``,
``num_draft_tokens``, ``new_block_ids``, ``samples``, ``state_blocks``), so a decode that
allocates nothing costs a few list appends and no object. :attr:`SchedulerOutput.scheduled`
builds the :class:`ScheduledRequest` views of the slots the first time it is read (an engine
reads them; the simulator reads the lists).
"""

from __future__ import annotations

from hybridkv.core.blockref import BlockRef
from hybridkv.core.coordinator import ExternalHit, StateBlocks
from hybridkv.sched.request import EngineRequest


class KVLoad:
    """One request's external load this step: the pool ``blocks`` to fill from the tier."""

    __slots__ = ("req", "external", "blocks")

    def __init__(self, req: EngineRequest, external: ExternalHit, blocks: list[BlockRef]) -> None:
        self.req = req
        self.external = external
        self.blocks = blocks


class ScheduledRequest:
    """One request's share of a step.

    The step computes the KV of ``num_new_tokens`` tokens at positions ``start ..``: the known
    tokens ``token_ids[start : start + num_new_tokens - num_draft_tokens]`` followed by the
    request's ``num_draft_tokens`` drafts. ``samples`` is True when the chunk reaches the end
    of the known tokens, so the step samples (and verifies drafts) for it (None: computed
    from the request's tokens now). ``state_blocks``: for a config with state groups,
    :meth:`KVCacheManager.state_blocks` taken right after the allocation (live extent,
    restore, exports of this step); empty otherwise.
    """

    __slots__ = ("req", "start", "num_new_tokens", "num_draft_tokens", "new_block_ids", "samples",
                 "state_blocks")

    def __init__(self, req: EngineRequest, start: int, num_new_tokens: int, num_draft_tokens: int,
                 new_block_ids: list[list[int]], samples: bool | None = None) -> None:
        self.req = req
        self.start = start
        self.num_new_tokens = num_new_tokens
        self.num_draft_tokens = num_draft_tokens
        self.new_block_ids = new_block_ids
        self.samples = (start + num_new_tokens - num_draft_tokens >= len(req.request.token_ids)
                        if samples is None else samples)
        self.state_blocks: list[StateBlocks] = []

    def token_ids(self) -> list[int]:
        """The tokens to compute: known tokens, then drafts."""
        end = self.start + self.num_new_tokens - self.num_draft_tokens
        known = list(self.req.request.token_ids[self.start:end])
        return known + self.req.spec_token_ids[:self.num_draft_tokens]

    def __repr__(self) -> str:
        return (f"ScheduledRequest({self.req.request_id!r}, start={self.start}, "
                f"new={self.num_new_tokens}, drafts={self.num_draft_tokens})")


class SchedulerOutput:
    """What one step computes.

    Attributes:
        step: the step index (0-based).
        requests, starts, num_new_tokens, num_draft_tokens, samples: one slot per scheduled
            request, in batch order: the request, the first position computed, the tokens
            computed (known tokens then drafts), how many of them are drafts, and whether the
            step samples for it (its chunk reaches the end of its known tokens).
        new_block_ids: per slot, the blocks allocated for it per group, or None when the
            allocation took no block (a quiet decode step): :attr:`scheduled` shows empty lists.
        state_blocks: per slot, :meth:`KVCacheManager.state_blocks` after the allocation
            (configs with state groups; empty otherwise).
        scheduled: the slots as :class:`ScheduledRequest` objects, in batch order (built once,
            on first read).
        num_scheduled_tokens: the sum of ``num_new_tokens`` (<= the token budget).
        preempted: requests preempted this step (their blocks are freed).
        admitted: requests moved from waiting to running this step (new or resumed); their
            ``num_cached_tokens`` is set at their first admission.
        loads: external KV to load this step (with a connector); those requests compute
            nothing this step and join the running set at :meth:`Scheduler.update`.
        saves_before: blocks cached since the last step whose KV is already computed; save
            them before this step's forward pass (their blocks may be reused by it).
        saves_after: blocks cached this step; save them after the forward pass.

    A worker runs a step as: saves_before, loads, forward over ``scheduled``, saves_after.
    """

    __slots__ = ("step", "requests", "starts", "num_new_tokens", "num_draft_tokens",
                 "new_block_ids", "samples", "state_blocks", "num_scheduled_tokens", "preempted",
                 "admitted", "loads", "saves_before", "saves_after", "num_groups", "_scheduled")

    def __init__(self, step: int, num_groups: int = 1) -> None:
        self.step = step
        self.num_groups = num_groups
        self.requests: list[EngineRequest] = []
        self.starts: list[int] = []
        self.num_new_tokens: list[int] = []
        self.num_draft_tokens: list[int] = []
        self.new_block_ids: list[list[list[int]] | None] = []
        self.samples: list[bool] = []
        self.state_blocks: list[list[StateBlocks]] = []
        self.num_scheduled_tokens = 0
        self.preempted: list[EngineRequest] = []
        self.admitted: list[EngineRequest] = []
        self.loads: list[KVLoad] = []
        self.saves_before: list[BlockRef] = []
        self.saves_after: list[BlockRef] = []
        self._scheduled: list[ScheduledRequest] | None = None

    def add(self, req: EngineRequest, start: int, num_new: int, num_drafts: int,
            new_block_ids: list[list[int]] | None, samples: bool) -> None:
        """Append one slot (the scheduler's per-request path)."""
        self.requests.append(req)
        self.starts.append(start)
        self.num_new_tokens.append(num_new)
        self.num_draft_tokens.append(num_drafts)
        self.new_block_ids.append(new_block_ids)
        self.samples.append(samples)

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        if self._scheduled is None:
            g = self.num_groups
            states = self.state_blocks
            views = []
            for j, r in enumerate(self.requests):
                blocks = self.new_block_ids[j]
                s = ScheduledRequest(r, self.starts[j], self.num_new_tokens[j],
                                     self.num_draft_tokens[j],
                                     [[] for _ in range(g)] if blocks is None else blocks,
                                     self.samples[j])
                if states:
                    s.state_blocks = states[j]
                views.append(s)
            self._scheduled = views
        return self._scheduled

    def __repr__(self) -> str:
        return (f"SchedulerOutput(step={self.step}, scheduled={len(self.requests)}, "
                f"tokens={self.num_scheduled_tokens}, preempted={len(self.preempted)}, "
                f"admitted={len(self.admitted)})")
