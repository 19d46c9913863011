"""What a worker process's dirty exit is reported as: counted, described, recorded, logged once.

:class:`.processes.Processes` sees a worker end and classifies the exit
(:mod:`.exits`); :func:`report_dirty_exit` is what follows for a dirty one: the failure
counted (``worker_failure_count``, ``worker_job_end_count``:
:func:`daisy_nb.runtime.common.failures.count_worker_failure`), the message (daisy 2.0.0's
words, a job end's note, the tail of the worker's stderr), the task's worker errors and
error groups (:func:`daisy_nb.runtime.common.failures.record_error`) and one log line.

The last worker error: the exit of a worker whose block raised is counted and grouped, but
the block's error (recorded when it arrived) stays the task's last, as daisy 2.0.0 shows the
block's traceback there, not the exit; unless this exit may not be replaced (the restart
cap is reached and the task is not done: it is abandoned for this exit, and the wheel's
abandonment message names the exit).
"""

from __future__ import annotations

import logging

from daisy_nb.runtime.common.failures import CRASH_CAUSES, JOB_CRASH, JOB_END, count_worker_failure, record_error
from daisy_nb.runtime.common.run_block import TB_CAP_BYTES, cap_traceback
from daisy_nb.runtime.local.exits import ExitKind, job_cause_kind

__all__ = ["err_tail", "exit_message", "report_dirty_exit"]

logger = logging.getLogger("daisy")


def report_dirty_exit(
    scheduler,
    w,
    kind: ExitKind,
    rc: int,
    *,
    was_busy: bool,
    finished: int,
    raised: bool,
    msg: str | None,
    function_message,
) -> None:
    """Worker ``w`` ended dirty (``kind``, exit code ``rc``); ``msg``: a worker function's diagnosis
    when it returned on its own, else None (described here; ``function_message(w, kind, rc)``
    describes a worker function's other exits)."""
    tr = w.tr
    c = scheduler.counters[tr.tid]
    job_end = kind is ExitKind.JOB_END
    count_worker_failure(c, job_end)
    if msg is None:
        if kind is ExitKind.TIMEOUT or w.block_worker:
            msg = exit_message(w, kind, rc, was_busy)
        else:
            msg = function_message(w, kind, rc)
        if job_end:
            msg += f" after it had finished {finished} block(s): {JOB_END}"
        elif finished and not w.block_worker and job_cause_kind(w.job) in CRASH_CAUSES:
            msg += f" after it had finished {finished} block(s): {JOB_CRASH}"  # not the job end it would be
        tail = err_tail(w)
        if tail:
            msg += "\nworker stderr tail:\n" + tail
    abandons = tr.restarts.cap_reached(c) and not scheduler.is_task_done(tr.tid)
    record_error(c, msg, log=w.err_path, last=not raised or abandons)
    logger.warning("task %r: %s", tr.tid, msg.splitlines()[0])


def exit_message(w, kind: ExitKind, rc: int, was_busy: bool) -> str:
    """daisy 2.0.0's words for a block worker's exit, or any worker's timeout."""
    if kind is ExitKind.TIMEOUT:
        return f"daisy worker process killed after a block exceeded timeout={w.tr.timeout:g}s"
    return f"daisy worker process exited with code {rc}" + (" while processing blocks" if was_busy else "")


def err_tail(w) -> str:
    """The end of what ``w`` wrote to its ``.err`` log in this life (capped as a traceback is)."""
    if not w.err_path:
        return ""
    try:
        with open(w.err_path, "rb") as f:
            f.seek(w.err_offset)
            data = f.read()[-TB_CAP_BYTES:]
        return cap_traceback(data.decode("utf-8", "replace").strip())
    except OSError:
        return ""
