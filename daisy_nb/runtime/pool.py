"""The worker pool: runs a :class:`daisy_nb.Scheduler` on worker processes.

Design (numbers in ``benchmarks/bench_runtime.py``):

* **Processes, never a fork of this one.** On Linux each worker is forked by the
  run's worker template (:mod:`._zygote`: exec'd once per run, imported only the
  worker side, single-threaded), which hands back a pidfd and later the exit code;
  elsewhere, after the template died, or with ``DAISY_NB_WORKER_START=exec``, it is
  ``python -m daisy_nb.runtime.worker`` started with :class:`subprocess.Popen`. Either
  way in its own session (process group), with ``.out``/``.err`` as fd 1/2. This is
  the ``spawn`` start method without ``multiprocessing``'s re-import of the user's
  ``__main__``: daisy 2.0 scripts often have no ``if __name__ == "__main__"`` guard.
  Never ``fork`` this process: it runs numba and zarr threads. The user's function is
  serialized once per task at run start (cloudpickle, else pickle); an unpicklable
  function fails before any worker starts. At most ``SPAWN_BURST`` workers start per
  loop turn, so the first ones get work while the rest are forked.
* **Transport.** One shared-memory segment per block-function worker carries
  batches of block indices and ROI arrays one way and a status per block back
  (layout in :mod:`._shm`, two batch slots); a socket pair per worker carries
  tiny signals ("run the batch in slot k", "slot k done", "quit"). Nothing is
  pickled per block.
* **Batching.** Per task, the batch size starts at 1 and follows the measured
  per-block time so that a batch takes about ``batch_target_secs``, or
  ``PER_WORKER_BATCH_SECS`` per running worker when that is longer (x4 growth per
  batch at most), capped by ``ceil(ready / workers)`` so that workers share the
  ready blocks and dependent levels are not held back by one worker's batch.
  Blocks slower than the target go one at a time.
* **Prefetch.** While a worker runs a batch, a second one can wait in its other
  slot, so it never idles through the round trip to this process (release,
  acquire, write, signal: ~0.7 ms on 2 cores, 7 % of a 10 ms batch). Only for
  fast blocks (measured faster than ``batch_target_secs``; a prefetched batch holds
  at most about a batch target of work), when no worker of the task is waiting for work,
  and when the ready blocks cover a running and a queued batch for every worker;
  so slow blocks, starved workers and dependent levels are never held back.
  Prefetched blocks are "processing" for the scheduler, like the running batch.
* **Failure detection.** The main loop waits on every worker's socket, a pidfd
  per worker process (its "sentinel": readable when it exits) and a wake-up pipe
  (SIGINT, new client connections) with a 0.1 s timeout. A dead worker is seen at
  once: blocks it finished count, the block it was running fails (an attempt), and
  blocks of its batches it never started (including a prefetched one) are given
  back (status 0) and run again first. Timeouts are read off shared memory
  (``cur``/``cur_start_ns``, set when a block starts, so time spent queued does
  not count): the worker is killed.
* **0-argument worker functions** run their own ``daisy_nb.Client`` loop over TCP
  (:mod:`._net`: a listener on ``host``, default 127.0.0.1, started only when such
  a task exists; every connection authenticated with a per-run secret before any
  of its bytes are read, in the listener's thread). The address, the secret and
  the liveness timeouts travel in ``DAISY_CONTEXT``, so programs the worker
  launches, also on other machines, connect too. A client silent for
  ``peer_timeout`` seconds is dropped, its blocks fail (and are retried) and the
  worker function whose job it was is ended (and replaced); parked clients get a
  heartbeat so that they can tell a live scheduler from a vanished one.

Not done here: topological ordering, dependency bookkeeping, retries and tracking
(the scheduler's job), and printing (``daisy_nb.progress``).
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import queue
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing import connection as mpc

import numpy as np

from daisy_nb import logging as dlog
from daisy_nb.progress import Heartbeat, notify
from daisy_nb.runtime import _net, _shm, _zygote
from daisy_nb.runtime.clients import ClientConn, ClientsMixin
from daisy_nb.runtime.context import Context

__all__ = ["function_arity", "run_pool", "serialize_function"]

logger = logging.getLogger("daisy")

# workers run ``python -m daisy_nb.runtime.worker``: make sure they import this very package
_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WORKER_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")  # a forked worker's argv[0]

CAPACITY = 4096  # blocks per shared-memory batch
POLL_SECS = 0.1  # main loop wake-up: timeouts, Ctrl-C, progress
SPAWN_BURST = 4  # workers started per main-loop turn (the loop serves the ready ones in between)
SHUTDOWN_GRACE_SECS = 2.0  # after "quit", before SIGKILL
WORKER_FUNCTION_GRACE_SECS = 10.0  # a worker function may clean up after its loop
MAX_GROWTH = 4
PER_WORKER_BATCH_SECS = 0.002  # batch target floor per running worker (16 workers: 32 ms batches)

# worker states
STARTING, IDLE, BUSY, PARKED, QUITTING, DEAD = range(6)

_RUN = [b"R" + bytes((k,)) for k in range(_shm.SLOTS)]  # "run the batch in slot k"


def function_arity(fn) -> tuple[int, bool]:
    """``(number of positional args without self, wants keyword-only context)``."""
    spec = inspect.getfullargspec(fn)
    args = [a for a in spec.args if a != "self"]
    return len(args), "context" in (spec.kwonlyargs or [])


def serialize_function(fn, task_id: str) -> bytes:
    """cloudpickle (pickle if absent) the function once; a clear error if impossible."""
    try:
        import cloudpickle

        dumps, how = cloudpickle.dumps, "cloudpickle"
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        dumps, how = pickle.dumps, "pickle (cloudpickle is not installed: module-level functions only)"
    try:
        return dumps(fn)
    except Exception as e:
        raise RuntimeError(
            f"daisy_nb could not serialize the process_function of task '{task_id}' with {how}: every "
            "worker is a separate process, so the function travels there together with what it captures. "
            "Define it at module level, create locks/file handles/connections inside it rather than "
            "capturing them, or run in-process with run_blockwise(..., multiprocessing=False). "
            f"Underlying error: {e!r}"
        ) from e


class _TaskRun:
    """Per-task runtime bookkeeping (the scheduler owns the block state)."""

    def __init__(self, task, payload: bytes, arity: int, wants_context: bool, ndim: int):
        self.task = task
        self.tid = task.task_id
        self.payload = payload
        self.arity = arity
        self.wants_context = wants_context
        self.ndim = ndim
        self.requires = {k: int(v) for k, v in (getattr(task, "requires", None) or {}).items()}
        self.max_workers = max(1, int(task.max_workers))
        self.max_restarts = int(getattr(task, "max_worker_restarts", 10))
        t = getattr(task, "timeout_secs", None)
        self.timeout_ns = None if t is None or t <= 0 or t == float("inf") else int(t * 1e9)
        self.workers: set[_Worker] = set()
        self.inflight = 0
        self.batch_k = 1
        self.per_block = None  # seconds, from the last finished batch (None: not measured yet)
        self.next_slot = 0
        self.abandoned = False
        self.t_first = None
        self.t_done = None
        self.log_dir = None
        # resource_tracking: per-block stats come back in the workers' segments (or Client releases)
        self.track = bool(getattr(task, "resource_tracking", False))
        self.res = None
        if self.track:
            from daisy_nb.profiling import TaskResourceStats

            self.res = TaskResourceStats(self.tid)


class _Worker:
    def __init__(self, wid: int, tr: _TaskRun, slot: int):
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
        self.acquired = 0
        self.err_path = None
        self.err_offset = 0
        self.t_spawn = time.monotonic()


class _Pool(ClientsMixin):
    def __init__(self, scheduler, resources, observer, batch_target_secs, host=None):
        self.s = scheduler
        self.order = list(scheduler.task_ids)
        self.budget = {k: int(v) for k, v in (resources or {}).items()}
        self.used = dict.fromkeys(self.budget, 0)
        self.observer = observer
        self.target = float(batch_target_secs)
        self.trs: dict[str, _TaskRun] = {}
        self.workers: dict[int, _Worker] = {}
        self.by_obj: dict = {}  # waitable -> ("w", worker) | ("pidfd", worker) | ("c", client)
        self._sel = None  # cached poll selector over by_obj (see _wait)
        self._sel_set: set = set()
        self.clients: dict = {}  # connection -> ClientConn (see clients.py)
        self.n_clients: dict[str, int] = {}  # task id -> connected clients
        self.client_block_secs: dict[str, float] = {}  # task id -> mean block time of its clients
        self.pgids: list[int] = []
        self.next_wid = 0
        self.interrupted = False
        self.listener = None
        self.new_conns: queue.SimpleQueue = queue.SimpleQueue()
        self.authkey = secrets.token_bytes(32)
        self.port = 0
        self.bind_host, self.advertise = _net.resolve_host(host)
        self.host_given = host not in (None, "")
        self.net = _net.liveness()  # auth / heartbeat / peer_timeout seconds (DAISY_NB_* env)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.t_start = time.monotonic()
        self.t_first_block = None
        self.t_last_done = None
        self.aborting = False
        self.template = None  # the worker template (_zygote), started by the first _spawn
        self.template_failed = False
        self.more_spawns = False  # _spawn_pass stopped at SPAWN_BURST with more workers to start

    # ------------------------------------------------------------------ setup
    def prepare(self):
        for tid in self.order:
            task = self.s.tasks[tid]
            fn = task.process_function
            if fn is None:
                raise RuntimeError(
                    f'invalid configuration: task "{tid}" has no process_function; distributed runs need one '
                    "(daisy 2.0 would wait forever)"
                )
            try:
                arity, wants_ctx = function_arity(fn)
            except TypeError:  # builtins without a signature
                arity, wants_ctx = 1, False
            arity = getattr(task, "arity", None) if getattr(task, "arity", None) is not None else arity
            arity = 1 if arity >= 1 else 0
            # init_fn (daisy_nb extension): called once per block-function worker before its first block
            payload = serialize_function((fn, getattr(task, "init_fn", None)), tid)
            ndim = len(task.total_roi.shape) if getattr(task, "total_roi", None) is not None else 1
            tr = _TaskRun(task, payload, arity, wants_ctx, ndim)
            for k, v in tr.requires.items():
                if v > self.budget.get(k, 0):
                    raise ValueError(
                        f'task "{tid}" requires {{{k}: {v}}} but the global budget only has '
                        f"{{{k}: {self.budget.get(k, 0)}}}"
                    )
            self.trs[tid] = tr
        if any(tr.arity == 0 for tr in self.trs.values()):
            self._start_listener()
        elif self.host_given:  # no Client will connect, but a host this machine does not have is an error
            _net.Listener.check_bindable(self.bind_host)

    def _start_listener(self):
        def on_conn(conn):  # listener thread: an authenticated connection
            self.new_conns.put(conn)
            self._wake()

        self.listener = _net.Listener(self.bind_host, self.authkey, on_conn, self.net)
        self.port = self.listener.port

    def _wake(self):
        fd = self.wake_w
        if fd is None:
            return
        try:
            os.write(fd, b"x")
        except OSError:
            pass

    # ----------------------------------------------------------------- workers
    def _context(self, tr: _TaskRun, wid: int) -> Context:
        base = dlog.get_log_basedir()
        return Context(
            hostname=self.advertise,
            port=self.port,
            task_id=tr.tid,
            worker_id=wid,
            logdir="" if base is None else str(base),
            resource_tracking=int(tr.track),
            authkey=self.authkey.hex(),
            heartbeat=f"{self.net['heartbeat']:g}",
            peer_timeout=f"{self.net['peer_timeout']:g}",
            auth=f"{self.net['auth']:g}",
        )

    def _spawn(self, tr: _TaskRun) -> None:
        c = self.s.counters[tr.tid]
        if c.worker_failure_count > c.worker_restart_count:
            c.worker_restart_count += 1
        c.worker_start_count += 1
        wid = self.next_wid
        self.next_wid += 1
        w = _Worker(wid, tr, tr.next_slot)
        tr.next_slot += 1
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
        env = dict(os.environ)
        env[Context.ENV_VARIABLE] = self._context(tr, wid).to_env()
        env["PYTHONPATH"] = _PKG_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
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
            w.pidfd = w.proc.pidfd
            self.by_obj[w.pidfd] = ("pidfd", w)
        elif hasattr(os, "pidfd_open"):
            try:
                w.pidfd = os.pidfd_open(w.proc.pid)
                self.by_obj[w.pidfd] = ("pidfd", w)
            except OSError:
                w.pidfd = None
        if tr.arity:
            self.by_obj[w.conn] = ("w", w)
        else:
            w.conn.close()  # worker functions talk through Client connections
            w.conn = None
            w.state = BUSY
        self.workers[wid] = w
        tr.workers.add(w)

    def _start_process(self, env: dict, fd: int, keep_fds: list, logs):
        """Fork the worker from the run's template (started on first use), else exec it."""
        if self.template is None and not self.template_failed:
            if _zygote.available():
                tenv = {k: v for k, v in env.items() if k != Context.ENV_VARIABLE}
                try:
                    self.template = _zygote.Template(tenv, any(t.arity == 0 for t in self.trs.values()))
                except OSError as e:
                    logger.warning("daisy_nb: no worker template (%s); workers start by exec", e)
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

    def _template_gone(self) -> None:
        if not self.template_failed:
            self.template_failed = True
            logger.warning("daisy_nb: the worker template process died; its workers' unfinished blocks are "
                           "given back and new workers start by exec")

    def _kill(self, w: _Worker) -> None:
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                w.proc.kill()
            except OSError:
                pass

    def _quit(self, w: _Worker) -> None:
        w.expected_exit = True
        if w.state == DEAD:
            return
        w.state = QUITTING
        w.t_quit = time.monotonic()
        if w.conn is not None:
            try:
                w.conn.send_bytes(b"Q")
            except OSError:
                pass

    def _release_resources(self, tr: _TaskRun) -> None:
        for k, v in tr.requires.items():
            self.used[k] -= v

    def _can_allocate(self, tr: _TaskRun) -> bool:
        return all(self.used.get(k, 0) + v <= self.budget.get(k, 0) for k, v in tr.requires.items())

    def _alive(self, tr: _TaskRun) -> int:
        return sum(1 for w in tr.workers if w.state != QUITTING or w.raised)

    def _on_exit(self, w: _Worker) -> None:
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
                while w.state == BUSY and w.conn.poll(0):
                    self._on_worker_msg(w, w.conn.recv_bytes(), redispatch=False)
            except (EOFError, OSError):
                pass
        was_busy = w.state == BUSY
        if tr.arity and w.state == BUSY and w.queue:
            o_st = w.off["status"]
            for k, index in w.queue:  # the running batch, then a prefetched one (all 0: given back)
                n = len(index)
                st = w.bufs[k][o_st : o_st + n].astype(np.uint8)
                if tr.res is not None:  # blocks it finished have their stats written
                    self._add_stats(w, k, n, st, (st == 2) | (st == 3))
                # the block it was running fails (an attempt), except on Ctrl-C: then it is given back
                st[st == 1] = 0 if self.aborting or orphan else 3
                self.s.release_blocks(tr.tid, index, st)
                tr.inflight -= n
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
        else:
            # a worker function that returns without asking for work would be respawned forever
            dirty = w.acquired == 0 and self.s.ready_count(tr.tid) > 0
            if dirty:
                msg = "worker function returned without acquiring any block while blocks were ready"
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
        if dirty:
            self._kill(w)  # helpers it launched go too
            c = self.s.counters[tr.tid]
            c.worker_failure_count += 1
            if msg is None:
                if w.timed_out:
                    msg = f"daisy worker process killed after a block exceeded timeout={tr.task.timeout_secs:g}s"
                elif w.lost:
                    msg = (
                        f"daisy worker function killed: its worker sent nothing for "
                        f"{self.net['peer_timeout']:g}s (heartbeat; DAISY_NB_PEER_TIMEOUT_SECS)"
                    )
                else:
                    msg = f"daisy worker process exited with code {rc}" + (" while processing blocks" if was_busy else "")
                tail = self._err_tail(w)
                if tail:
                    msg += "\nworker stderr tail:\n" + tail
            c.last_worker_error = msg
            if c.first_worker_error is None:
                c.first_worker_error = msg
            logger.warning("task %r: %s", tr.tid, msg.splitlines()[0])

    def _err_tail(self, w: _Worker) -> str:
        if not w.err_path:
            return ""
        try:
            with open(w.err_path, "rb") as f:
                f.seek(w.err_offset)
                data = f.read()[-8192:]
            return "\n".join(data.decode("utf-8", "replace").strip().splitlines()[-50:])
        except OSError:
            return ""

    # ---------------------------------------------------------------- dispatch
    def _batch_size(self, tr: _TaskRun, ready: int) -> int:
        n = max(1, sum(1 for w in tr.workers if w.state in (IDLE, BUSY, PARKED)))
        return max(1, min(tr.batch_k, -(-ready // n), CAPACITY))

    def _nothing_left(self, tr: _TaskRun) -> bool:
        return tr.abandoned or self.s.remaining_count(tr.tid) - tr.inflight <= 0

    def _send_batch(self, w: _Worker, max_n: int) -> int:
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
            if self.t_first_block is None:
                self.t_first_block = tr.t_first
        try:
            w.conn.send_bytes(_RUN[k])
        except OSError:
            pass  # dead: the pidfd/EOF path accounts for its batches
        return n

    def _dispatch(self, w: _Worker) -> None:
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

    def _prefetch(self, w: _Worker) -> None:
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

    def _on_worker_msg(self, w: _Worker, msg: bytes, redispatch: bool = True) -> None:
        tr = w.tr
        kind = msg[:1]
        if kind == b"I":
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
            if tr.res is not None:
                self._add_stats(w, k, n, st)
            self.s.release_blocks(tr.tid, index, st)
            tr.inflight -= n
            per_block = elapsed / n / 1e9
            tr.per_block = per_block
            if per_block > 0:
                # many workers: longer batches, so that this process's batches per second stay bounded
                target = max(self.target, len(self.workers) * PER_WORKER_BATCH_SECS)
                want = int(target / per_block)
                tr.batch_k = max(1, min(want, tr.batch_k * MAX_GROWTH, CAPACITY))
            else:
                tr.batch_k = min(tr.batch_k * MAX_GROWTH, CAPACITY)
            if len(msg) > 2:  # b"D" + slot + first traceback
                text = msg[2:].decode("utf-8", "replace")
                c = self.s.counters[tr.tid]
                c.last_worker_error = text
                if c.first_worker_error is None:
                    c.first_worker_error = text
            if w.queue:  # it is already running the prefetched batch
                if redispatch:
                    self._prefetch(w)
            else:
                w.state = IDLE
                if redispatch:
                    self._dispatch(w)

        elif kind == b"X" and w.state == BUSY and w.queue:
            # a block raised: the worker exits (daisy 2.0's dirty exit); blocks it ran count,
            # the rest of the batch and a prefetched batch were never started: given back
            k, index = w.queue.popleft()
            n = len(index)
            st = w.bufs[k][w.off["status"] : w.off["status"] + n].astype(np.uint8)
            st[(st != 2) & (st != 3)] = 0
            if tr.res is not None:
                self._add_stats(w, k, n, st, st != 0)
            self.s.release_blocks(tr.tid, index, st)
            tr.inflight -= n
            for _, rest in w.queue:
                self.s.release_blocks(tr.tid, rest, np.zeros(len(rest), np.uint8))
                tr.inflight -= len(rest)
            w.queue.clear()
            text = msg[2:].decode("utf-8", "replace")
            c = self.s.counters[tr.tid]
            c.last_worker_error = text
            if c.first_worker_error is None:
                c.first_worker_error = text
            w.state = QUITTING  # no more work for it; its exit is a dirty one (replaced once reaped)
            w.raised = True

    def _add_stats(self, w: _Worker, k: int, n: int, st, measured=None) -> None:
        """Fold the per-block stats of slot ``k``'s first ``n`` blocks into the task's totals."""
        o = w.off["stats"]
        rows = w.fbufs[k][o : o + n * _shm.NSTATS].reshape(n, _shm.NSTATS)
        failed = st == 3
        if measured is not None:
            rows, failed = rows[measured], failed[measured]
        w.tr.res.add(rows, failed)

    # ----------------------------------------------------------------- clients
    def _client_lost(self, cc) -> None:
        """``cc`` went silent and was dropped: end the worker function waiting for it (it is replaced)."""
        w = self.workers.get(cc.wid)
        if w is not None and w.tr is cc.tr and w.state != DEAD and not w.expected_exit:
            w.lost = True
            self._kill(w)

    def _client_timed_out(self, cc) -> None:
        """``cc``'s block exceeded the task's timeout (already reclaimed): end its worker function, or drop it."""
        w = self.workers.get(cc.wid)
        if w is not None and w.tr is cc.tr:
            w.timed_out = True
            self._kill(w)
        else:
            self._drop_client(cc)

    # ------------------------------------------------------------------- loop
    def _spawn_pass(self) -> None:
        """Start the workers the ready blocks call for, at most ``SPAWN_BURST`` per loop turn: the
        workers started first get their batches while the rest are forked (``more_spawns``)."""
        progress = True
        started = 0
        self.more_spawns = False
        while progress:
            progress = False
            if started >= SPAWN_BURST:
                self.more_spawns = True
                return
            for tid in self.order:
                tr = self.trs[tid]
                if tr.abandoned or self.s.is_task_done(tid) or self._alive(tr) >= tr.max_workers:
                    continue
                ready = self.s.ready_count(tid)
                # block workers: only if the ready blocks are more than the idle/starting ones can take
                waiting = sum(1 for w in tr.workers if w.state in (STARTING, PARKED, IDLE))
                if ready <= waiting:
                    continue
                c = self.s.counters[tid]
                if c.worker_failure_count > c.worker_restart_count and c.worker_restart_count >= tr.max_restarts:
                    continue
                if not self._can_allocate(tr):
                    self._free_parked_for(tr)
                    continue
                self._spawn(tr)
                started += 1
                progress = True

    def _free_parked_for(self, tr: _TaskRun) -> None:
        """A parked worker of another task must not hold budget a task with ready work needs."""
        for w in list(self.workers.values()):
            if w.tr is not tr and w.state == PARKED and set(w.tr.requires) & set(tr.requires):
                self._quit(w)
                return

    def _check_abandon(self) -> None:
        for tid in self.order:
            tr = self.trs[tid]
            if tr.abandoned or self.s.is_task_done(tid) or tr.workers:
                continue
            c = self.s.counters[tid]
            if c.worker_failure_count > c.worker_restart_count and c.worker_restart_count >= tr.max_restarts:
                for a in self.s.abandon_task(tid, "worker restart cap exhausted"):
                    atr = self.trs[a]
                    atr.abandoned = True
                    for w in list(atr.workers):
                        self._quit(w)
                        if w.state != DEAD:
                            self._kill(w)
                    for cc in list(self.clients.values()):
                        if cc.tr is atr:
                            self._drop_client(cc)

    def _check_timeouts(self) -> None:
        now = time.monotonic_ns()
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
        if self.clients:
            self._client_timeouts(now)  # clients.py; calls _client_timed_out

    def _notify(self, what: str) -> None:
        notify(self.observer, what, self.s)

    def _on_sigint(self, signum, frame):
        self.interrupted = True
        self._wake()

    def run(self) -> None:
        s = self.s
        self._notify("on_start")
        heartbeat = Heartbeat(self.observer, s)
        stalled = 0
        draining_since = None
        while True:
            if self.interrupted:
                raise KeyboardInterrupt("run aborted by SIGINT")
            while not self.new_conns.empty():
                conn = self.new_conns.get()
                cc = ClientConn(conn)
                self.clients[conn] = cc
                self.by_obj[conn] = ("c", cc)
            done = s.is_done()
            if not done:
                for w in list(self.workers.values()):
                    if w.state == PARKED:
                        self._dispatch(w)
                for cc in list(self.clients.values()):
                    if cc.parked and cc.tr is not None:
                        self._serve_client(cc)
                self._check_abandon()
                self._spawn_pass()
                done = s.is_done()
            else:
                self.more_spawns = False
            now = time.monotonic()
            for tid, tr in self.trs.items():
                if tr.t_done is None and s.is_task_done(tid):
                    tr.t_done = now
            if done:
                if draining_since is None:
                    draining_since = now
                    self.t_last_done = now
                    self._notify("on_progress")
                for w in list(self.workers.values()):
                    if w.state in (IDLE, PARKED, STARTING):
                        self._quit(w)
                for cc in list(self.clients.values()):
                    if cc.parked:
                        self._serve_client(cc)
                if not self.workers:
                    break
                for w in list(self.workers.values()):
                    grace = SHUTDOWN_GRACE_SECS if w.tr.arity else WORKER_FUNCTION_GRACE_SECS
                    if now - draining_since > grace:
                        w.expected_exit = True
                        self._kill(w)
            elif not self.workers and not any(cc.held for cc in self.clients.values()):
                if not any(s.ready_count(t) for t in self.order):
                    stalled += 1
                    if stalled > 20:
                        raise RuntimeError("daisy_nb: the run stalled (no workers, no ready blocks, tasks not done)")
            else:
                stalled = 0
            for obj in self._wait(0 if self.more_spawns else POLL_SECS):
                if obj == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                entry = self.by_obj.get(obj)
                if entry is None:
                    continue
                kind, x = entry
                if kind == "w":
                    try:  # one message per wake-up: Connection.poll(0) builds a selector per call
                        if x.state != DEAD:
                            self._on_worker_msg(x, obj.recv_bytes())
                    except (EOFError, OSError):
                        self.by_obj.pop(obj, None)  # the pidfd (or poll below) reports the exit
                        if x.pidfd is None:
                            self._on_exit(x)
                elif kind == "pidfd":
                    self._on_exit(x)
                else:
                    self._on_client_readable(x)
            for w in list(self.workers.values()):
                if w.pidfd is None and w.proc.poll() is not None:
                    self._on_exit(w)
            self._check_timeouts()
            if self.clients:
                self._check_clients()
            now = time.monotonic()
            heartbeat(now)

    def _wait(self, timeout: float) -> list:
        """The waitables (``by_obj`` keys and the wake pipe) that are ready to read.

        Like ``multiprocessing.connection.wait``, but the poll selector is kept until
        the set of waitables changes: building one per loop (a register call per
        waitable) was a third of this process's CPU time on small batches.
        """
        cur = set(self.by_obj)
        if self._sel is None or cur != self._sel_set:
            sel = selectors.PollSelector()
            sel.register(self.wake_r, selectors.EVENT_READ)
            for obj in cur:
                sel.register(obj, selectors.EVENT_READ)
            if self._sel is not None:
                self._sel.close()
            self._sel, self._sel_set = sel, cur
        return [key.fileobj for key, _ in self._sel.select(timeout)]

    def shutdown(self) -> None:
        """End every worker (quit, then SIGKILL), close connections, unlink shared memory."""
        for w in list(self.workers.values()):
            if w.state != DEAD:
                w.expected_exit = True
                self._kill(w)
        for w in list(self.workers.values()):
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._on_exit(w)
        for cc in list(self.clients.values()):
            self._drop_client(cc)
        if self.template is not None:
            self.template.close()
        for pgid in self.pgids:  # helpers a worker function launched and left behind
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.listener is not None:
            self.listener.close()
        while not self.new_conns.empty():
            try:
                self.new_conns.get().close()
            except OSError:
                pass
        if self._sel is not None:
            self._sel.close()
            self._sel = None
        wake_w, self.wake_w = self.wake_w, None
        os.close(wake_w)
        os.close(self.wake_r)


def run_pool(
    scheduler,
    *,
    resources=None,
    progress=True,
    summary=True,
    log_dir=None,
    batch_target_secs: float = 0.01,
    host=None,
):
    """Run every task of ``scheduler`` on worker processes; returns ``{task_id: TaskState}``.

    ``log_dir`` overrides ``daisy_nb.logging``'s basedir for this run. On SIGINT the
    workers are ended, tracking is flushed, the partial summary printed and
    ``KeyboardInterrupt`` raised with ``daisy_states``/``daisy_task_order``
    attached. Abandoned tasks do not raise here (see :func:`raise_if_abandoned`).
    ``host``: where ``Client`` connections are accepted (see ``_net.resolve_host``).
    """
    from daisy_nb.progress import finish_run, resolve_observer

    saved_base = dlog.get_log_basedir()
    if log_dir is not None:
        dlog.set_log_basedir(log_dir)
    pool = _Pool(scheduler, resources, resolve_observer(progress, list(scheduler.task_ids)), batch_target_secs, host)
    if hasattr(pool.observer, "attach_runtime"):  # the dashboard's view of the workers
        pool.observer.attach_runtime(pool)
    old_handler = None
    in_main = threading.current_thread() is threading.main_thread()
    interrupted = False
    try:
        try:
            pool.prepare()
            if in_main:
                old_handler = signal.signal(signal.SIGINT, pool._on_sigint)
            pool.run()
        except KeyboardInterrupt:
            interrupted = pool.aborting = True
        except BaseException:
            pool.aborting = True
            raise
        finally:
            pool.shutdown()
            scheduler.flush_tracking()
            if in_main and old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
        states = scheduler.task_states
        for tid, tr in pool.trs.items():
            states[tid].resource_stats = tr.res  # None unless the task tracks resources
        pool._notify("on_finish")
        elapsed = {}
        for tid, tr in pool.trs.items():
            t1 = tr.t_done or time.monotonic()
            elapsed[tid] = (t1 - tr.t_first) if tr.t_first is not None else 0.0
        finish_run(states, pool.order, elapsed, summary=summary, interrupted=interrupted)
        run_pool.last_timing = {
            "start_to_first_block": (pool.t_first_block - pool.t_start) if pool.t_first_block else None,
            "last_block_to_exit": (time.monotonic() - pool.t_last_done) if pool.t_last_done else None,
        }
        return states
    finally:
        if log_dir is not None:
            dlog.set_log_basedir(saved_base)


run_pool.last_timing = {}


def raise_if_abandoned(states, task_order) -> None:
    """daisy 2.0 wheel: ``run_blockwise`` raises ``RuntimeError`` when a task was abandoned."""
    from daisy_nb.progress import raise_if_abandoned as _raise

    _raise(states, task_order, "workers")
