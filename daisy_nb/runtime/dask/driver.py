"""Run a pipeline on a ``dask.distributed`` cluster (the driver shell): ``run_blockwise(pipeline, executor=client)``.

The decisions (which blocks go into which batch, what a result, a lost worker, a
timeout or an abandonment does) are :class:`.core.Submission`'s, without I/O; this
module is the shell that feeds it the cluster's events and executes its actions
(``client.submit``, cancellations, ``client.run``), with ``as_completed``, the run's
event topic (:mod:`.events`) and Ctrl-C. The worker side (what runs in dask
workers) is :mod:`.worker`.

The daisy_nb :class:`~daisy_nb.Scheduler` stays in the calling process (the
"driver") and owns all dependency state; dask only ever sees independent
**batches** of ready blocks, never the block graph.

* **Batches.** Each dask future runs :func:`_run_batch` on a batch of ready blocks
  of one task, shipped as one small int64 array (index, spatial id, read/write
  offsets and shapes); the worker rebuilds :class:`daisy_nb.Block` objects from it
  (workers import ``daisy_nb.block`` and this module, never numba or the
  scheduler). Per task the batch size starts at 1 and follows the measured
  per-block time so that a batch carries about ``batch_target_secs`` of work (x4
  growth per batch at most); blocks slower than that go one per future. A batch
  never takes more than its share of the ready blocks (``ready / slots``), so a
  narrow level of a conflict task is spread over the cluster.
* **Keeping the cluster busy.** ``futures_per_thread`` futures per dask worker
  thread are in flight (re-read when workers come or go); results are consumed
  with :class:`distributed.as_completed` and replaced at once.
* **Failures.** A block whose function raises (or sets ``block.status =
  FAILED``) is released as failed (retried up to ``max_retries``, then a
  permanent failure that orphans its dependents); the first traceback goes to the
  summary. Futures are submitted with ``retries=0`` and ``pure=False``.
* **Lost workers.** Every batch announces its start (worker address, pid) through
  the run's own dask event topic. A small scheduler plugin forwards the
  scheduler's worker events to that topic (:mod:`.events`); when a worker is removed unexpectedly
  (``remove-worker``, not ``expected``), the batches that *started* there are
  cancelled (so dask does not silently rerun them) and their blocks fail once and
  are retried; batches that were merely queued there are left to dask, which runs
  them elsewhere. A worker killed before its announcement left it (the worker
  sends it on its next flush, a few ms) leaves a batch the driver never saw start:
  dask runs it elsewhere as a queued one, its lost worker is not counted, and
  nothing is lost. A future that errors (``KilledWorker``, ``CancelledError``, a
  deserialization error on the worker) fails its blocks once too. Each lost worker
  counts as a worker failure of the task (``worker_failure_count``); after
  ``max_worker_restarts`` of them the task is abandoned, as with the local pool; one
  lost after finishing blocks of the task is a job end, not counted toward the cap
  (:func:`daisy_nb.runtime.common.failures.is_job_end`). Nothing waits on a lost worker: every ``client.run``
  goes through :class:`.events.WorkerCalls` (off the loop, never to a removed worker).
* **Timeouts.** A batch that has been running longer than ``timeout × its size``
  is cancelled and its blocks fail (``timeout_reclaim_count``, and a worker
  failure, as when the pool kills a worker). dask cannot stop a running Python
  thread: the batch stops at its next block boundary (the driver tells the
  worker with ``client.run``; the batch checks before every block), but a block that never returns keeps
  its worker thread busy until the worker is restarted. Until such a batch ends
  (it says so with an event; the driver also asks the worker every 0.5 s), a
  worker whose every thread is stuck gets no new batches (loose ``workers=``
  restrictions, ``allow_other_workers=True``) and batches queued there are taken
  back and resubmitted.
* **Per-worker setup.** ``Task(init_fn=...)``: ``init_fn()`` runs once per dask
  worker process per run (the first time a batch of the task runs there); the
  block function gets its return value with :func:`daisy_nb.worker_state`.

The worker side (what runs in dask workers) is :mod:`daisy_nb.runtime.dask.worker`.
* **Tracking, progress, Ctrl-C.** Successes are recorded in block tracking as they
  are released (flushed about once a second and at the end). On Ctrl-C the
  finished results are recorded, the other futures are cancelled and their blocks
  given back, tracking is flushed, the partial summary printed and
  ``KeyboardInterrupt`` raised.

Only public ``distributed`` APIs are used: ``submit``/``cancel``/``run``/
``scatter``/``processing``/``nthreads``, ``as_completed``, event topics
(``subscribe_topic``/``log_event``), ``register_plugin`` with a ``SchedulerPlugin``
and ``get_worker``.

Not supported on dask: 0-argument worker functions (``daisy_nb.Client`` loops)
and ``max_workers`` (the cluster's size is the parallelism). ``Task(requires=...)``
becomes dask resource restrictions (``client.submit(..., resources=...)``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import warnings
from collections import deque

from daisy_nb.progress import Heartbeat, notify
from daisy_nb.runtime.common.failures import raise_if_abandoned
from daisy_nb.runtime.common.run_block import cap_traceback, format_exception
from daisy_nb.runtime.common.run_end import end_run
from daisy_nb.runtime.dask.core import AskQueued, AskRunning, Cancel, DaskTaskRun, Stop, Submission, Submit
from daisy_nb.runtime.dask.events import RunTopic, WorkerCalls
from daisy_nb.runtime.dask.worker import _cancel_batches, _forget_run_async, _run_batch, _running_batches

__all__ = ["run_dask"]

logger = logging.getLogger("daisy")

MAX_BATCH = 4096  # blocks per future
POLL_SECS = 0.05
INLINE_PAYLOAD_BYTES = 1 << 20  # larger functions are scattered to the workers once
FORGET_WAIT_SECS = 2.0  # at the end of a run, for the calls to the workers still under way
STALL_SECS = 1.0  # nothing in flight, nothing ready, tasks not done: the run cannot go on


def batch_result(fut, result) -> dict | None:
    """The result of a batch's future as ``as_completed`` brought it: the batch's result dict, or
    None (the future erred or was cancelled). A dict is the batch's result whatever the future's
    status is by now: a worker killed just after it returned leaves the future "lost" (dask would
    compute it again), while the result, fetched before, is here: the batch's blocks ran.
    (Counting them failed counted a worker failure too: a task abandoned at
    ``max_worker_restarts=0``.)"""
    return result if isinstance(result, dict) else None


class _DaskRun:
    """The driver shell of one run: the cluster's events into :attr:`core`, its actions out."""

    def __init__(self, scheduler, client, observer, batch_target_secs, futures_per_thread, max_batch):
        from distributed import as_completed

        self.s = scheduler
        self.client = client
        self.observer = observer
        self.target = float(batch_target_secs)
        self.per_thread = futures_per_thread
        self.max_batch = max(1, int(max_batch))
        self.order = list(scheduler.task_ids)
        self.token = uuid.uuid4().hex
        self.topic = f"daisy_nb-{self.token}"
        self.trs: dict[str, DaskTaskRun] = {}
        self.core = Submission(scheduler, {}, target_secs=self.target, per_thread=1, max_batch=self.max_batch)
        self.futures: dict = {}  # bid -> future, exactly the core's batches
        self.by_key: dict = {}  # future key -> bid
        self.events: deque = deque()
        self.ac = as_completed(with_results=True, raise_errors=False)
        self.cond = self.ac.thread_condition
        self.hang = None  # run_blockwise's hang_alarm= (see daisy_nb.hang)
        self.workers_changed = True
        self.interrupted = False
        self.watch = RunTopic(client, self.topic, self._on_event)  # events.py
        self.timeline = None  # set by the dashboard's observer (attach_runtime): one bar per batch result
        self.calls = WorkerCalls(client)  # client.run off the loop, never to a removed worker
        self.logged: set = set()  # what went wrong once already (logged with its traceback then)

    # ------------------------------------------------------------------ setup
    def prepare(self, records: dict) -> None:
        """Check and serialize the tasks (``records``: a ``DaskTaskRun`` per task) that have blocks."""
        self.trs = _prepared(self.client, records, self.order)
        self.core = Submission(
            self.s, self.trs, target_secs=self.target, per_thread=self.per_thread, max_batch=self.max_batch
        )
        self._refresh_nthreads()
        needed = {k for tr in self.trs.values() for k in (tr.resources or {})}
        if needed:
            try:
                info = self.client.scheduler_info(n_workers=-1)
                have = {k for w in info.get("workers", {}).values() for k in (w.get("resources") or {})}
            except Exception:  # a failed check only loses the warning below
                self._log_once("read the dask workers' resources")
                have = needed
            if needed - have:
                logger.warning(
                    "tasks require dask worker resources %s that no current worker has: their blocks wait "
                    "until workers started with --resources join the cluster",
                    sorted(needed - have),
                )

    def _log_once(self, what: str) -> None:
        _log_once(self.logged, what)

    # -------------------------------------------------- event loop thread callbacks
    def _wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def _post(self, event) -> None:
        """An event for the loop, from another thread (a ``WorkerCalls`` answer)."""
        self.events.append(event)
        self._wake()

    def _on_event(self, event) -> None:
        msg = event[1]
        if not isinstance(msg, dict):
            return
        cluster = msg.get("cluster")
        if cluster is None:
            self.events.append(("start", time.monotonic(), msg))
        elif cluster.get("action") in ("add-worker", "remove-worker"):
            self.events.append((cluster["action"], time.monotonic(), cluster))
        else:
            return
        self._wake()

    # ------------------------------------------------------------ the core's actions
    def _execute(self, actions) -> None:
        for a in actions:
            if isinstance(a, Submit):
                self._submit(a)
            elif isinstance(a, Cancel):
                futs = [self.futures.pop(bid) for bid in a.bids]
                for f in futs:
                    self.by_key.pop(f.key, None)
                try:
                    self.client.cancel(futs)
                except Exception:  # a closing client: the run is ending anyway
                    self._log_once("cancel dask futures")
            elif isinstance(a, Stop):  # it runs: tell its worker, it stops at the next block (off the loop)
                self.calls.run(_cancel_batches, self.token, list(a.bids), workers=[a.worker] if a.worker else None)
            elif isinstance(a, AskRunning):
                asked = list(a.workers)
                if not self.calls.run(
                    _running_batches,
                    self.token,
                    workers=asked,
                    done=lambda r, asked=asked: self._post(("running", 0.0, (asked, r))),
                ):
                    self.core.running(asked, None)  # every one of them was removed meanwhile
            elif isinstance(a, AskQueued):
                try:
                    proc = self.client.processing(workers=list(a.workers))
                except Exception:
                    self._log_once("ask the dask scheduler which futures are queued")
                    continue
                bids = [self.by_key[k] for keys in proc.values() for k in keys if k in self.by_key]
                self._execute(self.core.queued(bids))
            else:
                raise TypeError(f"daisy_nb: unknown action of the dask core: {a!r}")

    def _submit(self, a: Submit) -> None:
        tr = self.trs[a.tid]
        placement = {"workers": a.workers, "allow_other_workers": True} if a.workers else {}
        fut = self.client.submit(
            _run_batch,
            self.token,
            self.topic,
            a.bid,
            a.tid,
            tr.payload_arg,
            a.packed,
            tr.ndim,
            key=f"daisy_nb-{a.tid}-{self.token[:8]}-{a.bid}",
            pure=False,
            retries=0,
            resources=tr.resources,
            **placement,
        )
        self.futures[a.bid] = fut
        self.by_key[fut.key] = a.bid
        self.ac.add(fut)

    def _refresh_nthreads(self) -> None:
        self.workers_changed = False
        try:
            self.core.set_workers(self.client.nthreads())
        except Exception:  # keep the last known workers; the next change asks again
            self._log_once("read the dask workers' threads")

    # ----------------------------------------------------------------- results
    def _on_result(self, fut, result) -> None:
        bid = self.by_key.pop(fut.key, None)
        if bid is None:
            return  # already accounted for (timeout, lost worker, abandonment)
        del self.futures[bid]
        b = self.core.batches[bid]
        if batch_result(fut, result) is not None:
            self._execute(self.core.finished(bid, result))
            if self.timeline is not None and result.get("worker") and not result.get("init_error"):
                status = result["status"]
                self._timeline_bar(b, result, status.count(2) + status.count(3), status.count(3))
            return
        # the future erred or was cancelled behind our back: its blocks fail once
        exc = result[1] if isinstance(result, tuple) and len(result) == 3 else result
        name = type(exc).__name__ if isinstance(exc, BaseException) else str(fut.status)
        if isinstance(exc, BaseException):
            detail = cap_traceback(format_exception(exc)) if exc.__traceback__ is not None else f"{name}: {exc}"
        else:
            detail = repr(exc)
        self.core.erred(bid, name, detail)
        _rescatter(self.client, self.trs[b.tid], self._log_once)

    def _timeline_bar(self, b, result, ran: int, failed: int) -> None:
        t1 = time.monotonic()
        key = ("d", result["worker"])
        if key not in self.timeline.rows:
            self.timeline.worker(key, b.tid, "dask", f"dask {result['worker']}", b.pid, None, b.t_start)
        self.timeline.bar(key, b.tid, t1 - result.get("elapsed_ns", 0) / 1e9, t1, ran, failed)

    # ------------------------------------------------------------------ events
    def _drain_events(self) -> None:
        core = self.core
        while self.events:
            kind, t, msg = self.events.popleft()
            if kind == "start":
                if msg.get("end"):
                    core.batch_ended(msg.get("bid"), msg.get("worker"))
                else:
                    core.started(msg.get("bid"), msg.get("worker"), msg.get("pid"), t)
            elif kind == "running":  # the answer to an AskRunning
                core.running(*msg)
            elif kind == "add-worker":
                self.workers_changed = True
                self.calls.added(msg.get("worker"))
                core.worker_added(msg.get("worker"))
            elif kind == "remove-worker":
                self.workers_changed = True
                self.calls.removed(msg.get("worker"))  # nothing is ever sent to it again
                if self.timeline is not None:
                    self.timeline.ended(("d", msg.get("worker")), lost=not msg.get("expected"))
                self._execute(core.worker_removed(msg.get("worker"), expected=bool(msg.get("expected"))))
            else:
                raise ValueError(f"daisy_nb: unknown dask driver event {kind!r}")

    # -------------------------------------------------------------------- loop
    def run(self) -> None:
        s = self.s
        notify(self.observer, "on_start", s)
        from daisy_nb.hang import make_alarm, resolve_hang_alarm

        alarm = make_alarm(resolve_hang_alarm(self.hang), s, self.observer, self.running_blocks, self.trs)
        heartbeat = Heartbeat(self.observer, s, alarm)
        idle_since = None
        while True:
            if self.interrupted:
                raise KeyboardInterrupt("run aborted by SIGINT")
            if self.client.status in ("closing", "closed"):
                raise RuntimeError("daisy_nb: the dask client was closed during the run")
            self._consume()
            self._drain_events()
            if self.workers_changed:
                self._refresh_nthreads()
            now = time.monotonic()
            self._execute(self.core.tick(now))
            if s.is_done():
                break
            retry_at = s.wake_retries(now)  # failed blocks whose retry time came are ready now (retry_backoff)
            self._execute(self.core.submit(now))
            if self.core.batches or retry_at is not None or any(s.ready_count(t) for t in self.trs):
                idle_since = None
            else:
                idle_since = idle_since or now
                if now - idle_since > STALL_SECS:
                    raise RuntimeError("daisy_nb: the run stalled (nothing in flight, no ready blocks, tasks not done)")
            heartbeat(now)
            with self.cond:
                if self.ac.queue.empty() and not self.events and not self.interrupted:
                    wait = POLL_SECS if retry_at is None else min(POLL_SECS, max(0.0, retry_at - time.monotonic()))
                    self.cond.wait(wait)
        notify(self.observer, "on_progress", s)
        if alarm is not None:
            alarm.close()

    def running_blocks(self) -> list:
        """Batches a dask worker has started, for the hang alarm (from its thread)."""
        return self.core.running_blocks()

    def _consume(self) -> None:
        for fut, result in self.ac.next_batch(block=False):
            self._on_result(fut, result)
        self._execute(self.core.end_pass())

    def shutdown(self, aborting: bool) -> None:
        """Record finished results, cancel the rest (blocks given back), clean up."""
        if aborting:
            try:
                self._consume()
            except Exception:  # Ctrl-C or an error ends the run: what cannot be read is given back below
                self._log_once("read the last results")
        self._execute(self.core.shutdown())
        self.watch.unsubscribe()
        if self.core.next_bid:
            self.calls.run(_forget_run_async, self.token, wait=False)
        self.calls.wait(FORGET_WAIT_SECS)  # a worker lost just now must not hold up the end of the run
        for tr in self.trs.values():
            if tr.payload_arg is not tr.payload:
                try:
                    tr.payload_arg.release()
                except Exception:  # the client is closing: the scheduler drops it with the client
                    self._log_once("release a scattered process_function")

    def _on_sigint(self, signum, frame):
        if self.interrupted:  # a second Ctrl-C: the driver may be stuck talking to the cluster
            raise KeyboardInterrupt("run aborted by SIGINT")
        self.interrupted = True


def _log_once(logged: set, what: str) -> None:
    """An unexpected error of a call to the cluster (the run goes on): WARNING with its
    traceback the first time for ``what`` (``logged``: what was), DEBUG afterwards. Call from an ``except``."""
    first = what not in logged
    logged.add(what)
    logger.log(logging.WARNING if first else logging.DEBUG, "daisy_nb could not %s", what, exc_info=True)


def _rescatter(client, tr: DaskTaskRun, log_once) -> None:
    """A scattered function lost with its workers is scattered again; ``log_once(what)`` if that fails."""
    if tr.payload_arg is tr.payload or getattr(tr.payload_arg, "status", "finished") == "finished":
        return
    try:
        tr.payload_arg = client.scatter(tr.payload, broadcast=True, hash=False)
    except Exception:  # its batches keep failing until a scatter works: say why once
        log_once(f"scatter the process_function of task {tr.tid!r} again")


def _prepared(client, records: dict, order) -> dict:
    """The run records of the tasks that have blocks, checked, their functions serialized
    (large ones scattered to every worker once)."""
    trs = {}
    for tid in order:
        tr = records[tid]
        if tr.task.layout.num_blocks == 0:
            continue
        if tr.fn is None:
            raise RuntimeError(
                f'invalid configuration: task "{tid}" has no process_function; distributed runs need one'
            )
        if tr.arity != 1:
            raise ValueError(
                f"invalid configuration: task {tid!r} has a 0-argument worker function (a daisy_nb.Client "
                "loop). run_blockwise(executor=dask_client) runs 1-argument block functions only: write "
                "process_function(block) (use Task(init_fn=...) and daisy_nb.dask.worker_state() for "
                "per-worker setup), or run this task with the local pool (no executor)."
            )
        tr.payload_arg = tr.serialize()
        trs[tid] = tr
    for tr in trs.values():
        if len(tr.payload) > INLINE_PAYLOAD_BYTES:
            logger.warning(
                "task %r: the pickled process_function is %.1f MB; it is scattered to every dask worker. "
                "Load large objects in Task(init_fn=...) instead.",
                tr.tid,
                len(tr.payload) / 1e6,
            )
            tr.payload_arg = client.scatter(tr.payload, broadcast=True, hash=False)
    return trs


def _as_client(executor):
    """``(client, owned)`` from a Client, a Cluster object or a scheduler address."""
    from distributed import Client

    if isinstance(executor, Client):
        return executor, False
    if isinstance(executor, str) or hasattr(executor, "scheduler_address"):
        return Client(executor), True
    raise TypeError(
        "executor must be a dask.distributed.Client, a dask Cluster or a scheduler address, "
        f"got {type(executor).__name__}"
    )


def run_dask(
    scheduler,
    client,
    *,
    progress=True,
    summary=True,
    batch_target_secs: float = 0.1,
    futures_per_thread: int = 2,
    max_batch: int = MAX_BATCH,
    hang_alarm=None,
):
    """Run every task of ``scheduler`` on a dask cluster; returns ``{task_id: TaskState}``.

    ``client`` is a ``distributed.Client`` (or a Cluster object / scheduler address:
    a Client is opened and closed here). ``batch_target_secs`` is the work per
    future, ``futures_per_thread`` the futures in flight per dask worker thread.
    On SIGINT the futures are cancelled, tracking is flushed, the partial summary
    printed and ``KeyboardInterrupt`` raised with ``daisy_states``/``daisy_task_order``
    attached. A task abandoned after ``max_worker_restarts`` lost workers raises
    :class:`~daisy_nb.runtime.common.failures.TaskAbandonedError` (a ``RuntimeError``), like the local pool.
    """
    records = {tid: DaskTaskRun(scheduler.tasks[tid]) for tid in scheduler.task_ids}
    tracked = [tid for tid, tr in records.items() if tr.track]
    if tracked:
        warnings.warn(
            f"resource_tracking=True is not measured under executor= (dask): tasks {tracked} get no "
            "per-block stats and no Resource Utilization panel; the worker pool and the serial runner "
            "measure them",
            UserWarning,
            stacklevel=3,
        )
    try:
        import distributed  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("run_blockwise(executor=...) needs dask.distributed: pip install 'daisy_nb[dask]'") from e
    from daisy_nb.progress import resolve_observer

    client, owned = _as_client(client)
    run = _DaskRun(
        scheduler,
        client,
        resolve_observer(progress, list(scheduler.task_ids)),
        batch_target_secs,
        futures_per_thread,
        max_batch,
    )
    run.hang = hang_alarm
    if hasattr(run.observer, "attach_runtime"):  # the dashboard's timeline (its worker table is the pool's only)
        run.observer.attach_runtime(run)
    in_main = threading.current_thread() is threading.main_thread()
    old_handler = None
    interrupted = False
    import signal

    try:
        try:
            run.prepare(records)
            run.watch.subscribe()
            if in_main:
                old_handler = signal.signal(signal.SIGINT, run._on_sigint)
            run.run()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if in_main and old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
            try:
                run.shutdown(aborting=True)
            finally:
                scheduler.flush_tracking()
        states = end_run(scheduler, run.observer, run.trs, run.order, summary=summary, interrupted=interrupted)
        run_dask.last_timing = {"futures": run.core.next_bid}
        raise_if_abandoned(states, run.order, "dask workers")
        return states
    finally:
        if owned:
            client.close()


run_dask.last_timing = {}
