"""The command-line tests share the simulator tests' fixture of the bundled traces."""

from tests.sim.conftest import trace_dir  # noqa: F401  (a fixture, found by name)
