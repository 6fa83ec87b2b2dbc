"""Hypothesis profiles, a wall-clock budget for the deep profile, and exercise counters.

Profiles (select with ``pytest --hypothesis-profile=NAME``):

* ``default`` — what every property test's own ``@settings`` says (a few hundred examples,
  short operation sequences): the whole suite stays fast.
* ``deep`` — at least :data:`DEEP_EXAMPLES` examples per property test, longer operation
  sequences, configurations weighted to multi-group hybrids and EAGLE/MTP/DFlash. It is meant
  to run in CI as a second pytest invocation (``.ci/run``).
* ``mutation`` — each test's own budget, derandomized and without the example database, so
  every mutant meets the same examples (mutmut, TESTING.md "Mutation testing").

**How the deep run stops in time.** Each property test gets a share of the budget
``HYBRIDKV_DEEP_BUDGET_S`` (seconds, default 300, see :func:`budget_for`). Once its share is
spent, the remaining examples return at once (they still count as Hypothesis examples, not as
exercised ones: the counters below tell the difference), so a slower machine runs fewer real
examples instead of failing. The guard never turns a failure into a pass: once an example has
failed, the test keeps running every example (shrinking included) regardless of the budget.

**Counters.** :func:`note` counts what examples exercise (lookups, non-zero hits, evictions,
preemptions, configurations by kind) in :data:`EXERCISED`, and labels the example with
Hypothesis's ``event()`` (shown by ``--hypothesis-show-statistics``). ``tests/conftest.py``
prints the totals at the end of the session and writes them as JSON to
``HYBRIDKV_TEST_STATS`` when that is set.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from typing import Callable

from hypothesis import HealthCheck, event, settings

DEEP_EXAMPLES = 5000
DEFAULT_DEEP_BUDGET_S = 300.0

EXERCISED: Counter[str] = Counter()


def register_profiles() -> None:
    settings.register_profile(
        "deep", max_examples=DEEP_EXAMPLES, deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    # Mutation testing (TESTING.md): the same examples for every mutant, no example database
    # carried from one mutant to the next, no deadline under mutmut's trampolines.
    settings.register_profile(
        "mutation", derandomize=True, database=None, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def is_deep() -> bool:
    """True when the loaded profile is ``deep`` (read at collection time)."""
    return settings.default.max_examples >= DEEP_EXAMPLES


def examples(default: int) -> int:
    """A property test's example count: its own under the default profile, the deep count
    under ``deep``."""
    return max(default, DEEP_EXAMPLES) if is_deep() else default


def budget_for(share: float) -> float:
    """Seconds of the deep budget this test may use (``share`` of the total)."""
    total = float(os.environ.get("HYBRIDKV_DEEP_BUDGET_S", DEFAULT_DEEP_BUDGET_S))
    return total * share


def note(key: str, n: int = 1) -> None:
    """Count ``n`` occurrences of ``key`` and label the current example with it."""
    if n:
        EXERCISED[key] += n
        try:
            event(key)
        except Exception:  # outside a Hypothesis example (a plain test reusing the model)
            pass


def budgeted(share: float) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Under the deep profile, stop doing work once this test's budget share is spent.

    Apply *inside* ``@given`` (closest to the function). Examples after the budget return
    immediately and are counted as ``<test>: skipped by budget``; a test that has failed once
    ignores the budget from then on, so shrinking and the final replay behave normally.
    """

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        if not is_deep():
            return fn
        state = {"start": None, "failed": False}
        limit = budget_for(share)
        name = fn.__name__

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            now = time.monotonic()
            if state["start"] is None:
                state["start"] = now
            if not state["failed"] and now - state["start"] > limit:
                EXERCISED[f"{name}: skipped by budget"] += 1
                return None
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                state["failed"] = True
                raise
            EXERCISED[f"{name}: examples run"] += 1
            return result

        return inner

    return wrap
