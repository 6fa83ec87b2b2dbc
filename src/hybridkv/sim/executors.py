"""Where a sweep's simulations run: in this process, on local processes, or as Ray tasks.

A sweep is a list of :class:`SimConfig` over one workload. :func:`execute` runs every
configuration and yields an :class:`Outcome` as each one finishes (in completion order;
``index`` says which configuration it is). A configuration that raises yields its error and
the others go on. Every executor runs the same :func:`run_config`, so a configuration gives
the same :class:`SimResult` (all but its timing keys, ``simulator.TIMING_KEYS``) wherever it
runs.

* ``serial``: one configuration after another in this process (a large workload's offline
  optimum still runs in a forked child meanwhile, as in ``simulate``).
* ``processes``: a pool of ``workers`` local processes (spawned: no state is inherited). The
  workload is sent once per worker. Inside a worker the optimum runs inline (no child), so
  ``workers`` processes use ``workers`` cores.
* ``ray``: one Ray task per configuration on the cluster at ``ray_address`` (``ray.init``'s
  address: ``auto``, ``ray://host:10001``, ...), or on a local Ray started for the sweep when
  no address is given (``workers`` CPUs). The workload is put in the object store once. The
  cluster's workers must be able to import hybridkv (install it there). Needs the optional
  extra: ``pip install "hybridkv[ray]"``.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Callable, Iterator, Sequence

from hybridkv.core.validation import check_int
from hybridkv.sim.simulator import SimConfig, SimResult, Simulator
from hybridkv.sim.workitems import WorkItem

EXECUTORS = ("serial", "processes", "ray")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished configuration: its result, or the error it raised (``"Type: message"``)."""

    index: int
    result: SimResult | None
    error: str | None = None


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_config(index: int, cfg: SimConfig, items: Sequence[WorkItem],
               progress: Callable[[int, int], None] | None = None) -> Outcome:
    """Simulate one configuration; an exception becomes the outcome's error."""
    try:
        return Outcome(index, Simulator(cfg, progress=progress).run(items))
    except Exception as exc:  # noqa: BLE001 - reported per configuration, the sweep goes on
        return Outcome(index, None, _describe(exc))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, (ValueError, RuntimeError, MemoryError)):   # unexpected: where
        frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        text += "".join(f" (at {f.filename}:{f.lineno})" for f in frame)
    return text


def _inline_optimum(configs: Sequence[SimConfig]) -> list[SimConfig]:
    """The configurations with the optimum computed inline: a worker uses one core."""
    return [dataclasses.replace(c, parallel_optimum=False) for c in configs]


def execute(configs: Sequence[SimConfig], items: Sequence[WorkItem], executor: str = "serial",
            workers: int | None = None, ray_address: str | None = None,
            progress: Callable[[int, int], None] | None = None) -> Iterator[Outcome]:
    """Run every configuration on ``items``; yield outcomes as they finish.

    Args:
        configs: the configurations (their position is the outcome's ``index``).
        items: the workload, shared by all configurations.
        executor: ``serial``, ``processes`` or ``ray``.
        workers: processes (``processes``) or local Ray CPUs (``ray`` without an address);
            default: the usable cores, at most one per configuration.
        ray_address: the Ray cluster to submit to (``ray`` only); None starts a local Ray.
        progress: ``serial`` only: per-request progress of the running configuration.

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
        return (run_config(i, c, items, progress) for i, c in enumerate(configs))
    if executor == "processes":
        return _run_processes(_inline_optimum(configs), items, workers)
    _ray_module()                              # fail now, not at the first outcome
    return _run_ray(_inline_optimum(configs), items, workers, ray_address)


# ---- local processes ------------------------------------------------------------------------------
_WORKER_ITEMS: list[WorkItem] = []


def _init_worker(items: list[WorkItem]) -> None:
    global _WORKER_ITEMS
    _WORKER_ITEMS = items


def _process_task(index: int, cfg: SimConfig) -> Outcome:
    return run_config(index, cfg, _WORKER_ITEMS)


def _run_processes(configs: list[SimConfig], items: list[WorkItem], workers: int) -> Iterator[Outcome]:
    pool = ProcessPoolExecutor(max_workers=min(workers, len(configs)), mp_context=get_context("spawn"),
                               initializer=_init_worker, initargs=(items,))
    try:
        pending = {pool.submit(_process_task, i, c): i for i, c in enumerate(configs)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                index = pending.pop(fut)
                try:
                    yield fut.result()
                except Exception as exc:  # noqa: BLE001 - a worker died (killed, out of memory)
                    yield Outcome(index, None, _describe(exc))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ---- Ray ------------------------------------------------------------------------------------------
def _ray_module():
    try:
        import ray
    except ImportError:
        raise RuntimeError('the ray executor needs Ray: pip install "hybridkv[ray]"') from None
    return ray


def _ray_task(index: int, cfg: SimConfig, items: list[WorkItem]) -> Outcome:
    return run_config(index, cfg, items)


def _run_ray(configs: list[SimConfig], items: list[WorkItem], workers: int,
             address: str | None) -> Iterator[Outcome]:
    ray = _ray_module()
    started = False
    if not ray.is_initialized():
        kw: dict = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            if address is None:
                ray.init(num_cpus=workers, **kw)
            else:
                ray.init(address=address, **kw)
        except Exception as exc:  # noqa: BLE001 - Ray raises several types for a bad address
            where = "a local Ray" if address is None else f"the Ray cluster at {address!r}"
            raise RuntimeError(f"cannot start or reach {where}: {exc}") from None
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        items_ref = ray.put(items)
        pending = {task.remote(i, c, items_ref): i for i, c in enumerate(configs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the task's worker died
                    yield Outcome(index, None, _describe(exc))
    finally:
        if started:
            ray.shutdown()
