"""Where a sweep's simulations run: in this process, on local processes, or as Ray tasks.

A sweep is a list of jobs over one workload: :class:`SimConfig` (one instance),
:class:`~hybridkv.sim.cluster.loop.ClusterJob` (N instances behind a router) or any picklable
job with ``run(items, progress)`` returning either's result (:data:`Job`). :func:`execute` runs
every job and yields an :class:`Outcome` as each one finishes (in completion order; ``index``
says which job it is). A job that raises yields its error and the others go on. Every executor
runs the same :func:`run_config`, so a job gives the same result (all but its timing keys,
``simulator.TIMING_KEYS``) wherever it runs. A job whose process died (a worker process or Ray
task killed, out of memory; the offline optimum's forked child) yields an error starting
``ChildProcessDied:`` that names the process and the signal, never a silent loss.

* ``serial``: one job after another in this process (a large workload's offline optimum still
  runs in a forked child meanwhile, as in ``simulate``).
* ``processes``: ``workers`` local processes (spawned: no state is inherited), each taking the
  next job from a queue. The workload is sent once per worker. Inside a worker the optimum runs
  inline (no child), so ``workers`` processes use ``workers`` cores. Workers ignore Ctrl-C.
* ``ray``: one Ray task per job on the cluster at ``ray_address`` (``ray.init``'s address:
  ``auto``, ``ray://host:10001``, ...), or on a local Ray started for the sweep when no address
  is given (``workers`` CPUs). The workload is put in the object store once. The cluster's
  workers must be able to import hybridkv (install it there). Needs the optional extra:
  ``pip install "hybridkv[ray]"``.

``progress(index, done, total)`` reports requests done in job ``index`` as it runs (a worker
process sends it on its result queue, a Ray task through a queue actor that takes no CPU). When the consumer stops early or Ctrl-C
arrives (``KeyboardInterrupt`` in this process, the only one that handles it), the executor
stops what still runs before the exception leaves it: worker processes are killed and reaped,
Ray tasks cancelled and a local Ray shut down, within seconds; nothing is left behind.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, Callable, Iterator, Sequence, Union

from hybridkv.core.validation import check_int
from hybridkv.sim.cluster.loop import ClusterJob, ClusterResult
from hybridkv.sim.failures import ChildProcessDied, describe_exit
from hybridkv.sim.interrupt import sigint_deferred
from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.traffic.workitems import WorkItem

EXECUTORS = ("serial", "processes", "ray")

#: One job of a sweep: a single instance, a cluster, or an object with
#: ``run(items, progress) -> SimResult | ClusterResult`` (e.g. one that stops a run early).
Job = Union[SimConfig, ClusterJob, Any]
#: ``progress(index, done, total)``: requests done in job ``index``.
Progress = Callable[[int, int, int], None]

_STOP_S = 3.0   # how long a killed worker may take to be reaped


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished job: its result, or the error it raised (``"Type: message"``). A job whose
    offline optimum's child died has both: the online run's result (no bound) and the error."""

    index: int
    result: SimResult | ClusterResult | None
    error: str | None = None


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_config(index: int, cfg: Job, items: Sequence[WorkItem],
               progress: Callable[[int, int], None] | None = None) -> Outcome:
    """Simulate one job; an exception becomes the outcome's error (Ctrl-C is not caught)."""
    try:
        if isinstance(cfg, ClusterJob):
            return Outcome(index, cfg.simulator(progress).run(items))
        if isinstance(cfg, SimConfig):
            return Outcome(index, Simulator(cfg, progress=progress).run(items))
        return Outcome(index, cfg.run(items, progress))
    except ChildProcessDied as exc:    # the online run finished: keep it beside the error
        return Outcome(index, exc.partial, _describe(exc))
    except Exception as exc:  # noqa: BLE001 - reported per job, the sweep goes on
        return Outcome(index, None, _describe(exc))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, (ValueError, RuntimeError, MemoryError, ChildProcessDied)):   # unexpected: where
        frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        text += "".join(f" (at {f.filename}:{f.lineno})" for f in frame)
    return text


def _inline_optimum(jobs: Sequence[Job]) -> list[Job]:
    """The jobs with the optimum computed inline: a worker uses one core."""
    out: list[Job] = []
    for j in jobs:
        if isinstance(j, ClusterJob):
            out.append(dataclasses.replace(j, config=dataclasses.replace(j.config, parallel_optimum=False)))
        elif isinstance(j, SimConfig):
            out.append(dataclasses.replace(j, parallel_optimum=False))
        else:                                  # a job of its own sets its optimum itself
            out.append(j)
    return out


def execute(configs: Sequence[Job], items: Sequence[WorkItem], executor: str = "serial",
            workers: int | None = None, ray_address: str | None = None,
            progress: Progress | None = None) -> Iterator[Outcome]:
    """Run every job on ``items``; yield outcomes as they finish.

    Args:
        configs: the jobs (their position is the outcome's ``index``).
        items: the workload, shared by all jobs.
        executor: ``serial``, ``processes`` or ``ray``.
        workers: processes (``processes``) or local Ray CPUs (``ray`` without an address);
            default: the usable cores, at most one per job.
        ray_address: the Ray cluster to submit to (``ray`` only); None starts a local Ray.
        progress: ``progress(index, done, total)`` as jobs run (module docstring).

    Raises:
        ValueError: an unknown executor, ``workers < 1``, ``workers`` with ``serial``, or an
            address without ``ray``.
        RuntimeError: ``ray`` without Ray installed, or a cluster that cannot be reached.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    check_int("workers", workers, 1, optional=True)
    if workers is not None and executor == "serial":
        raise ValueError(f"workers ({workers}) needs executor 'processes' or 'ray', got 'serial'")
    if ray_address is not None and executor != "ray":
        raise ValueError(f"a Ray address ({ray_address!r}) needs executor 'ray', got {executor!r}")
    items = list(items)
    if workers is None:
        workers = max(1, min(default_workers(), len(configs)))
    if executor == "serial" or not configs:
        return _run_serial(configs, items, progress)
    if executor == "processes":
        return _run_processes(_inline_optimum(configs), items, workers, progress)
    _ray_module()                              # fail now, not at the first outcome
    return _run_ray(_inline_optimum(configs), items, workers, ray_address, progress)


def _run_serial(configs: Sequence[Job], items: list[WorkItem], progress: Progress | None) -> Iterator[Outcome]:
    for i, c in enumerate(configs):
        yield run_config(i, c, items, None if progress is None else
                         (lambda done, total, i=i: progress(i, done, total)))


# ---- local processes ------------------------------------------------------------------------------
def _worker(items: list[WorkItem], tasks, results, report: bool) -> None:
    """A worker process: run jobs from ``tasks`` until a None; messages on ``results``:
    ``("start", index, pid)``, ``("progress", index, done, total)``, ``("done", outcome, pid)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the parent handles Ctrl-C and stops us
    pid = os.getpid()
    while True:
        task = tasks.get()
        if task is None:
            return
        index, cfg = task
        results.put(("start", index, pid))
        progress = _throttled(lambda done, total, index=index: results.put(("progress", index, done, total)))
        results.put(("done", run_config(index, cfg, items, progress if report else None), pid))


def _run_processes(configs: list[Job], items: list[WorkItem], workers: int,
                   progress: Progress | None) -> Iterator[Outcome]:
    ctx = get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    for i, c in enumerate(configs):
        tasks.put((i, c))
    procs = [ctx.Process(target=_worker, args=(items, tasks, results, progress is not None),
                         daemon=True) for _ in range(min(workers, len(configs)))]
    for _ in procs:
        tasks.put(None)
    running: dict[int, int] = {}     # worker pid -> the job it runs
    left = set(range(len(configs)))
    try:
        for proc in procs:
            proc.start()
        while left:
            try:
                msg = results.get(timeout=0.2)
            except queue.Empty:
                yield from _dead_workers(procs, running, left)
                continue
            if msg[0] == "start":
                running[msg[2]] = msg[1]
            elif msg[0] == "progress":
                if progress is not None:
                    progress(msg[1], msg[2], msg[3])
            else:
                running.pop(msg[2], None)
                left.discard(msg[1].index)
                yield msg[1]
    finally:
        _stop_workers(procs, (tasks, results))


def _dead_workers(procs: list, running: dict[int, int], left: set[int]) -> Iterator[Outcome]:
    """Outcomes for jobs whose worker died (killed, out of memory), naming the worker and its
    signal; when no worker is left, for the jobs no worker took, naming the workers that died."""
    for proc in procs:
        if proc.exitcode not in (None, 0) and proc.pid in running:
            index = running.pop(proc.pid)
            left.discard(index)
            yield Outcome(index, None, f"ChildProcessDied: the sweep's worker process (pid "
                                       f"{proc.pid}) running it {describe_exit(proc.exitcode)}")
    if left and all(proc.exitcode is not None for proc in procs):
        died = "; ".join(f"the sweep's worker process (pid {proc.pid}) {describe_exit(proc.exitcode)}"
                         for proc in procs if proc.exitcode != 0)
        for index in sorted(left - set(running.values())):
            left.discard(index)
            yield (Outcome(index, None, f"ChildProcessDied: no worker process was left to run it "
                                        f"({died})") if died else
                   Outcome(index, None, "RuntimeError: no worker process was left to run it"))


def _stop_workers(procs: list, queues: tuple) -> None:
    """Kill the workers still alive, reap them, and let the queues go without waiting on them."""
    with sigint_deferred():
        _kill_and_reap(procs, queues)


def _kill_and_reap(procs: list, queues: tuple) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    deadline = time.monotonic() + _STOP_S
    for proc in procs:
        if proc.pid is not None:
            proc.join(max(0.0, deadline - time.monotonic()))
    for q in queues:
        q.cancel_join_thread()
        q.close()


# ---- Ray ------------------------------------------------------------------------------------------
def _ray_module():
    try:
        import ray
    except ImportError:
        raise RuntimeError('the ray executor needs Ray: pip install "hybridkv[ray]"') from None
    return ray


def _ray_task(index: int, cfg: Job, items: list[WorkItem], channel=None) -> Outcome:
    return run_config(index, cfg, items, None if channel is None else _throttled(
        lambda done, total: channel.put_nowait((index, done, total))))


def _throttled(send: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """``send(done, total)`` at most every half second, and always the last call."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or done == total:
            last[0] = now
            send(done, total)
    return progress


def _run_ray(configs: list[Job], items: list[WorkItem], workers: int,
             address: str | None, progress: Progress | None) -> Iterator[Outcome]:
    ray = _ray_module()
    started = False
    pending: dict = {}
    channel = None
    try:
        if not ray.is_initialized():
            started = True
            kw: dict = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            try:
                if address is None:
                    ray.init(num_cpus=workers, **kw)
                else:
                    ray.init(address=address, **kw)
            except Exception as exc:  # noqa: BLE001 - Ray raises several types for a bad address
                where = "a local Ray" if address is None else f"the Ray cluster at {address!r}"
                raise RuntimeError(f"cannot start or reach {where}: {exc}") from None
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        items_ref = ray.put(items)
        if progress is not None:       # the tasks' progress, through a queue actor (no CPU)
            from ray.util.queue import Queue
            channel = Queue(actor_options={"num_cpus": 0})
        pending = {task.remote(i, c, items_ref, channel): i for i, c in enumerate(configs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            if channel is not None:
                waiting = channel.qsize()
                for index, n, total in (channel.get_nowait_batch(waiting) if waiting else ()):
                    progress(index, n, total)
            for ref in done:
                index = pending.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the task's worker died
                    out = Outcome(index, None, _ray_failure(ray, exc))
                yield out
    finally:
        _stop_ray(ray, pending, started, channel)


def _ray_failure(ray, exc: Exception) -> str:
    """A failed Ray task's error: the job's own exception as :func:`_describe` says it; a task
    whose worker or node died (killed, out of memory) as ``ChildProcessDied`` with Ray's reason."""
    if isinstance(exc, ray.exceptions.RayError) and not isinstance(exc, ray.exceptions.RayTaskError):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return (f"ChildProcessDied: the Ray task running it died ({type(exc).__name__}"
                + (f": {reason}" if reason else "") + ")")
    return _describe(exc)


def _stop_ray(ray, pending: dict, started: bool, channel=None) -> None:
    """Cancel the tasks still pending, stop the progress queue; shut down the Ray this sweep
    started."""
    with sigint_deferred():
        _cancel_ray(ray, pending, started, channel)


def _cancel_ray(ray, pending: dict, started: bool, channel) -> None:
    if channel is not None:
        try:
            channel.shutdown(force=True)
        except Exception:  # noqa: BLE001 - its actor is already gone
            pass
    for ref in pending:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - already finished or its worker gone
            pass
    if started:
        ray.shutdown()
