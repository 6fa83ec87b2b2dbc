"""A helper process that died: what it was, and how it ended.

The simulator's offline optimum may run in a forked child (:class:`~hybridkv.sim.bounds.optimal.OptimumJob`),
a sweep's jobs in worker processes or Ray tasks (:mod:`hybridkv.sim.executors`). When such a
process dies without answering (the kernel's out-of-memory killer sends it ``SIGKILL``), the
run raises :class:`ChildProcessDied`, never a silent success: its ``partial`` carries what had
finished (the online run's result, without the bound), so a caller can still write it. The
command line turns it into exit status 1 after writing what finished.
"""

from __future__ import annotations

import signal

__all__ = ["ChildProcessDied", "describe_exit"]


class ChildProcessDied(Exception):
    """A helper process died before it answered.

    Deliberately not a ``RuntimeError`` (which the command line reads as a workload that cannot
    run as configured, exit status 2): this is a failure while running (exit status 1).

    Attributes:
        child: which process: ``"optimum"`` (the offline optimum's forked child), ``"worker"``
            (a sweep's worker process) or ``"ray task"``.
        partial: what had finished without the dead process (a
            :class:`~hybridkv.sim.simulator.SimResult` with no offline bound, a cluster result),
            or None.
    """

    def __init__(self, message: str, child: str, partial: object = None) -> None:
        super().__init__(message)
        self.child = child
        self.partial = partial


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, from ``multiprocessing``'s ``exitcode`` (minus N: killed by signal N).

    ``-9`` -> ``"was killed by SIGKILL (likely out of memory)"``, ``-11`` -> ``"was killed by
    SIGSEGV"``, ``3`` -> ``"exited with status 3"``, None -> ``"did not exit"``.
    """
    if exitcode is None:
        return "did not exit"
    if exitcode >= 0:
        return f"exited with status {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    return f"was killed by {name}" + (" (likely out of memory)" if -exitcode == signal.SIGKILL else "")
