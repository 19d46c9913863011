"""``run_blockwise``: run a pipeline serially (in-process) or on a pool of worker processes."""

from __future__ import annotations

import os
import time
import warnings

from .block import BlockStatus
from .scheduler import Scheduler

__all__ = ["run_blockwise"]


def _serial(scheduler: Scheduler, progress, summary: bool):
    """daisy's serial runner: the first exception from a block function propagates."""
    order = scheduler.task_ids
    for tid in order:
        task = scheduler.tasks[tid]
        if task.layout.num_blocks and (task.process_function is None or task.arity != 1):
            raise ValueError(
                f"invalid configuration: task {tid!r} has no 1-argument process_function; serial mode "
                "(multiprocessing=False) calls process_function(block)"
            )
    from .dask import set_worker_state

    for tid in order:
        init_fn = scheduler.tasks[tid].init_fn
        if init_fn is not None and scheduler.tasks[tid].layout.num_blocks:
            set_worker_state(tid, init_fn())
    res = {}  # resource_tracking: task id -> TaskResourceStats
    for tid in order:
        if getattr(scheduler.tasks[tid], "resource_tracking", False):
            from .profiling import TaskResourceStats

            res[tid] = TaskResourceStats(tid)
    t0 = {}
    t1 = {}
    try:
        while True:
            progressed = False
            for tid in order:
                block = scheduler.acquire_block(tid)
                if block is None:
                    continue
                t0.setdefault(tid, time.monotonic())
                block.status = BlockStatus.PROCESSING
                acc = res.get(tid)
                if acc is None:
                    scheduler.tasks[tid].process_function(block)
                else:
                    from .profiling import measured_stats, profile_block

                    prof = profile_block(block)
                    with prof:
                        scheduler.tasks[tid].process_function(block)
                    acc.add_one(measured_stats(prof, block), block.status == BlockStatus.FAILED)
                if block.status != BlockStatus.FAILED:
                    block.status = BlockStatus.SUCCESS
                scheduler.release_block(block)
                t1[tid] = time.monotonic()
                progressed = True
                break
            if not progressed:
                break
    finally:
        scheduler.flush_tracking()
    states = scheduler.task_states
    for tid in order:
        states[tid].resource_stats = res.get(tid)
    if summary:
        from .progress import print_summary

        print_summary(states, order, {tid: t1.get(tid, 0) - t0.get(tid, 0) for tid in order})
    return states


def run_blockwise(
    tasks,
    multiprocessing: bool = True,
    resources=None,
    progress=True,
    return_states: bool = False,
    summary: bool = True,
    block_tracking: bool = True,
    host=None,
    executor=None,
    log_dir=None,
):
    """Run a Pipeline, a Task, or a list of tasks (daisy 1.x form) blockwise.

    Returns True iff every block of every task completed (skipped blocks count as
    completed), or the ``{task_id: TaskState}`` dict with ``return_states=True``.
    ``multiprocessing=False`` runs in this process and re-raises the first exception
    of a block function. With worker processes, a task abandoned after
    ``max_worker_restarts`` raises ``RuntimeError`` with the states attached.
    ``host`` (else ``DAISY_HOST``) is the address the pool listens on for ``Client``
    connections and tells workers (``DAISY_CONTEXT``); default ``127.0.0.1``,
    ``"0.0.0.0"`` listens on every interface and advertises ``socket.getfqdn()``.
    """
    host = host if host is not None else os.environ.get("DAISY_HOST")
    if host is not None and not isinstance(host, str):
        raise TypeError(f"host must be a string (an address or host name of this machine), got {type(host).__name__}")
    scheduler = Scheduler(tasks, block_tracking=block_tracking)
    try:
        if not multiprocessing:
            states = _serial(scheduler, progress, summary)
        elif executor is not None:
            from .dask import run_dask  # optional extra

            tracked = [t for t in scheduler.task_ids if getattr(scheduler.tasks[t], "resource_tracking", False)]
            if tracked:
                warnings.warn(
                    f"resource_tracking=True is not measured under executor= (dask): tasks {tracked} get no "
                    "per-block stats and no Resource Utilization panel; the worker pool and the serial runner "
                    "measure them",
                    UserWarning,
                    stacklevel=2,
                )

            states = run_dask(scheduler, executor, progress=progress, summary=summary)
        else:
            from .runtime.pool import raise_if_abandoned, run_pool

            states = run_pool(
                scheduler, resources=resources, progress=progress, summary=summary, log_dir=log_dir, host=host
            )
            raise_if_abandoned(states, scheduler.task_ids)
    finally:
        scheduler.close()
    if return_states:
        return states
    return all(s.completed_count == s.total_block_count for s in states.values())
