"""The worker pool: runs a :class:`daisy_nb.Scheduler` on worker processes.

Design (numbers in ``benchmarks/bench_runtime.py``):

* **Worker processes** (spawned from a worker template or exec'd, fed batches
  through shared memory, a second batch prefetched, exits and timeouts) are
  :mod:`.processes`; ``daisy_nb.Client`` connections are :mod:`.clients`; what a
  task asks for (its run record, batch sizing, function serialisation) is
  :mod:`.policy`. This module is the main loop and ``run_pool``.
* **Starting workers.** Up to ``max_workers`` per task, within the ``resources``
  budget, only while the task has more ready blocks than its idle workers can take;
  at most ``SPAWN_BURST`` start per loop turn, so the first ones get work while the
  rest are forked. A parked worker of another task gives its budget up to a task
  with ready work. After ``max_worker_restarts`` replaced crashes and no worker
  left, the task is abandoned (job ends do not count: :func:`.policy.is_job_end`).
* **Failure detection.** The main loop waits on every worker's socket, a pidfd
  per worker process (its "sentinel": readable when it exits) and a wake-up pipe
  (SIGINT, new client connections) with a 0.1 s timeout.
* **0-argument worker functions** run their own ``daisy_nb.Client`` loop over TCP
  (:mod:`._net`: a listener on ``host``, by default on every interface with an
  address detected as daisy 2.0.0 does, started only when such a task exists;
  every connection authenticated with a per-run secret before any of its bytes
  are read, in the listener's thread). The address, the secret and
  the liveness timeouts travel in ``DAISY_CONTEXT``, so programs the worker
  launches, also on other machines, connect too. A client silent for
  ``peer_timeout`` seconds is dropped, its blocks fail (and are retried) and the
  worker function whose job it was is ended (and replaced); every client gets a
  heartbeat so that it can tell a live scheduler from a vanished one. At the run's
  end (any end) every connection is closed at once, and worker functions get
  ``SIGTERM`` and a grace before ``SIGKILL`` (a launcher of :mod:`daisy_nb.launch`
  cancels its job in it): no job outlives its run.

Not done here: topological ordering, dependency bookkeeping, retries and tracking
(the scheduler's job), and printing (``daisy_nb.progress``).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import selectors
import signal
import subprocess
import threading
import time

from daisy_nb import logging as dlog
from daisy_nb.progress import ABANDON_RESTARTS, Heartbeat, notify, raise_if_abandoned
from daisy_nb.runtime import _net
from daisy_nb.runtime.clients import ClientConn, ClientsMixin
from daisy_nb.runtime.policy import TaskRun, end_run
from daisy_nb.runtime.processes import DEAD, IDLE, PARKED, STARTING, TERM_GRACE_SECS, ProcessesMixin, Worker

__all__ = ["raise_if_abandoned", "run_pool"]

logger = logging.getLogger("daisy")

POLL_SECS = 0.1  # main loop wake-up: timeouts, Ctrl-C, progress
SPAWN_BURST = 4  # workers started per main-loop turn (the loop serves the ready ones in between)
SHUTDOWN_GRACE_SECS = 2.0  # after "quit", before SIGKILL
WORKER_FUNCTION_GRACE_SECS = 10.0  # a worker function may clean up after its loop


class _TaskRun(TaskRun):
    """The pool's run record of a task: the shared one, plus its workers."""

    def __init__(self, task):
        super().__init__(task)
        self.timeout_ns = None if self.timeout is None else int(self.timeout * 1e9)
        self.workers: set[Worker] = set()
        self.per_block = None  # seconds, from the last finished batch (None: not measured yet)
        self.next_slot = 0  # the next worker's slot number (its log file names)
        self.t_spawned: float | None = None  # monotonic time its first worker started


class _Pool(ProcessesMixin, ClientsMixin):
    def __init__(self, scheduler, resources, observer, batch_target_secs, host=None, template=None, hang_alarm=None):
        self.s = scheduler
        self.hang = hang_alarm  # run_blockwise's hang_alarm= (see daisy_nb.hang)
        self.order = list(scheduler.task_ids)
        self.budget = {k: int(v) for k, v in (resources or {}).items()}
        self.used = dict.fromkeys(self.budget, 0)
        self.observer = observer
        self.target = float(batch_target_secs)
        self.trs: dict[str, _TaskRun] = {}
        self.workers: dict[int, Worker] = {}
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
        self.bind_host, advertise = _net.resolve_host(host)
        self.advertise: str = advertise or ""  # detected when the listener starts (None: detect)
        self.where = ""  # where Client connections go, for messages (see _start_listener)
        self.host_given = host not in (None, "")
        self.net = _net.liveness()  # auth / heartbeat / peer_timeout seconds (DAISY_NB_* env)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.aborting = False
        # the worker template (_zygote): started early by run._execute, else by the first _spawn
        self.template = template
        self.template_failed = False
        self.forked_wids: set[int] = set()  # workers forked by the template (they die with it)
        self.more_spawns = False  # _spawn_pass stopped at SPAWN_BURST with more workers to start
        self.returned_wids: set[int] = set()  # worker functions that returned on their own (clients.py)
        self.connected_tids: set[str] = set()  # tasks a Client has said hello for
        self.warned: set[tuple[str, str]] = set()  # (task id, kind) of the diagnoses logged once
        self.timeline = None  # set by the dashboard's observer (attach_runtime): batches are reported to it

    # ------------------------------------------------------------------ setup
    def prepare(self):
        for tid in self.order:
            task = self.s.tasks[tid]
            if task.process_function is None:
                raise RuntimeError(
                    f'invalid configuration: task "{tid}" has no process_function; distributed runs need one '
                    "(daisy 2.0 would wait forever)"
                )
            tr = _TaskRun(task)
            tr.serialize()  # with init_fn (daisy_nb extension: once per block-function worker)
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
        if not self.advertise:  # no host=, or the wildcard: as daisy 2.0.0 (see _net.detect_address)
            self.advertise = _net.detect_address(self.listener)
        self.where = _net.describe(self.bind_host, self.port, self.advertise)
        logger.info("daisy_nb scheduler %s", self.where)

    def _wake(self):
        fd = self.wake_w
        if fd is None:
            return
        try:
            os.write(fd, b"x")
        except OSError:
            pass

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
                if tr.restarts_exhausted(self.s.counters[tid]):
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
            if tr.restarts_exhausted(self.s.counters[tid]):
                self._abandon(tid, ABANDON_RESTARTS)

    def _abandon(self, tid: str, reason: str) -> None:
        """Abandon ``tid`` and its downstream tasks: their workers and clients are ended."""
        for a in self.s.abandon_task(tid, reason):
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
        self._worker_timeouts(now)  # processes.py
        self._term_overdue(now / 1e9)  # worker functions past their SIGTERM grace
        if self.clients:
            self._client_timeouts(now)  # clients.py; calls _client_timed_out
        if self.listener is not None:
            self._check_unconnected(now / 1e9)  # clients.py: a task none of whose jobs connect

    def _notify(self, what: str) -> None:
        notify(self.observer, what, self.s)

    def _on_sigint(self, signum, frame):
        self.interrupted = True
        self._wake()

    def run(self) -> None:
        s = self.s
        self._notify("on_start")
        from daisy_nb.hang import make_alarm, resolve_hang_alarm

        alarm = make_alarm(resolve_hang_alarm(self.hang), s, self.observer, self.running_blocks, self.trs)
        heartbeat = Heartbeat(self.observer, s, alarm)
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
        if alarm is not None:
            alarm.close()

    def running_blocks(self) -> list:
        """What runs now, per worker and Client connection (see ``daisy_nb.hang``)."""
        return self._running_worker_blocks() + self._running_client_blocks()

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
        """End every worker (block workers: SIGKILL; worker functions: SIGTERM, SIGKILL after a
        grace), close every ``Client`` connection at once (their programs end, see
        ``runtime.client``), unlink shared memory."""
        for w in list(self.workers.values()):
            if w.state != DEAD:
                w.expected_exit = True
                self._kill(w)
        for cc in list(self.clients.values()):  # before waiting: the jobs' clients learn the run ended now
            self._drop_client(cc)
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
            self._on_exit(w)
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
    template=None,
    hang_alarm=None,
):
    """Run every task of ``scheduler`` on worker processes; returns ``{task_id: TaskState}``.

    ``log_dir`` overrides ``daisy_nb.logging``'s basedir for this run. On SIGINT the
    workers are ended, tracking is flushed, the partial summary printed and
    ``KeyboardInterrupt`` raised with ``daisy_states``/``daisy_task_order``
    attached. Abandoned tasks do not raise here (see :func:`raise_if_abandoned`).
    ``host``: where ``Client`` connections are accepted (see ``_net.resolve_host``).
    ``template``: a worker template already started (``_zygote.start_early``); the
    pool forks its workers from it and closes it at the end. ``hang_alarm``: see
    :func:`daisy_nb.hang.resolve_hang_alarm`.
    """
    from daisy_nb.progress import resolve_observer

    saved_base = dlog.get_log_basedir()
    if log_dir is not None:
        dlog.set_log_basedir(log_dir)
    pool = _Pool(
        scheduler,
        resources,
        resolve_observer(progress, list(scheduler.task_ids)),
        batch_target_secs,
        host,
        template,
        hang_alarm,
    )
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
        return end_run(scheduler, pool.observer, pool.trs, pool.order, summary=summary, interrupted=interrupted)
    finally:
        if log_dir is not None:
            dlog.set_log_basedir(saved_base)
