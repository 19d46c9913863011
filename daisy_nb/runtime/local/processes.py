"""The pool's worker processes, seen from the scheduler process: the shell around the decisions.

A part of the pool (:mod:`daisy_nb.runtime.pool`): every method runs in the pool's main
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
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from daisy_nb.block import BlockStatus
from daisy_nb.runtime import _shm, _zygote
from daisy_nb.runtime.context import Context
from daisy_nb.runtime.local import wire
from daisy_nb.runtime.local.blocks import BlockCore, Kill, Quit, SendBatch
from daisy_nb.runtime.local.exits import ExitFacts, ExitKind, classify_exit
from daisy_nb.runtime.local.functions import Functions, job_report
from daisy_nb.runtime.local.records import (
    BUSY,
    DEAD,
    IDLE,
    PARKED,
    QUITTING,
    STARTING,
    BlockProcess,
    FunctionWorker,
    job_text,
)
from daisy_nb.runtime.local.starter import CAPACITY, Starter
from daisy_nb.runtime.policy import JOB_END, count_worker_failure, record_error
from daisy_nb.runtime.pool_parts import PoolTaskRun, Waitables
from daisy_nb.runtime.state import TB_CAP_BYTES, cap_traceback

__all__ = ["BUSY", "DEAD", "IDLE", "PARKED", "QUITTING", "STARTING", "Processes", "job_text"]

logger = logging.getLogger("daisy")

TERM_GRACE_SECS = 3.0  # a worker function's SIGTERM -> SIGKILL (a launcher cancels its job meanwhile)
REAP_SECS = 5.0  # the run's end: every worker gone within this (worker functions: after their grace)
EXIT_CODE_SECS = 5.0  # a worker whose pidfd said "exited": its code arrives within this
RESPAWN_AFTER_RETURN_SECS = 1.0  # a worker function that returned without its worker: the next one waits

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
        self.budget = dict(budget)
        self.used = dict.fromkeys(self.budget, 0)
        self._make_context = context
        self.observer = observer
        self.workers: dict[int, Worker] = {}
        self.of_task: dict[str, set[Worker]] = {}  # task id -> its workers
        self.core = BlockCore(
            scheduler, target_secs=batch_target_secs, capacity=CAPACITY, slots=_shm.SLOTS, workers_total=self.count
        )
        self.block_workers = 0  # workers of block-function tasks not reaped yet
        self.starter = Starter(tasks, template)  # tasks: whether the template preloads the Client
        self.next_wid = 0
        self.aborting = False
        self.timeline: Any = None  # a dashboard.timeline.Timeline, or None (no dashboard or report)

    # ------------------------------------------------------------- coordination
    def attach_timeline(self, timeline) -> None:
        self.timeline = timeline

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

    def can_allocate(self, tr: PoolTaskRun) -> bool:
        return all(self.used.get(k, 0) + v <= self.budget.get(k, 0) for k, v in tr.requires.items())

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
        """The block each block worker runs (from ``cur`` in its segment), for the hang alarm:
        ``(task id, block rows, label, pid, started or None)``."""
        out: list[tuple] = []
        for w in list(self.workers.values()):
            if not isinstance(w, BlockProcess) or w.state != BUSY or not w.queue or w.bufs is None:
                continue
            k, idx = w.queue[0]
            a = w.bufs[k]
            c = int(a[_shm.H_CUR])
            pid = w.proc.pid if w.proc is not None else None
            if 0 <= c < len(idx):
                out.append((w.tr.tid, idx[c : c + 1], f"worker {w.wid}", pid, int(a[_shm.H_START]) / 1e9))
            else:  # sent, not started yet (a worker still importing, a stuck init_fn)
                out.append((w.tr.tid, idx[:1], f"worker {w.wid} (batch not started)", pid, None))
        return out

    # ------------------------------------------------------------------ start
    def spawn(self, tr: PoolTaskRun) -> None:
        c = self.s.counters[tr.tid]
        if tr.crash_unreplaced(c):  # replacing a crash: a restart (a job end's replacement is not)
            c.worker_restart_count += 1
        c.worker_start_count += 1
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
        for k, v in tr.requires.items():
            self.used[k] = self.used.get(k, 0) + v
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
                self._write_batch(w, a.slot, a.blocks)
            elif isinstance(a, Quit):
                self._send(w, wire.Kind.QUIT)
            elif isinstance(a, Kill):
                self._kill(w)
            else:
                raise TypeError(f"unknown action {a!r}")

    def _write_batch(self, w, k: int, b) -> None:
        """Write batch ``b`` into ``w``'s slot ``k`` and tell it to run it."""
        n = len(b.index)
        a, o, m = w.bufs[k], w.off, n * w.tr.ndim
        a[o["index"] : o["index"] + n] = b.index
        a[o["spatial"] : o["spatial"] + n] = b.spatial_id
        a[o["status"] : o["status"] + n] = BlockStatus.CREATED
        a[o["read_offset"] : o["read_offset"] + m] = b.read_offset.reshape(-1)
        a[o["read_shape"] : o["read_shape"] + m] = b.read_shape.reshape(-1)
        a[o["write_offset"] : o["write_offset"] + m] = b.write_offset.reshape(-1)
        a[o["write_shape"] : o["write_shape"] + m] = b.write_shape.reshape(-1)
        a[_shm.H_N] = n
        a[_shm.H_CUR] = -1
        if w.tr.t_first is None:
            w.tr.t_first = time.monotonic()
        self._send(w, wire.run(k))

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
            self._batch_done(w, redispatch)
        elif m.kind == wire.Kind.RAISED:
            self._batch_raised(w, m.text)
        else:
            raise RuntimeError(f"worker {w.wid} sent {m.kind!r}, a message for workers")

    def _statuses(self, w: BlockProcess, k: int, n: int) -> np.ndarray:
        o = w.off["status"]
        return w.bufs[k][o : o + n].astype(np.uint8)

    def _batch_done(self, w: BlockProcess, redispatch: bool) -> None:
        tr = w.tr
        k, index = w.queue[0]
        a, n = w.bufs[k], len(index)
        st = self._statuses(w, k, n)
        elapsed = int(a[_shm.H_ELAPSED])
        if tr.res is not None:
            self._add_stats(w, k, n, st)
        actions = self.core.batch_done(w.wid, st, elapsed, dispatch=redispatch)
        t = self.core.tasks[tr.tid]
        tr.per_block, tr.batch_k = t.per_block, t.batch_k
        if self.timeline is not None:  # one bar per batch: its run time is in shared memory
            t1 = time.monotonic()
            self.timeline.bar(("w", w.wid), tr.tid, t1 - elapsed / 1e9, t1, n, int(np.count_nonzero(st == _FAILED)))
        self._execute(actions)

    def _batch_raised(self, w: BlockProcess, text: str) -> None:
        """A block raised (status FAILED: none is left running): the worker exits (daisy 2.0's dirty
        exit); blocks it ran count, the rest and a batch sent ahead were never started: given back."""
        tr = w.tr
        statuses = [self._statuses(w, k, len(index)) for k, index in w.queue]
        if tr.res is not None:
            for (k, index), st in zip(w.queue, statuses):
                self._add_stats(w, k, len(index), st, st >= _SUCCESS)
        k0, index0 = w.queue[0]
        st0 = statuses[0]
        ran = self.core.batch_raised(w.wid, statuses)
        if self.timeline is not None:
            t1 = time.monotonic()
            elapsed = int(w.bufs[k0][_shm.H_ELAPSED]) / 1e9
            self.timeline.bar(("w", w.wid), tr.tid, t1 - elapsed, t1, ran, int(np.count_nonzero(st0 == _FAILED)))
        del index0
        record_error(self.s.counters[tr.tid], text, log=w.err_path)

    def _add_stats(self, w: BlockProcess, k: int, n: int, st, measured=None) -> None:
        """Fold the per-block stats of slot ``k``'s first ``n`` blocks into the task's totals."""
        o = w.off["stats"]
        rows = w.fbufs[k][o : o + n * _shm.NSTATS].reshape(n, _shm.NSTATS)
        failed = st == _FAILED
        if measured is not None:
            rows, failed = rows[measured], failed[measured]
        w.tr.res.add(rows, failed)

    # --------------------------------------------------------------- the clock
    def poll_exits(self) -> None:
        """Workers without a pidfd: ask their process."""
        for w in list(self.workers.values()):
            if w.pidfd is None and w.proc.poll() is not None:
                self.on_exit(w)

    def check_timeouts(self, now: int) -> None:
        """Block timeouts (from ``cur``/``cur_start_ns`` in shared memory: time queued does not
        count), and worker functions past their SIGTERM grace."""
        started: dict[int, int] = {}
        for w in self.workers.values():
            if isinstance(w, BlockProcess) and w.tr.timeout_ns is not None and w.state == BUSY:
                for k, _ in w.queue:  # only the batch being run has cur >= 0
                    a = w.bufs[k]
                    if int(a[_shm.H_CUR]) >= 0:
                        started[w.wid] = int(a[_shm.H_START])
                        break
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
        msg = None
        if isinstance(w, BlockProcess):
            statuses = [self._statuses(w, k, len(index)) for k, index in w.queue]
            if tr.res is not None:  # blocks it finished have their stats written
                for (k, index), st in zip(w.queue, statuses):
                    self._add_stats(w, k, len(index), st, st >= _SUCCESS)
            if self.timeline is not None and w.state == BUSY and w.queue:
                self._timeline_died(w, fails=not (self.aborting or orphan))
            rep = self.core.exited(w.wid, statuses, rc, orphaned=orphan)
            kind, was_busy, finished = rep.kind, rep.was_busy, rep.finished
        else:
            was_busy, finished = True, w.finished
            kind = classify_exit(
                ExitFacts(
                    block_worker=False,
                    returncode=rc,
                    finished=w.finished,
                    raised=w.client_raised,
                    timed_out=w.timed_out,
                    lost=w.lost,
                    expected=w.expected_exit,
                    aborting=self.aborting,
                    orphaned=orphan,
                )
            )
        dirty = kind.dirty
        if kind is ExitKind.RETURNED:  # a worker function returned on its own: daisy 2.0.0's diagnoses
            assert isinstance(w, FunctionWorker)
            dirty, msg = self.functions.function_returned(w.wid, tr, w.acquired, w.connected)
            if dirty:  # returned without its worker connecting: its next replacement waits (the wheel's pace)
                tr.no_spawn_before = time.monotonic() + RESPAWN_AFTER_RETURN_SECS
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
        record_error(c, msg, log=w.err_path)
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
        for k, v in tr.requires.items():
            self.used[k] -= v

    def _timeline_died(self, w: BlockProcess, fails: bool) -> None:
        """The bar of the batch ``w`` died in: its finished blocks and the one it was running,
        from an estimated start (blocks done x the task's time per block) to now."""
        k, index = w.queue[0]
        a = w.bufs[k]
        st = a[w.off["status"] : w.off["status"] + len(index)]
        done, running = int(np.count_nonzero(st >= _SUCCESS)), int(np.count_nonzero(st == BlockStatus.PROCESSING))
        if done + running:
            t1 = time.monotonic()
            t_cur = int(a[_shm.H_START]) / 1e9 if int(a[_shm.H_CUR]) >= 0 else t1
            t0 = min(t1, t_cur) - done * (w.tr.per_block or 0.0)
            failed = int(np.count_nonzero(st == _FAILED)) + (running if fails else 0)
            self.timeline.bar(("w", w.wid), w.tr.tid, t0, t1, done + running, failed)

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
        their SIGTERM grace), the template closed, the process groups killed, shared memory unlinked."""
        now = time.monotonic()
        last = now + REAP_SECS
        for w in self.workers.values():
            if w.t_term is not None:
                last = max(last, w.t_term + TERM_GRACE_SECS + REAP_SECS)
        while self.workers:
            now = time.monotonic()
            for w in list(self.workers.values()):
                if w.t_term is not None and now - w.t_term > TERM_GRACE_SECS:
                    self._sigkill(w)
                if w.proc.poll() is not None:
                    self.on_exit(w)
            if not self.workers or now >= last:
                break
            fds = [w.pidfd for w in self.workers.values() if w.pidfd is not None]
            wait = min(0.05, max(0.0, last - now))
            if fds and len(fds) == len(self.workers):
                select.select(fds, [], [], wait)  # a pidfd is readable once its process ended
            else:
                time.sleep(wait)
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
