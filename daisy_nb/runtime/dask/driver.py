"""Run a pipeline on a ``dask.distributed`` cluster (the driver side): ``run_blockwise(pipeline, executor=client)``.

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
  them elsewhere. A future that errors (``KilledWorker``, ``CancelledError``, a
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
from daisy_nb.runtime.common.batching import grow_batch
from daisy_nb.runtime.common.failures import (
    JOB_END,
    AbandonReason,
    abandon,
    is_job_end,
    raise_if_abandoned,
    record_error,
    worker_failure,
)
from daisy_nb.runtime.common.run_block import cap_traceback, format_exception
from daisy_nb.runtime.common.run_end import end_run
from daisy_nb.runtime.common.taskrun import TaskRun
from daisy_nb.runtime.dask.events import RunTopic, WorkerCalls
from daisy_nb.runtime.dask.worker import _cancel_batches, _forget_run_async, _run_batch, _running_batches

__all__ = ["run_dask"]

logger = logging.getLogger("daisy")

MAX_BATCH = 4096  # blocks per future
POLL_SECS = 0.05
INLINE_PAYLOAD_BYTES = 1 << 20  # larger functions are scattered to the workers once
FORGET_WAIT_SECS = 2.0  # at the end of a run, for the calls to the workers still under way


class _Batch:
    __slots__ = ("bid", "tid", "future", "index", "n", "t_start", "worker", "pid")

    def __init__(self, bid, tid, future, index):
        self.bid = bid
        self.tid = tid
        self.future = future
        self.index = index
        self.n = len(index)
        self.t_start = None
        self.worker = None
        self.pid = None


class _TaskRun(TaskRun):
    """dask's run record of a task: the shared one, plus the function as the workers get it."""

    measures_resources = False  # dask workers report no per-block stats

    def __init__(self, task):
        super().__init__(task)
        self.payload_arg = None  # the payload bytes, or a scattered future for large functions
        self.resources = {k: v for k, v in self.requires.items() if v} or None  # dask resource restrictions
        self.workers_seen: set = set()
        self.finished_on: dict = {}  # dask worker address -> blocks of this task it finished (job ends)


class _DaskRun:
    def __init__(self, scheduler, client, observer, batch_target_secs, futures_per_thread, max_batch):
        from distributed import as_completed

        self.s = scheduler
        self.client = client
        self.observer = observer
        self.target = float(batch_target_secs)
        self.per_thread = max(1, int(futures_per_thread))
        self.max_batch = max(1, int(max_batch))
        self.order = list(scheduler.task_ids)
        self.token = uuid.uuid4().hex
        self.topic = f"daisy_nb-{self.token}"
        self.trs: dict[str, _TaskRun] = {}
        self.inflight: dict[int, _Batch] = {}
        self.by_key: dict = {}  # future key -> bid
        self.next_bid = 0
        self.rr = 0  # round-robin start over tasks
        self.events: deque = deque()
        self.ac = as_completed(with_results=True, raise_errors=False)
        self.cond = self.ac.thread_condition
        self.nthreads = 0
        self.hang = None  # run_blockwise's hang_alarm= (see daisy_nb.hang)
        self.worker_threads: dict = {}  # address -> threads
        self.zombies: dict = {}  # address -> {bid: key} of cancelled batches still running there
        self.last_pullback = 0.0
        self.pass_failures: dict = {}  # task id -> error text of futures that erred in this pass
        self.workers_changed = True
        self.interrupted = False
        self.watch = RunTopic(client, self.topic, self._on_event)  # events.py
        self.timeline = None  # set by the dashboard's observer (attach_runtime): one bar per batch result
        self.calls = WorkerCalls(client)  # client.run off the loop, never to a removed worker
        self.asking = False  # a _running_batches call is under way

    # ------------------------------------------------------------------ setup
    def prepare(self, records: dict) -> None:
        """Check and serialize the tasks (``records``: a ``_TaskRun`` per task) that have blocks."""
        for tid in self.order:
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
            self.trs[tid] = tr
        for tr in self.trs.values():
            if len(tr.payload) > INLINE_PAYLOAD_BYTES:
                logger.warning(
                    "task %r: the pickled process_function is %.1f MB; it is scattered to every dask worker. "
                    "Load large objects in Task(init_fn=...) instead.",
                    tr.tid,
                    len(tr.payload) / 1e6,
                )
                tr.payload_arg = self.client.scatter(tr.payload, broadcast=True, hash=False)
        self._refresh_nthreads()
        needed = {k for tr in self.trs.values() for k in (tr.resources or {})}
        if needed:
            try:
                info = self.client.scheduler_info(n_workers=-1)
                have = {k for w in info.get("workers", {}).values() for k in (w.get("resources") or {})}
            except Exception:
                have = needed
            missing = needed - have
            if missing:
                logger.warning(
                    "tasks require dask worker resources %s that no current worker has: their blocks wait "
                    "until workers started with --resources join the cluster",
                    sorted(missing),
                )

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

    # ---------------------------------------------------------------- helpers
    def _refresh_nthreads(self) -> None:
        self.workers_changed = False
        try:
            self.worker_threads = {k: int(v) for k, v in self.client.nthreads().items()}
            self.nthreads = sum(self.worker_threads.values())
        except Exception:
            pass

    def _slots(self) -> int:
        busy = sum(min(len(z), self.worker_threads.get(a, 0)) for a, z in self.zombies.items())
        return max(1, self.nthreads - busy) * self.per_thread

    def _tainted(self) -> list:
        """Workers whose every thread still runs a batch we cancelled (a hung block)."""
        return [a for a, z in self.zombies.items() if z and len(z) >= self.worker_threads.get(a, 1)]

    def _pull_back(self, now: float) -> None:
        """Batches queued on a worker whose threads are all stuck: take them back."""
        if not self.zombies or now - self.last_pullback < 0.5:
            return
        self.last_pullback = now
        if not self.asking:  # which cancelled batches still run (one may have ended just before its cancel)
            asked = list(self.zombies)
            self.asking = self.calls.run(
                _running_batches, self.token, workers=asked, done=lambda r: self._post(("running", now, (asked, r)))
            )
        tainted = self._tainted()
        if not tainted:
            return
        try:
            proc = self.client.processing(workers=tainted)
        except Exception:
            return
        for keys in proc.values():
            for key in keys:
                bid = self.by_key.get(key)
                b = self.inflight.get(bid) if bid is not None else None
                if b is not None and b.t_start is None:
                    self._drop(b, cancel=True)
                    self._release(b, 0)  # never started: given back uncounted

    def _notify(self, what: str) -> None:
        notify(self.observer, what, self.s)

    def _worker_failure(self, tid: str, text: str, job_end: bool = False) -> None:
        """A batch lost to its worker (death, timeout, init_fn): the pool's dirty exit; a ``job_end``
        (lost after finishing blocks, :func:`.failures.is_job_end`) is not counted toward the cap."""
        c = self.s.counters[tid]
        worker_failure(c, tid, text, job_end=job_end)
        tr = self.trs[tid]
        if self.s.is_abandoned(tid) or job_end:
            return
        if tr.restarts_exhausted(c):
            for a in abandon(self.s, tid, AbandonReason.RESTARTS):
                gone = [b for b in self.inflight.values() if b.tid == a]
                for b in gone:
                    self._drop(b, cancel=False)  # the scheduler counted them orphaned already
                if gone:
                    try:
                        self.client.cancel([b.future for b in gone])
                    except Exception:
                        pass
        else:
            c.worker_restart_count += 1

    def _drop(self, b: _Batch, cancel: bool) -> None:
        self.inflight.pop(b.bid, None)
        self.by_key.pop(b.future.key, None)
        if cancel:
            try:
                b.future.cancel()
            except Exception:
                pass
            if b.t_start is not None:  # it runs: tell its worker, it stops at the next block
                self._cancel_running([b.bid], [b.worker] if b.worker else None)

    def _cancel_running(self, bids, workers) -> None:
        self.calls.run(_cancel_batches, self.token, list(bids), workers=workers)  # off the loop

    def _release(self, b: _Batch, status) -> None:
        import numpy as np

        st = np.asarray(status, dtype=np.uint8)
        if st.ndim == 0:
            st = np.full(b.n, int(st), np.uint8)
        if not self.s.is_abandoned(b.tid):
            self.s.release_blocks(b.tid, b.index, st)

    # ------------------------------------------------------------------ submit
    def _submit_pass(self) -> None:
        import numpy as np

        free = self._slots() - len(self.inflight)
        if free <= 0:
            return
        slots = self._slots()
        T = len(self.order)
        tainted = self._tainted()
        healthy = None
        if tainted:  # prefer workers with a free thread (loose: any worker if they go away)
            healthy = [a for a in self.worker_threads if a not in tainted] or None
        placement = {"workers": healthy, "allow_other_workers": True} if healthy else {}
        progressed = True
        while free > 0 and progressed:
            progressed = False
            for j in range(T):
                if free <= 0:
                    break
                tid = self.order[(self.rr + j) % T]
                tr = self.trs.get(tid)
                if tr is None or self.s.is_abandoned(tid):
                    continue
                ready = self.s.ready_count(tid)
                if ready <= 0:
                    continue
                k = max(1, min(tr.batch_k, -(-ready // slots), self.max_batch))
                batch = self.s.acquire_blocks(tid, k)
                n = len(batch.index)
                if n == 0:
                    progressed = True  # check_function may have skipped them all: look again
                    continue
                packed = np.concatenate(
                    [
                        batch.index[:, None],
                        batch.spatial_id[:, None],
                        batch.read_offset,
                        batch.read_shape,
                        batch.write_offset,
                        batch.write_shape,
                    ],
                    axis=1,
                ).astype(np.int64, copy=False)
                bid = self.next_bid
                self.next_bid += 1
                fut = self.client.submit(
                    _run_batch,
                    self.token,
                    self.topic,
                    bid,
                    tid,
                    tr.payload_arg,
                    packed,
                    tr.ndim,
                    key=f"daisy_nb-{tid}-{self.token[:8]}-{bid}",
                    pure=False,
                    retries=0,
                    resources=tr.resources,
                    **placement,
                )
                b = _Batch(bid, tid, fut, np.array(batch.index, dtype=np.int64))
                self.inflight[bid] = b
                self.by_key[fut.key] = bid
                if tr.t_first is None:
                    tr.t_first = time.monotonic()
                self.ac.add(fut)
                free -= 1
                progressed = True
            self.rr = (self.rr + 1) % max(1, T)

    # ----------------------------------------------------------------- results
    def _on_result(self, fut, result) -> None:
        bid = self.by_key.get(fut.key)
        if bid is None:
            return  # already accounted for (timeout, lost worker, abandonment)
        b = self.inflight[bid]
        tr = self.trs[b.tid]
        self._drop(b, cancel=False)
        if fut.status == "finished" and isinstance(result, dict):
            import numpy as np

            addr = result.get("worker")
            if addr:
                tr.workers_seen.add(addr)
                self.s.counters[b.tid].worker_start_count = len(tr.workers_seen)
            if result.get("init_error"):
                self._release(b, 0)  # never started: given back uncounted
                self._worker_failure(b.tid, result["init_error"])
                return
            st = np.frombuffer(result["status"], dtype=np.uint8).copy()
            if len(st) != b.n:  # cannot happen; be safe
                st = np.resize(st, b.n)
            st[(st != 2) & (st != 3)] = 0
            if addr:
                tr.finished_on[addr] = tr.finished_on.get(addr, 0) + int(np.count_nonzero(st == 2))
            self._release(b, st)
            if result.get("first_error"):
                record_error(self.s.counters[b.tid], result["last_error"], first=result["first_error"])
            ran = int(np.count_nonzero(st))
            if self.timeline is not None and result.get("worker"):
                t1 = time.monotonic()
                key = ("d", result["worker"])
                if key not in self.timeline.rows:
                    self.timeline.worker(key, b.tid, "dask", f"dask {result['worker']}", b.pid, None, b.t_start)
                t0 = t1 - result.get("elapsed_ns", 0) / 1e9
                self.timeline.bar(key, b.tid, t0, t1, ran, int(np.count_nonzero(st == 3)))
            if ran:
                tr.batch_k = grow_batch(tr.batch_k, result["elapsed_ns"], ran, self.target, self.max_batch)
                tr.block_secs.append(result["elapsed_ns"] / ran / 1e9)
            return
        # the future erred or was cancelled behind our back: its blocks fail once
        where = f" on dask worker {b.worker} (pid {b.pid})" if b.worker else ""
        exc = result
        if isinstance(result, tuple) and len(result) == 3:
            exc = result[1]
        name = type(exc).__name__ if isinstance(exc, BaseException) else str(fut.status)
        if isinstance(exc, BaseException):
            detail = cap_traceback(format_exception(exc)) if exc.__traceback__ is not None else f"{name}: {exc}"
        else:
            detail = repr(exc)
        text = f"dask future of a batch of {b.n} block(s) of task {b.tid!r} failed{where} ({name}):\n{detail}"
        self._release(b, 3)
        if tr.payload_arg is not tr.payload and getattr(tr.payload_arg, "status", "finished") != "finished":
            try:  # the scattered function was lost with its workers: scatter it again
                tr.payload_arg = self.client.scatter(tr.payload, broadcast=True, hash=False)
            except Exception:
                pass
        # one cluster event (a worker or the scheduler going away) errs many futures at
        # once: count one worker failure per task per pass of the loop
        self.pass_failures.setdefault(b.tid, text)

    # ------------------------------------------------------------------ events
    def _drain_events(self) -> None:
        while self.events:
            kind, t, msg = self.events.popleft()
            if kind == "start":
                if not isinstance(msg, dict):
                    continue
                if msg.get("end"):
                    z = self.zombies.get(msg.get("worker"))
                    if z is not None:
                        z.pop(msg.get("bid"), None)
                        if not z:
                            del self.zombies[msg.get("worker")]
                    continue
                b = self.inflight.get(msg.get("bid"))
                if b is not None:
                    b.t_start = t  # a dask-side rerun restarts the clock
                    b.worker = msg.get("worker")
                    b.pid = msg.get("pid")
            elif kind == "running":  # the answer of _pull_back's _running_batches call
                self.asking = False
                asked, running = msg
                for addr in asked if running is not None else ():
                    if addr in running and addr in self.zombies:  # else: not reached, or gone meanwhile
                        bids = set(running[addr])
                        z = {bid: key for bid, key in self.zombies[addr].items() if bid in bids}
                        if z:
                            self.zombies[addr] = z
                        else:
                            del self.zombies[addr]
            elif kind == "add-worker":
                self.workers_changed = True
                self.calls.added(msg.get("worker"))
                for tr in self.trs.values():  # an address reused by a new worker: it finished nothing yet
                    tr.finished_on.pop(msg.get("worker"), None)
            elif kind == "remove-worker":
                self.workers_changed = True
                self.calls.removed(msg.get("worker"))  # nothing is ever sent to it again
                self.zombies.pop(msg.get("worker"), None)
                if self.timeline is not None:
                    self.timeline.ended(("d", msg.get("worker")), lost=not msg.get("expected"))
                if msg.get("expected"):
                    continue  # retired on purpose: dask reruns its tasks, nothing counted
                addr = msg.get("worker")
                lost = [b for b in self.inflight.values() if b.worker == addr and b.t_start is not None]
                by_task: dict[str, list[_Batch]] = {}
                for b in lost:
                    by_task.setdefault(b.tid, []).append(b)
                for tid, bs in by_task.items():
                    pid = bs[0].pid
                    nblk = sum(b.n for b in bs)
                    for b in bs:
                        self._drop(b, cancel=True)  # no silent rerun by dask
                        self._release(b, 3)
                    finished = self.trs[tid].finished_on.get(addr, 0)
                    job_end = is_job_end(finished)
                    text = f"dask worker {addr} (pid {pid}) was lost while running {nblk} block(s) of task {tid!r}"
                    if job_end:
                        text += f" after it had finished {finished} of them: {JOB_END}"
                    self._worker_failure(tid, text, job_end)
                for tr in self.trs.values():
                    tr.finished_on.pop(addr, None)

    def _check_timeouts(self, now: float) -> None:
        late = []
        for b in self.inflight.values():
            tr = self.trs[b.tid]
            if tr.timeout is not None and b.t_start is not None and now - b.t_start > tr.timeout * b.n:
                late.append(b)
        for b in late:
            if b.bid not in self.inflight:
                continue  # dropped by an abandonment meanwhile
            tr = self.trs[b.tid]
            self._drop(b, cancel=True)
            self._release(b, 3)
            if b.worker:
                self.zombies.setdefault(b.worker, {})[b.bid] = b.future.key
                self.last_pullback = 0.0  # look for batches queued behind it at once
            self.s.counters[b.tid].timeout_reclaim_count += 1
            self._worker_failure(
                b.tid,
                f"a batch of {b.n} block(s) of task {b.tid!r} exceeded timeout={tr.timeout:g}s per block on dask "
                f"worker {b.worker} (pid {b.pid}) and was cancelled",
            )

    # -------------------------------------------------------------------- loop
    def run(self) -> None:
        s = self.s
        self._notify("on_start")
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
            self._check_timeouts(now)
            self._pull_back(now)
            done = s.is_done()
            for tid, tr in self.trs.items():
                if tr.t_done is None and s.is_task_done(tid):
                    tr.t_done = now
            if done:
                break
            self._submit_pass()
            if not self.inflight:
                if not any(s.ready_count(t) for t in self.trs):
                    idle_since = idle_since or now
                    if now - idle_since > 1.0:
                        raise RuntimeError(
                            "daisy_nb: the run stalled (nothing in flight, no ready blocks, tasks not done)"
                        )
            else:
                idle_since = None
            heartbeat(now)
            with self.cond:
                if self.ac.queue.empty() and not self.events and not self.interrupted:
                    self.cond.wait(POLL_SECS)
        self._notify("on_progress")
        if alarm is not None:
            alarm.close()

    def running_blocks(self) -> list:
        """Batches a dask worker has started (which of its blocks runs is not known here), for the hang alarm."""
        return [
            (b.tid, b.index[:5], f"dask worker {b.worker} (a batch of {b.n})", b.pid, b.t_start)
            for b in self.inflight.values()
            if b.t_start is not None
        ]

    def _consume(self) -> None:
        for fut, result in self.ac.next_batch(block=False):
            self._on_result(fut, result)
        failures, self.pass_failures = self.pass_failures, {}
        for tid, text in failures.items():
            self._worker_failure(tid, text)

    def shutdown(self, aborting: bool) -> None:
        """Record finished results, cancel the rest (blocks given back), clean up."""
        if aborting:
            try:
                self._consume()
            except Exception:
                pass
        left = list(self.inflight.values())
        if left:
            try:
                self.client.cancel([b.future for b in left])
            except Exception:
                pass
            for b in left:
                self._drop(b, cancel=False)
                try:
                    self._release(b, 0)
                except Exception:
                    pass
        self.watch.unsubscribe()
        if self.next_bid:
            self.calls.run(_forget_run_async, self.token, wait=False)
        self.calls.wait(FORGET_WAIT_SECS)  # a worker lost just now must not hold up the end of the run
        for tr in self.trs.values():
            if tr.payload_arg is not tr.payload:
                try:
                    tr.payload_arg.release()
                except Exception:
                    pass

    def _on_sigint(self, signum, frame):
        if self.interrupted:  # a second Ctrl-C: the driver may be stuck talking to the cluster
            raise KeyboardInterrupt("run aborted by SIGINT")
        self.interrupted = True


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
    ``RuntimeError``, like the local pool.
    """
    records = {tid: _TaskRun(scheduler.tasks[tid]) for tid in scheduler.task_ids}
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
        run_dask.last_timing = {"futures": run.next_bid}
        raise_if_abandoned(states, run.order, "dask workers")
        return states
    finally:
        if owned:
            client.close()


run_dask.last_timing = {}
