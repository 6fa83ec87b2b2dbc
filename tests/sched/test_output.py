"""A step's output (``hybridkv.sched.output``): the slots, their views, and what a slot's
fields mean (module docstring of ``ScheduledRequest``: the step computes the known tokens
``token_ids[start : start + new - drafts]`` then the drafts, and samples when that reaches the
end of the known tokens). Values are computed by hand from those definitions."""

from __future__ import annotations

from hybridkv import KVCacheManager, Request
from hybridkv.sched import EngineRequest, Scheduler, SchedulerConfig
from hybridkv.sched.output import KVLoad, ScheduledRequest, SchedulerOutput
from tests.support.helpers import FA, config


def engine_request(rid: str, n: int, drafts: list[int] = ()) -> EngineRequest:
    r = EngineRequest(Request(rid, list(range(100, 100 + n))), 4)
    r.spec_token_ids = list(drafts)
    return r


def test_a_view_samples_when_its_known_tokens_reach_the_end() -> None:
    """With ``samples`` not given, a 10-token request samples for a chunk ending at 10 known
    tokens, not for one ending at 9; drafts count as computed tokens but not as known ones."""
    r = engine_request("a", 10, drafts=[7, 8])
    assert ScheduledRequest(r, 6, 4, 0, []).samples is True           # known [6, 10)
    assert ScheduledRequest(r, 5, 4, 0, []).samples is False          # known [5, 9)
    assert ScheduledRequest(r, 9, 3, 2, []).samples is True           # [9, 10) + 2 drafts
    assert ScheduledRequest(r, 8, 3, 2, []).samples is False          # [8, 9) + 2 drafts
    assert ScheduledRequest(r, 5, 4, 0, [], samples=True).samples is True   # given: kept
    assert ScheduledRequest(r, 6, 4, 0, [], samples=False).samples is False


def test_a_view_lists_its_known_tokens_then_its_drafts() -> None:
    r = engine_request("a", 10, drafts=[7, 8, 9])
    s = ScheduledRequest(r, 9, 3, 2, [[5]])
    assert s.token_ids() == [109, 7, 8]                                # last known + 2 of 3 drafts
    assert ScheduledRequest(r, 2, 4, 0, [[1]]).token_ids() == [102, 103, 104, 105]
    assert s.new_block_ids == [[5]] and s.state_blocks == [] and (s.start, s.num_new_tokens,
                                                                   s.num_draft_tokens) == (9, 3, 2)
    assert s.req is r
    assert repr(s) == "ScheduledRequest('a', start=9, new=3, drafts=2)"


def test_slots_become_views_in_batch_order_with_empty_lists_for_quiet_steps() -> None:
    """``scheduled`` turns the parallel lists into views, once: a slot whose allocation took no
    block (None) shows one empty list per group; state blocks go with their slot."""
    a, b = engine_request("a", 10), engine_request("b", 5)
    out = SchedulerOutput(3, num_groups=2)
    out.add(a, 0, 8, 0, [[1, 2], [3]], False)
    out.add(b, 4, 1, 0, None, True)
    out.num_scheduled_tokens = 9
    views = out.scheduled
    assert out.scheduled is views                                       # built once
    assert [(v.req, v.start, v.num_new_tokens, v.num_draft_tokens, v.new_block_ids, v.samples)
            for v in views] == [(a, 0, 8, 0, [[1, 2], [3]], False), (b, 4, 1, 0, [[], []], True)]
    assert views[0].state_blocks == [] and views[1].new_block_ids[0] is not views[1].new_block_ids[1]
    assert (out.requests, out.starts, out.num_new_tokens, out.num_draft_tokens, out.samples) == (
        [a, b], [0, 4], [8, 1], [0, 0], [False, True])
    assert repr(out) == "SchedulerOutput(step=3, scheduled=2, tokens=9, preempted=0, admitted=0)"
    with_states = SchedulerOutput(0)
    with_states.add(a, 0, 8, 0, [[1]], False)
    with_states.state_blocks.append(["S"])
    assert with_states.scheduled[0].state_blocks == ["S"]
    empty = SchedulerOutput(7)
    assert (empty.step, empty.num_groups, empty.scheduled, empty.preempted, empty.admitted,
            empty.loads, empty.saves_before, empty.saves_after, empty.state_blocks,
            empty.num_scheduled_tokens) == (7, 1, [], [], [], [], [], [], [], 0)
    load = KVLoad(a, "ext", [[4]])
    assert (load.req, load.external, load.blocks) == (a, "ext", [[4]])


def test_new_block_ids_are_the_blocks_each_step_allocated() -> None:
    """Concatenating a request's ``new_block_ids`` over its steps gives its block table (full
    attention: nothing is released while it runs), and a step that allocates nothing shows
    empty lists. Hand-computed for 4-token blocks: a 10-token prompt takes 3 blocks, decodes
    at 11 and 12 tokens fit them, the 13th token takes a fourth."""
    kv = KVCacheManager(config(FA(4), num_blocks=20))
    for batched in (True, False):
        sched = Scheduler(kv, SchedulerConfig(batched=batched))
        r = EngineRequest(Request(f"a{batched}", list(range(10))), 5)
        sched.add_request(r)
        got, table = [], []
        while sched.has_unfinished():
            out = sched.schedule()
            (s,) = out.scheduled
            got.append([len(ids) for ids in s.new_block_ids])
            table += s.new_block_ids[0]
            assert kv.block_ids(r.request)[0] == table
            sched.update(out, [[1]])
        assert got == [[3], [0], [0], [1], [0]]
        kv.reset_prefix_cache()
