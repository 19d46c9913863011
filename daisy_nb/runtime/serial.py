"""The serial runner (``run_blockwise(..., multiprocessing=False)``): every block in this process.

daisy's serial mode: one block at a time, in dependency order, no retries of an
exception: the first exception from a block function propagates with its type and
traceback (a block whose function set ``block.status = FAILED`` fails and is retried
as usual). Like the worker pool it has the heartbeat of :mod:`daisy_nb.progress`:
``progress=`` observers (tqdm bars by default) get ``on_start``, ``on_progress``
about every 0.2 s and ``on_finish``, block tracking is flushed about once a second,
and the execution summary is printed at the end. The heartbeat beats between
blocks, so a block that runs for minutes holds the bars still meanwhile.

daisy 2.0.0 shows no progress in serial mode (API.md 1.4; its observers get no
call at all). daisy_nb shows it, as issue #12 asks: ``progress=False`` gives
daisy's silence.
"""

from __future__ import annotations

import time

from daisy_nb.block import BlockStatus
from daisy_nb.progress import (
    Heartbeat,
    finish_run,
    notify,
    print_summary,
    resolve_observer,
)

__all__ = ["run_serial"]


def _check(scheduler, order) -> None:
    for tid in order:
        task = scheduler.tasks[tid]
        if task.layout.num_blocks and (task.process_function is None or task.arity != 1):
            raise ValueError(
                f"invalid configuration: task {tid!r} has no 1-argument process_function; serial mode "
                "(multiprocessing=False) calls process_function(block)"
            )


def run_serial(scheduler, *, progress=True, summary: bool = True):
    """Run every block of ``scheduler`` in this process; returns ``{task_id: TaskState}``.

    A block function's exception propagates at once (no summary, so the traceback
    is not buried; the bars are closed and tracking is flushed first). Ctrl-C prints
    the partial summary and re-raises the ``KeyboardInterrupt`` with
    ``daisy_states``/``daisy_task_order`` attached, as the pool does.
    """
    order = list(scheduler.task_ids)
    _check(scheduler, order)
    from daisy_nb.runtime.state import set_worker_state

    for tid in order:
        init_fn = scheduler.tasks[tid].init_fn
        if init_fn is not None and scheduler.tasks[tid].layout.num_blocks:
            set_worker_state(tid, init_fn())
    res = {}  # resource_tracking: task id -> TaskResourceStats
    for tid in order:
        if getattr(scheduler.tasks[tid], "resource_tracking", False):
            from daisy_nb.profiling import TaskResourceStats

            res[tid] = TaskResourceStats(tid)
    observer = resolve_observer(progress, order)
    notify(observer, "on_start", scheduler)
    heartbeat = Heartbeat(observer, scheduler)
    tasks = scheduler.tasks
    t0: dict = {}
    t1: dict = {}
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
                    tasks[tid].process_function(block)
                else:
                    from daisy_nb.profiling import measured_stats, profile_block

                    prof = profile_block(block)
                    with prof:
                        tasks[tid].process_function(block)
                    acc.add_one(measured_stats(prof, block), block.status == BlockStatus.FAILED)
                if block.status != BlockStatus.FAILED:
                    block.status = BlockStatus.SUCCESS
                scheduler.release_block(block)
                now = time.monotonic()
                t1[tid] = now
                heartbeat(now)
                progressed = True
                break
            if not progressed:
                break
    except KeyboardInterrupt as e:
        states = _end(scheduler, observer, res)
        if summary:
            print_summary(states, order, _elapsed(order, t0, t1), interrupted=True)
        e.daisy_states = states
        e.daisy_task_order = order
        raise
    except BaseException:
        _end(scheduler, observer, res)
        raise
    states = _end(scheduler, observer, res)
    finish_run(states, order, _elapsed(order, t0, t1), summary=summary, interrupted=False)
    return states


def _end(scheduler, observer, res):
    scheduler.flush_tracking()
    states = scheduler.task_states
    for tid, st in states.items():
        st.resource_stats = res.get(tid)
    notify(observer, "on_progress", scheduler)  # the final counts, then the bars close
    notify(observer, "on_finish", scheduler)
    return states


def _elapsed(order, t0, t1) -> dict:
    return {tid: t1.get(tid, 0.0) - t0.get(tid, 0.0) for tid in order}
