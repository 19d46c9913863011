"""The worker pool: runs a :class:`daisy_nb.Scheduler` on worker processes.

Design (numbers in ``benchmarks/bench_runtime.py``):

* **Parts, each the one owner of its state.** The worker processes (spawned from a
  worker template or exec'd, fed batches through shared memory, exits and timeouts) are
  :class:`.processes.Processes`, a shell around the block workers' decision core
  (:class:`.blocks.BlockCore`: batches, prefetch, parking, timeouts, exits, tested
  without processes); 0-argument worker functions' jobs and daisy 2.0.0's diagnoses are
  :class:`.functions.Functions`; the ``daisy_nb.Client`` connections are
  :class:`daisy_nb.runtime.net.server.Clients`, which asks and tells ``Functions`` about the
  worker function a connection belongs to (its ``Jobs`` protocol) and is asked
  ``has_client``. What a task asks for (its run record, batch sizing, function
  serialisation) is :mod:`daisy_nb.runtime.common` and :mod:`.pool_parts`. The listener
  and what connecting workers are told (address, secret, timeouts: ``DAISY_CONTEXT``) are
  :class:`.listening.Listening`'s. This module owns the run records, the dispatch across
  tasks (which task gets a worker, abandonment), the main loop, and ``run_pool``. The dashboard and the
  hang alarm read :meth:`_Pool.worker_snapshots` and :meth:`_Pool.running_blocks` (on the
  runtime's thread) and set ``timeline``.
* **Starting workers.** Up to ``max_workers`` per task, within the ``resources``
  budget, only while the task has more ready blocks than its idle workers can take;
  at most ``SPAWN_BURST`` start per loop turn (their forks asked of the template together:
  :meth:`.starter.Starter.start_many`), so the first ones get work while the rest are
  forked. A parked worker of another task gives its budget up to a task
  with ready work. After ``max_worker_restarts`` replaced crashes and no worker
  left, the task is abandoned (a worker function's job ends do not count: :mod:`.exits`).
* **Failure detection.** The main loop waits (one ``epoll`` set for the run) on
  every worker's socket, a pidfd per worker process (its "sentinel": readable when
  it exits), every ``Client`` connection and a wake-up pipe (SIGINT, new client
  connections) with a 0.1 s timeout, shorter when a failed block's retry is due sooner
  (``Task(retry_backoff=...)``: the Scheduler holds such a block as pending until then). The connections that are readable together are
  handed to :class:`.clients.Clients` in one pass; the scans over every worker and
  connection (block timeouts, heartbeats, exits without a pidfd, progress) run at
  most every ``CHECK_SECS``, so a turn of the loop costs the same with 2,000
  connections as with 2.
* **0-argument worker functions** run their own ``daisy_nb.Client`` loop over TCP
  (:mod:`daisy_nb.runtime.net.transport`: a listener on ``host``, by default on every interface with an
  address detected as daisy 2.0.0 does, started only when such a task exists, and only
  then is the TCP server loaded: until it is, :class:`.no_clients.NoClients` stands in;
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
import signal
import threading
import time
from typing import TYPE_CHECKING

from daisy_nb import logging as dlog
from daisy_nb.progress import ABANDON_RESTARTS, Heartbeat, notify, raise_if_abandoned
from daisy_nb.runtime.common.failures import abandon
from daisy_nb.runtime.common.run_end import end_run
from daisy_nb.runtime.local.budget import TaskNeed, plan_spawns
from daisy_nb.runtime.local.functions import Functions
from daisy_nb.runtime.local.listening import Listening
from daisy_nb.runtime.local.no_clients import NoClients
from daisy_nb.runtime.local.pool_parts import PoolTaskRun, Waitables
from daisy_nb.runtime.local.processes import Processes
from daisy_nb.runtime.snapshot import RunningBlock, WorkerSnapshot

if TYPE_CHECKING:
    from daisy_nb.runtime.net.server import Clients

__all__ = ["raise_if_abandoned", "run_pool"]

logger = logging.getLogger("daisy")

POLL_SECS = 0.1  # main loop wake-up: timeouts, Ctrl-C, progress
CHECK_SECS = 0.02  # timeouts, heartbeats, exits without a pidfd, progress: at most this often
SPAWN_BURST = 4  # workers started per main-loop turn (the loop serves the ready ones in between)
SHUTDOWN_GRACE_SECS = 2.0  # after "quit", before SIGKILL
WORKER_FUNCTION_GRACE_SECS = 10.0  # a worker function may clean up after its loop


def _wait_limit(more_spawns: bool, retry_at: float | None, procs=None) -> float:
    """How long the loop may wait for its descriptors: not at all while workers are still to be
    started, else ``POLL_SECS``, or less when a held retry (``Task(retry_backoff=...)``) is due sooner,
    or ``CHECK_SECS`` while parked workers wait for a straggler's backup copy (``procs``' backups:
    :meth:`.backups.PoolBackups.copies_due`), or less when the block core asks for a look sooner
    (``look_again_ns``: a straggler's cut batch to confirm, its blocks given back and its backup
    copy sent a few ms after the cut; at a speculative task's tail, the moment a block in flight
    reaches the backup limit)."""
    if more_spawns:
        return 0.0
    limit = CHECK_SECS if procs is not None and procs.blocks.core.backups.copies_due() else POLL_SECS
    again = None if procs is None else procs.blocks.core.look_again_ns
    if again is not None:
        retry_at = again / 1e9 if retry_at is None else min(retry_at, again / 1e9)
    return limit if retry_at is None else min(limit, max(0.0, retry_at - time.monotonic()))


def _next_scan(now: float, procs) -> float:
    """When the scans after the one at ``now`` are due: ``CHECK_SECS`` on, or sooner when the block
    core asks for a look then (``look_again_ns``: a cut to confirm, :mod:`.giveback`; a copy due at
    a speculative task's tail, :mod:`.backups`)."""
    again = procs.blocks.core.look_again_ns
    return now + CHECK_SECS if again is None else min(now + CHECK_SECS, again / 1e9)


class _Pool:
    """The main loop over the parts (see the module docstring); owns the run records and the
    dispatch across tasks."""

    def __init__(self, scheduler, resources, observer, batch_target_secs, host=None, template=None, hang_alarm=None):
        self.s = scheduler
        self.hang = hang_alarm  # run_blockwise's hang_alarm= (see daisy_nb.hang)
        self.order = list(scheduler.task_ids)
        self.budget = {k: int(v) for k, v in (resources or {}).items()}
        self.observer = observer
        self.trs: dict[str, PoolTaskRun] = {}
        self.interrupted = False
        self.listening = Listening(host, self._wake)  # the listener, the secret, what workers are told
        self.net = self.listening.net
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.aborting = False
        self.more_spawns = False  # _spawn_pass stopped at SPAWN_BURST with more workers to start
        self.waitables = Waitables(self.wake_r)
        self.functions = Functions(scheduler, self.trs, self.net)  # worker functions' jobs and diagnoses
        self.procs = Processes(
            scheduler,
            self.trs,
            self.waitables,
            self.functions,
            budget=self.budget,
            batch_target_secs=batch_target_secs,
            context=self.listening.context,
            observer=observer,
            template=template,  # started early by run._execute, else by the first spawn
        )
        self.tcp: Clients | NoClients = NoClients()  # the TCP server once listening (_start_listener)
        self.functions.attach(self.procs, self.tcp)
        self._timeline = None

    @property
    def authkey(self) -> bytes:
        """The run's secret (every Client connection authenticates with it)."""
        return self.listening.authkey

    @property
    def port(self) -> int:
        """Where Client connections are accepted (0: not listening)."""
        return self.listening.port

    @property
    def listener(self):
        """The TCP listener (a ``net.transport.Listener``), None until a task's worker function needs it."""
        return self.listening.listener

    # ------------------------------------------------ what the dashboard reads (dashboard/live.py)
    @property
    def workers(self) -> dict:
        """The worker processes (read-only; on the runtime's thread)."""
        return self.procs.roster.workers

    @property
    def clients(self) -> dict:
        """The Client connections (read-only; on the runtime's thread)."""
        return self.tcp.clients

    @property
    def timeline(self):
        return self._timeline

    @timeline.setter
    def timeline(self, timeline) -> None:
        """Set by the dashboard's observer (``attach_runtime``): the parts report batches to it."""
        self._timeline = timeline
        self.procs.attach_timeline(timeline)
        self.tcp.attach_timeline(timeline)

    def abort(self) -> None:
        """The run is being aborted (Ctrl-C, an error): blocks cut short are given back, not failed."""
        self.aborting = True
        self.procs.abort()
        self.tcp.abort()

    # ------------------------------------------------------------------ setup
    def prepare(self):
        for tid in self.order:
            task = self.s.tasks[tid]
            if task.process_function is None:
                raise RuntimeError(
                    f'invalid configuration: task "{tid}" has no process_function; distributed runs need one '
                    "(daisy 2.0 would wait forever)"
                )
            tr = PoolTaskRun(task)
            tr.serialize()  # with init_fn (daisy_nb extension: once per block-function worker)
            for k, v in tr.requires.items():
                if v > self.budget.get(k, 0):
                    raise ValueError(
                        f'task "{tid}" requires {{{k}: {v}}} but the global budget only has '
                        f"{{{k}: {self.budget.get(k, 0)}}}"
                    )
            self.trs[tid] = tr
        self.procs.prepare()
        if any(tr.arity == 0 for tr in self.trs.values()):
            self._start_listener()
        else:
            self.listening.check_host()

    def _start_listener(self):
        from daisy_nb.runtime.net.server import Clients  # only a run that listens loads the TCP server

        where = self.listening.start()
        self.tcp = Clients(self.s, self.trs, self.waitables, self.functions, self._abandon, net=self.net)
        self.tcp.listening(where)
        if self._timeline is not None:  # the dashboard attaches it before the run is prepared
            self.tcp.attach_timeline(self._timeline)
        self.functions.attach(self.procs, self.tcp)
        self.functions.listening(where)

    def _wake(self):
        fd = self.wake_w
        if fd is None:
            return
        try:
            os.write(fd, b"x")
        except OSError:
            pass

    # ------------------------------------------------------------------- loop
    def _spawn_pass(self) -> None:
        """Start the workers the ready blocks call for (:func:`.budget.plan_spawns`), at most
        ``SPAWN_BURST`` per loop turn: the workers started first get their batches while the rest
        are forked (``more_spawns``)."""
        s, procs = self.s, self.procs
        now = time.monotonic()
        needs = []
        for tid in self.order:
            tr = self.trs[tid]
            closed = (
                s.is_abandoned(tid)
                or s.is_task_done(tid)
                or tr.restarts.cap_reached(s.counters[tid])
                or (tr.no_spawn_before > 0 and now < tr.no_spawn_before)
            )
            if closed:
                needs.append(TaskNeed(tid, 0, 0, 0, 0, closed=True))
                continue
            # alive and waiting are scans over the task's workers, at every turn of the loop: skipped
            # where plan_spawns starts nothing anyway (no ready block, or max_workers alive)
            ready = s.ready_count(tid)
            alive = procs.alive(tr) if ready else 0
            if not ready or alive >= tr.max_workers:
                waiting = 0
            elif tr.arity:
                waiting = procs.waiting(tr)
            else:  # jobs not connected yet, idle clients
                waiting = self.functions.waiting(tr)
            needs.append(TaskNeed(tid, ready, alive, waiting, tr.max_workers, tr.requires))
        plan = plan_spawns(needs, procs.roster.budget, SPAWN_BURST)
        for tid in plan.free_for:
            procs.free_parked_for(self.trs[tid])
        # the plan may start several of a task's workers in one pass: each replacement of a crash
        # is one of the cap's, so the cap is asked again before each (as daisy starts them)
        procs.spawn_many([self.trs[tid] for tid in plan.start])
        self.more_spawns = plan.more

    def _check_abandon(self) -> None:
        for tid in self.order:
            tr = self.trs[tid]
            if self.s.is_abandoned(tid) or self.s.is_task_done(tid) or self.procs.has_workers(tr):
                continue
            if tr.restarts.cap_reached(self.s.counters[tid]):
                self._abandon(tid, ABANDON_RESTARTS)

    def _abandon(self, tid: str, reason: str) -> None:
        """Abandon ``tid`` and its downstream tasks: their workers and clients are ended."""
        for a in abandon(self.s, tid, reason):
            atr = self.trs[a]
            self.procs.end_task(atr)
            self.tcp.drop_task(atr)

    def _check_timeouts(self) -> None:
        now = time.monotonic_ns()
        self.procs.check_timeouts(now)  # block timeouts; worker functions past their SIGTERM grace
        self.tcp.check_timeouts(now)  # a Client's block timeout ends its worker function
        if self.listening.listener is not None:
            self.functions.check_unconnected(now / 1e9)  # a task none of whose jobs connect

    def _notify(self, what: str) -> None:
        notify(self.observer, what, self.s)

    def _on_sigint(self, signum, frame):
        self.interrupted = True
        self._wake()

    def run(self) -> None:
        s = self.s
        procs, tcp = self.procs, self.tcp
        self._notify("on_start")
        from daisy_nb.hang import make_alarm, resolve_hang_alarm

        alarm = make_alarm(resolve_hang_alarm(self.hang), s, self.observer, self.running_blocks, self.trs)
        heartbeat = Heartbeat(self.observer, s, alarm)
        stalled = 0
        draining_since = None
        next_checks = 0.0
        while True:
            if self.interrupted:
                tcp.drain()  # the releases already readable are recorded; nothing more is handed out
                raise KeyboardInterrupt("run aborted by SIGINT")
            for conn in self.listening.accepted():
                tcp.add(conn)
            retry_at = s.wake_retries()  # failed blocks whose retry time came are ready now (retry_backoff)
            done = s.is_done()
            if not done:
                procs.dispatch_parked()
                tcp.serve_parked()
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
                procs.drain(now - draining_since, SHUTDOWN_GRACE_SECS, WORKER_FUNCTION_GRACE_SECS)
                tcp.serve_parked()
                if not procs.count():
                    break
            elif not procs.count() and not tcp.holding() and retry_at is None:
                if not any(s.ready_count(t) for t in self.order):
                    stalled += 1
                    if stalled > 20:
                        raise RuntimeError("daisy_nb: the run stalled (no workers, no ready blocks, tasks not done)")
            else:
                stalled = 0
            readable = []
            for obj in self.waitables.wait(tcp.wait_timeout(_wait_limit(self.more_spawns, retry_at, procs))):
                if obj == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                entry = self.waitables.get(obj)
                if entry is None:
                    continue
                kind, x = entry
                if kind == "w":
                    procs.on_readable(x, obj)
                elif kind == "pidfd":
                    procs.on_exit(x)
                else:
                    readable.append(x)
            if readable or tcp.quiet_over():  # every readable connection in one pass (one scheduler call per task)
                tcp.on_readable(readable, quiet=not procs.roster.block_workers)  # may leave them unread a while
            now = time.monotonic()
            if now >= next_checks:  # the scans over every worker and connection, a few times a second
                procs.poll_exits()
                self._check_timeouts()
                tcp.check_heartbeats()
                heartbeat(now)
                next_checks = _next_scan(now, procs)
        if alarm is not None:
            alarm.close()

    def running_blocks(self) -> list[RunningBlock]:
        """What runs now, per worker and Client connection (see ``daisy_nb.hang``)."""
        return [RunningBlock.of(e) for e in self.procs.running_blocks() + self.tcp.running_blocks()]

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every worker process now, as the dashboard lists them (``runtime/snapshot.py``): the block
        a worker function's job holds over TCP stands for its row; on the runtime's thread."""
        held = {cc.wid: next(iter(cc.held)) for cc in list(self.tcp.clients.values()) if cc.held}
        return [
            WorkerSnapshot(
                v.wid,
                v.task,
                v.state,
                v.pid,
                v.row if v.row is not None else held.get(v.wid),
                v.since,
                v.t_spawn,
                v.job,
            )  # fmt: skip
            for v in self.procs.snapshot()
        ]

    def shutdown(self) -> None:
        """End every worker (block workers: SIGKILL; worker functions: SIGTERM, SIGKILL after a
        grace), close every ``Client`` connection at once (their programs end, see
        ``runtime.client``), unlink shared memory."""
        self.procs.kill_all()
        self.tcp.close_all()  # before waiting: the jobs' clients learn the run ended now
        self.procs.reap_all()
        self.listening.close()
        self.waitables.close()
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
    ``host``: where ``Client`` connections are accepted (see ``address.resolve_host``).
    ``template``: a worker template already started (``_zygote.start_early``); the
    pool forks its workers from it and closes it at the end. ``hang_alarm``: see
    :func:`daisy_nb.hang.resolve_hang_alarm`.
    """
    from daisy_nb.progress import resolve_observer

    saved_base = dlog.LOG_BASEDIR  # as set, so that an unset one stays unset (DAISY_NB_LOG_DIR)
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
            interrupted = True
            pool.abort()
        except BaseException:
            pool.abort()
            raise
        finally:
            pool.shutdown()
            scheduler.flush_tracking()
            if in_main and old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
        return end_run(scheduler, pool.observer, pool.trs, pool.order, summary=summary, interrupted=interrupted)
    finally:
        if log_dir is not None:
            dlog.LOG_BASEDIR = saved_base
