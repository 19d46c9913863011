"""Worker failures and abandonment: one policy for every back-end (pool, ``Client`` loops, dask).

* :func:`is_job_end`: the one rule that tells a *job end* (a worker that finished
  blocks and then ended: walltime, preemption, node lost) from a *crash* (also by what
  the batch system said killed the job: :data:`CRASH_CAUSES`);
* :func:`worker_failure` (:func:`count_worker_failure` plus :func:`record_error` plus
  one log line): what every back-end does with a dirty worker exit;
* :class:`Restarts`: the one restart rule (``worker_restart_count`` as daisy 2.0.0's wheel
  counts it; the cap, ``max_worker_restarts``, counts crashes: job ends are exempt), which
  every back-end calls when it starts or replaces a worker and before it replaces one;
* :class:`AbandonReason`: why a task is abandoned, by name (the Scheduler stores the
  value; :meth:`AbandonReason.of` reads it back);
* :func:`abandon`: the one abandonment routine (the task and every task downstream);
* :class:`TaskAbandonedError` and :func:`raise_if_abandoned`: a run with a task
  abandoned by its own workers' failures raises, with the states attached (daisy 2.0
  wheel: a ``RuntimeError``, which this is).
"""

from __future__ import annotations

import enum
import logging
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daisy_nb.errors import WorkerError

__all__ = [
    "ABANDON_NOT_WAITING",
    "ABANDON_RESTARTS",
    "CRASH_CAUSES",
    "CRASH_SIGNALS",
    "JOB_CRASH",
    "JOB_END",
    "AbandonReason",
    "Restarts",
    "TaskAbandonedError",
    "abandon",
    "count_worker_failure",
    "crashes",
    "is_job_end",
    "raise_if_abandoned",
    "record_error",
    "record_worker_error",
    "worker_failure",
]

logger = logging.getLogger("daisy")


class AbandonReason(enum.StrEnum):
    """Why a task was abandoned; the value is what ``Scheduler.abandon_reason`` and the states say."""

    RESTARTS = "worker restart cap exhausted"
    # a Client connected for a worker function that had returned (daisy 2.0.0 stops the run with a RuntimeError)
    NOT_WAITING = "worker function did not wait for its worker"
    UPSTREAM = "upstream task abandoned"  # given by the Scheduler to the tasks downstream of one abandoned

    def __str__(self) -> str:
        return self.value

    @property
    def raises(self) -> bool:
        """The run raises :class:`TaskAbandonedError` for a task abandoned for this reason (its
        downstream tasks are abandoned with it, and raise nothing of their own)."""
        return self is not AbandonReason.UPSTREAM

    @classmethod
    def of(cls, text) -> AbandonReason | None:
        """The reason a Scheduler or a ``TaskState`` gives as text; None for none or another text."""
        try:
            return cls(text)
        except ValueError:
            return None


ABANDON_RESTARTS = AbandonReason.RESTARTS.value
ABANDON_NOT_WAITING = AbandonReason.NOT_WAITING.value

JOB_END = "a job end (walltime, preemption, node lost?), replaced without counting toward max_worker_restarts"
JOB_CRASH = "a crash (its job's own failure), counted toward max_worker_restarts"
# what the batch system said ended a launcher's job (daisy_nb.launch: the report's "cause"), when it
# was the job's own doing: a crash, whatever it finished before. The others (TIMEOUT, PREEMPTED,
# NODE_FAIL, CANCELLED) are the batch system's doing: a job end, once the job finished a block.
CRASH_CAUSES = frozenset({"OUT_OF_MEMORY", "FAILED"})
# a worker killed by one of these crashed by itself (a bug in the program), whatever it finished before
CRASH_SIGNALS = frozenset(
    getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS") if hasattr(signal, n)
)


def is_job_end(
    finished: int, *, crashed: bool = False, returncode: int | None = None, cause: str | None = None
) -> bool:
    """Whether a worker's dirty exit is a *job end* rather than a crash.

    The restart cap (``max_worker_restarts``) is there to stop crash loops. A worker
    that finished at least one block since it started and then ended (its job's
    walltime, a preemption, the node lost, ``SIGKILL``/``SIGTERM``, a non-zero exit)
    is a job end: it is counted (``worker_failure_count``, ``worker_job_end_count``)
    and replaced, but not as a restart. A crash is a worker that finished no block,
    or whose own error ended it: ``crashed`` (its block raised, as daisy 2.0 ends the
    worker then; a block timeout; a worker that cannot have a job end, such as a local
    block worker), a signal of :data:`CRASH_SIGNALS` (segfault, abort), or what the batch
    system said ended its job (``cause``, the kind of ``daisy_nb.launch.Cause``) is one of
    :data:`CRASH_CAUSES` (out of memory, the program's own non-zero exit). Job ends
    cannot loop: each needs a block completed since the worker started, and a block
    completes once; so a job killed by its walltime or preempted before it finished a
    block is a crash too.
    """
    if finished <= 0 or crashed or cause in CRASH_CAUSES:
        return False
    return returncode is None or returncode >= 0 or -returncode not in CRASH_SIGNALS


def count_worker_failure(counters, job_end: bool) -> None:
    """One dirty worker exit: ``worker_failure_count`` (and ``worker_job_end_count`` for a job end)."""
    counters.worker_failure_count += 1
    if job_end:
        counters.worker_job_end_count += 1


def record_error(
    counters,
    text: str,
    first: str | None = None,
    log: str | None = None,
    *,
    error: WorkerError | None = None,
    first_error: WorkerError | None = None,
    last: bool = True,
) -> None:
    """Keep ``text`` as the task's last worker error (and ``first``, else ``text``, as its first),
    and count it (and ``first``) in the task's error groups (:mod:`daisy_nb.errors`); ``log``:
    the worker's log file.

    ``error``: the same failure structured, as a back-end that sends type, message and
    traceback apart knows it: the groups count it without parsing ``text`` (``first_error``:
    ``first`` structured likewise). ``last=False``:
    ``text`` does not replace the last worker error (a worker's exit caused by a block's error
    recorded already: daisy 2.0.0 shows the block's traceback, not the exit)."""
    if counters.first_worker_error is None:
        counters.first_worker_error = text if first is None else first
    if last:
        counters.last_worker_error = text
    groups = getattr(counters, "error_groups", None)
    if groups is not None:
        if first is not None and first != text:
            groups.add(first if first_error is None else first_error, log)
        groups.add(text if error is None else error, log)


def record_worker_error(counters, error: WorkerError, first: WorkerError | None = None, log: str | None = None) -> None:
    """:func:`record_error` of a structured failure: the task's last (and first) worker error
    is ``error.text()`` (the same text the text path records), and the error groups count
    ``error`` (and ``first``) by its type and message as sent, without parsing."""
    record_error(counters, error.text(), None if first is None else first.text(), log, error=error, first_error=first)


def worker_failure(counters, task_id: str, text: str, *, job_end: bool, log: str | None = None) -> None:
    """A dirty worker exit of ``task_id``'s worker: counted (:func:`count_worker_failure`), its
    error kept for the summary (:func:`record_error`) and logged once (the first line) on ``daisy``."""
    count_worker_failure(counters, job_end)
    record_error(counters, text, log=log)
    logger.warning("task %r: %s", task_id, text.splitlines()[0] if text else text)


def crashes(counters) -> int:
    """The task's crashes so far: its dirty worker exits that were not job ends (:func:`is_job_end`)."""
    return counters.worker_failure_count - counters.worker_job_end_count


class Restarts:
    """One task's restarts: the one rule of every back-end (pool, dask).

    * ``worker_restart_count`` counts restarts as daisy 2.0.0's wheel does: a worker that
      starts while the task has more failures than restarts is a restart (every
      replacement after a dirty exit, a job end's too);
    * the cap, ``max_worker_restarts``, counts crashes: a crash replaced is one of the
      cap's; a job end (a worker function's job that finished blocks and then ended,
      :func:`is_job_end`) is replaced however many there were. A local block worker's death
      is a crash (:mod:`daisy_nb.runtime.local.exits`).

    The pool calls :meth:`started` for every worker it starts; dask, whose cluster replaces
    a lost worker itself, calls :meth:`replaced` for a crash it replaces at once. Both ask
    :meth:`cap_reached` before replacing one.
    """

    def __init__(self, max_restarts: int):
        self.max_restarts = int(max_restarts)
        self.crashes_replaced = 0  # crashes whose worker was replaced (what the cap counts)

    def started(self, counters) -> None:
        """A worker of the task starts (its first, or a replacement): ``worker_start_count``, and
        :meth:`replaced` when a failure waits for its replacement."""
        counters.worker_start_count += 1
        self.replaced(counters)

    def replaced(self, counters) -> None:
        """A failed worker is replaced: a restart as the wheel counts it (``failures > restarts``);
        a crash not replaced yet is now (one of the cap's)."""
        if counters.worker_failure_count > counters.worker_restart_count:
            counters.worker_restart_count += 1
        if crashes(counters) > self.crashes_replaced:
            self.crashes_replaced += 1

    def cap_reached(self, counters) -> bool:
        """A crash that may not be replaced: ``max_worker_restarts`` crashes were replaced already
        (job ends do not count toward the cap)."""
        return crashes(counters) > self.crashes_replaced and self.crashes_replaced >= self.max_restarts


def abandon(scheduler, task_id: str, reason: AbandonReason | str) -> list[str]:
    """Abandon ``task_id`` for ``reason`` and every task downstream of it (for
    :attr:`AbandonReason.UPSTREAM`); returns the task ids abandoned now (none if it was already).

    The Scheduler owns the outcome: ``is_abandoned``, ``abandon_reason``, and the blocks
    left (orphaned) and in flight (0). Blocks still running in a worker are the
    back-end's to end; their releases are ignored.
    """
    why = AbandonReason(reason)
    if why is AbandonReason.UPSTREAM:
        raise ValueError("abandon(reason=UPSTREAM): the Scheduler gives that reason to downstream tasks itself")
    return scheduler.abandon_task(task_id, why.value)


class TaskAbandonedError(RuntimeError):
    """A task of the run was abandoned after its workers' failures (a ``RuntimeError``, as daisy 2.0).

    Carries ``daisy_states`` (``{task_id: TaskState}``), ``daisy_task_order``,
    ``daisy_run_stats`` (None), ``task_id`` and ``reason`` (an :class:`AbandonReason`).
    """

    def __init__(self, message: str, *, task_id=None, reason=None, states=None, task_order=()):
        super().__init__(message)
        self.task_id = task_id
        self.reason = AbandonReason.of(reason) if reason is not None else None
        self.daisy_states = states
        self.daisy_task_order = list(task_order)
        self.daisy_run_stats = None


def raise_if_abandoned(states, task_order, workers: str = "workers") -> None:
    """daisy 2.0 wheel: a run with a task abandoned after its worker restart cap raises
    ``RuntimeError`` (:class:`TaskAbandonedError`) with the states attached (daisy_nb: also
    one abandoned because its worker function did not wait for its worker, which daisy
    2.0.0 stops the run for). Tasks abandoned as downstream of one raise nothing of their own."""
    for tid in task_order:
        st = states[tid]
        reason = AbandonReason.of(getattr(st, "abandon_reason", None))
        if getattr(st, "abandoned", False) and reason is not None and reason.raises:
            ends = getattr(st, "worker_job_end_count", 0)
            msg = (
                f"task '{tid}' was abandoned ({reason.value}): {workers} failed "
                f"{st.worker_failure_count} times"
                + (f" ({ends} of them job ends after finished blocks, not counted toward the cap)" if ends else "")
                + f", {st.worker_restart_count} restarts performed; "
                f"{st.orphaned_count} of {st.total_block_count} blocks were orphaned."
            )
            if getattr(st, "last_worker_error", None):
                msg += f" Last worker error: {st.last_worker_error}"
            raise TaskAbandonedError(msg, task_id=tid, reason=reason, states=states, task_order=task_order)
