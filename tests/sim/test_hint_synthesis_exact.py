"""Synthesised hints request by request, at a clock far from 0: the truth (continues, gap),
each kind at accuracy 1 and 0, the resume time relative to the request's own arrival, the
default TTL, sessions by hash-chain continuation with and without shared content."""

from __future__ import annotations

import math

import pytest

from hybridkv.core.hints import Hint
from hybridkv.sim.traffic.hint_synthesis import (DEFAULT_TTL_S, HintSpec, session_truth, sessions_from_chains,
                                         synthesize_hints)

T0 = 1.0e6
SESSIONS = ["a", "b", "a", "c", "b"]
ARRIVALS = [T0, T0 + 1.0, T0 + 5.0, T0 + 6.0, T0 + 20.0]


def test_the_truth_is_each_requests_next_turn_relative_to_its_arrival() -> None:
    continues, gap = session_truth(SESSIONS, ARRIVALS)
    assert continues == [True, True, False, False, False]
    assert gap == [5.0, 19.0, math.inf, math.inf, math.inf]


@pytest.mark.parametrize("accuracy, ends", [(1.0, [False, False, True, True, True]),
                                            (0.0, [True, True, False, False, False])])
def test_session_end_at_accuracy_one_and_zero(accuracy, ends) -> None:
    hints = synthesize_hints(HintSpec("session-end", accuracy), SESSIONS, ARRIVALS)
    assert hints == [Hint(session=s, last_turn=e) for s, e in zip(SESSIONS, ends)]


def test_ttl_pins_continuing_sessions_for_the_ttl() -> None:
    assert HintSpec("ttl").ttl_s == DEFAULT_TTL_S == 300.0
    hints = synthesize_hints(HintSpec("ttl", 1.0, 600.0), SESSIONS, ARRIVALS)
    assert hints == [Hint(session="a", pin_s=600.0), Hint(session="b", pin_s=600.0),
                     Hint(session="a"), Hint(session="c"), Hint(session="b")]
    wrong = synthesize_hints(HintSpec("ttl", 0.0), SESSIONS, ARRIVALS)
    assert wrong == [Hint(session="a"), Hint(session="b"), Hint(session="a", pin_s=300.0),
                     Hint(session="c", pin_s=300.0), Hint(session="b", pin_s=300.0)]


def test_resume_says_the_gap_to_the_next_turn() -> None:
    hints = synthesize_hints(HintSpec("resume"), SESSIONS, ARRIVALS)
    assert hints == [Hint(session="a", resume_s=5.0), Hint(session="b", resume_s=19.0),
                     Hint(session="a"), Hint(session="c"), Hint(session="b")]
    wrong = synthesize_hints(HintSpec("resume", 0.0), SESSIONS, ARRIVALS, seed=3)
    assert wrong[:2] == [Hint(session="a"), Hint(session="b")]
    assert all(h.resume_s in (5.0, 19.0) for h in wrong[2:])     # drawn from the trace's gaps


def test_accuracy_is_a_seeded_share_of_right_hints() -> None:
    n = 4000
    sessions = [i // 2 for i in range(n)]                        # pairs: every other continues
    arrivals = [T0 + i for i in range(n)]
    hints = synthesize_hints(HintSpec("session-end", 0.8), sessions, arrivals, seed=7)
    right = sum(h.last_turn == (i % 2 == 1) for i, h in enumerate(hints))
    assert abs(right / n - 0.8) < 0.03                           # binomial: sd 0.0063
    assert hints == synthesize_hints(HintSpec("session-end", 0.8), sessions, arrivals, seed=7)


@pytest.mark.parametrize("text, spec, back", [
    ("session-end", HintSpec("session-end", 1.0), "session-end:1"),
    ("ttl=600:0.9:force", HintSpec("ttl", 0.9, 600.0, True), "ttl=600:0.9:force"),
    ("ttl", HintSpec("ttl", 1.0, 300.0), "ttl=300:1"),
    ("resume:0.5", HintSpec("resume", 0.5), "resume:0.5"),
])
def test_spec_spelling_round_trips(text, spec, back) -> None:
    assert HintSpec.parse(text) == spec and str(spec) == back


def test_sessions_by_chain_continuation() -> None:
    chains = [[1, 2], [1, 2, 3], [1, 2, 3, 4], [1, 5], [9], [1, 2, 3, 4, 6]]
    assert sessions_from_chains(chains) == [0, 0, 0, 1, 2, 0]


def test_a_shared_system_prompt_continues_no_session() -> None:
    """Block 0 is followed by 8 distinct blocks: shared content (HUB_CHILDREN = 8). A chain of
    only [0] is not continued; [0, 100, 200] continues [0, 100]'s session. With the threshold
    at 9, block 0 is a session's own and every request continues the first."""
    chains = [[0]] + [[0, 100 + i] for i in range(8)] + [[0, 100, 200]]
    assert sessions_from_chains(chains) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 1]
    assert sessions_from_chains(chains, hub_children=9) == [0] * 10
