"""0-argument worker functions: their jobs, daisy 2.0.0's diagnoses, their launchers' job reports.

A worker function runs its own ``daisy_nb.Client`` loop (often as a cluster job:
``sbatch --wait``, ``srun``, a launcher of :mod:`daisy_nb.launch`); its process is a
:class:`.records.FunctionWorker`, started and ended by :class:`.processes.Processes`.
Its connections are the TCP server's (:class:`daisy_nb.runtime.net.server.Clients`). This
module is the one place that knows what a worker function's job did and what to say
about it. :class:`Functions` is the narrow interface between the two sides:

* the server calls (the ``Jobs`` protocol; names kept stable): ``job_connected(wid, tr)``
  (a Client said hello for worker ``wid``: False if no such worker function runs),
  ``job_released(wid)`` (its Client was told no block is left: its return is clean),
  ``returned(wid)`` (worker ``wid``'s function had returned on its own: a connection
  for it now is daisy 2.0.0's "did not wait" error), ``job_acquired``, ``job_result``,
  ``job_log``, ``job_label``, ``job_pid``, ``job_lost`` (its client went silent: ended),
  ``job_timed_out`` (its block timed out: ended), ``died_with_template``, ``is_worker``,
  ``has_workers``;
* it asks the server three things: ``has_client(wid, tr)`` (a connection of worker ``wid``
  is open), ``idle_clients(tr)`` (connections of ``tr`` that would take a block now) and
  ``soon_free(tr)`` (the blocks its busy connections take within a job's start, while the
  task is paced by its upstream tasks: ``daisy_nb/runtime/net/tail.py``);
* the pool asks ``waiting(tr)``: the worker functions of ``tr`` that could take a ready
  block without a new one being started (not connected yet, or their client idle), so
  that worker functions are started in proportion to the ready blocks: one retry at a
  task's tail starts one job, a downstream task with three ready blocks three.

daisy 2.0.0's diagnoses (a worker function must block until its worker exits):

* it returned while its worker is still connected: the run goes on, with a warning;
* it returned before any block while blocks are ready: a failure (else it would be
  respawned without end), saying where its worker should have connected;
* a task none of whose jobs connect for twice the peer timeout: a warning (the jobs may
  not reach the scheduler's address).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from daisy_nb.runtime.local.exits import ExitKind, classify_worker_exit
from daisy_nb.runtime.local.pool_parts import PoolTaskRun
from daisy_nb.runtime.local.records import FunctionWorker, job_text
from daisy_nb.scheduling.median import median

__all__ = ["MUST_BLOCK", "Functions", "job_report"]

logger = logging.getLogger("daisy")

START_SAMPLES = 16  # job starts kept per task for job_start_secs
RESPAWN_AFTER_RETURN_SECS = 1.0  # a worker function that returned without its worker: the next one waits

MUST_BLOCK = (
    "0-argument worker functions must block until their worker exits (e.g. `sbatch --wait`, `srun`, `bsub -K`, "
    "`subprocess.run`, or a launcher of `daisy_nb.launch`): daisy tracks worker liveness by that call, so a "
    "fire-and-forget submit (plain `sbatch`, `subprocess.Popen` without waiting) makes daisy respawn "
    "workers it believes dead, burning the worker restarts, and can abandon the task while real workers "
    "still run"
)


def job_report(w: FunctionWorker, text: str, observer) -> None:
    """A worker function's launcher reported its job (JSON: scheduler, id, state, and ``cause`` when
    the batch system said why it failed): kept on the worker, logged (a warning when it failed or
    could not be cancelled) and told to the observer."""
    try:
        info = json.loads(text)
    except ValueError:
        logger.warning("task %r: worker %d sent a job report that is not JSON: %.200r", w.tr.tid, w.wid, text)
        return
    if not isinstance(info, dict):
        return
    w.job = {k: str(info.get(k, "")) for k in ("scheduler", "job", "state")}
    if info.get("cause"):
        w.job["cause"] = str(info["cause"])
    bad = w.job["state"].startswith(("failed", "cancel failed"))
    logger.log(
        logging.WARNING if bad else logging.INFO,
        "task %r: worker %d: %s",
        w.tr.tid,
        w.wid,
        job_text(w.job),
    )
    hook = getattr(observer, "on_worker_job", None)
    if hook is not None:
        try:
            hook({"task": w.tr.tid, "worker": w.wid, **w.job})
        except Exception:  # an observer's bug must not end the run: reported once, with its traceback
            if not getattr(observer, "_daisy_nb_job_hook_failed", False):
                logger.warning("the observer's on_worker_job raised (reported once)", exc_info=True)
                try:
                    observer._daisy_nb_job_hook_failed = True
                except AttributeError:
                    pass


class Server(Protocol):
    """What :class:`Functions` asks the TCP server."""

    def has_client(self, wid: int, tr: PoolTaskRun) -> bool: ...
    def idle_clients(self, tr: PoolTaskRun) -> int: ...
    def soon_free(self, tr: PoolTaskRun) -> int: ...


class _Procs(Protocol):
    """What :class:`Functions` asks the processes shell."""

    def function_workers(self, tr: PoolTaskRun) -> list[FunctionWorker]: ...
    def function_worker(self, wid: int, tr: PoolTaskRun | None = None) -> FunctionWorker | None: ...
    def is_worker(self, wid: int) -> bool: ...
    def has_workers(self, tr: PoolTaskRun) -> bool: ...
    def died_with_template(self, wid: int) -> bool: ...
    def end_function(self, w: FunctionWorker) -> None: ...


class Functions:
    """Worker functions' jobs and diagnoses (see the module docstring)."""

    def __init__(self, scheduler, tasks: Mapping[str, PoolTaskRun], net: Mapping[str, float]):
        self.s = scheduler
        self.trs = tasks
        self.net = net
        self.procs: _Procs | None = None
        self.server: Server | None = None
        self.where = ""  # where the scheduler listens and what it advertises (for the diagnoses)
        self.returned_wids: set[int] = set()  # worker functions that returned on their own
        self.released_wids: set[int] = set()  # worker functions whose Client was told no block is left
        self.connected_tids: set[str] = set()  # tasks a Client has said hello for
        self.warned: set[tuple[str, str]] = set()  # (task id, kind) of the diagnoses logged once
        # task id -> recent times from a worker function's start to its Client's first ask (job_start_secs)
        self.start_secs: dict[str, deque[float]] = {}

    def attach(self, procs: _Procs, server: Server) -> None:
        self.procs, self.server = procs, server

    def listening(self, where: str) -> None:
        """The listener is up: ``where`` Client connections go (for the diagnoses)."""
        self.where = where

    def _w(self, wid: int, tr: PoolTaskRun | None = None) -> FunctionWorker | None:
        assert self.procs is not None, "Functions.attach was not called"
        return self.procs.function_worker(wid, tr)

    def waiting(self, tr: PoolTaskRun) -> int:
        """``tr``'s worker functions that can take a ready block without a new one being started: those
        whose job has not connected yet (starting, or queued in a batch system) and the connections
        that would take one now (parked, as at a task's tail, or connected and not asked yet). A job
        that holds blocks, or was told to end, does not wait; but while ``tr`` is paced by its
        upstream tasks, the blocks its busy jobs take within a job's start count as waited for
        (``HandOut.soon_free``; net/tail.py: "Downstream jobs at the upstream's pace")."""
        assert self.procs is not None and self.server is not None
        starting = sum(1 for w in self.procs.function_workers(tr) if not (w.connected or w.expected_exit))
        return starting + self.server.idle_clients(tr) + self.server.soon_free(tr)

    # ------------------------------------------------------------ what the server calls
    def job_connected(self, wid: int, tr: PoolTaskRun) -> bool:
        """A Client said hello for worker ``wid`` of ``tr``: False if no such worker function runs."""
        self.connected_tids.add(tr.tid)
        w = self._w(wid, tr)
        if w is None:
            return False
        w.connected = True
        return True

    def job_ready(self, wid: int, tr: PoolTaskRun) -> None:
        """The Client of worker ``wid`` asked for its first block: its job is set up (a model loaded
        after its hello counts), which is how long a job of ``tr`` takes to start."""
        w = self._w(wid, tr)
        if w is not None and not w.ready:
            w.ready = True
            self.start_secs.setdefault(tr.tid, deque(maxlen=START_SAMPLES)).append(time.monotonic() - w.t_spawn)

    def job_start_secs(self, tid: str) -> float | None:
        """How long a job of ``tid`` takes to start: the median time from its worker function's start
        to its Client's first ask for a block (submission, queue, start-up, the program's own set-up),
        over its last jobs; None before the first."""
        xs = self.start_secs.get(tid)
        return median(xs) if xs else None

    def returned(self, wid: int) -> bool:
        """Worker ``wid``'s function had returned on its own (a connection for it comes too late)."""
        return wid in self.returned_wids

    def job_released(self, wid: int) -> None:
        """A Client of worker ``wid`` was told that no block is left for it (``NO_MORE``, also at its
        task's tail): its function returning is a clean end, even if a retry became ready since."""
        self.released_wids.add(wid)

    def job_acquired(self, wid: int) -> None:
        w = self._w(wid)
        if w is not None:
            w.acquired += 1

    def job_result(self, wid: int, tr: PoolTaskRun, *, raised: bool, finished: bool) -> None:
        """A Client of worker ``wid``'s job released a block: what its job finished (a job end?)."""
        w = self._w(wid, tr)
        if w is not None:
            w.raised = raised
            if finished:
                w.finished += 1

    def job_log(self, wid: int) -> str | None:
        w = self._w(wid)
        return None if w is None else w.err_path

    def job_label(self, wid: int) -> str | None:
        w = self._w(wid)
        return None if w is None else job_text(w.job)

    def job_pid(self, wid: int) -> int | None:
        w = self._w(wid)
        return w.proc.pid if w is not None and w.proc is not None else None

    def job_lost(self, wid: int, tr: PoolTaskRun) -> None:
        """A Client of worker ``wid`` went silent and was dropped: its worker function is ended (and replaced)."""
        w = self._w(wid, tr)
        if w is not None and not w.expected_exit:
            w.lost = True
            assert self.procs is not None
            self.procs.end_function(w)

    def job_timed_out(self, wid: int, tr: PoolTaskRun) -> bool:
        """A Client of worker ``wid`` exceeded the task's timeout: its worker function is ended;
        False if there is none (the server drops the connection instead)."""
        w = self._w(wid, tr)
        if w is None:
            return False
        w.timed_out = True
        assert self.procs is not None
        self.procs.end_function(w)
        return True

    def died_with_template(self, wid: int) -> bool:
        assert self.procs is not None
        return self.procs.died_with_template(wid)

    def is_worker(self, wid: int) -> bool:
        assert self.procs is not None
        return self.procs.is_worker(wid)

    def has_workers(self, tr: PoolTaskRun) -> bool:
        assert self.procs is not None
        return self.procs.has_workers(tr)

    # ------------------------------------------------------------ daisy 2.0.0's diagnoses
    def _unreachable_hint(self) -> str:
        return (
            f"the scheduler {self.where}; jobs on other machines need an address of this machine that "
            "they can reach: run_blockwise(host=...) or DAISY_HOST"
        )

    def function_returned(self, wid: int, tr: PoolTaskRun, acquired: int, connected: bool) -> tuple[bool, str | None]:
        """A worker function returned on its own (exit 0): ``(dirty, reason)``.

        Its worker still connected: it goes on (daisy 2.0.0 too), with a warning. Returned
        before any block while blocks are ready: a failure; never connected: daisy 2.0.0's
        diagnosis, and where its job should have connected."""
        self.returned_wids.add(wid)
        assert self.server is not None
        if self.server.has_client(wid, tr):
            if (tr.tid, "running") not in self.warned:
                self.warned.add((tr.tid, "running"))
                logger.warning(
                    "task %r: the worker function of worker %d returned while its worker is still connected; %s",
                    tr.tid,
                    wid,
                    MUST_BLOCK,
                )
            return False, None
        if acquired or wid in self.released_wids or self.s.ready_count(tr.tid) == 0:
            return False, None
        if connected:
            return True, (
                f"worker function of worker {wid} returned without acquiring any block while blocks were "
                "ready (its worker connected and left without asking for one)"
            )
        return True, (
            f"worker function of worker {wid} returned without its worker ever connecting, while the task "
            f"still has work. {MUST_BLOCK}. If it did wait, its worker could not connect: " + self._unreachable_hint()
        )

    def exited(
        self, w: FunctionWorker, rc: int, *, aborting: bool, orphaned: bool
    ) -> tuple[ExitKind, bool, str | None]:
        """Worker function ``w``'s process ended with ``rc``: ``(kind, dirty, reason or None)``. One
        that returned on its own is judged by :meth:`function_returned`; one that returned without
        its worker connecting makes the task's next spawn wait (``RESPAWN_AFTER_RETURN_SECS``)."""
        kind = classify_worker_exit(w, rc, block_worker=False, aborting=aborting, orphaned=orphaned)
        if kind is not ExitKind.RETURNED:
            return kind, kind.dirty, None
        dirty, msg = self.function_returned(w.wid, w.tr, w.acquired, w.connected)
        if dirty:  # the wheel's pace: about one spawn a second while its functions return at once
            w.tr.no_spawn_before = time.monotonic() + RESPAWN_AFTER_RETURN_SECS
        return kind, dirty, msg

    def exit_message(self, w: FunctionWorker, kind: ExitKind, rc: int) -> str:
        """What a worker function's dirty exit (not a timeout) is reported as."""
        if w.lost:
            return (
                f"daisy worker function killed: its worker sent nothing for "
                f"{self.net['peer_timeout']:g}s (heartbeat; DAISY_NB_PEER_TIMEOUT_SECS)"
            )
        msg = f"daisy worker process exited with code {rc}" + (" while processing blocks" if w.acquired else "")
        if w.job and w.job.get("cause"):  # what the batch system said (daisy_nb.launch)
            msg += f": its {w.job['scheduler']} job {w.job['job']} ended {w.job['cause']}"
        return msg + self.unconnected_note(w.tr.tid, w.connected)

    def unconnected_note(self, tid: str, connected: bool) -> str:
        """For a worker function that failed before any worker of its task connected: where to, in
        case its job failed because it could not connect (the function may also have failed before
        starting one: a command not found, say, which its stderr tail shows)."""
        if connected or tid in self.connected_tids:
            return ""
        return f" (no worker of this task has connected yet; if its job ran, it may not have reached the scheduler: {self._unreachable_hint()})"

    def check_unconnected(self, now: float) -> None:
        """Warn once per task when its worker functions run but no worker has connected for a while
        (twice the peer timeout: 60 s by default). Jobs still queued are fine; jobs that cannot
        reach the address are what this is about."""
        limit = 2 * self.net["peer_timeout"]
        for tid, tr in self.trs.items():
            if (
                tr.arity != 0
                or tid in self.connected_tids
                or not self.has_workers(tr)
                or tr.t_spawned is None
                or now - tr.t_spawned < limit
                or (tid, "unconnected") in self.warned
            ):
                continue
            self.warned.add((tid, "unconnected"))
            logger.warning(
                "task %r: no worker has connected in %.0f s since its first worker function started. If the jobs "
                "are still queued, this is expected; if they run, they cannot reach the scheduler: %s",
                tid,
                now - tr.t_spawned,
                self._unreachable_hint(),
            )
