"""Suite-wide setup: Hypothesis profiles and the report of what property tests exercised."""

from __future__ import annotations

import json
import os

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
