"""The demo command runs and shows the effects it describes."""

import json
import subprocess
import sys

from hybridkv.cli.demo import demo


def test_demo_numbers():
    out = demo(as_json=True)
    dense, sparse = out["retention_None"], out["retention_0"]
    assert dense["B"] == sparse["B"] == 1536          # next turn hits prompt + answer
    assert dense["C"] == 1200 and sparse["C"] == 0    # sparse: system prompt not yet retained
    assert sparse["D"] == 1200                        # ... until the junction is promised
    assert out["eagle_lookahead"] == 1024 > out["eagle_drop"] == 1008


def test_demo_cli_json():
    res = subprocess.run([sys.executable, "-m", "hybridkv.cli", "demo", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(res.stdout)["retention_0"]["D"] == 1200
