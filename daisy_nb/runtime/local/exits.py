"""Why a worker process ended, and what it counts as: a pure function of what was seen.

daisy 2.0 counts every dirty worker exit as a failure, and its replacement as a
restart (``worker_restart_count``), up to ``max_worker_restarts``. daisy_nb keeps that
rule, with one exemption for cluster jobs: a worker *function* (a 0-argument function,
whose job runs on a cluster) that finished blocks and then ended (its job's walltime,
a preemption, a lost node) is a *job end*, replaced without counting as a restart
(:func:`daisy_nb.runtime.common.failures.is_job_end`), unless its launcher's job report says the
job's own failure ended it (out of memory, a non-zero exit: ``cause``). A local block worker has
no walltime: its death is a crash, whatever it finished before, as the wheel counts it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from daisy_nb.runtime.common.failures import is_job_end

__all__ = ["ExitFacts", "ExitKind", "WorkerRecord", "classify_exit", "classify_worker_exit", "job_cause_kind"]


class ExitKind(enum.Enum):
    STOPPED = "stopped"  # we asked it to quit or killed it (the run's end, abandonment, Ctrl-C): clean
    RETURNED = "returned"  # a worker function returned on its own (exit 0): its diagnoses decide
    CRASH = "crash"  # a dirty exit that counts toward max_worker_restarts
    JOB_END = "job end"  # a worker function's job ended after finished blocks: replaced, not a restart
    TIMEOUT = "timeout"  # killed by us: a block exceeded the task's timeout (a crash)
    LOST = "lost"  # killed by us: a client of its job went silent (a crash, or a job end)

    @property
    def dirty(self) -> bool:
        return self not in (ExitKind.STOPPED, ExitKind.RETURNED)


@dataclass(frozen=True)
class ExitFacts:
    """What the shell knows when a worker process has ended."""

    block_worker: bool  # a block function's worker (else a 0-argument worker function)
    returncode: int  # its exit code (negative: the signal that ended it)
    finished: int = 0  # blocks it (or its job's clients) finished successfully
    raised: bool = False  # a block raised (daisy 2.0 ends the worker: a crash)
    timed_out: bool = False  # we killed it: a block exceeded the timeout
    lost: bool = False  # we killed it: a client of its job went silent
    expected: bool = False  # we told it to quit, or killed it at the run's end or for abandonment
    aborting: bool = False  # the run is being aborted (Ctrl-C, an error)
    orphaned: bool = False  # it died with the worker template (not its fault)
    cause: str | None = None  # what the batch system said ended its job (daisy_nb.launch.Cause.kind)


def classify_exit(f: ExitFacts) -> ExitKind:
    """The kind of a worker's exit (see the module docstring)."""
    if f.timed_out:
        return ExitKind.TIMEOUT
    if f.lost:
        return (
            ExitKind.JOB_END
            if is_job_end(f.finished, crashed=f.raised, returncode=f.returncode, cause=f.cause)
            else ExitKind.LOST
        )
    if f.expected or f.aborting or f.orphaned:
        return ExitKind.STOPPED
    if f.block_worker:
        return ExitKind.CRASH  # block workers only exit when told to; no walltime on this machine
    if f.returncode == 0:
        return ExitKind.RETURNED
    if is_job_end(f.finished, crashed=f.raised, returncode=f.returncode, cause=f.cause):
        return ExitKind.JOB_END
    return ExitKind.CRASH


def job_cause_kind(job) -> str | None:
    """What the batch system said ended a launcher's job: the first word of its report's ``cause``
    (``daisy_nb.launch.Cause``: ``OUT_OF_MEMORY``, ``TIMEOUT``...), None when it said nothing."""
    cause = job.get("cause") if job else None
    return cause.split(" ", 1)[0] if cause else None


class WorkerRecord(Protocol):
    """What a worker's record knows of its life (the core's ``BlockWorker``, the shell's ``FunctionWorker``)."""

    finished: int
    raised: bool
    timed_out: bool
    expected_exit: bool


def classify_worker_exit(
    w: WorkerRecord, returncode: int, *, block_worker: bool, aborting: bool, orphaned: bool
) -> ExitKind:
    """The kind of the exit of the worker ``w`` records (:func:`classify_exit` of its facts; ``lost``:
    a worker function's job whose client went silent; ``cause``: its launcher's last job report's)."""
    return classify_exit(
        ExitFacts(
            block_worker=block_worker,
            returncode=returncode,
            finished=w.finished,
            raised=w.raised,
            timed_out=w.timed_out,
            lost=bool(getattr(w, "lost", False)),
            expected=w.expected_exit,
            aborting=aborting,
            orphaned=orphaned,
            cause=job_cause_kind(getattr(w, "job", None)),
        )
    )
