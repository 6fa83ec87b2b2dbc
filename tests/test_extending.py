"""Adding an eviction policy, a router or an attention type the way docs/extending.md says
needs no edit to an existing test: the suite's registry tests pass again, in a fresh
interpreter, with a throwaway of each registered first (:mod:`tests.support.throwaways`), and
they see it (each file runs it: the throwaway policy through every policy contract, the
router through the one-instance cluster, the type through the facts check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

REGISTRY_TESTS = (
    "tests/core/test_attention_types.py",
    "tests/core/eviction/test_policy_registry.py",
    "tests/core/eviction/test_every_policy.py",
    "tests/sim/test_cluster.py::test_one_instance_cluster_is_the_single_simulator",
    "tests/test_docs.py",
)


def test_the_registry_tests_pass_with_a_throwaway_of_each_kind_registered() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.throwaways",
         "-rA", *REGISTRY_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = [line for line in proc.stdout.splitlines() if line.startswith("PASSED ")]
    # the throwaways were there: the parametrized policy tests ran it by name
    assert any("[throwaway-fifo]" in line for line in passed), proc.stdout[-2000:]
    assert not any(line.startswith(("SKIPPED", "FAILED", "ERROR")) for line in proc.stdout.splitlines())
