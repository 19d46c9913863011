"""The pool's block and worker-function processes, seen from the scheduler process.

A mixin of the pool (``pool._Pool``), as :mod:`.clients` is for ``Client``
connections: every method runs in the pool's main loop.

* **Processes, never a fork of the scheduler.** On Linux each worker is forked by the
  run's worker template (:mod:`._zygote`: exec'd once per run, imported only the
  worker side, single-threaded), which hands back a pidfd and later the exit code;
  elsewhere, after the template died, or with ``DAISY_NB_WORKER_START=exec``, it is
  ``python -m daisy_nb.runtime.worker`` started with :class:`subprocess.Popen`. Either
  way in its own session (process group), with ``.out``/``.err`` as fd 1/2. This is
  the ``spawn`` start method without ``multiprocessing``'s re-import of the user's
  ``__main__``: daisy 2.0 scripts often have no ``if __name__ == "__main__"`` guard.
  Never ``fork`` the scheduler process: it runs numba and zarr threads. The user's
  function is serialized once per task at run start (:mod:`.policy`).
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
  Their socket pair carries only the launchers' job reports (``J``, :meth:`_on_job`).
* **Timeouts** are read off shared memory (``cur``/``cur_start_ns``, set when a
  block starts, so time spent queued does not count): the worker is killed.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from collections import deque
from multiprocessing import connection as mpc
from typing import TYPE_CHECKING, Any

import numpy as np

from daisy_nb import logging as dlog
from daisy_nb.runtime import _shm, _zygote
from daisy_nb.runtime.context import Context
from daisy_nb.runtime.policy import JOB_END, count_worker_failure, grow_batch, is_job_end, record_error
from daisy_nb.runtime.state import TB_CAP_BYTES, cap_traceback

if TYPE_CHECKING:
    from daisy_nb.runtime.policy import TaskRun

__all__ = ["BUSY", "DEAD", "IDLE", "PARKED", "QUITTING", "STARTING", "ProcessesMixin"]

logger = logging.getLogger("daisy")

_WORKER_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")  # a forked worker's argv[0]

CAPACITY = 4096  # blocks per shared-memory batch
PER_WORKER_BATCH_SECS = 0.002  # batch target floor per running worker (16 workers: 32 ms batches)
TERM_GRACE_SECS = 3.0  # a worker function's SIGTERM -> SIGKILL (a launcher cancels its job meanwhile)

# worker states
STARTING, IDLE, BUSY, PARKED, QUITTING, DEAD = range(6)

_RUN = [b"R" + bytes((k,)) for k in range(_shm.SLOTS)]  # "run the batch in slot k"


def job_text(job) -> str | None:
    """A worker function's launcher job (``daisy_nb.launch``) as the worker list and timeline show it."""
    if not job:
        return None
    return f"{job.get('scheduler', '')} {job.get('job', '')} {job.get('state', '')}".strip()


class Worker:
    def __init__(self, wid: int, tr: TaskRun, slot: int):
        self.wid = wid
        self.tr = tr
        self.slot = slot
        self.state = STARTING
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self.pidfd = None
        self.shm = None
        self.bufs: list | None = None  # one int64 array per batch slot of its shared memory
        self.fbufs: list | None = None  # the same slots as float64 (stats region), when tracking
        self.off = None
        self.queue: deque = deque()  # (batch slot, block indices) sent to the worker, in run order
        self.next_buf = 0
        self.expected_exit = False
        self.raised = False  # a block raised: the worker is exiting (dirty), not yet reaped
        self.timed_out = False
        self.lost = False  # a client of its job went silent (heartbeat): killed, counts as a failure
        self.connected = False  # a Client of its job said hello (0-argument worker functions)
        self.acquired = 0
        self.finished = 0  # blocks it (or its worker function's clients) finished successfully
        self.client_raised = False  # a worker function's last block raised (its exit is a crash)
        self.err_path = None
        self.err_offset = 0
        self.t_spawn = time.monotonic()
        self.t_term: float | None = None  # a worker function: when it was sent SIGTERM
        self.job: dict | None = None  # a worker function's launcher: its last job report


class ProcessesMixin:
    """Spawn, dispatch and prefetch, messages, exits and timeouts of worker processes."""

    # set by the pool (pool._Pool)
    s: Any  # the Scheduler
    trs: dict
    workers: dict
    by_obj: dict
    used: dict
    budget: dict
    pgids: list
    target: float
    net: dict
    port: int
    advertise: str
    authkey: bytes
    aborting: bool
    template: Any
    template_failed: bool
    forked_wids: set[int]
    next_wid: int
    timeline: Any  # a dashboard.timeline.Timeline, or None (no dashboard or report)

    if TYPE_CHECKING:

        def _function_returned(self, w: Worker) -> tuple[bool, str | None]: ...
        def _unconnected_note(self, w: Worker) -> str: ...

    def _context(self, tr: TaskRun, wid: int) -> Context:
        """A worker's ``DAISY_CONTEXT``. Only a worker function's (its programs connect over TCP)
        holds the run's secret: a block-function worker never connects, so it never gets it."""
        base = dlog.get_log_basedir()
        ctx = Context(
            hostname=self.advertise,
            port=self.port,
            task_id=tr.tid,
            worker_id=wid,
            logdir="" if base is None else str(base),
            resource_tracking=int(tr.track),
            heartbeat=f"{self.net['heartbeat']:g}",
            peer_timeout=f"{self.net['peer_timeout']:g}",
            auth=f"{self.net['auth']:g}",
        )
        if tr.arity == 0:
            ctx["authkey"] = self.authkey.hex()
        return ctx

    def _spawn(self, tr: TaskRun) -> None:
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
        setup = {
            "sys_path": list(sys.path),
            "log_basedir": None if dlog.get_log_basedir() is None else str(dlog.get_log_basedir()),
            "log_mode": dlog.get_log_mode(),
            "log_level": dlog.get_log_level(),
            "task_id": tr.tid,
            "worker_id": wid,
            "arity": tr.arity,
            "wants_context": tr.wants_context,
            "capacity": CAPACITY,
            "ndim": tr.ndim,
        }
        keep_fds = []
        if tr.arity:
            w.shm = _shm.Segment(_shm.segment_bytes(CAPACITY, tr.ndim, tr.track))
            nw = _shm.words(CAPACITY, tr.ndim, tr.track)
            arr = np.ndarray((_shm.SLOTS, nw), dtype=np.int64, buffer=w.shm.buf)
            arr[:, : _shm.HDR] = 0
            arr[:, _shm.H_CUR] = -1
            w.bufs = list(arr)
            w.off = _shm.offsets(CAPACITY, tr.ndim, tr.track)
            if tr.track:
                w.fbufs = list(np.ndarray((_shm.SLOTS, nw), dtype=np.float64, buffer=w.shm.buf))
                setup["resource_tracking"] = True
            setup.update(w.shm.worker_setup())
            setup["slots"] = _shm.SLOTS
            if w.shm.fd >= 0:
                keep_fds.append(w.shm.fd)
        parent_end, child_end = mpc.Pipe(duplex=True)
        logs = dlog.open_worker_logs(tr.tid, w.slot)
        tee = logs is not None and dlog.get_log_mode() == "both"
        if tee:  # console stays fd 1/2; the worker copies Python-level writes into the files
            setup["tee_files"] = (logs[0].name, logs[1].name)
        env = _zygote.worker_env()
        env[Context.ENV_VARIABLE] = self._context(tr, wid).to_env()
        fd = child_end.fileno()
        try:
            w.proc = self._start_process(env, fd, keep_fds, logs if logs and not tee else None)
        finally:
            child_end.close()
            if w.shm is not None:
                w.shm.close_fd()  # the worker has its own
            if logs:
                w.err_path = logs[1].name
                w.err_offset = logs[1].tell()
                logs[0].close()
                logs[1].close()
        self.pgids.append(w.proc.pid)
        w.conn = parent_end
        try:
            parent_end.send_bytes(pickle.dumps(setup))
            parent_end.send_bytes(tr.payload)
        except OSError:
            pass  # died already: its pidfd says so
        if isinstance(w.proc, _zygote.ForkedProcess):  # the template opened it before it could reap
            self.forked_wids.add(wid)
            w.pidfd = w.proc.pidfd
            self.by_obj[w.pidfd] = ("pidfd", w)
        elif hasattr(os, "pidfd_open"):
            try:
                w.pidfd = os.pidfd_open(w.proc.pid)
                self.by_obj[w.pidfd] = ("pidfd", w)
            except OSError:
                w.pidfd = None
        self.by_obj[w.conn] = ("w", w)  # a worker function's: job reports only (Client connections do the rest)
        if not tr.arity:
            w.state = BUSY
        self.workers[wid] = w
        tr.workers.add(w)
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

    def _start_process(self, env: dict, fd: int, keep_fds: list, logs):
        """Fork the worker from the run's template (started on first use), else exec it."""
        if self.template is None and not self.template_failed:
            self.template = _zygote.start_early(any(t.arity == 0 for t in self.trs.values()))
            self.template_failed = self.template is None
        if self.template is not None and not self.template.dead:
            fds = {"conn": fd}
            outs = (logs[0].fileno(), logs[1].fileno()) if logs else (1, 2)  # else: this process's console
            for name, x in zip(("out", "err"), outs):
                try:
                    os.fstat(x)
                    fds[name] = x
                except OSError:
                    pass
            if keep_fds:
                fds["shm"] = keep_fds[0]
            try:
                return self.template.fork(env, fds, [_WORKER_PY, str(fd), str(os.getpid())])
            except _zygote.TemplateDied:
                self._template_gone()
        return subprocess.Popen(
            [sys.executable, "-m", "daisy_nb.runtime.worker", str(fd), str(os.getpid())],
            pass_fds=(fd, *keep_fds),
            stdin=subprocess.DEVNULL,
            stdout=logs[0] if logs else None,
            stderr=logs[1] if logs else None,
            env=env,
            start_new_session=True,  # own process group: Ctrl-C is ours to handle, killpg reaps helpers
        )

    def _died_with_template(self, wid: int) -> bool:
        """Worker ``wid`` was forked by the run's template, and the template has died (taking it along)."""
        t = self.template
        return wid in self.forked_wids and t is not None and (t.dead or t.proc.poll() is not None)

    def _template_gone(self) -> None:
        if not self.template_failed:
            self.template_failed = True
            logger.warning(
                "daisy_nb: the worker template process died; its workers' unfinished blocks are "
                "given back and new workers start by exec"
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
        if w.conn is not None:
            try:
                w.conn.send_bytes(b"Q")
            except OSError:
                pass

    def _release_resources(self, tr: TaskRun) -> None:
        for k, v in tr.requires.items():
            self.used[k] -= v

    def _can_allocate(self, tr: TaskRun) -> bool:
        return all(self.used.get(k, 0) + v <= self.budget.get(k, 0) for k, v in tr.requires.items())

    def _alive(self, tr: TaskRun) -> int:
        return sum(1 for w in tr.workers if w.state != QUITTING or w.raised)

    def _on_exit(self, w: Worker) -> None:
        """A worker process ended: account for its batch, decide dirty/clean, clean up."""
        if w.state == DEAD:
            return
        tr = w.tr
        rc = w.proc.wait()
        orphan = getattr(w.proc, "orphaned", False)  # died with the worker template: not its fault
        if orphan:
            self._template_gone()
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
        if w.timed_out or w.lost:
            dirty = True
        elif w.expected_exit or self.aborting or orphan:
            dirty = False  # we asked it to quit, or killed it (shutdown, abandonment)
        elif tr.arity:
            dirty = True  # block workers only exit when told to
        elif rc != 0:
            dirty = True
        else:  # a worker function returned on its own: daisy 2.0.0's diagnoses (clients.py)
            dirty, msg = self._function_returned(w)
        w.state = DEAD
        for obj in (w.conn, w.pidfd):
            if obj is not None:
                self.by_obj.pop(obj, None)
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
        tr.workers.discard(w)
        self.workers.pop(w.wid, None)
        self._release_resources(tr)
        if self.timeline is not None:
            self.timeline.ended(("w", w.wid), lost=dirty, job=job_text(w.job))
        if dirty:
            self._sigkill(w)  # helpers it launched go too
            c = self.s.counters[tr.tid]
            crashed = w.raised or w.timed_out or w.client_raised
            job_end = is_job_end(w.finished, crashed=crashed, returncode=rc)
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
                        " while processing blocks" if was_busy else ""
                    )
                    if not tr.arity:
                        msg += self._unconnected_note(w)
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
    def _batch_size(self, tr: TaskRun, ready: int) -> int:
        n = max(1, sum(1 for w in tr.workers if w.state in (IDLE, BUSY, PARKED)))
        return max(1, min(tr.batch_k, -(-ready // n), CAPACITY))

    def _nothing_left(self, tr: TaskRun) -> bool:
        return tr.abandoned or self.s.remaining_count(tr.tid) - tr.inflight <= 0

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
        if self._nothing_left(tr):
            self._quit(w)
        else:
            w.state = PARKED

    def _prefetch(self, w: Worker) -> None:
        """Queue a second batch behind the one ``w`` is running, if nobody can be held back by it."""
        tr = w.tr
        if len(w.queue) >= _shm.SLOTS or tr.abandoned or tr.per_block is None or tr.per_block > self.target:
            return  # slow blocks (one at a time) never wait behind another batch
        active = 0
        for x in tr.workers:
            if x.state in (IDLE, PARKED):
                return  # a worker waiting for work comes first
            if x.state in (STARTING, BUSY):
                active += 1
        k = min(tr.batch_k, CAPACITY)
        # enough ready blocks for a running and a queued batch on every worker: near the end of a
        # task, or of a level, blocks go to whoever is free instead of queueing behind a batch
        if self.s.ready_count(tr.tid) >= 2 * active * k:
            self._send_batch(w, k)

    def _on_job(self, w: Worker, msg: bytes) -> None:
        """``J`` + JSON from a worker function's launcher: its job (scheduler, id, state)."""
        import json

        try:
            info = json.loads(msg[1:].decode())
        except ValueError:
            return
        if not isinstance(info, dict):
            return
        w.job = {k: str(info.get(k, "")) for k in ("scheduler", "job", "state")}
        bad = w.job["state"].startswith(("failed", "cancel failed"))
        logger.log(
            logging.WARNING if bad else logging.INFO,
            "task %r: worker %d: %s job %s %s",
            w.tr.tid,
            w.wid,
            w.job["scheduler"],
            w.job["job"],
            w.job["state"],
        )
        hook = getattr(getattr(self, "observer", None), "on_worker_job", None)
        if hook is not None:
            try:
                hook({"task": w.tr.tid, "worker": w.wid, **w.job})
            except Exception:
                pass

    def _on_worker_msg(self, w: Worker, msg: bytes, redispatch: bool = True) -> None:
        tr = w.tr
        kind = msg[:1]
        if kind == b"J":
            self._on_job(w, msg)
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

    def _add_stats(self, w: Worker, k: int, n: int, st, measured=None) -> None:
        """Fold the per-block stats of slot ``k``'s first ``n`` blocks into the task's totals."""
        o = w.off["stats"]
        rows = w.fbufs[k][o : o + n * _shm.NSTATS].reshape(n, _shm.NSTATS)
        failed = st == 3
        if measured is not None:
            rows, failed = rows[measured], failed[measured]
        w.tr.res.add(rows, failed)

    def _running_worker_blocks(self) -> list:
        """The block each block-function worker runs (from ``cur`` in its segment), for the hang alarm."""
        out = []
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
