"""Suite-wide setup: Hypothesis profiles, the report of what property tests exercised, and an
opt-in CPU budget per test for mutation runs."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from tests.hypothesis_budget import EXERCISED, register_profiles

register_profiles()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not EXERCISED:
        return
    terminalreporter.section("property tests: what the examples exercised")
    for key in sorted(EXERCISED):
        terminalreporter.write_line(f"{EXERCISED[key]:>10}  {key}")
    path = os.environ.get("HYBRIDKV_TEST_STATS")
    if path:
        with open(path, "w") as fh:
            json.dump(dict(sorted(EXERCISED.items())), fh, indent=1)


#: exit status mutmut reads as "timeout" (mutmut/stats.py)
_MUTMUT_TIMEOUT_EXIT = 36


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """With ``HYBRIDKV_TEST_CPU_BUDGET=S`` set, a test that uses more than S CPU seconds ends the
    process with mutmut's "timeout" status.

    For mutation runs only (docs/mutation.md): a mutant that loops forever
    otherwise holds a worker until mutmut's own limit, a multiple of the *whole* covering test
    set's time (minutes on this machine). Unset (the default, and in CI) this does nothing.
    """
    budget = float(os.environ.get("HYBRIDKV_TEST_CPU_BUDGET") or 0)
    if budget <= 0:
        yield
        return

    def over_budget(signum, frame):
        os._exit(_MUTMUT_TIMEOUT_EXIT)    # no report: pytest holds the captured output

    previous = signal.signal(signal.SIGPROF, over_budget)
    signal.setitimer(signal.ITIMER_PROF, budget)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
