"""The Mooncake examples, run as a user runs them: ``python examples/NAME.py``, as subprocesses.

Each example exits 0 only when the engine that loaded KV from Mooncake produced the same tokens
as a run without any store and really loaded something; it prints ``RESULT: identical`` then.
Skipped only when the ``mooncake`` package is not installed (CI installs it) or when
``HYBRIDKV_SKIP_MOONCAKE=1`` asks for it, as for the other Mooncake tests.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hybridkv.engine.checkpoints import random_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("mooncake") is None,
                       reason="mooncake is not installed (.ci/install_mooncake.sh)"),
    pytest.mark.skipif(os.environ.get("HYBRIDKV_SKIP_MOONCAKE") == "1",
                       reason="HYBRIDKV_SKIP_MOONCAKE=1"),
]


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = proc.stdout
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out}\n{proc.stderr[-3000:]}"
    assert re.search(r"^RESULT: identical\b", out, re.M), out
    assert "MISMATCH" not in out and "FAILED" not in out, out
    return out


def test_pd_disaggregation_example() -> None:
    out = run_example("pd_disaggregation.py")
    loaded = int(re.search(r"^decode\s*: (\d+) prompt tokens loaded", out, re.M).group(1))
    assert 512 - 16 <= loaded < 512  # all but the last (partial) block of the default prompt


def test_two_replicas_example_with_a_given_model(tmp_path: Path) -> None:
    cfg = dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
               use_sliding_window=True, sliding_window=24,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    model = random_model(tmp_path / "m", cfg, seed=3)
    out = run_example("two_replicas.py", "--model", str(model), "--block-size", "8",
                      "--prompt-len", "200", "--max-tokens", "12")
    loaded = int(re.search(r"turn 2 \((\d+) tokens\): (\d+) loaded", out).group(2))
    assert loaded >= 200  # turn 1's prompt and most of its answer came from replica A
