"""A run stopped by Ctrl-C, carrying what it had finished.

SIGINT raises ``KeyboardInterrupt`` in the main thread. The simulator, the cluster and the
sweep executors turn it into :class:`RunInterrupted` (a ``KeyboardInterrupt``, so code that
only knows that still stops) after stopping their helpers (forked children, worker processes,
Ray tasks), so the caller can keep what was measured: a partial
:class:`~hybridkv.sim.simulator.SimResult` (``partial=True``: counts of the requests admitted
so far, no offline bound), a partial cluster result, or a sweep's finished configurations.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

__all__ = ["RunInterrupted", "sigint_deferred"]


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; ``partial`` is what it had measured (None: nothing)."""

    def __init__(self, partial: object = None) -> None:
        super().__init__("interrupted")
        self.partial = partial


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Ignore Ctrl-C inside the block, so stopping helpers or writing a partial result is not
    cut short by a second one; the handler in place before comes back after it (outside the
    main thread, where no signal is delivered, nothing changes)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
