"""The acceptance model (``hybridkv.sched.acceptance``): the distribution its docstring states,
its checks, and seeded draws. (tests/sched/test_scheduler.py checks the empirical mean.)"""

from __future__ import annotations

import pytest

from hybridkv.sched import AcceptanceModel


def test_rate_gives_the_stop_at_first_rejection_distribution() -> None:
    """alpha = 0.5, k = 3: P(a=0..2) = 0.5, 0.25, 0.125 (alpha**i * (1 - alpha)) and P(a=3) =
    alpha**3 = 0.125; mean = 0.5 + 0.25 + 0.125."""
    m = AcceptanceModel(3, rate=0.5)
    assert m.k == 3 and m.probs.tolist() == [0.5, 0.25, 0.125, 0.125]
    assert m.mean_accepted == 0.875
    assert AcceptanceModel(2, rate=0.0).probs.tolist() == [1.0, 0.0, 0.0]
    assert AcceptanceModel(2, rate=1.0).probs.tolist() == [0.0, 0.0, 1.0]
    assert AcceptanceModel(1, rate=0.25).probs.tolist() == [0.75, 0.25]


def test_given_probabilities_are_kept_and_normalised() -> None:
    m = AcceptanceModel(2, probs=[0.2, 0.3, 0.5])
    assert m.probs.tolist() == [0.2, 0.3, 0.5] and abs(m.mean_accepted - 1.3) < 1e-12
    near = AcceptanceModel(1, probs=[0.5, 0.5000005])        # within the 1e-6 tolerance
    assert abs(near.probs.sum() - 1.0) < 1e-15


@pytest.mark.parametrize("kwargs, message", [
    (dict(rate=-0.01), r"acceptance rate must be in \[0, 1\], got -0.01"),
    (dict(rate=1.01), r"acceptance rate must be in \[0, 1\], got 1.01"),
    (dict(rate=0.5, probs=[1, 0, 0]),
     r"^give exactly one of rate \(per-token acceptance\) or probs \(P\(a=0..k\)\)$"),
    (dict(), r"^give exactly one of rate"),
    (dict(probs=[0.5, 0.5]), r"probs must have k \+ 1 = 3 entries \(P\(a=0..k\)\), got 2"),
    (dict(probs=[0.5, 0.6, -0.1]), "probs must be non-negative and sum to 1"),
    (dict(probs=[0.5, 0.5, 0.01]), r"sum to 1, got \[0.5, 0.5, 0.01\] \(sum 1.010000\)"),
    (dict(probs=[0.5, 0.5, 0.000002]), "sum to 1"),
])
def test_bad_models_are_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        AcceptanceModel(2, **kwargs)
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer >= 1, got 0"):
        AcceptanceModel(0, rate=0.5)


def test_draws_are_seeded_and_follow_the_probabilities() -> None:
    """The same seed gives the same counts, past one refill of the draw buffer; a certain
    outcome is always drawn; another seed gives another sequence."""
    a, b = AcceptanceModel(3, rate=0.7, seed=4), AcceptanceModel(3, rate=0.7, seed=4)
    n = 2 * AcceptanceModel._BATCH + 10
    xs = [a.draw() for _ in range(n)]
    assert xs == [b.draw() for _ in range(n)] and set(xs) == {0, 1, 2, 3}
    assert xs != [AcceptanceModel(3, rate=0.7, seed=5).draw() for _ in range(n)]
    assert {AcceptanceModel(2, probs=[0, 1, 0], seed=s).draw() for s in range(5)} == {1}
    default, zero = AcceptanceModel(3, rate=0.7), AcceptanceModel(3, rate=0.7, seed=0)
    assert [default.draw() for _ in range(50)] == [zero.draw() for _ in range(50)]   # seed 0
    freq = [xs.count(i) / n for i in range(4)]
    assert all(abs(f - p) < 0.03 for f, p in zip(freq, a.probs))
