"""The serial runner (``run_blockwise(..., multiprocessing=False)``): every block in this process.

daisy's serial mode: one block at a time, in dependency order, no retries of an
exception: the first exception from a block function propagates with its type and
traceback (a block whose function set ``block.status = FAILED`` fails and is retried
as usual; with ``Task(retry_backoff=...)`` the loop sleeps until a retry is due when
nothing else is ready). Like the worker pool it has the heartbeat of :mod:`daisy_nb.progress`:
``progress=`` observers (tqdm bars by default) get ``on_start``, ``on_progress``
about every 0.2 s and ``on_finish``, block tracking is flushed about once a second,
and the execution summary is printed at the end. The heartbeat beats between
blocks, so a block that runs for minutes holds the bars still meanwhile; the hang
alarm (:mod:`daisy_nb.hang`) checks from a daemon thread instead.

daisy 2.0.0 shows no progress in serial mode (its observers get no
call at all). daisy_nb shows it (docs/how-to/migrate.md#progress): ``progress=False`` gives
daisy's silence.
"""

from __future__ import annotations

import os
import time

from daisy_nb.block import BlockStatus
from daisy_nb.progress import Heartbeat, notify, resolve_observer
from daisy_nb.runtime.common.run_end import end_run
from daisy_nb.runtime.common.taskrun import TaskRun
from daisy_nb.runtime.common.worker_state import bind, unbind

__all__ = ["run_serial"]

_BEAT_SECS = 0.2  # while a failed block waits for its retry: the heartbeat's pace (progress bars, tracking)


def _records(scheduler, order) -> dict:
    trs = {tid: TaskRun(scheduler.tasks[tid]) for tid in order}
    for tid, tr in trs.items():
        if tr.task.layout.num_blocks and (tr.fn is None or tr.arity != 1):
            raise ValueError(
                f"invalid configuration: task {tid!r} has no 1-argument process_function; serial mode "
                "(multiprocessing=False) calls process_function(block)"
            )
    return trs


def run_serial(scheduler, *, progress=True, summary: bool = True, hang_alarm=None):
    """Run every block of ``scheduler`` in this process; returns ``{task_id: TaskState}``.

    A block function's exception propagates at once (no summary, so the traceback
    is not buried; the bars are closed and tracking is flushed first). Ctrl-C prints
    the partial summary and re-raises the ``KeyboardInterrupt`` with
    ``daisy_states``/``daisy_task_order`` attached, as the pool does.
    """
    order = list(scheduler.task_ids)
    trs = _records(scheduler, order)
    states = {}  # task id -> init_fn() result, bound to this thread while a block function runs
    for tid, tr in trs.items():
        if tr.init_fn is not None and tr.task.layout.num_blocks:
            states[tid] = tr.init_fn()
    observer = resolve_observer(progress, order)
    notify(observer, "on_start", scheduler)
    heartbeat = Heartbeat(observer, scheduler)
    from daisy_nb.hang import make_alarm, resolve_hang_alarm

    cur: list = []  # the block running now: (task, [row], worker, pid, started), for the hang alarm
    alarm = make_alarm(resolve_hang_alarm(hang_alarm), scheduler, observer, lambda: list(cur), trs)
    if alarm is not None:
        alarm.start_thread()  # this loop is inside the block while it runs: the alarm checks from a thread
    try:
        while True:
            progressed = False
            for tid in order:
                block = scheduler.acquire_block(tid)
                if block is None:
                    continue
                tr = trs[tid]
                if tr.t_first is None:
                    tr.t_first = time.monotonic()
                block.status = BlockStatus.PROCESSING
                prev = bind(states, tid)
                t0 = time.monotonic()
                cur[:] = [(tid, [block.index], "this process", os.getpid(), t0)]
                try:
                    if tr.res is None:
                        tr.fn(block)
                    else:
                        from daisy_nb.profiling import measured_stats, profile_block

                        prof = profile_block(block)
                        with prof:
                            tr.fn(block)
                        tr.res.add_one(measured_stats(prof, block), block.status == BlockStatus.FAILED)
                finally:
                    unbind(prev)
                    cur.clear()
                    secs = time.monotonic() - t0
                    tr.block_secs.append(secs)
                    scheduler.counters[tid].job_seconds.ran(secs)
                if block.status != BlockStatus.FAILED:
                    block.status = BlockStatus.SUCCESS
                scheduler.release_block(block)
                now = tr.t_done = time.monotonic()  # the task's last block so far
                heartbeat(now)
                progressed = True
                break
            if not progressed:
                if not _wait_for_retry(scheduler, heartbeat):
                    break
    except KeyboardInterrupt as e:
        _flush(scheduler, observer)
        end_run(scheduler, observer, trs, order, summary=summary, interrupted=True, interrupt=e)
        raise  # not reached: end_run re-raises ``e`` with the states
    except BaseException:  # the block function's exception, as it is
        _flush(scheduler, observer)
        notify(observer, "on_finish", scheduler)
        raise
    finally:
        if alarm is not None:
            alarm.close()
    _flush(scheduler, observer)
    return end_run(scheduler, observer, trs, order, summary=summary, interrupted=False)


def _wait_for_retry(scheduler, heartbeat) -> bool:
    """No block is ready: wait until the next failed block's retry time (``Task(retry_backoff=...)``),
    beating the heartbeat meanwhile; False if no block waits for a retry (the run is over)."""
    at = scheduler.wake_retries()
    if at is None:
        return False
    while True:
        now = time.monotonic()
        if now >= at:
            return True
        time.sleep(min(at - now, _BEAT_SECS))
        heartbeat(time.monotonic())


def _flush(scheduler, observer) -> None:
    scheduler.flush_tracking()
    notify(observer, "on_progress", scheduler)  # the final counts, then the bars close
