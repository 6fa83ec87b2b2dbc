"""The bounds of one run: computed beside the simulation, once per (workload, size).

:class:`OptimumJob` gives a run its offline optimum (Belady at the pool's size), the
non-anticipative hazard-rate reference, the gap report and the answers of an :class:`Extra`
(the what-if's LRU model and Belady at 2x, :mod:`hybridkv.sim.bounds.whatif`) and of ``side`` (the
hybrid bound, a :class:`SideTask`). Everything but the gap report and the extra's last step needs no online result
(:class:`BoundParts`): a large workload computes it in a forked child from the start, on a
second core while the simulation runs, and after the step loop only the gap report is left.

A workload's parts are kept in this process (by identity of the served list, and the block
size, capacity, extra and the side task's ``key``): a sweep computes each bound once per size and every
other row at that size (another eviction policy) reuses them (:attr:`OptimumJob.reused`).
:attr:`OptimumJob.seconds` says what each bound took, by name.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from hybridkv.sim.bounds.bound_inputs import BoundInputs, bound_inputs
from hybridkv.sim.failures import ChildProcessDied, describe_exit
from hybridkv.sim.bounds.hazard import HazardBound
from hybridkv.sim.bounds.optimal import GapInputs, GapReport, OnlineHits, gap_from
from hybridkv.sim.traffic.workitems import ServedItem

__all__ = ["BoundParts", "Extra", "OptimumJob", "PARALLEL_OPTIMUM_TOKENS", "SideTask", "timed"]

PARALLEL_OPTIMUM_TOKENS = 20_000_000  # above this many prompt tokens, compute the bound in a child


def timed(seconds: dict[str, float], name: str, fn: Callable[[], object]) -> object:
    """``fn()``, adding the seconds it took to ``seconds[name]``."""
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True, slots=True)
class SideTask:
    """Another bound an :class:`OptimumJob` computes with its parts (in its child, if any).

    Attributes:
        run: ``run()`` computes it; its answer is :attr:`OptimumJob.side_result`.
        key: what the answer depends on besides the served list (hashable); parts kept for
            the same key are reused. None: never reused.
    """

    run: Callable[[], object]
    key: Hashable | None = None

    def __post_init__(self) -> None:
        if not callable(self.run):
            raise TypeError(f"SideTask.run must be callable, got {self.run!r}")
        if not isinstance(self.key, Hashable):
            raise TypeError(f"SideTask.key must be hashable or None, got {self.key!r}")


@dataclass(frozen=True, slots=True)
class Extra:
    """A computation on a served workload's keys beside the bound, in two steps:
    ``before(inputs, capacity, seconds)`` needs no online result (it runs with the bound, in
    the child while the simulation runs; it times what it does into ``seconds``);
    ``after(before's answer, online)`` runs once the online run is done (keep it cheap: the
    run waits for it); its answer is the third item of :meth:`OptimumJob.result`."""

    before: Callable[[BoundInputs, int, dict], object]
    after: Callable[[object, OnlineHits], object]


@dataclass(frozen=True, slots=True, eq=False)
class BoundParts:
    """What a run's bounds are before its online result: the optimum in key blocks, the hazard
    reference, the gap report's inputs, the extra's and ``side``'s answers, and the seconds
    each took (``keys``: hashing the workload and its key stream)."""

    optimum_blocks: int
    hazard: HazardBound
    gap: GapInputs
    before: object
    side: object
    seconds: dict[str, float]


def _bound_parts(items: list[ServedItem], block_size: int, capacity: int,
                 extra: Extra | None, side: Callable[[], object] | None) -> BoundParts:
    seconds: dict[str, float] = {}
    inputs = timed(seconds, "keys", lambda: bound_inputs(items, block_size))
    opt = timed(seconds, "optimum", lambda: inputs.belady(capacity))
    gap = timed(seconds, "unlimited", inputs.gap_inputs)
    hazard = timed(seconds, "hazard", lambda: inputs.hazard(capacity))
    before = extra.before(inputs, capacity, seconds) if extra is not None else None
    beside = timed(seconds, "hybrid", side) if side is not None else None
    return BoundParts(opt, hazard, gap, before, beside, seconds)


def _finish(parts: BoundParts, online: OnlineHits, extra: Extra | None
            ) -> tuple[tuple[int, GapReport, object, HazardBound], float]:
    """The job's answer from ``parts`` and the online run, and the seconds it took."""
    t0 = time.perf_counter()
    gap = gap_from(parts.gap, parts.optimum_blocks, online)
    more = extra.after(parts.before, online) if extra is not None else None
    return (parts.optimum_blocks, gap, more, parts.hazard), time.perf_counter() - t0


def _remembered(served: list[ServedItem], key: Hashable | None) -> BoundParts | None:
    memo = _PARTS
    if key is None or memo is None or memo[0] is not served:
        return None
    return memo[1].get(key)


def _remember(served: list[ServedItem], key: Hashable | None, parts: BoundParts) -> None:
    global _PARTS
    if key is None:
        return
    if _PARTS is None or _PARTS[0] is not served:
        _PARTS = (served, {})               # another workload: forget the last one's
    _PARTS[1][key] = parts


_PARTS: tuple | None = None   # (served list, {(block size, capacity, extra, side key): BoundParts})


class OptimumJob:
    """The offline bound, the non-anticipative reference and the gap report of one run over a
    served workload.

    Large workloads (more than :data:`PARALLEL_OPTIMUM_TOKENS` prompt tokens, with ``parallel``
    and where ``fork`` exists) compute the parts in a forked child from the start, while the
    simulation runs on this core: they need no simulation state, and the child waits for the
    online run's :class:`OnlineHits` only for the gap report and ``extra.after``. Others
    compute them inline in :meth:`result`. Parts this process already has for the same served
    list, block size, capacity, extra and ``side.key`` are reused (no child, nothing
    recomputed; a ``side`` whose key is None never reuses). ``side.run()`` runs with the
    parts; its answer is :attr:`side_result` once :meth:`result` returned.
    """

    def __init__(self, served: list[ServedItem], block_size: int, capacity: int,
                 parallel: bool = True, extra: Extra | None = None,
                 side: SideTask | None = None) -> None:
        self.served = served
        self.block_size = block_size
        self.capacity = capacity
        self.extra = extra
        self.side = side.run if side is not None else None
        self.side_result: object = None
        #: Seconds by bound name spent for this run (``gap``: the report after the online run).
        self.seconds: dict[str, float] = {}
        side_key = side.key if side is not None else None
        self._key = ((block_size, capacity, extra, side_key)
                     if side is None or side_key is not None else None)
        self._parts = _remembered(served, self._key)
        #: Whether the parts came from an earlier run over the same workload and size.
        self.reused = self._parts is not None
        self._child = self._conn = None
        if self._parts is None and parallel and "fork" in mp.get_all_start_methods() \
                and sum(s.item.prompt_len for s in served) > PARALLEL_OPTIMUM_TOKENS:
            ctx = mp.get_context("fork")
            self._conn, child_conn = ctx.Pipe()
            self._child = ctx.Process(target=_optimum_child, daemon=True,
                                      args=(served, block_size, capacity, child_conn, extra, self.side))
            self._child.start()
            child_conn.close()

    def result(self, online: OnlineHits) -> tuple[int, GapReport, object, HazardBound]:
        """The bound in key blocks, the gap report, ``extra``'s answer and the non-anticipative
        reference (:mod:`hybridkv.sim.bounds.hazard`), given the finished online run's hits.

        Raises:
            ChildProcessDied: the forked child died before it answered (``SIGKILL`` from the
                kernel's out-of-memory killer, typically); the message names its pid and signal.
        """
        if self._child is None:
            parts = self._parts
            if parts is None:
                parts = _bound_parts(self.served, self.block_size, self.capacity, self.extra,
                                     self.side)
            got, finish_s = _finish(parts, online, self.extra)
        else:
            try:
                self._conn.send(online)
            except OSError:                 # it stopped early: its error (or nothing) is read next
                pass
            try:
                answer = self._conn.recv()
            except (OSError, EOFError):     # the child died before it answered (killed, OOM)
                self._child.join(timeout=5)
                self.cancel()
                raise ChildProcessDied(f"the offline optimum's child process (pid "
                                       f"{self._child.pid}) {describe_exit(self._child.exitcode)} "
                                       f"before it answered", child="optimum") from None
            self._child.join()
            if isinstance(answer, BaseException):
                raise answer
            parts, got, finish_s = answer
        if not self.reused:
            _remember(self.served, self._key, parts)
            self.seconds = dict(parts.seconds)
        self.seconds["gap"] = finish_s
        self.side_result = parts.side
        return got

    def cancel(self) -> None:
        """Stop the child, if any, and wait for it (the run failed or was interrupted)."""
        if self._child is not None:
            self._child.kill()
            self._child.join(timeout=5)
            self._conn.close()


def _optimum_child(items: list[ServedItem], block_size: int, capacity: int, conn,
                   extra: Extra | None, side: Callable[[], object] | None = None) -> None:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent handles Ctrl-C and stops us
    try:
        parts = _bound_parts(items, block_size, capacity, extra, side)
        got, finish_s = _finish(parts, conn.recv(), extra)
        conn.send((parts, got, finish_s))
    except BaseException as exc:  # report, never hang the parent
        conn.send(exc)
    finally:
        conn.close()
