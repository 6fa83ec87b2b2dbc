"""The scheduler with an external KV tier (its ``connector``), on hand-built steps: which
requests wait for a load, how many seats and blocks a load takes, what counts as loaded and as
cached, when a load that does not fit waits, and which blocks the step hands the connector to
save. The tier is an in-process stub of the :class:`~hybridkv.sched.scheduler.ExternalKV`
contract: it holds every block of the requests it is told about (``match`` goes through
:meth:`KVCacheManager.lookup_external`, so the core's hit rules decide how far a load reaches)
and drains what the manager caches (:meth:`KVCacheManager.add_cached_listener`), as
:class:`~hybridkv.connectors.connector.KVConnector` does over a real store."""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request
from hybridkv.core.blockref import BlockRef
from hybridkv.sched import EngineRequest, RequestStatus, Scheduler, SchedulerConfig
from tests.support.helpers import FA, config


class Tier:
    """Holds every block of the requests named in ``holds`` (all requests: None)."""

    def __init__(self, kv: KVCacheManager, holds: set | None = None) -> None:
        self.kv = kv
        self.holds = holds
        self.pending: list[BlockRef] = []
        kv.add_cached_listener(
            lambda g, hashes, blocks: self.pending.extend(BlockRef(g, b, h) for h, b in zip(hashes, blocks)))

    def match(self, request, hit):
        if self.holds is not None and request.request_id not in self.holds:
            return None
        return self.kv.lookup_external(request, hit, lambda g, h: True)

    def take_saves(self) -> list[BlockRef]:
        out, self.pending = self.pending, []
        return out


def setup(num_blocks: int, holds: set | None = None, **sched_kw) -> tuple[KVCacheManager, Scheduler]:
    kv = KVCacheManager(config(FA(4), num_blocks=num_blocks))
    return kv, Scheduler(kv, SchedulerConfig(**sched_kw), connector=Tier(kv, holds))


def req(rid: str, n: int, max_tokens: int, base: int = 0) -> EngineRequest:
    return EngineRequest(Request(rid, list(range(base, base + n))), max_tokens)


def steps(out) -> list[tuple[str, int, int]]:
    return [(s.req.request_id, s.start, s.num_new_tokens) for s in out.scheduled]


def loads(out) -> list[tuple[str, int, int]]:
    return [(ld.req.request_id, ld.external.local_tokens, ld.external.num_tokens) for ld in out.loads]


def run(sched: Scheduler, out, ok: bool = True) -> list[EngineRequest]:
    return sched.update(out, [[1] if s else None for s in out.samples],
                        loaded={ld.req.request_id: ok for ld in out.loads})


def test_a_load_takes_the_blocks_it_fills_and_the_request_waits_for_it() -> None:
    """A 16-token prompt the tier holds: 12 tokens load (the last block is computed) into
    exactly 3 blocks, the request's only blocks, and no step computes it before the load
    reports; ``pending_external`` is the load's plan until then. Loaded tokens then count as
    computed and as external, not as a prefix-cache hit."""
    kv, sched = setup(20)
    a = req("a", 16, 2)
    sched.add_request(a)
    out = sched.schedule()
    assert loads(out) == [("a", 0, 12)] and steps(out) == []
    (load,) = out.loads
    assert a.status is RequestStatus.WAITING_FOR_KV and a.pending_external is load.external
    assert kv.block_ids(a.request)[0] == [ref.block_id for ref in load.blocks]
    assert len(load.blocks) == 3 and kv.num_free_blocks == 19 - 3
    run(sched, out)
    assert a.status is RequestStatus.RUNNING and a.pending_external is None
    assert (a.num_computed_tokens, a.num_external_tokens, a.num_cached_tokens) == (12, 12, 0)
    out = sched.schedule()
    assert steps(out) == [("a", 12, 4)]


def test_loading_requests_take_seats() -> None:
    """max_num_seqs 2: two requests load, the third waits (not even looked up) until a seat
    frees, although the pool and the budget have room for it."""
    kv, sched = setup(40, max_num_seqs=2)
    rs = [req(f"r{i}", 16, 1, base=100 * i) for i in range(3)]
    for r in rs:
        sched.add_request(r)
    out = sched.schedule()
    assert loads(out) == [("r0", 0, 12), ("r1", 0, 12)] and rs[2].status is RequestStatus.WAITING
    run(sched, out)
    out = sched.schedule()
    assert steps(out) == [("r0", 12, 4), ("r1", 12, 4)] and out.loads == []
    assert run(sched, out) == rs[:2]                             # max_tokens 1: both finish
    out = sched.schedule()
    assert loads(out) == [("r2", 0, 12)]


@pytest.mark.parametrize("reserve", [True, False])
def test_reserve_full_sequence_applies_to_loads(reserve) -> None:
    """5 usable blocks, a running 8-token request holds 2: a 16-token request's load fits the
    3 free blocks but its whole sequence (4 blocks) does not, so with the reservation it
    waits (no load, no block), and without it the load is admitted."""
    kv, sched = setup(6, holds={"a"}, reserve_full_sequence=reserve)
    c, a = req("c", 8, 2, base=100), req("a", 16, 2)
    sched.add_request(c)
    sched.add_request(a)
    out = sched.schedule()
    assert steps(out) == [("c", 0, 8)]
    if reserve:
        assert out.loads == [] and a.status is RequestStatus.WAITING and kv.num_free_blocks == 3
    else:
        assert loads(out) == [("a", 0, 12)] and a.status is RequestStatus.WAITING_FOR_KV


def test_a_load_that_does_not_fit_waits_while_another_load_is_in_flight() -> None:
    """Two 16-token requests the tier holds, 5 usable blocks, no reservation: the first load
    takes 3 blocks; the second does not fit the other 2 and waits for them (it is neither
    loaded nor computed in pieces), although nothing is running yet."""
    kv, sched = setup(6, reserve_full_sequence=False, max_num_batched_tokens=4)
    a, b = req("a", 16, 2), req("b", 16, 2, base=100)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert loads(out) == [("a", 0, 12)] and steps(out) == []
    assert b.status is RequestStatus.WAITING and sched.num_waiting == 1 and kv.num_free_blocks == 2


def test_a_request_that_does_not_fit_beside_a_load_in_flight_waits() -> None:
    """The tier holds only ``a``: while a's load is in flight nothing runs, and ``b`` (no
    load; its whole sequence does not fit beside a's blocks) waits instead of being refused
    as too large for the pool; both then finish."""
    kv, sched = setup(6, holds={"a"})
    a, b = req("a", 16, 2), req("b", 16, 2, base=100)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert loads(out) == [("a", 0, 12)] and steps(out) == [] and b.status is RequestStatus.WAITING
    for _ in range(8):
        run(sched, out)
        if not sched.has_unfinished():
            break
        out = sched.schedule()
    assert not sched.has_unfinished() and (b.num_cached_tokens, b.num_external_tokens) == (0, 0)
    kv.check_integrity()


def test_a_reload_after_preemption_adds_its_tokens_and_keeps_the_first_hit() -> None:
    """5 usable blocks, budget 4, no reservation. ``x`` (4 tokens) runs; ``a`` (16 tokens)
    loads 12 into 3 blocks, then, needing a 4th, is preempted (the newest request). Its
    loaded blocks stay cached until x's growth evicts one; after x finishes, a loads again
    from its local hit (8 tokens) to 12. Its external tokens add up over both loads
    (12 + 4), and ``num_cached_tokens`` keeps the first admission's hit (0)."""
    kv, sched = setup(6, holds={"a"}, max_num_batched_tokens=4, reserve_full_sequence=False)
    x, a = req("x", 4, 6, base=100), req("a", 16, 4)
    sched.add_request(x)
    sched.add_request(a)
    seen = []
    while sched.has_unfinished():
        out = sched.schedule()
        seen.append((steps(out), loads(out), [r.request_id for r in out.preempted]))
        run(sched, out)
        assert len(seen) < 20
    assert seen[:3] == [([("x", 0, 4)], [], []),
                        ([("x", 4, 1)], [("a", 0, 12)], []),
                        ([("x", 5, 1)], [], ["a"])]
    assert seen[6] == ([], [("a", 8, 12)], [])
    assert seen[7][0] == [("a", 12, 4)]
    assert (a.num_external_tokens, a.num_cached_tokens) == (16, 0)
    assert a.status is RequestStatus.FINISHED_LENGTH and a.num_tokens == 20
    kv.check_integrity()


def test_a_load_from_a_local_hit_counts_only_the_loaded_tokens() -> None:
    """``b`` shares its first 8 tokens with ``a``, computed here: b's local hit is 8 tokens
    and the tier extends it to 12, so 4 tokens count as external and 8 as cached; a failed
    load counts none and b recomputes from its local hit."""
    for ok in (True, False):
        kv, sched = setup(40, holds={"b"})
        a = req("a", 9, 1)
        sched.add_request(a)
        run(sched, sched.schedule())                              # a computed and finished
        b = EngineRequest(Request("b", list(range(8)) + list(range(50, 58))), 2)
        sched.add_request(b)
        out = sched.schedule()
        assert loads(out) == [("b", 8, 12)]
        run(sched, out, ok=ok)
        assert b.num_cached_tokens == 8
        assert (b.num_computed_tokens, b.num_external_tokens) == ((12, 4) if ok else (8, 0))
        assert steps(sched.schedule()) == ([("b", 12, 4)] if ok else [("b", 8, 8)])


def test_the_step_hands_the_connector_the_blocks_to_save_before_and_after_it() -> None:
    """``saves_before``: what the connector had pending when the step began (cached before
    it, KV already written); ``saves_after``: the blocks this step's allocations cached (the
    prompt's two full blocks), written by this step's forward pass."""
    kv, sched = setup(20, holds=set())
    tier = sched.connector
    a = req("a", 8, 3)
    sched.add_request(a)
    out = sched.schedule()
    table = kv.block_ids(a.request)[0]
    assert out.saves_before == []
    assert [(ref.group, ref.block_id) for ref in out.saves_after] == [(0, table[0]), (0, table[1])]
    assert [ref.block_hash for ref in out.saves_after] == a.request.block_hashes[:2]
    run(sched, out)
    earlier = BlockRef(0, 7, b"cached between the steps")
    tier.pending.append(earlier)
    out = sched.schedule()
    assert out.saves_before == [earlier] and out.saves_after == []
