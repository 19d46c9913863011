"""The pool's worker processes, seen from the scheduler process: the shell around the decisions.

A part of the pool (:mod:`daisy_nb.runtime.local.pool`): every method runs in the pool's main
loop. :class:`Processes` owns every worker process's life (a record of :mod:`.records`
per kind: :class:`.records.BlockProcess`, :class:`.records.FunctionWorker`): starting
them, their messages, signalling them, their exits and reaping; and through its
:class:`.starter.Starter` the worker template and the workers' process groups. Which
workers there are (by id and task), the ``resources`` they hold and how they look to
observers is its :class:`.roster.Roster`'s. The block workers' decisions (who gets which batch, prefetch, parking,
timeouts, what an exit counts as) are :class:`.blocks.BlockCore`'s, fed and carried out
by :class:`.block_workers.BlockWorkers` (their batches in shared memory, the core's
actions); what a dirty exit is reported as is :mod:`.diagnosis`'s. A 0-argument worker
function's jobs are :class:`.functions.Functions`'s.

* **Transport.** One shared-memory segment per block worker carries batches of block
  indices and ROI arrays one way and a status per block back (layout in :mod:`._shm`,
  two batch slots); a socket pair per worker carries the tiny messages of :mod:`.wire`.
  Nothing is pickled per block.
* **Exits.** A dead worker is seen at once (its pidfd, or EOF and then its exit code):
  the core accounts for its batches (:meth:`.blocks.BlockCore.exited`) and classifies
  the exit (:func:`.exits.classify_exit`). A dirty exit counts toward
  ``max_worker_restarts`` unless it is a worker function's job end.
* **Worker functions** are ended with ``SIGTERM`` to their process group and ``SIGKILL``
  ``TERM_GRACE_SECS`` later: the grace lets a launcher (:mod:`daisy_nb.launch`) cancel the
  job it submitted. One that returns on its own keeps its process group (a program it
  started lives on, as with daisy 2.0.0); the run's end kills every group.
* **Reaping** at the run's end has one deadline for every worker (no wait per worker).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from daisy_nb import config
from daisy_nb.runtime.context import Context
from daisy_nb.runtime.local import _zygote, ending, wire
from daisy_nb.runtime.local.block_workers import BlockWorkers
from daisy_nb.runtime.local.diagnosis import report_dirty_exit
from daisy_nb.runtime.local.ending import TERM_GRACE_SECS  # (re-exported: its old home)
from daisy_nb.runtime.local.exits import ExitKind
from daisy_nb.runtime.local.functions import Functions, job_report
from daisy_nb.runtime.local.pool_parts import PoolTaskRun, Waitables
from daisy_nb.runtime.local.records import (
    BUSY,
    DEAD,
    IDLE,
    PARKED,
    QUITTING,
    STARTING,
    BlockProcess,
    FunctionWorker,
    WorkerView,
    job_text,
)
from daisy_nb.runtime.local.roster import Roster, Worker
from daisy_nb.runtime.local.starter import Starter

__all__ = ["BUSY", "DEAD", "IDLE", "PARKED", "QUITTING", "STARTING", "TERM_GRACE_SECS", "Processes", "job_text"]

logger = logging.getLogger("daisy")

EXIT_CODE_SECS = 5.0  # a worker whose pidfd said "exited": its code arrives within this


class Processes:
    """Spawn, messages, exits, timeouts and the end of worker processes (see the module docstring)."""

    def __init__(
        self,
        scheduler,
        tasks: Mapping[str, PoolTaskRun],
        waitables: Waitables,
        functions: Functions,
        *,
        budget: dict[str, int],
        batch_target_secs: float,
        context: Callable[[PoolTaskRun, int], Context],
        observer=None,
        template=None,
    ):
        self.s = scheduler
        self.waitables = waitables
        self.functions = functions
        self._make_context = context
        self.observer = observer
        self.roster = Roster(budget)  # which workers there are, the resources they hold
        self.blocks = BlockWorkers(
            scheduler,
            batch_target_secs=batch_target_secs,
            workers=self.roster.workers,
            kill=self._kill,
            workers_total=self.count,
            retask=self._retask,
        )
        self.starter = Starter(tasks, template)  # tasks: whether the template preloads the Client
        self.aborting = False
        self.timeline: Any = None  # a dashboard.timeline.Timeline, or None (no dashboard or report)

    # ------------------------------------------------------------- coordination
    def prepare(self) -> None:
        """The run's tasks are known: which of them a block worker may move between (:mod:`.reuse`)."""
        self.blocks.register(self.starter.trs, config.REUSE_WORKERS.get())

    def attach_timeline(self, timeline) -> None:
        self.timeline = self.blocks.batches.timeline = timeline

    def abort(self) -> None:
        """The run is being aborted (Ctrl-C, an error): blocks cut short are given back, not failed."""
        self.aborting = True
        self.blocks.abort()

    def has_workers(self, tr: PoolTaskRun) -> bool:
        """``tr`` has a worker process (in any state but reaped)."""
        return bool(self.roster.of(tr))

    def waiting(self, tr: PoolTaskRun) -> int:
        """``tr``'s workers that are starting or waiting for work."""
        return self.blocks.waiting(tr.tid) if tr.arity else 0

    def alive(self, tr: PoolTaskRun) -> int:
        """``tr``'s workers that count toward ``max_workers``."""
        return self.blocks.alive(tr.tid) if tr.arity else self.roster.functions_alive(tr)

    def count(self) -> int:
        """Worker processes not reaped yet."""
        return len(self.roster)

    def free_parked_for(self, tr: PoolTaskRun) -> None:
        """A parked worker of another task must not hold budget a task with ready work needs."""
        w = self.roster.parked_holding(tr)
        if w is not None:
            self.blocks.quit(w.wid)

    def dispatch_parked(self) -> None:
        self.blocks.dispatch_parked()

    def drain(self, elapsed: float, block_grace: float, function_grace: float) -> None:
        """Every task is done: workers waiting for work quit, workers still there ``elapsed``
        seconds after the end past their grace (block workers, worker functions) are ended."""
        self.blocks.drain()
        for w in self.roster:
            grace = block_grace if w.block_worker else function_grace
            if elapsed > grace:
                self._stop(w)
                self._kill(w)

    def end_task(self, tr: PoolTaskRun) -> None:
        """``tr`` was abandoned: its workers are asked to quit, and ended."""
        if tr.arity:
            self.blocks.end_task(tr.tid)
            return
        for w in list(self.roster.of(tr)):
            self._stop(w)
            self._kill(w)

    def running_blocks(self) -> list:
        """The block each block worker runs, for the hang alarm: ``(task id, block rows, label, pid,
        started or None)``."""
        return self.blocks.batches.running_blocks(self.roster)

    def snapshot(self) -> list[WorkerView]:
        """Every worker process now, for the dashboard and the hang alarm (on the runtime's thread)."""
        return self.roster.views(self.blocks.batches.current_block)

    # ------------------------------------------------------------------ start
    def spawn_many(self, trs: list[PoolTaskRun]) -> None:
        """A worker of each of ``trs`` whose restart cap is not reached by then, started together."""
        ws: list[Worker] = []
        for tr in (tr for tr in trs if not tr.restarts.cap_reached(self.s.counters[tr.tid])):  # asked before each
            tr.restarts.started(self.s.counters[tr.tid])  # the restart rule (common/failures.py)
            wid = self.roster.new_wid()
            args = (wid, tr, tr.next_slot)
            w = BlockProcess(*args, self.blocks.add(wid, tr)) if tr.arity else FunctionWorker(*args)
            tr.next_slot += 1
            tr.t_spawned = w.t_spawn if tr.t_spawned is None else tr.t_spawned
            ws.append(w)
        self.starter.start_many([(w, self._make_context(w.tr, w.wid)) for w in ws], self._register)

    def _register(self, w: Worker) -> None:  # a started worker's process watched, counted from its start
        tr, wid = w.tr, w.wid
        if w.pidfd is not None:
            self.waitables.add(w.pidfd, "pidfd", w)
        self.waitables.add(w.conn, "w", w)  # a worker function's: job reports only
        self.roster.add(w)
        self.s.counters[tr.tid].job_seconds.started(w, w.t_spawn)  # held until _forget or a move
        if self.timeline is not None:  # the dashboard's worker timeline (dashboard/timeline.py)
            self.timeline.worker(
                ("w", wid), tr.tid, "worker" if tr.arity else "job", f"worker {wid}", w.proc.pid, None, w.t_spawn
            )

    def _retask(self, w: Worker, tid: str) -> None:
        """The core moved block worker ``w`` to task ``tid`` (:mod:`.reuse`): a worker start of ``tid``
        (its timeline row stays: one per process, its bars in each task's colour)."""
        tr, now = self.starter.trs[tid], time.monotonic()
        self.s.counters[w.tr.tid].job_seconds.ended(w, now)
        self.s.counters[tid].job_seconds.started(w, now)
        tr.restarts.started(self.s.counters[tid])
        self.roster.move(w, tr)
        w.slot, tr.next_slot = tr.next_slot, tr.next_slot + 1
        self.starter.retask(w, self._make_context(tr, w.wid))  # it answers "ready"
        if self.timeline is not None:
            self.timeline.moved(("w", w.wid), tid)

    # ------------------------------------------------------------ signals
    def _stop(self, w) -> None:
        """We end ``w`` (the run's end, abandonment): its exit is not a failure."""
        if isinstance(w, BlockProcess):
            self.blocks.stop(w.wid)
        else:
            w.expected_exit = True
            if w.state != DEAD:
                w.state = QUITTING

    def _kill(self, w) -> None:
        """SIGKILL ``w``'s process group; a live worker function gets SIGTERM first (:mod:`.ending`)."""
        ending.kill(w)

    # -------------------------------------------------------------- messages
    def on_readable(self, w, obj) -> None:
        """``w``'s socket is readable: one message per wake-up, or its end."""
        try:
            if self.roster.is_current(w):
                self._on_worker_msg(w, obj.recv_bytes())
        except (EOFError, OSError):
            self.waitables.discard(obj)  # the pidfd (or poll_exits) reports the exit
            if w.pidfd is None and w.proc.poll() is not None:
                self.on_exit(w)

    def _on_worker_msg(self, w, msg: bytes, redispatch: bool = True) -> None:
        m = wire.decode(msg)
        if m.kind == wire.Kind.JOB:
            if isinstance(w, FunctionWorker):
                job_report(w, m.text, self.observer)
            return
        if not isinstance(w, BlockProcess):
            raise RuntimeError(f"worker function {w.wid} sent a block worker's message {m.kind!r}")
        self.blocks.on_message(w, m, redispatch)

    # --------------------------------------------------------------- the clock
    def poll_exits(self) -> None:
        """Workers without a pidfd: ask their process."""
        for w in self.roster:
            if w.pidfd is None and w.proc.poll() is not None:
                self.on_exit(w)

    def check_timeouts(self, now: int) -> None:
        """Block timeouts (from ``cur``/``cur_start_ns`` in shared memory: time queued does not
        count), and worker functions past their SIGTERM grace."""
        self.blocks.tick(now, self.roster)
        ending.term_overdue(self.roster, now / 1e9)

    # ------------------------------------------------------------------- exits
    def _returncode(self, w) -> int:
        """The exit code of a worker whose process has ended (its pidfd said so, or poll did)."""
        try:
            return w.proc.wait(timeout=EXIT_CODE_SECS)
        except subprocess.TimeoutExpired:
            logger.warning("daisy_nb: worker %d (pid %s) ended but its exit code did not come", w.wid, w.proc.pid)
            return -signal.SIGKILL

    def on_exit(self, w: Worker) -> None:
        """A worker process ended: account for its batches, classify the exit, clean up."""
        if not self.roster.is_current(w):
            return
        rc = self._returncode(w)
        orphan = bool(getattr(w.proc, "orphaned", False))  # died with the worker template: not its fault
        if orphan:
            self.starter.template_gone()
        if w.conn is not None:  # results and job reports it sent before dying still count
            try:
                while (not w.block_worker or w.state == BUSY) and w.conn.poll(0):
                    self._on_worker_msg(w, w.conn.recv_bytes(), redispatch=False)
            except (EOFError, OSError):
                pass
        msg, raised = None, False
        if isinstance(w, BlockProcess):
            rep = self.blocks.exited(w, rc, orphan)
            kind, was_busy, finished, dirty, raised = rep.kind, rep.was_busy, rep.finished, rep.kind.dirty, rep.raised
        else:  # a worker function: daisy 2.0.0's diagnoses when it returned on its own
            kind, dirty, msg = self.functions.exited(w, rc, aborting=self.aborting, orphaned=orphan)
            was_busy, finished = True, w.finished
        self._forget(w)
        if self.timeline is not None:
            self.timeline.ended(("w", w.wid), lost=dirty, job=job_text(w.job))
        if not dirty:
            return
        if kind is not ExitKind.RETURNED:
            # helpers it launched go too; not those of a worker function that returned: as daisy 2.0.0,
            # a fire-and-forget program lives on (its late connection stops the run), and the run's
            # end kills every process group (Starter.close)
            ending.sigkill(w)
        report_dirty_exit(
            self.s,
            w,
            kind,
            rc,
            was_busy=was_busy,
            finished=finished,
            raised=raised,
            msg=msg,
            function_message=self.functions.exit_message,
        )

    def _forget(self, w) -> None:
        """``w`` has ended: its descriptors, shared memory and place in the roster (its budget) go."""
        if isinstance(w, FunctionWorker):
            w.state = DEAD
        for obj in (w.conn, w.pidfd):
            if obj is not None:
                self.waitables.discard(obj)
        if w.conn is not None:
            w.conn.close()
        if w.pidfd is not None:
            if isinstance(w.proc, _zygote.ForkedProcess):
                w.proc.pidfd = None
            os.close(w.pidfd)
        if w.shm is not None:
            w.bufs = w.fbufs = None
            w.shm.close()
            w.shm = None
        self.roster.remove(w)
        self.s.counters[w.tr.tid].job_seconds.ended(w, time.monotonic())

    # -------------------------------------------------------------- the run's end
    def kill_all(self) -> None:
        """End every worker (block workers: SIGKILL; worker functions: SIGTERM, SIGKILL after a grace)."""
        self.blocks.stop_all()
        for w in self.roster:
            if isinstance(w, FunctionWorker):
                w.expected_exit = True
            self._kill(w)

    def reap_all(self) -> None:
        """After :meth:`kill_all`: every worker reaped within one deadline (worker functions after
        their SIGTERM grace), the template closed, the process groups killed, shared memory unlinked.
        Every worker was signalled at once, so waiting for them in turn costs the slowest one."""
        ending.reap(self.roster.workers, self.on_exit, self._give_up)
        self.starter.close()

    def _give_up(self, w) -> None:
        """``w`` was not reaped by the run's end (SIGKILLed): forgotten all the same."""
        self.blocks.forget(w.wid)
        self._forget(w)

    # --------------------------------------------- a worker function's jobs (the Client side asks)
    def function_workers(self, tr: PoolTaskRun) -> list[FunctionWorker]:
        """``tr``'s worker functions (their processes)."""
        return [w for w in self.roster.of(tr) if isinstance(w, FunctionWorker)]

    def function_worker(self, wid: int, tr: PoolTaskRun | None = None) -> FunctionWorker | None:
        """Worker function ``wid`` (of ``tr``, when given), if it runs."""
        return self.roster.function_worker(wid, tr)

    def died_with_template(self, wid: int) -> bool:
        """Worker ``wid`` was forked by the run's template, and the template has died (taking it along)."""
        return self.starter.died_with_template(wid)

    def is_worker(self, wid: int) -> bool:
        """Worker ``wid`` runs (the timeline row of its Clients)."""
        return wid in self.roster.workers

    def end_function(self, w: FunctionWorker) -> None:
        """End worker function ``w`` (SIGTERM, then SIGKILL after the grace)."""
        self._kill(w)
