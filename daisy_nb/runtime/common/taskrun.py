"""The per-task run record every runtime shares, and what is derived from the Scheduler.

:class:`TaskRun` reads every ``Task`` option a runtime uses (process function and
its arity, ``init_fn``, timeout, ``max_workers``, ``max_worker_restarts``,
``requires``, ``resource_tracking``) once, here, and keeps the run-time measures the
runtimes share (batch size, first/done times, block times, resource stats). The
pool and dask extend it with what only they track; the serial runner uses it as
it is. Block counts are not kept here: the Scheduler owns them
(``processing_count``, ``is_abandoned``, ``abandon_reason``); :func:`nothing_left`
derives from them.
"""

from __future__ import annotations

import time
from collections import deque

from daisy_nb.runtime.common import failures
from daisy_nb.runtime.common.payload import serialize_function, timeout_of, wants_context

__all__ = ["TaskRun", "elapsed_of", "nothing_left"]


class TaskRun:
    """One task of a run as the runtimes see it; the scheduler owns the block state.

    Built from the Task once: the options are read here and nowhere else in the
    runtimes. ``payload`` (the pickled ``(process_function, init_fn)``) is made by
    :meth:`serialize`, after a runtime's own checks of the task.
    """

    measures_resources = True  # False: the runtime measures no per-block stats (dask)

    def __init__(self, task):
        self.task = task
        self.tid = task.task_id
        self.fn = task.process_function
        self.init_fn = task.init_fn
        self.arity = task.arity  # 1: block function, 0: worker function (Client loop), None: no function
        self.wants_context = self.fn is not None and wants_context(self.fn)
        roi = getattr(task, "total_roi", None)
        self.ndim = len(roi.shape) if roi is not None else 1
        self.timeout = timeout_of(task)  # seconds per block, None: none
        self.max_workers = max(1, int(task.max_workers))
        self.max_restarts = int(task.max_worker_restarts)
        self.restarts = failures.Restarts(self.max_restarts)  # the restart rule and its cap
        self.requires = {k: int(v) for k, v in task.requires.items()}
        self.track = bool(task.resource_tracking)
        self.speculative = bool(getattr(task, "speculative", None))  # Task(speculative=...): backup copies
        self.res = None  # TaskResourceStats when the task tracks resources and the runtime measures them
        if self.track and self.measures_resources:
            from daisy_nb.profiling import TaskResourceStats

            self.res = TaskResourceStats(self.tid)
        self.payload: bytes | None = None
        self.batch_k = 1
        self.block_secs: deque = deque(maxlen=64)  # recent measured block times (the hang alarm's median)
        self.t_first: float | None = None  # monotonic time of the task's first block handed out
        self.t_done: float | None = None  # monotonic time the task was seen done (serial: its last block released)

    def serialize(self) -> bytes:
        self.payload = serialize_function(self.fn, self.init_fn, self.tid)
        return self.payload

    def elapsed(self, now: float) -> float:
        """Seconds from the first block to done (or to ``now``), for the summary's blocks/s."""
        if self.t_first is None:
            return 0.0
        return (self.t_done or now) - self.t_first


def elapsed_of(trs: dict, order) -> dict:
    """``{task_id: elapsed seconds}`` for the summary; tasks without a run record ran nothing."""
    now = time.monotonic()
    return {tid: trs[tid].elapsed(now) if tid in trs else 0.0 for tid in order}


def nothing_left(scheduler, task_id: str) -> bool:
    """``task_id`` is abandoned, or every block it has left is handed out already (the Scheduler's counts)."""
    return (
        scheduler.is_abandoned(task_id) or scheduler.remaining_count(task_id) - scheduler.processing_count(task_id) <= 0
    )
