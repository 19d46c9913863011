"""The pool's worker processes, seen from the scheduler process: the shell around the decisions.

A part of the pool (:mod:`daisy_nb.runtime.local.pool`): every method runs in the pool's main
loop. :class:`Processes` owns every worker process (a record of :mod:`.records` per
kind: :class:`.records.BlockProcess`, :class:`.records.FunctionWorker`), the ``resources``
budget in use, and through its :class:`.starter.Starter` the worker template and the
workers' process groups. The block workers' decisions (who gets which batch, prefetch,
parking, timeouts, what an exit counts as) are :class:`.blocks.BlockCore`'s: this shell
feeds it what it reads (messages, shared memory, exits, the clock) and executes what it
returns (writes a batch into shared memory and signals the worker, asks a worker to
quit, kills it). A 0-argument worker function's jobs are :class:`.functions.Functions`'s.

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

from daisy_nb.block import BlockStatus
from daisy_nb.runtime.common.failures import JOB_END, count_worker_failure, record_error
from daisy_nb.runtime.common.run_block import TB_CAP_BYTES, cap_traceback
from daisy_nb.runtime.context import Context
from daisy_nb.runtime.local import _shm, _zygote, wire
from daisy_nb.runtime.local.batches import Batches
from daisy_nb.runtime.local.blocks import BlockCore, Kill, Quit, SendBatch
from daisy_nb.runtime.local.budget import Budget
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
    STATE_NAMES,
    BlockProcess,
    FunctionWorker,
    WorkerView,
    job_text,
)
from daisy_nb.runtime.local.starter import CAPACITY, Starter

__all__ = ["BUSY", "DEAD", "IDLE", "PARKED", "QUITTING", "STARTING", "Processes", "job_text"]

logger = logging.getLogger("daisy")

TERM_GRACE_SECS = 3.0  # a worker function's SIGTERM -> SIGKILL (a launcher cancels its job meanwhile)
REAP_SECS = 5.0  # the run's end: every worker gone within this (worker functions: after their grace)
EXIT_CODE_SECS = 5.0  # a worker whose pidfd said "exited": its code arrives within this

_SUCCESS, _FAILED = BlockStatus.SUCCESS, BlockStatus.FAILED

Worker = BlockProcess | FunctionWorker


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
        self.budget = Budget(budget)  # the run's resources and what the live workers hold
        self._make_context = context
        self.observer = observer
        self.workers: dict[int, Worker] = {}
        self.of_task: dict[str, set[Worker]] = {}  # task id -> its workers
        self.core = BlockCore(
            scheduler, target_secs=batch_target_secs, capacity=CAPACITY, slots=_shm.SLOTS, workers_total=self.count
        )
        self.batches = Batches(scheduler, self.core)  # the block workers' batches in shared memory
        self.block_workers = 0  # workers of block-function tasks not reaped yet
        self.starter = Starter(tasks, template)  # tasks: whether the template preloads the Client
        self.next_wid = 0
        self.aborting = False
        self.timeline: Any = None  # a dashboard.timeline.Timeline, or None (no dashboard or report)

    # ------------------------------------------------------------- coordination
    def attach_timeline(self, timeline) -> None:
        self.timeline = self.batches.timeline = timeline

    def abort(self) -> None:
        """The run is being aborted (Ctrl-C, an error): blocks cut short are given back, not failed."""
        self.aborting = True
        self.core.abort()

    def _workers_of(self, tr: PoolTaskRun) -> set[Worker]:
        ws = self.of_task.get(tr.tid)
        if ws is None:
            ws = self.of_task[tr.tid] = set()
        return ws

    def has_workers(self, tr: PoolTaskRun) -> bool:
        """``tr`` has a worker process (in any state but reaped)."""
        return bool(self._workers_of(tr))

    def waiting(self, tr: PoolTaskRun) -> int:
        """``tr``'s workers that are starting or waiting for work."""
        return self.core.waiting(tr.tid) if tr.arity else 0

    def alive(self, tr: PoolTaskRun) -> int:
        """``tr``'s workers that count toward ``max_workers``."""
        if tr.arity:
            return self.core.alive(tr.tid)
        return sum(1 for w in self._workers_of(tr) if w.state != QUITTING)

    def count(self) -> int:
        """Worker processes not reaped yet."""
        return len(self.workers)

    def free_parked_for(self, tr: PoolTaskRun) -> None:
        """A parked worker of another task must not hold budget a task with ready work needs."""
        for w in list(self.workers.values()):
            if w.tr is not tr and w.state == PARKED and set(w.tr.requires) & set(tr.requires):
                self._execute(self.core.quit(w.wid))
                return

    def dispatch_parked(self) -> None:
        self._execute(self.core.dispatch_parked())

    def drain(self, elapsed: float, block_grace: float, function_grace: float) -> None:
        """Every task is done: workers waiting for work quit, workers still there ``elapsed``
        seconds after the end past their grace (block workers, worker functions) are ended."""
        self._execute(self.core.drain())
        if not self.workers:
            return
        for w in list(self.workers.values()):
            grace = block_grace if w.block_worker else function_grace
            if elapsed > grace:
                self._stop(w)
                self._kill(w)

    def end_task(self, tr: PoolTaskRun) -> None:
        """``tr`` was abandoned: its workers are asked to quit, and ended."""
        if tr.arity:
            self._execute(self.core.end_task(tr.tid))
            return
        for w in list(self._workers_of(tr)):
            self._stop(w)
            self._kill(w)

    def running_blocks(self) -> list:
        """The block each block worker runs, for the hang alarm: ``(task id, block rows, label, pid,
        started or None)``."""
        return self.batches.running_blocks(self.workers.values())

    def snapshot(self) -> list[WorkerView]:
        """Every worker process now, for the dashboard and the hang alarm (on the runtime's thread)."""
        out = []
        for w in list(self.workers.values()):
            row, since = self.batches.current_block(w) if isinstance(w, BlockProcess) else (None, None)
            out.append(
                WorkerView(
                    wid=w.wid,
                    task=w.tr.tid,
                    kind="block" if w.block_worker else "function",
                    pid=int(w.proc.pid) if w.proc is not None else None,
                    state=STATE_NAMES.get(w.state, str(w.state)),
                    row=row,
                    since=since,
                    t_spawn=w.t_spawn,
                    job=job_text(w.job),
                )
            )
        return out

    # ------------------------------------------------------------------ start
    def spawn(self, tr: PoolTaskRun) -> None:
        tr.restarts.started(self.s.counters[tr.tid])  # the restart rule (common/failures.py)
        wid = self.next_wid
        self.next_wid += 1
        w: Worker
        if tr.arity:
            t = self.core.add_task(tr.tid, tr.timeout_ns)
            t.block_secs = tr.block_secs  # one deque: the hang alarm reads the task run's
            w = BlockProcess(wid, tr, tr.next_slot, self.core.add(wid, tr.tid))
        else:
            w = FunctionWorker(wid, tr, tr.next_slot)
        tr.next_slot += 1
        if tr.t_spawned is None:
            tr.t_spawned = w.t_spawn
        self.budget.take(tr.requires)
        self.starter.start(w, self._make_context(tr, wid))
        if w.pidfd is not None:
            self.waitables.add(w.pidfd, "pidfd", w)
        self.waitables.add(w.conn, "w", w)  # a worker function's: job reports only
        self.workers[wid] = w
        self.block_workers += w.block_worker
        self._workers_of(tr).add(w)
        if self.timeline is not None:  # the dashboard's worker timeline (dashboard/timeline.py)
            self.timeline.worker(
                ("w", wid), tr.tid, "worker" if tr.arity else "job", f"worker {wid}", w.proc.pid, None, w.t_spawn
            )

    # --------------------------------------------------------------- actions
    def _execute(self, actions: list) -> None:
        for a in actions:
            w = self.workers.get(a.wid)
            if w is None:
                raise RuntimeError(f"an action for worker {a.wid}, which is gone: {a!r}")
            if isinstance(a, SendBatch):
                assert isinstance(w, BlockProcess)
                self.batches.write(w, a.slot, a.blocks)
                self._send(w, wire.run(a.slot))
            elif isinstance(a, Quit):
                self._send(w, wire.Kind.QUIT)
            elif isinstance(a, Kill):
                self._kill(w)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _send(self, w, msg: bytes) -> None:
        if w.conn is None:
            return
        try:
            w.conn.send_bytes(msg)
        except OSError:
            pass  # dead: its pidfd (or EOF) accounts for it

    def _stop(self, w) -> None:
        """We end ``w`` (the run's end, abandonment): its exit is not a failure."""
        if isinstance(w, BlockProcess):
            self._execute(self.core.stop(w.wid))
        else:
            w.expected_exit = True
            if w.state != DEAD:
                w.state = QUITTING

    def _kill(self, w) -> None:
        """SIGKILL ``w``'s process group; a live worker function gets SIGTERM first (see the docstring)."""
        if isinstance(w, FunctionWorker) and w.state != DEAD:
            if w.t_term is None:
                w.t_term = time.monotonic()
                try:
                    os.killpg(w.proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
            return  # _term_overdue sends the SIGKILL
        self._sigkill(w)

    def _sigkill(self, w) -> None:
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                w.proc.kill()
            except OSError:
                pass

    # -------------------------------------------------------------- messages
    def on_readable(self, w, obj) -> None:
        """``w``'s socket is readable: one message per wake-up, or its end."""
        try:
            if self.workers.get(w.wid) is w:
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
        if m.kind == wire.Kind.READY:
            if redispatch:
                self._execute(self.core.ready(w.wid))
        elif m.kind == wire.Kind.DONE:
            self._execute(self.batches.done(w, redispatch))
        elif m.kind == wire.Kind.RAISED:
            assert m.error is not None
            self.batches.raised(w, m.error)
        else:
            raise RuntimeError(f"worker {w.wid} sent {m.kind!r}, a message for workers")

    # --------------------------------------------------------------- the clock
    def poll_exits(self) -> None:
        """Workers without a pidfd: ask their process."""
        for w in list(self.workers.values()):
            if w.pidfd is None and w.proc.poll() is not None:
                self.on_exit(w)

    def check_timeouts(self, now: int) -> None:
        """Block timeouts (from ``cur``/``cur_start_ns`` in shared memory: time queued does not
        count), and worker functions past their SIGTERM grace."""
        started = self.batches.started(self.workers.values())
        if started:
            self._execute(self.core.tick(now, started))
        self._term_overdue(now / 1e9)

    def _term_overdue(self, now: float) -> None:
        """SIGKILL the worker functions still alive ``TERM_GRACE_SECS`` after their SIGTERM."""
        for w in list(self.workers.values()):
            if w.t_term is not None and now - w.t_term > TERM_GRACE_SECS:
                self._sigkill(w)

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
        if self.workers.get(w.wid) is not w:
            return
        tr = w.tr
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
            rep = self.batches.exited(w, rc, orphan)
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
            self._sigkill(w)
        c = self.s.counters[tr.tid]
        job_end = kind is ExitKind.JOB_END
        count_worker_failure(c, job_end)
        if msg is None:
            msg = self._exit_message(w, kind, rc, was_busy)
            if job_end:
                msg += f" after it had finished {finished} block(s): {JOB_END}"
            tail = self._err_tail(w)
            if tail:
                msg += "\nworker stderr tail:\n" + tail
        # the exit of a worker whose block raised is counted and grouped; the block's error stays the
        # task's last worker error (daisy 2.0.0 shows the block's traceback there, not the exit), unless
        # this exit may not be replaced: the task is abandoned for it, and the wheel's message names it
        abandons = tr.restarts.cap_reached(c) and not self.s.is_task_done(tr.tid)
        record_error(c, msg, log=w.err_path, last=not raised or abandons)
        logger.warning("task %r: %s", tr.tid, msg.splitlines()[0])

    def _exit_message(self, w, kind: ExitKind, rc: int, was_busy: bool) -> str:
        tr = w.tr
        if kind is ExitKind.TIMEOUT:
            return f"daisy worker process killed after a block exceeded timeout={tr.timeout:g}s"
        if w.block_worker:
            return f"daisy worker process exited with code {rc}" + (" while processing blocks" if was_busy else "")
        return self.functions.exit_message(w, kind, rc)

    def _forget(self, w) -> None:
        """``w`` has ended: its descriptors, shared memory and budget go."""
        tr = w.tr
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
        self._workers_of(tr).discard(w)
        self.block_workers -= w.block_worker
        self.workers.pop(w.wid, None)
        self.budget.give(tr.requires)

    def _err_tail(self, w) -> str:
        if not w.err_path:
            return ""
        try:
            with open(w.err_path, "rb") as f:
                f.seek(w.err_offset)
                data = f.read()[-TB_CAP_BYTES:]
            return cap_traceback(data.decode("utf-8", "replace").strip())
        except OSError:
            return ""

    # -------------------------------------------------------------- the run's end
    def kill_all(self) -> None:
        """End every worker (block workers: SIGKILL; worker functions: SIGTERM, SIGKILL after a grace)."""
        self.core.stop_all()
        for w in list(self.workers.values()):
            if isinstance(w, FunctionWorker):
                w.expected_exit = True
            self._kill(w)

    def reap_all(self) -> None:
        """After :meth:`kill_all`: every worker reaped within one deadline (worker functions after
        their SIGTERM grace), the template closed, the process groups killed, shared memory unlinked.
        Every worker was signalled at once, so waiting for them in turn costs the slowest one."""
        last = time.monotonic() + REAP_SECS
        for w in list(self.workers.values()):
            if w.t_term is not None:  # a worker function: SIGKILL once its grace is over
                try:
                    w.proc.wait(timeout=max(0.0, w.t_term + TERM_GRACE_SECS - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._sigkill(w)
                last = max(last, w.t_term + TERM_GRACE_SECS + REAP_SECS)
            try:
                w.proc.wait(timeout=max(0.0, last - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue  # reported below
            self.on_exit(w)
        if self.workers:
            left = sorted(self.workers)
            logger.warning("daisy_nb: %d worker(s) not reaped within %g s: %s", len(left), REAP_SECS, left)
            for w in list(self.workers.values()):
                self._sigkill(w)
                self.core.workers.pop(w.wid, None)
                self._forget(w)
        self.starter.close()

    # --------------------------------------------- a worker function's jobs (the Client side asks)
    def function_worker(self, wid: int, tr: PoolTaskRun | None = None) -> FunctionWorker | None:
        w = self.workers.get(wid)
        if not isinstance(w, FunctionWorker) or (tr is not None and w.tr is not tr):
            return None
        return w

    def died_with_template(self, wid: int) -> bool:
        """Worker ``wid`` was forked by the run's template, and the template has died (taking it along)."""
        return self.starter.died_with_template(wid)

    def is_worker(self, wid: int) -> bool:
        """Worker ``wid`` runs (the timeline row of its Clients)."""
        return wid in self.workers

    def end_function(self, w: FunctionWorker) -> None:
        """End worker function ``w`` (SIGTERM, then SIGKILL after the grace)."""
        self._kill(w)
