"""The pool's block and worker-function processes, seen from the scheduler process.

A part of the pool (:mod:`.pool`): every method runs in the pool's main loop.
:class:`Processes` owns every worker process (:class:`.starter.Worker`: its state,
batches sent, shared memory, socket pair and pidfd), the per-task sets of them,
the ``resources`` budget in use, and, through its :class:`.starter.Starter`, the
worker template and the workers' process groups. Nobody else writes a ``Worker``.

Called by the pool: ``spawn``, ``alive``, ``waiting``, ``can_allocate``,
``free_parked_for``, ``has_workers``, ``count``, ``dispatch_parked``, ``drain``,
``end_task`` (abandonment), ``on_readable`` and ``on_exit`` (its waitables),
``poll_exits``, ``check_timeouts``, ``running_blocks``, ``kill_all`` and
``reap_all`` (the run's end), ``abort``, ``attach_timeline``; it reads
``block_workers`` (the Client side's quiet time is only for runs without them).
``alive`` is cached per task (it is asked every loop turn) and parked workers are
kept in a set, so neither costs a scan of every worker per turn. Called by the Client
side (:class:`.clients.Clients`, through its :class:`.clients.Jobs`) about the
worker function whose job a connection is: the ``job_*`` methods, ``is_worker``,
``has_workers`` and ``died_with_template``. What it asks the Client side (a worker
function that returned or failed: daisy 2.0.0's diagnoses) goes through
:class:`JobHooks`, which the pool implements.

* **Transport.** One shared-memory segment per block-function worker carries
  batches of block indices and ROI arrays one way and a status per block back
  (layout in :mod:`._shm`, two batch slots); a socket pair per worker carries
  tiny signals ("run the batch in slot k", "slot k done", "quit"). Nothing is
  pickled per block.
* **Batching.** Per task, the batch size starts at 1 and follows the measured
  per-block time so that a batch takes about ``batch_target_secs``, or
  ``PER_WORKER_BATCH_SECS`` per running worker when that is longer
  (:func:`.policy.grow_batch`), capped by ``ceil(ready / workers)`` so that workers
  share the ready blocks and dependent levels are not held back by one worker's
  batch. Blocks slower than the target go one at a time.
* **Prefetch.** While a worker runs a batch, a second one can wait in its other
  slot, so it never idles through the round trip to the scheduler (release,
  acquire, write, signal: ~0.7 ms on 2 cores, 7 % of a 10 ms batch). Only for
  fast blocks (measured faster than ``batch_target_secs``; a prefetched batch holds
  at most about a batch target of work), when no worker of the task is waiting for work,
  and when the ready blocks cover a running and a queued batch for every worker;
  so slow blocks, starved workers and dependent levels are never held back.
  Prefetched blocks are "processing" for the scheduler, like the running batch.
* **Exits.** A dead worker is seen at once (its pidfd, or EOF): blocks it finished
  count, the block it was running fails (an attempt), and blocks of its batches it
  never started (including a prefetched one) are given back (status 0) and run
  again first. A block that raises makes its worker exit (daisy 2.0's dirty exit).
  A dirty exit counts toward ``max_worker_restarts`` unless it is a job end
  (:func:`.policy.is_job_end`: the worker had finished blocks, and neither a raised
  block, a timeout nor a segfault ended it): then it is replaced without a restart.
* **Worker functions** (0-argument) are ended with ``SIGTERM`` to their process group
  and ``SIGKILL`` ``TERM_GRACE_SECS`` later (their death signal is ``SIGTERM`` too):
  the grace lets a launcher (:mod:`daisy_nb.launch`) cancel the job it submitted.
  Their socket pair carries only the launchers' job reports (``J``, :func:`.starter.job_report`).
* **Timeouts** are read off shared memory (``cur``/``cur_start_ns``, set when a
  block starts, so time spent queued does not count): the worker is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from daisy_nb.runtime import _shm, _zygote, starter
from daisy_nb.runtime.context import Context
from daisy_nb.runtime.local.exits import ExitFacts, ExitKind, classify_exit
from daisy_nb.runtime.policy import JOB_END, count_worker_failure, grow_batch, record_error
from daisy_nb.runtime.pool_parts import PoolTaskRun, Waitables, nothing_left
from daisy_nb.runtime.starter import BUSY, CAPACITY, DEAD, IDLE, PARKED, QUITTING, STARTING, Starter, Worker, job_text
from daisy_nb.runtime.state import TB_CAP_BYTES, cap_traceback

__all__ = ["BUSY", "DEAD", "IDLE", "PARKED", "QUITTING", "STARTING", "JobHooks", "Processes", "Worker", "job_text"]

logger = logging.getLogger("daisy")

PER_WORKER_BATCH_SECS = 0.002  # batch target floor per running worker (16 workers: 32 ms batches)
RESPAWN_AFTER_RETURN_SECS = 1.0  # a worker function that returned without its worker: the next one waits
TERM_GRACE_SECS = 3.0  # a worker function's SIGTERM -> SIGKILL (a launcher cancels its job meanwhile)

_RUN = [b"R" + bytes((k,)) for k in range(_shm.SLOTS)]  # "run the batch in slot k"


class JobHooks(Protocol):
    """What this part asks about a worker function's exit that only the Client side knows
    (:class:`.clients.Clients`, through the pool)."""

    def function_returned(self, wid: int, tr: PoolTaskRun, acquired: int, connected: bool) -> tuple[bool, str | None]:
        """It returned on its own (exit 0): ``(dirty, reason)``."""
        ...

    def unconnected_note(self, tid: str, connected: bool) -> str:
        """For a worker function that failed: where its workers should have connected."""
        ...


class Processes:
    """Spawn, dispatch and prefetch, messages, exits and timeouts of worker processes.

    Owns every :class:`Worker` (``workers``, and per task), the ``resources`` budget in
    use and the :class:`.starter.Starter` (template, process groups). See the module
    docstring for the methods the pool and the Client side call.
    """

    def __init__(
        self,
        scheduler,
        tasks: Mapping[str, PoolTaskRun],
        waitables: Waitables,
        hooks: JobHooks,
        *,
        budget: dict[str, int],
        batch_target_secs: float,
        net: dict[str, float],
        context: Callable[[PoolTaskRun, int], Context],
        observer=None,
        template=None,
    ):
        self.s = scheduler
        self.waitables = waitables
        self.hooks = hooks
        self.budget = dict(budget)
        self.used = dict.fromkeys(self.budget, 0)
        self.target = float(batch_target_secs)
        self.net = net
        self._make_context = context
        self.observer = observer
        self.workers: dict[int, Worker] = {}
        self.of_task: dict[str, set[Worker]] = {}  # task id -> its workers
        self._alive: dict[str, int] = {}  # task id -> alive(), until a worker of it starts, quits or ends
        self._parked: set[Worker] = set()  # workers set PARKED (some may have moved on: see dispatch_parked)
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
        return sum(1 for w in self._workers_of(tr) if w.state in (STARTING, PARKED, IDLE))

    def count(self) -> int:
        """Worker processes not reaped yet."""
        return len(self.workers)

    def dispatch_parked(self) -> None:
        if not self._parked:
            return
        parked, self._parked = self._parked, set()
        for w in sorted(parked, key=lambda w: w.wid):  # in start order, as a scan of the workers
            if w.state == PARKED:
                self._dispatch(w)

    def drain(self, elapsed: float, block_grace: float, function_grace: float) -> None:
        """Every task is done: workers waiting for work quit, workers still there ``elapsed``
        seconds after the end past their grace (block workers, worker functions) are ended."""
        for w in list(self.workers.values()):
            if w.state in (IDLE, PARKED, STARTING):
                self._quit(w)
        if not self.workers:
            return
        for w in list(self.workers.values()):
            grace = block_grace if w.tr.arity else function_grace
            if elapsed > grace:
                w.expected_exit = True
                self._kill(w)

    def end_task(self, tr: PoolTaskRun) -> None:
        """``tr`` was abandoned: its workers are asked to quit, and ended."""
        for w in list(self._workers_of(tr)):
            self._quit(w)
            if w.state != DEAD:
                self._kill(w)

    def free_parked_for(self, tr: PoolTaskRun) -> None:
        """A parked worker of another task must not hold budget a task with ready work needs."""
        for w in list(self.workers.values()):
            if w.tr is not tr and w.state == PARKED and set(w.tr.requires) & set(tr.requires):
                self._quit(w)
                return

    def on_readable(self, w: Worker, obj) -> None:
        """``w``'s socket is readable: one message per wake-up (``Connection.poll(0)`` builds a
        selector per call), or its end."""
        try:
            if w.state != DEAD:
                self._on_worker_msg(w, obj.recv_bytes())
        except (EOFError, OSError):
            self.waitables.discard(obj)  # the pidfd (or poll_exits) reports the exit
            if w.pidfd is None:
                self.on_exit(w)

    def poll_exits(self) -> None:
        """Workers without a pidfd: ask their process."""
        for w in list(self.workers.values()):
            if w.pidfd is None and w.proc.poll() is not None:
                self.on_exit(w)

    def check_timeouts(self, now: int) -> None:
        self._worker_timeouts(now)
        self._term_overdue(now / 1e9)  # worker functions past their SIGTERM grace

    def kill_all(self) -> None:
        """End every worker (block workers: SIGKILL; worker functions: SIGTERM, SIGKILL after a grace)."""
        for w in list(self.workers.values()):
            if w.state != DEAD:
                w.expected_exit = True
                self._kill(w)

    def reap_all(self) -> None:
        """After :meth:`kill_all`: wait for every worker, close the template, kill the helpers
        worker functions left behind, unlink shared memory."""
        for w in list(self.workers.values()):
            t_term = w.t_term
            wait = 5.0 if t_term is None else max(0.0, t_term + TERM_GRACE_SECS - time.monotonic())
            try:
                w.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                if t_term is not None:
                    self._sigkill(w)
                    try:
                        w.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
            self.on_exit(w)
        self.starter.close()

    # ------------------------------------------------- a worker function's jobs (the Client side)
    def died_with_template(self, wid: int) -> bool:
        """Worker ``wid`` was forked by the run's template, and the template has died (taking it along)."""
        return self.starter.died_with_template(wid)

    def _job(self, wid: int, tr: PoolTaskRun | None = None) -> Worker | None:
        w = self.workers.get(wid)
        if w is None or (tr is not None and w.tr is not tr):
            return None
        return w

    def is_worker(self, wid: int) -> bool:
        """Worker ``wid`` runs (the timeline row of its Clients)."""
        return wid in self.workers

    def job_connected(self, wid: int, tr: PoolTaskRun) -> bool:
        """A Client said hello for worker ``wid`` of ``tr``: False if no such worker runs."""
        w = self._job(wid, tr)
        if w is None:
            return False
        w.connected = True
        return True

    def job_acquired(self, wid: int) -> None:
        w = self._job(wid)
        if w is not None:
            w.acquired += 1

    def job_result(self, wid: int, tr: PoolTaskRun, *, raised: bool, finished: bool) -> None:
        """A Client of worker ``wid``'s job released a block: what its job finished (policy.is_job_end)."""
        w = self._job(wid, tr)
        if w is not None:
            w.client_raised = raised
            if finished:
                w.finished += 1

    def job_log(self, wid: int) -> str | None:
        w = self._job(wid)
        return None if w is None else w.err_path

    def job_label(self, wid: int) -> str | None:
        w = self._job(wid)
        return None if w is None else job_text(w.job)

    def job_pid(self, wid: int) -> int | None:
        w = self._job(wid)
        return w.proc.pid if w is not None and w.proc is not None else None

    def job_lost(self, wid: int, tr: PoolTaskRun) -> None:
        """A Client of worker ``wid`` went silent and was dropped: end the worker function waiting
        for it (it is replaced)."""
        w = self._job(wid, tr)
        if w is not None and w.state != DEAD and not w.expected_exit:
            w.lost = True
            self._kill(w)

    def job_timed_out(self, wid: int, tr: PoolTaskRun) -> bool:
        """A Client of worker ``wid`` exceeded the task's timeout: end its worker function;
        False if there is none (the Client side drops the connection instead)."""
        w = self._job(wid, tr)
        if w is None:
            return False
        w.timed_out = True
        self._kill(w)
        return True

    def spawn(self, tr: PoolTaskRun) -> None:
        c = self.s.counters[tr.tid]
        if tr.crash_unreplaced(c):  # replacing a crash: a restart (a job end's replacement is not)
            c.worker_restart_count += 1
        c.worker_start_count += 1
        wid = self.next_wid
        self.next_wid += 1
        w = Worker(wid, tr, tr.next_slot)
        tr.next_slot += 1
        if tr.t_spawned is None:
            tr.t_spawned = w.t_spawn
        for k, v in tr.requires.items():
            self.used[k] = self.used.get(k, 0) + v
        self.starter.start(w, self._make_context(tr, wid))
        if w.pidfd is not None:
            self.waitables.add(w.pidfd, "pidfd", w)
        self.waitables.add(w.conn, "w", w)  # a worker function's: job reports only (Client connections do the rest)
        if not tr.arity:
            w.state = BUSY
        self.workers[wid] = w
        self.block_workers += tr.arity != 0
        self._workers_of(tr).add(w)
        self._alive.pop(tr.tid, None)
        if self.timeline is not None:  # the dashboard's worker timeline (dashboard/timeline.py)
            self.timeline.worker(
                ("w", wid),
                tr.tid,
                "worker" if tr.arity else "job",
                f"worker {wid}",
                w.proc.pid,
                job_text(w.job),
                w.t_spawn,
            )

    def _kill(self, w: Worker) -> None:
        """SIGKILL ``w``'s process group; a live worker function gets SIGTERM first (see the docstring)."""
        if not w.tr.arity and w.state != DEAD:
            if w.t_term is None:
                w.t_term = time.monotonic()
                try:
                    os.killpg(w.proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
            return  # _term_overdue sends the SIGKILL
        self._sigkill(w)

    def _term_overdue(self, now: float) -> None:
        """SIGKILL the worker functions still alive ``TERM_GRACE_SECS`` after their SIGTERM."""
        for w in list(self.workers.values()):
            if w.t_term is not None and now - w.t_term > TERM_GRACE_SECS:
                self._sigkill(w)

    def _sigkill(self, w: Worker) -> None:
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                w.proc.kill()
            except OSError:
                pass

    def _quit(self, w: Worker) -> None:
        w.expected_exit = True
        if w.state == DEAD:
            return
        w.state = QUITTING
        self._alive.pop(w.tr.tid, None)
        if w.conn is not None:
            try:
                w.conn.send_bytes(b"Q")
            except OSError:
                pass

    def _release_resources(self, tr: PoolTaskRun) -> None:
        for k, v in tr.requires.items():
            self.used[k] -= v

    def can_allocate(self, tr: PoolTaskRun) -> bool:
        return all(self.used.get(k, 0) + v <= self.budget.get(k, 0) for k, v in tr.requires.items())

    def alive(self, tr: PoolTaskRun) -> int:
        """``tr``'s workers that count toward ``max_workers`` (all but those told to quit; one
        whose block raised is replaced only once it is reaped). Cached: the main loop asks every
        turn, and it changes only when a worker starts, quits, raises or ends."""
        n = self._alive.get(tr.tid)
        if n is None:
            n = self._alive[tr.tid] = sum(1 for w in self._workers_of(tr) if w.state != QUITTING or w.raised)
        return n

    def on_exit(self, w: Worker) -> None:
        """A worker process ended: account for its batch, decide dirty/clean, clean up."""
        if w.state == DEAD:
            return
        tr = w.tr
        rc = w.proc.wait()
        orphan = getattr(w.proc, "orphaned", False)  # died with the worker template: not its fault
        if orphan:
            self.starter.template_gone()
        if w.conn is not None:  # results it sent before dying still count
            try:
                while (w.state == BUSY or not tr.arity) and w.conn.poll(0):  # a worker function's: job reports
                    self._on_worker_msg(w, w.conn.recv_bytes(), redispatch=False)
            except (EOFError, OSError):
                pass
        was_busy = w.state == BUSY
        if tr.arity and w.state == BUSY and w.queue and self.timeline is not None:
            self._timeline_died(w, fails=not (self.aborting or orphan))
        if tr.arity and w.state == BUSY and w.queue:
            # the block it was running fails (an attempt), except on Ctrl-C: then it is given back
            self._release_queue(w, 0 if self.aborting or orphan else 3)
        w.queue.clear()
        msg = None
        kind = classify_exit(
            ExitFacts(
                block_worker=bool(tr.arity),
                returncode=rc,
                finished=w.finished,
                raised=w.raised or w.client_raised,
                timed_out=w.timed_out,
                lost=w.lost,
                expected=w.expected_exit,
                aborting=self.aborting,
                orphaned=orphan,
            )
        )
        dirty = kind.dirty
        if kind is ExitKind.RETURNED:  # a worker function returned on its own: daisy 2.0.0's diagnoses
            dirty, msg = self.hooks.function_returned(w.wid, tr, w.acquired, w.connected)
            if dirty:  # returned without its worker connecting: its next replacement waits (the wheel's pace)
                tr.no_spawn_before = time.monotonic() + RESPAWN_AFTER_RETURN_SECS
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
        self.block_workers -= tr.arity != 0
        self._alive.pop(tr.tid, None)
        self._parked.discard(w)
        self.workers.pop(w.wid, None)
        self._release_resources(tr)
        if self.timeline is not None:
            self.timeline.ended(("w", w.wid), lost=dirty, job=job_text(w.job))
        if dirty:
            if kind is not ExitKind.RETURNED:
                # helpers it launched go too; not those of a worker function that returned: as daisy 2.0.0,
                # a fire-and-forget program lives on (its late connection stops the run, see clients.py),
                # and the run's end kills every process group (Starter.close)
                self._sigkill(w)
            c = self.s.counters[tr.tid]
            job_end = kind is ExitKind.JOB_END
            count_worker_failure(c, job_end)
            if msg is None:
                if w.timed_out:
                    msg = f"daisy worker process killed after a block exceeded timeout={tr.timeout:g}s"
                elif w.lost:
                    msg = (
                        f"daisy worker function killed: its worker sent nothing for "
                        f"{self.net['peer_timeout']:g}s (heartbeat; DAISY_NB_PEER_TIMEOUT_SECS)"
                    )
                else:
                    msg = f"daisy worker process exited with code {rc}" + (
                        " while processing blocks" if was_busy and (tr.arity or w.acquired) else ""
                    )
                    if not tr.arity:
                        msg += self.hooks.unconnected_note(tr.tid, w.connected)
                if job_end:
                    msg += f" after it had finished {w.finished} block(s): {JOB_END}"
                tail = self._err_tail(w)
                if tail:
                    msg += "\nworker stderr tail:\n" + tail
            record_error(c, msg, log=w.err_path)
            logger.warning("task %r: %s", tr.tid, msg.splitlines()[0])

    def _release_queue(self, w: Worker, running_status: int) -> None:
        """Release the batches sent to ``w``, in run order, and forget them.

        Blocks it finished count (with their stats), the block it was running gets
        ``running_status``, and blocks it never started (the rest of its batch, a
        prefetched batch: status 0 in shared memory) are given back.
        """
        tr = w.tr
        o_st = w.off["status"]
        for k, index in w.queue:
            n = len(index)
            st = w.bufs[k][o_st : o_st + n].astype(np.uint8)
            w.finished += int(np.count_nonzero(st == 2))
            if tr.res is not None:  # blocks it finished have their stats written
                self._add_stats(w, k, n, st, (st == 2) | (st == 3))
            st[st == 1] = running_status
            self.s.release_blocks(tr.tid, index, st)
            tr.inflight -= n
        w.queue.clear()

    def _timeline_died(self, w: Worker, fails: bool) -> None:
        """The bar of the batch ``w`` died in: its finished blocks and the one it was running,
        from an estimated start (blocks done x the task's time per block) to now."""
        k, index = w.queue[0]
        a = w.bufs[k]
        st = a[w.off["status"] : w.off["status"] + len(index)]
        done, running = int(np.count_nonzero(st >= 2)), int(np.count_nonzero(st == 1))
        if done + running:
            t1 = time.monotonic()
            t_cur = int(a[_shm.H_START]) / 1e9 if int(a[_shm.H_CUR]) >= 0 else t1
            t0 = min(t1, t_cur) - done * (w.tr.per_block or 0.0)
            failed = int(np.count_nonzero(st == 3)) + (running if fails else 0)
            self.timeline.bar(("w", w.wid), w.tr.tid, t0, t1, done + running, failed)

    def _err_tail(self, w: Worker) -> str:
        if not w.err_path:
            return ""
        try:
            with open(w.err_path, "rb") as f:
                f.seek(w.err_offset)
                data = f.read()[-TB_CAP_BYTES:]
            return cap_traceback(data.decode("utf-8", "replace").strip())
        except OSError:
            return ""

    # ---------------------------------------------------------------- dispatch
    def _batch_size(self, tr: PoolTaskRun, ready: int) -> int:
        n = max(1, sum(1 for w in self._workers_of(tr) if w.state in (IDLE, BUSY, PARKED)))
        return max(1, min(tr.batch_k, -(-ready // n), CAPACITY))

    def _send_batch(self, w: Worker, max_n: int) -> int:
        """Acquire up to ``max_n`` blocks into ``w``'s next slot and tell it; returns how many."""
        tr = w.tr
        b = self.s.acquire_blocks(tr.tid, max_n)
        n = len(b.index)
        if not n:
            return 0
        k = w.next_buf
        w.next_buf = (k + 1) % _shm.SLOTS
        a, o, m = w.bufs[k], w.off, n * tr.ndim
        a[o["index"] : o["index"] + n] = b.index
        a[o["spatial"] : o["spatial"] + n] = b.spatial_id
        a[o["status"] : o["status"] + n] = 0
        a[o["read_offset"] : o["read_offset"] + m] = b.read_offset.reshape(-1)
        a[o["read_shape"] : o["read_shape"] + m] = b.read_shape.reshape(-1)
        a[o["write_offset"] : o["write_offset"] + m] = b.write_offset.reshape(-1)
        a[o["write_shape"] : o["write_shape"] + m] = b.write_shape.reshape(-1)
        a[_shm.H_N] = n
        a[_shm.H_CUR] = -1
        w.queue.append((k, np.array(b.index, dtype=np.int64)))
        tr.inflight += n
        w.state = BUSY
        if tr.t_first is None:
            tr.t_first = time.monotonic()
        try:
            w.conn.send_bytes(_RUN[k])
        except OSError:
            pass  # dead: the pidfd/EOF path accounts for its batches
        return n

    def _dispatch(self, w: Worker) -> None:
        """``w`` has nothing to run: send it a batch (and maybe a second), park it, or let it go."""
        tr = w.tr
        if tr.abandoned or self.s.is_task_done(tr.tid):
            self._quit(w)
            return
        ready = self.s.ready_count(tr.tid)
        if ready > 0 and self._send_batch(w, self._batch_size(tr, ready)):
            self._prefetch(w)
            return
        if nothing_left(self.s, tr):
            self._quit(w)
        else:
            w.state = PARKED
            self._parked.add(w)

    def _prefetch(self, w: Worker) -> None:
        """Queue a second batch behind the one ``w`` is running, if nobody can be held back by it."""
        tr = w.tr
        if len(w.queue) >= _shm.SLOTS or tr.abandoned or tr.per_block is None or tr.per_block > self.target:
            return  # slow blocks (one at a time) never wait behind another batch
        active = 0
        for x in self._workers_of(tr):
            if x.state in (IDLE, PARKED):
                return  # a worker waiting for work comes first
            if x.state in (STARTING, BUSY):
                active += 1
        k = min(tr.batch_k, CAPACITY)
        # enough ready blocks for a running and a queued batch on every worker: near the end of a
        # task, or of a level, blocks go to whoever is free instead of queueing behind a batch
        if self.s.ready_count(tr.tid) >= 2 * active * k:
            self._send_batch(w, k)

    def _on_worker_msg(self, w: Worker, msg: bytes, redispatch: bool = True) -> None:
        tr = w.tr
        kind = msg[:1]
        if kind == b"J":
            starter.job_report(w, msg, self.observer)
        elif kind == b"I":
            if w.state == STARTING:
                w.state = IDLE
                if redispatch:
                    self._dispatch(w)
        elif kind == b"D" and w.state == BUSY and w.queue:
            k, index = w.queue.popleft()  # batches run in the order they were sent
            a, n = w.bufs[k], len(index)
            st = a[w.off["status"] : w.off["status"] + n].astype(np.uint8)
            st[st < 2] = 3  # cannot happen (the worker writes every status); be safe
            elapsed = int(a[_shm.H_ELAPSED])
            w.finished += int(np.count_nonzero(st == 2))
            if tr.res is not None:
                self._add_stats(w, k, n, st)
            self.s.release_blocks(tr.tid, index, st)
            tr.inflight -= n
            if self.timeline is not None:  # one bar per batch: its run time is in shared memory
                t1 = time.monotonic()
                self.timeline.bar(("w", w.wid), tr.tid, t1 - elapsed / 1e9, t1, n, int(np.count_nonzero(st == 3)))
            tr.per_block = elapsed / n / 1e9
            tr.block_secs.append(tr.per_block)
            # many workers: longer batches, so that this process's batches per second stay bounded
            target = max(self.target, len(self.workers) * PER_WORKER_BATCH_SECS)
            tr.batch_k = grow_batch(tr.batch_k, elapsed, n, target, CAPACITY)
            if w.queue:  # it is already running the prefetched batch
                if redispatch:
                    self._prefetch(w)
            else:
                w.state = IDLE
                if redispatch:
                    self._dispatch(w)

        elif kind == b"X" and w.state == BUSY and w.queue:
            # a block raised (status 3: none is left running): the worker exits (daisy 2.0's dirty
            # exit); blocks it ran count, the rest of the batch and a prefetched batch were never
            # started: given back
            if self.timeline is not None:
                k, index = w.queue[0]
                a = w.bufs[k]
                st = a[w.off["status"] : w.off["status"] + len(index)]
                t1 = time.monotonic()
                ran = int(np.count_nonzero(st >= 2))
                self.timeline.bar(
                    ("w", w.wid), tr.tid, t1 - int(a[_shm.H_ELAPSED]) / 1e9, t1, ran, int(np.count_nonzero(st == 3))
                )
            self._release_queue(w, 0)
            record_error(self.s.counters[tr.tid], msg[2:].decode("utf-8", "replace"), log=w.err_path)
            w.state = QUITTING  # no more work for it; its exit is a dirty one (replaced once reaped)
            w.raised = True
            self._alive.pop(tr.tid, None)

    def _add_stats(self, w: Worker, k: int, n: int, st, measured=None) -> None:
        """Fold the per-block stats of slot ``k``'s first ``n`` blocks into the task's totals."""
        o = w.off["stats"]
        rows = w.fbufs[k][o : o + n * _shm.NSTATS].reshape(n, _shm.NSTATS)
        failed = st == 3
        if measured is not None:
            rows, failed = rows[measured], failed[measured]
        w.tr.res.add(rows, failed)

    def running_blocks(self) -> list:
        """The block each block-function worker runs (from ``cur`` in its segment), for the hang alarm."""
        out: list[tuple] = []
        for w in list(self.workers.values()):
            if w.state != BUSY or not w.queue or w.bufs is None:
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

    def _worker_timeouts(self, now: int) -> None:
        """Kill a block worker whose running block exceeded the task's timeout."""
        for w in list(self.workers.values()):
            tr = w.tr
            if tr.timeout_ns is None or w.timed_out:
                continue
            if w.state == BUSY and tr.arity:
                for k, _ in w.queue:  # only the batch being run has cur >= 0
                    a = w.bufs[k]
                    cur = int(a[_shm.H_CUR])
                    if cur >= 0 and now - int(a[_shm.H_START]) > tr.timeout_ns:
                        w.timed_out = True
                        self.s.counters[tr.tid].timeout_reclaim_count += 1
                        self._kill(w)
                        break
