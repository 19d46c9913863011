"""The run policy that every runtime front-end shares (pool, dask, serial).

What a runtime needs to decide about a task, decided once, here:

* :class:`TaskRun`: the per-task run record. Every ``Task`` option a runtime uses
  (process function and its arity, ``init_fn``, timeout, ``max_workers``,
  ``max_worker_restarts``, ``requires``, ``resource_tracking``) is read from the
  Task here, once, with the run-time counts the runtimes share (batch size, blocks
  in flight, abandonment, first/done times, resource stats). The pool and dask
  extend it with what only they track; the serial runner uses it as it is;
* :func:`record_error`: a worker error or traceback for the summary (first and last);
* :func:`is_job_end` and :func:`count_worker_failure`: which worker deaths count toward
  ``max_worker_restarts`` (crashes) and which do not (job ends), for every runtime;
* :func:`end_run`: the end of every run (resource stats, ``on_finish``, the summary,
  a Ctrl-C re-raised with the states); the periodic chores are
  :class:`daisy_nb.progress.Heartbeat`, abandonment is raised by
  :func:`daisy_nb.progress.raise_if_abandoned`;

* :func:`serialize_function`: the task's ``(process_function, init_fn)`` pickled
  once per run (cloudpickle, else pickle), with one clear error when that is
  impossible, before any worker starts;
* :func:`timeout_of`: the task's block timeout in seconds, or None for none;
* :func:`grow_batch`: the next batch size from the measured time per block (a
  batch carries about ``target`` seconds of work, growing at most ``MAX_GROWTH``
  times per batch);
* :func:`wants_context`: whether a 0-argument worker function asks for its
  ``Context`` as the keyword-only ``context`` (daisy 2.0 wheel).

The per-block work of each runtime stays in its own module; this is the policy
around it.
"""

from __future__ import annotations

import inspect
import pickle
import signal
from collections import deque

__all__ = [
    "JOB_END",
    "MAX_GROWTH",
    "TaskRun",
    "count_worker_failure",
    "elapsed_of",
    "end_run",
    "grow_batch",
    "is_job_end",
    "record_error",
    "serialize_function",
    "timeout_of",
    "wants_context",
]

MAX_GROWTH = 4


def serialize_function(fn, init_fn, task_id: str) -> bytes:
    """``(fn, init_fn)`` pickled once; a ``RuntimeError`` that says how to fix it if impossible."""
    try:
        import cloudpickle

        dumps, how = cloudpickle.dumps, "cloudpickle"
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        dumps, how = pickle.dumps, "pickle (cloudpickle is not installed: module-level functions only)"
    try:
        return dumps((fn, init_fn))
    except Exception as e:
        raise RuntimeError(
            f"daisy_nb could not serialize the process_function/init_fn of task '{task_id}' with {how}: every "
            "worker is a separate process (with dask, often on another machine), so the function travels there "
            "together with what it captures. Define it at module level, create locks/file handles/connections "
            "inside it (or in init_fn) rather than capturing them, or run in-process with "
            f"run_blockwise(..., multiprocessing=False). Underlying error: {e!r}"
        ) from e


def timeout_of(task) -> float | None:
    """The task's per-block timeout in seconds; None when it has none (unset, <= 0 or infinite)."""
    t = getattr(task, "timeout_secs", None)
    if t is None or t <= 0 or t == float("inf"):
        return None
    return float(t)


def grow_batch(k: int, elapsed_ns: int, n: int, target_secs: float, cap: int) -> int:
    """The next batch size after a batch of ``n`` blocks took ``elapsed_ns``.

    Blocks measured at 0 ns (faster than the clock) grow the batch by ``MAX_GROWTH``.
    """
    per_block = elapsed_ns / n / 1e9 if n else 0.0
    want = int(target_secs / per_block) if per_block > 0 else cap
    return max(1, min(want, k * MAX_GROWTH, cap))


def wants_context(fn) -> bool:
    """A 0-argument worker function that takes its ``Context`` as keyword-only ``context``."""
    try:
        return "context" in (inspect.getfullargspec(fn).kwonlyargs or [])
    except TypeError:
        return False


JOB_END = "a job end (walltime, preemption, node lost?), replaced without counting toward max_worker_restarts"
# a worker killed by one of these crashed by itself (a bug in the program), whatever it finished before
CRASH_SIGNALS = frozenset(
    getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS") if hasattr(signal, n)
)


def is_job_end(finished: int, *, crashed: bool = False, returncode: int | None = None) -> bool:
    """Whether a worker's dirty exit is a *job end* rather than a crash.

    The restart cap (``max_worker_restarts``) is there to stop crash loops. A worker
    that finished at least one block since it started and then ended (its job's
    walltime, a preemption, the node lost, ``SIGKILL``/``SIGTERM``, a non-zero exit)
    is a job end: it is counted (``worker_failure_count``, ``worker_job_end_count``)
    and replaced, but not as a restart. A crash is a worker that finished no block,
    or whose own error ended it: ``crashed`` (its block raised, as daisy 2.0 ends the
    worker then; a block timeout) or a signal of :data:`CRASH_SIGNALS` (segfault,
    abort). Job ends cannot loop: each needs a block completed since the worker
    started, and a block completes once.
    """
    if finished <= 0 or crashed:
        return False
    return returncode is None or returncode >= 0 or -returncode not in CRASH_SIGNALS


def count_worker_failure(counters, job_end: bool) -> None:
    """One dirty worker exit: ``worker_failure_count`` (and ``worker_job_end_count`` for a job end)."""
    counters.worker_failure_count += 1
    if job_end:
        counters.worker_job_end_count += 1


def record_error(counters, text: str, first: str | None = None, log: str | None = None) -> None:
    """Keep ``text`` as the task's last worker error (and ``first``, else ``text``, as its first),
    and count it (and ``first``) in the task's error groups (:mod:`daisy_nb.errors`); ``log``:
    the worker's log file."""
    if counters.first_worker_error is None:
        counters.first_worker_error = text if first is None else first
    counters.last_worker_error = text
    groups = getattr(counters, "error_groups", None)
    if groups is not None:
        if first is not None and first != text:
            groups.add(first, log)
        groups.add(text, log)


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
        self.requires = {k: int(v) for k, v in task.requires.items()}
        self.track = bool(task.resource_tracking)
        self.res = None  # TaskResourceStats when the task tracks resources and the runtime measures them
        if self.track and self.measures_resources:
            from daisy_nb.profiling import TaskResourceStats

            self.res = TaskResourceStats(self.tid)
        self.payload: bytes | None = None
        self.batch_k = 1
        self.block_secs: deque = deque(maxlen=64)  # recent measured block times (the hang alarm's median)
        self.inflight = 0  # blocks acquired and not released yet
        self.abandoned = False
        self.t_first = None  # monotonic time of the task's first block handed out
        self.t_done = None  # monotonic time the task was seen done (serial: its last block released)

    def serialize(self) -> bytes:
        self.payload = serialize_function(self.fn, self.init_fn, self.tid)
        return self.payload

    @staticmethod
    def crash_unreplaced(counters) -> bool:
        """A crashed worker is not replaced yet: the next spawn is a *restart* (daisy 2.0's rule,
        ``worker_failure_count > worker_restart_count``, with job ends left out: their
        replacements are not restarts, see :func:`is_job_end`)."""
        return counters.worker_failure_count - counters.worker_job_end_count > counters.worker_restart_count

    def restarts_exhausted(self, counters) -> bool:
        """A worker crashed that may not be replaced: ``max_worker_restarts`` restarts were made."""
        return self.crash_unreplaced(counters) and counters.worker_restart_count >= self.max_restarts

    def elapsed(self, now: float) -> float:
        """Seconds from the first block to done (or to ``now``), for the summary's blocks/s."""
        if self.t_first is None:
            return 0.0
        return (self.t_done or now) - self.t_first


def elapsed_of(trs: dict, order) -> dict:
    """``{task_id: elapsed seconds}`` for the summary; tasks without a run record ran nothing."""
    import time

    now = time.monotonic()
    return {tid: trs[tid].elapsed(now) if tid in trs else 0.0 for tid in order}


def end_run(scheduler, observer, trs: dict, order, *, summary: bool, interrupted: bool, interrupt=None):
    """The end of a run, once its workers are gone and tracking is flushed; returns the states.

    Every runtime ends here: each task's resource stats (None unless measured), the
    observer's ``on_finish``, then :func:`daisy_nb.progress.finish_run` (the summary;
    a Ctrl-C re-raised as ``KeyboardInterrupt``, ``interrupt`` if given, with the states).
    """
    from daisy_nb.progress import finish_run, notify

    states = scheduler.task_states
    for tid, tr in trs.items():
        states[tid].resource_stats = tr.res
    notify(observer, "on_finish", scheduler)
    finish_run(states, order, elapsed_of(trs, order), summary=summary, interrupted=interrupted, interrupt=interrupt)
    return states
