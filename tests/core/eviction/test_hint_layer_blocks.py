"""The hint layer block by block, at a clock far from 0: which blocks are demoted, pinned,
broken and lapsed, and in what order they leave the cache, worked out by hand from the layer's
docstring (``hybridkv.core.eviction.hint_layer``) and the hint rules (``hybridkv.core.hints``).

One full-attention group of 4-token blocks (dense: the layer alone, no hit-point wrapper).
Hints are forced (``hints="force"``: followed from the first release, no shadow test), so the
order is the regions' alone. A request is a 16-token prompt unless it says otherwise (4 full
blocks, cached, freed tail first); blocks are named ``"<request><index>"`` in the order they
were first cached.
"""

from __future__ import annotations

import pytest

from hybridkv import Hint, KVCacheManager, Request
from tests.support.policies import policy_config
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

T0 = 1.0e6          # far from 0: a TTL taken as absolute would have lapsed long ago


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Pool:
    """A forced hinted manager that names every cached block and logs evictions in order."""

    def __init__(self, usable: int, policy: str = "lru", hints: bool | str = "force") -> None:
        self.clock = Clock(T0)
        self.kv = KVCacheManager(policy_config(usable + 1), CacheOptions(
            eviction_policy=policy, hints=hints), clock=self.clock)
        self.names: dict[bytes, str] = {}
        self.evicted: list[str] = []
        self._current = ""
        self.kv.add_cached_listener(self._cached)
        self.kv.add_evicted_listener(lambda g, h: self.evicted.append(self.names.get(h, "?")))
        self._count: dict[str, int] = {}

    def _cached(self, group, hashes, blocks) -> None:
        for h in hashes:
            if h not in self.names:
                i = self._count.get(self._current, 0)
                self._count[self._current] = i + 1
                self.names[h] = f"{self._current}{i}"

    def serve(self, name: str, first: int, hint: Hint | None = None, tokens: int = 16,
              out: int = 0) -> int:
        """A prompt of ``tokens`` tokens ``first, first + 1, ...`` (then ``out`` output tokens);
        returns its hit tokens."""
        self._current = name
        req = Request(name, list(range(first, first + tokens)), RequestCacheParams(hint=hint))
        hit = self.kv.lookup(req)
        assert self.kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        if out:
            req.append_tokens([70_000 + first + k for k in range(out)])
            assert self.kv.allocate(req, out) is not None
            req.num_computed_tokens = req.num_tokens
        self.kv.free(req)
        self.kv.check_integrity()
        return hit.num_tokens

    def serve_tokens(self, name: str, tokens: list[int], hint: Hint | None = None) -> int:
        self._current = name
        req = Request(name, tokens, RequestCacheParams(hint=hint))
        hit = self.kv.lookup(req)
        assert self.kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = req.num_tokens
        self.kv.free(req)
        self.kv.check_integrity()
        return hit.num_tokens

    def fill(self, name: str, blocks: int, first: int = 900_000) -> None:
        """A request that needs ``blocks`` fresh blocks, held while it runs, then freed."""
        self._current = name
        req = Request(name, list(range(first, first + 4 * blocks)))
        assert self.kv.allocate(req, 4 * blocks) is not None
        self.kv.check_integrity()
        self.kv.free(req)


def chain(name: str, tail_first: bool = True) -> list[str]:
    blocks = [f"{name}{i}" for i in range(4)]
    return blocks[::-1] if tail_first else blocks


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "priority"])
def test_the_regions_leave_in_order_demoted_policy_predicted_pins_then_ttl_pins(policy: str) -> None:
    """Freed at T0, in this order: p (pinned 100 s), r (resumes in 20 s: pinned
    1.5 * 20 + 1 = 31 s, a predicted return), q (pinned 200 s), e (last turn), n (no hint),
    s (resumes in 60 s: 91 s). A request then needs all 24 blocks: e's go first (demoted,
    tail first), then n's (the policy's region), then the predicted pins latest return first
    (s, then r), then the TTL pins earliest expiry first (p, then q); 16 pins broken."""
    pool = Pool(24, policy)
    pool.serve("p", 100, Hint(session="P", pin_s=100.0))
    pool.serve("r", 200, Hint(session="R", resume_s=20.0))
    pool.serve("q", 300, Hint(session="Q", pin_s=200.0))
    pool.serve("e", 400, Hint(session="E", last_turn=True))
    pool.serve("n", 500)
    pool.serve("s", 600, Hint(session="S", resume_s=60.0))
    st = pool.kv.hint_stats()
    assert (st.releases, st.demoted, st.pinned, st.pins_broken) == (5, 4, 16, 0)
    pool.clock.now = T0 + 30.0                       # every pin still live (r's until T0 + 31)
    pool.fill("x", 24)
    order = pool.evicted
    assert order[:4] == chain("e")
    assert sorted(order[4:8]) == sorted(chain("n"))
    if policy == "lru":
        assert order[4:8] == chain("n")
    # pins broken: predicted ones latest return first; within one chain, the order it was freed
    assert order[8:16] == chain("s") + chain("r")
    assert order[16:24] == chain("p") + chain("q")
    assert pool.kv.hint_stats().pins_broken == 16 and pool.kv.hint_stats().pins_lapsed == 0


def test_a_ttl_runs_from_the_release_not_from_clock_zero() -> None:
    """A 100 s pin released at T0 holds at T0 + 99 (the unpinned block goes first) and has lapsed
    at T0 + 101 (then it goes first: a lapsed pin is demoted, ahead of the policy's blocks)."""
    for now, first_out in ((T0 + 99.0, "n"), (T0 + 101.0, "p")):
        pool = Pool(8)
        pool.serve("p", 100, Hint(session="P", pin_s=100.0))
        pool.serve("n", 500)
        pool.clock.now = now
        pool.fill("x", 4)
        assert pool.evicted == chain(first_out), now
        st = pool.kv.hint_stats()
        assert (st.pins_broken, st.pins_lapsed) == ((0, 0) if first_out == "n" else (0, 4))


def test_a_resume_pin_lasts_one_and_a_half_times_the_estimate_plus_a_second() -> None:
    """resume_s=10 pins the chain for 1.5 * 10 + 1 = 16 s: live at T0 + 15.9, lapsed at T0 + 16."""
    for dt, first_out in ((15.9, "n"), (16.0, "r")):
        pool = Pool(8)
        pool.serve("r", 100, Hint(session="R", resume_s=10.0))
        pool.serve("n", 500)
        pool.clock.now = T0 + dt
        pool.fill("x", 4)
        assert pool.evicted == chain(first_out), dt


def test_pin_tokens_pin_only_the_covered_blocks() -> None:
    """pin_tokens=6 covers blocks 0 and 1 (a range's mark covers every block it touches and
    every earlier one); blocks 2 and 3 stay in the policy's region, freed before n's, so LRU
    evicts them first (tail first), then n's, then the two pinned blocks."""
    pool = Pool(8)
    pool.serve("p", 100, Hint(session="P", pin_s=50.0, pin_tokens=6))
    pool.serve("n", 500)
    assert pool.kv.hint_stats().pinned == 2
    pool.clock.now = T0 + 10.0
    pool.fill("x", 8)
    assert pool.evicted == ["p3", "p2", *chain("n"), "p1", "p0"]


@pytest.mark.parametrize("hint", [Hint(), Hint(session="A"), Hint(session="A", continues=0.5),
                                  Hint(session="A", continues=1.0)])
def test_an_empty_hint_changes_nothing(hint: Hint) -> None:
    """A hint that asks for nothing (or a session that continues with probability >= 0.5) is
    not a release: nothing is demoted or pinned, LRU decides (a's blocks are older)."""
    assert hint.empty
    pool = Pool(8)
    pool.serve("a", 100, hint)
    pool.serve("n", 500)
    pool.fill("x", 4)
    assert pool.evicted == chain("a")
    st = pool.kv.hint_stats()
    assert (st.releases, st.demoted, st.pinned) == (0, 0, 0)


def test_a_session_below_even_odds_ends() -> None:
    """continues=0.49 < ENDS_BELOW: an end, demoted first although it is the newest."""
    pool = Pool(8)
    pool.serve("n", 500)
    pool.serve("a", 100, Hint(session="A", continues=0.49))
    pool.fill("x", 4)
    assert pool.evicted == chain("a")
    assert pool.kv.hint_stats().demoted == 4


def test_demoted_blocks_leave_in_free_order_across_two_ends() -> None:
    """Two ending sessions freed a then b: their blocks leave a's (tail first), then b's, before
    the older unhinted n."""
    pool = Pool(12)
    pool.serve("n", 500)
    pool.serve("a", 100, Hint(session="A", last_turn=True))
    pool.serve("b", 200, Hint(session="B", last_turn=True))
    pool.fill("x", 12)
    assert pool.evicted == chain("a") + chain("b") + chain("n")


def test_a_session_that_returns_after_its_last_turn_un_demotes_what_it_re_reads() -> None:
    """The latest release decides: E says last turn, then comes back, re-reads its 4 blocks
    (a 20-token prompt: 16 hit, one new block e20) and goes on; they are the policy's again,
    newest, so the older n goes first, then E's release tail first."""
    pool = Pool(12)
    pool.serve("n", 500)
    pool.serve("e", 100, Hint(session="E", last_turn=True))
    assert pool.kv.hint_stats().demoted == 4
    assert pool.serve("e2", 100, Hint(session="E", pin_s=None, continues=0.9), tokens=20) == 16
    pool.fill("x", 12)
    assert pool.evicted == chain("n") + ["e20", *chain("e")]


def test_pins_accumulate_and_the_later_expiry_wins() -> None:
    """p pinned 10 s at T0 (until T0 + 10); at T0 + 8 p2 re-reads it (20 tokens: one new block
    p20) pinned 1 s (until T0 + 9). At T0 + 9.5: p20's pin has lapsed (it goes first, demoted),
    p's blocks keep the later expiry T0 + 10, so n goes next and p's 4 pins are broken last."""
    pool = Pool(12)
    pool.serve("p", 100, Hint(session="P", pin_s=10.0))
    pool.clock.now = T0 + 8.0
    assert pool.serve("p2", 100, Hint(session="P", pin_s=1.0), tokens=20) == 16
    pool.serve("n", 500)
    pool.clock.now = T0 + 9.5
    pool.fill("x", 12)
    assert pool.evicted == ["p20", *chain("n"), *chain("p")]
    st = pool.kv.hint_stats()
    assert (st.pins_lapsed, st.pins_broken) == (1, 4)


def test_a_pin_that_ran_out_while_the_blocks_were_in_use_does_not_pin_them_again() -> None:
    """p pinned 10 s at T0; exactly at T0 + 10 (the pin's last instant is over: expiry <= now)
    p2 re-reads it without a hint (20 tokens: one new block p20): its blocks are the policy's,
    newest, so the older n goes first, then p2's release tail first."""
    pool = Pool(12)
    pool.serve("n", 500)
    pool.serve("p", 100, Hint(session="P", pin_s=10.0))
    pool.clock.now = T0 + 10.0
    assert pool.serve("p2", 100, tokens=20) == 16
    pool.fill("x", 12)
    assert pool.evicted == [*chain("n"), "p20", *chain("p")]
    st = pool.kv.hint_stats()
    assert (st.pins_broken, st.pins_lapsed) == (0, 0)


def test_an_end_demotes_only_the_blocks_its_session_owns_alone() -> None:
    """X and Y share an 8-token system prompt (x0, x1); Y's last turn demotes its own y0, y1
    only. Order: y1, y0 (demoted, tail first), then LRU: x3, x2 (freed by X), x1, x0 (freed
    again, later, by Y)."""
    pool = Pool(12)
    system = list(range(50, 58))
    assert pool.serve_tokens("x", system + list(range(100, 108)), Hint(session="X")) == 0
    assert pool.serve_tokens("y", system + list(range(200, 208)), Hint(session="Y", last_turn=True)) == 8
    assert pool.kv.hint_stats().demoted == 2
    pool.fill("z", 12)
    assert pool.evicted == ["y1", "y0", "x3", "x2", "x1", "x0"]


def test_a_pin_covers_the_prompt_a_resume_the_whole_chain() -> None:
    """16 prompt tokens and 8 of output (6 blocks). ``pin_s`` pins the prompt's 4 blocks: the
    output's p5, p4 stay the policy's and go with n's (freed earlier, so first), the prompt's
    pins are broken last. ``resume_s`` pins all 6 (prompt and output): n goes first."""
    pool = Pool(12)
    pool.serve("p", 100, Hint(session="P", pin_s=100.0), out=8)
    pool.serve("n", 500)
    assert pool.kv.hint_stats().pinned == 4
    pool.clock.now = T0 + 10.0
    pool.fill("x", 12)
    assert pool.evicted == ["p5", "p4", *chain("n"), *chain("p")]
    pool = Pool(12)
    pool.serve("r", 100, Hint(session="R", resume_s=10.0), out=8)
    pool.serve("n", 500)
    assert pool.kv.hint_stats().pinned == 6
    pool.clock.now = T0 + 10.0
    pool.fill("x", 12)
    assert pool.evicted == [*chain("n"), "r5", "r4", *chain("r")]
