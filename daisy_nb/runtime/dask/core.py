"""The dask back-end's decisions, without I/O: which ready blocks go into which batch, and
what every event does to the blocks in flight.

:class:`Submission` is a plain object. It reads and changes the Scheduler's block
state (acquire, release, abandon) and the task counters, and knows the cluster only
through the events its shell (:mod:`.driver`) feeds it, the clock passed in:

=========================  ==================================================
event (method)             what it decides
=========================  ==================================================
:meth:`submit`             new batches for the free slots (:class:`Submit`)
:meth:`started`            a batch announced its start on a worker
:meth:`finished`           a batch's result: blocks released, batch size grown
:meth:`erred`              a future erred or was cancelled behind our back
:meth:`end_pass`           one worker failure per task for this pass's errors
:meth:`set_workers`        the cluster's workers and their threads
:meth:`worker_added`       an address (maybe reused) that finished nothing yet
:meth:`worker_removed`     a lost worker: its started batches fail, once
:meth:`tick`               block timeouts; asks about stuck workers
:meth:`queued`             batches still queued on a stuck worker: taken back
:meth:`running`            which cancelled batches still hold a worker thread
:meth:`batch_ended`        a cancelled batch let its thread go
:meth:`shutdown`           every batch left is given back
=========================  ==================================================

Actions out (dataclasses the shell executes): :class:`Submit` a batch,
:class:`Cancel` batches (their futures; the shell forgets them),
:class:`Stop` batches that already run on a worker (``client.run``, they stop at
the next block boundary), :class:`AskRunning` and :class:`AskQueued` (questions
whose answers come back as :meth:`running` and :meth:`queued`).

Every batch the core holds is in :attr:`Submission.batches` until one event ends it
(a result, an error, a timeout, a lost worker, a take-back, an abandonment, the
shutdown); :meth:`validate` checks the invariants (each handed-out block in exactly
one batch; the blocks in batches of a task equal the Scheduler's processing count).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daisy_nb.runtime.common.batching import grow_batch
from daisy_nb.runtime.common.failures import (
    JOB_END,
    AbandonReason,
    abandon,
    is_job_end,
    record_worker_error,
    worker_failure,
)
from daisy_nb.runtime.common.run_block import DONE, FAILED
from daisy_nb.runtime.common.taskrun import TaskRun

__all__ = ["AskQueued", "AskRunning", "Batch", "Cancel", "DaskTaskRun", "Stop", "Submission", "Submit"]

PULLBACK_SECS = 0.5  # how often stuck workers are asked about


class DaskTaskRun(TaskRun):
    """dask's run record of a task: the shared one, plus the function as the workers get it."""

    measures_resources = False  # dask workers report no per-block stats

    def __init__(self, task):
        super().__init__(task)
        self.payload_arg = None  # the payload bytes, or a scattered future for large functions
        self.resources = {k: v for k, v in self.requires.items() if v} or None  # dask resource restrictions
        self.workers_seen: set = set()
        self.finished_on: dict = {}  # dask worker address -> blocks of this task it finished (job ends)


class Batch:
    """Blocks of one task in one dask future; ``t_start``/``worker``/``pid`` once it started."""

    __slots__ = ("bid", "tid", "index", "n", "t_start", "worker", "pid")

    def __init__(self, bid: int, tid: str, index: np.ndarray):
        self.bid = bid
        self.tid = tid
        self.index = index
        self.n = len(index)
        self.t_start: float | None = None
        self.worker: str | None = None
        self.pid: int | None = None


@dataclass(frozen=True)
class Submit:
    """Submit batch ``bid`` of task ``tid`` (``packed``: one int64 row per block); ``workers``:
    loose placement on workers with a free thread (None: anywhere)."""

    bid: int
    tid: str
    packed: np.ndarray
    workers: list | None


@dataclass(frozen=True)
class Cancel:
    """Cancel the futures of these batches and forget them (their results are not wanted)."""

    bids: tuple


@dataclass(frozen=True)
class Stop:
    """Batches that run on ``worker`` (None: wherever they run) stop at their next block boundary."""

    worker: str | None
    bids: tuple


@dataclass(frozen=True)
class AskRunning:
    """Ask these workers which batches of the run still run there; answer with :meth:`Submission.running`."""

    workers: tuple


@dataclass(frozen=True)
class AskQueued:
    """Ask which futures are queued on these workers; answer with :meth:`Submission.queued`."""

    workers: tuple


def pack(batch) -> np.ndarray:
    """A ``BlockBatch`` as the int64 rows :func:`.worker._run_batch` rebuilds blocks from."""
    return np.concatenate(
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


class Submission:
    """Submission and accounting of one dask run's batches (see the module docstring)."""

    def __init__(self, scheduler, trs: dict, *, target_secs: float, per_thread: int, max_batch: int):
        self.s = scheduler
        self.trs: dict[str, DaskTaskRun] = trs
        self.order = [t for t in scheduler.task_ids if t in trs]
        self.target = float(target_secs)
        self.per_thread = max(1, int(per_thread))
        self.max_batch = max(1, int(max_batch))
        self.batches: dict[int, Batch] = {}
        self.next_bid = 0
        self.rr = 0  # round-robin start over tasks
        self.worker_threads: dict[str, int] = {}  # address -> threads
        self.nthreads = 0
        self.zombies: dict[str, set] = {}  # address -> batches we cancelled that still run there
        self.last_pullback = 0.0
        self.asking = False  # an AskRunning is under way
        self.pass_failures: dict[str, str] = {}  # task id -> error text of futures that erred in this pass

    # ------------------------------------------------------------------ cluster
    def set_workers(self, threads: dict) -> None:
        """The cluster's workers now: ``{address: threads}``."""
        self.worker_threads = {a: int(n) for a, n in threads.items()}
        self.nthreads = sum(self.worker_threads.values())

    def slots(self) -> int:
        """Futures in flight wanted: ``per_thread`` per thread not stuck in a cancelled batch."""
        busy = sum(min(len(z), self.worker_threads.get(a, 0)) for a, z in self.zombies.items())
        return max(1, self.nthreads - busy) * self.per_thread

    def tainted(self) -> list:
        """Workers whose every thread still runs a batch we cancelled (a hung block)."""
        return [a for a, z in self.zombies.items() if z and len(z) >= self.worker_threads.get(a, 1)]

    def worker_added(self, addr) -> None:
        for tr in self.trs.values():  # an address reused by a new worker: it finished nothing yet
            tr.finished_on.pop(addr, None)

    def worker_removed(self, addr, *, expected: bool) -> list:
        """A worker left; unless retired on purpose (dask reruns its tasks), the batches that
        started there are cancelled (no silent rerun by dask) and their blocks fail once."""
        self.zombies.pop(addr, None)
        if expected:
            return []
        out: list = []
        by_task: dict[str, list[Batch]] = {}
        for b in self.batches.values():
            if b.worker == addr and b.t_start is not None:
                by_task.setdefault(b.tid, []).append(b)
        for tid, bs in by_task.items():
            bs = [b for b in bs if b.bid in self.batches]
            if not bs:  # an upstream task's abandonment, just above, orphaned this one and took its batches
                continue
            pid, nblk = bs[0].pid, sum(b.n for b in bs)
            for b in bs:
                self._drop(b, out, stop=True)
                self._release(b, FAILED)
            finished = self.trs[tid].finished_on.get(addr, 0)
            job_end = is_job_end(finished)
            text = f"dask worker {addr} (pid {pid}) was lost while running {nblk} block(s) of task {tid!r}"
            if job_end:
                text += f" after it had finished {finished} of them: {JOB_END}"
            self._worker_failure(tid, text, out, job_end=job_end)
        for tr in self.trs.values():
            tr.finished_on.pop(addr, None)
        return out

    # ------------------------------------------------------------------ submit
    def submit(self, now: float) -> list:
        """Batches of ready blocks for the free slots, round-robin over the tasks."""
        slots = self.slots()
        free = slots - len(self.batches)
        out: list = []
        if free <= 0:
            return out
        tainted = self.tainted()
        healthy = ([a for a in self.worker_threads if a not in tainted] or None) if tainted else None
        T = len(self.order)
        progressed = True
        while free > 0 and progressed:
            progressed = False
            for j in range(T):
                if free <= 0:
                    break
                tid = self.order[(self.rr + j) % T]
                tr = self.trs[tid]
                ready = 0 if self.s.is_abandoned(tid) else self.s.ready_count(tid)
                if ready <= 0:
                    continue
                k = max(1, min(tr.batch_k, -(-ready // slots), self.max_batch))
                got = self.s.acquire_blocks(tid, k)
                progressed = True  # check_function may have skipped them all: look again
                if len(got.index) == 0:
                    continue
                b = Batch(self.next_bid, tid, np.array(got.index, dtype=np.int64))
                self.next_bid += 1
                self.batches[b.bid] = b
                if tr.t_first is None:
                    tr.t_first = now
                out.append(Submit(b.bid, tid, pack(got), healthy))
                free -= 1
            self.rr = (self.rr + 1) % max(1, T)
        return out

    # ----------------------------------------------------------------- results
    def started(self, bid: int, worker, pid, now: float) -> None:
        b = self.batches.get(bid)
        if b is not None:
            b.t_start, b.worker, b.pid = now, worker, pid  # a dask-side rerun restarts the clock

    def batch_ended(self, bid: int, worker) -> None:
        """A batch we had cancelled while it ran returned: its worker thread is free again."""
        z = self.zombies.get(worker)
        if z is not None:
            z.discard(bid)
            if not z:
                del self.zombies[worker]

    def finished(self, bid: int, result: dict) -> list:
        """The result of batch ``bid``: a status byte per block (0: not run, given back), the
        first and last errors (:class:`daisy_nb.errors.WorkerError`), or the ``init_fn`` error
        text that kept it from starting."""
        b = self.batches.pop(bid)
        tr, c = self.trs[b.tid], self.s.counters[b.tid]
        out: list = []
        addr = result.get("worker")
        if addr:
            tr.workers_seen.add(addr)
            c.worker_start_count = len(tr.workers_seen)
        if result.get("init_error"):
            self._release(b, 0)  # never started: given back uncounted
            self._worker_failure(b.tid, result["init_error"], out)
            return out
        st = np.frombuffer(result["status"], dtype=np.uint8).copy()
        if len(st) != b.n:
            raise RuntimeError(f"daisy_nb: a dask batch of {b.n} block(s) returned {len(st)} statuses")
        st[(st != DONE) & (st != FAILED)] = 0
        done = int(np.count_nonzero(st == DONE))
        if addr:
            tr.finished_on[addr] = tr.finished_on.get(addr, 0) + done
        self._release(b, st)
        if result.get("first_error"):
            record_worker_error(c, result["last_error"], first=result["first_error"])
        ran = int(np.count_nonzero(st))
        if ran:
            tr.batch_k = grow_batch(tr.batch_k, result["elapsed_ns"], ran, self.target, self.max_batch)
            tr.block_secs.append(result["elapsed_ns"] / ran / 1e9)
            c.job_seconds.ran(result["elapsed_ns"] / 1e9)
        return out

    def erred(self, bid: int, name: str, detail: str) -> None:
        """Batch ``bid``'s future erred (``KilledWorker``, cancelled behind our back, ...): its
        blocks fail once; one worker failure per task per pass (:meth:`end_pass`), as one cluster
        event errs many futures at once."""
        b = self.batches.pop(bid)
        where = f" on dask worker {b.worker} (pid {b.pid})" if b.worker else ""
        text = f"dask future of a batch of {b.n} block(s) of task {b.tid!r} failed{where} ({name}):\n{detail}"
        self._release(b, FAILED)
        self.pass_failures.setdefault(b.tid, text)

    def end_pass(self) -> list:
        out: list = []
        failures, self.pass_failures = self.pass_failures, {}
        for tid, text in failures.items():
            self._worker_failure(tid, text, out)
        return out

    # ------------------------------------------------------------------- clock
    def tick(self, now: float) -> list:
        """Block timeouts (a late batch is cancelled, its blocks fail, its worker thread is
        stuck until it returns), then questions about stuck workers every ``PULLBACK_SECS``."""
        out: list = []
        for tid in self.order:
            tr = self.trs[tid]
            if tr.t_done is None and self.s.is_task_done(tid):
                tr.t_done = now
        late = [
            b
            for b in self.batches.values()
            if b.t_start is not None and (t := self.trs[b.tid].timeout) is not None and now - b.t_start > t * b.n
        ]
        for b in late:
            if b.bid not in self.batches:
                continue  # dropped by an abandonment meanwhile
            tr = self.trs[b.tid]
            self._drop(b, out, stop=True)
            self._release(b, FAILED)
            if b.worker:
                self.zombies.setdefault(b.worker, set()).add(b.bid)
                self.last_pullback = -PULLBACK_SECS  # look for batches queued behind it at once
            self.s.counters[b.tid].timeout_reclaim_count += 1
            text = (
                f"a batch of {b.n} block(s) of task {b.tid!r} exceeded timeout={tr.timeout:g}s per block on dask "
                f"worker {b.worker} (pid {b.pid}) and was cancelled"
            )
            self._worker_failure(b.tid, text, out)
        if self.zombies and now - self.last_pullback >= PULLBACK_SECS:
            self.last_pullback = now
            if not self.asking:  # which cancelled batches still run (one may have ended just before its cancel)
                self.asking = True
                out.append(AskRunning(tuple(self.zombies)))
            tainted = self.tainted()
            if tainted:
                out.append(AskQueued(tuple(tainted)))
        return out

    def running(self, asked, running: dict | None) -> None:
        """The answer to :class:`AskRunning`: ``{address: [batch ids]}`` of the workers that
        answered (None: the question could not be asked)."""
        self.asking = False
        if running is None:
            return
        for addr in asked:
            if addr in running and addr in self.zombies:  # else: not reached, or gone meanwhile
                z = self.zombies[addr] & set(running[addr])
                if z:
                    self.zombies[addr] = z
                else:
                    del self.zombies[addr]

    def queued(self, bids) -> list:
        """The answer to :class:`AskQueued`: batches that never started are taken back (given back
        uncounted) to be submitted again elsewhere."""
        out: list = []
        for bid in bids:
            b = self.batches.get(bid)
            if b is not None and b.t_start is None:
                self._drop(b, out)
                self._release(b, 0)
        return out

    def shutdown(self) -> list:
        """The run ends: every batch left is cancelled (one :class:`Cancel`) and its blocks given back."""
        left = list(self.batches.values())
        self.batches.clear()
        for b in left:
            self._release(b, 0)
        return [Cancel(tuple(b.bid for b in left))] if left else []

    def running_blocks(self) -> list:
        """Batches a dask worker has started (which of its blocks runs is not known here), for the hang alarm."""
        return [
            (b.tid, b.index[:5], f"dask worker {b.worker} (a batch of {b.n})", b.pid, b.t_start)
            for b in list(self.batches.values())
            if b.t_start is not None
        ]

    # ---------------------------------------------------------------- internal
    def _drop(self, b: Batch, out: list, *, stop: bool = False) -> None:
        del self.batches[b.bid]
        out.append(Cancel((b.bid,)))
        if stop and b.t_start is not None:  # it runs: tell its worker, it stops at the next block
            out.append(Stop(b.worker, (b.bid,)))

    def _release(self, b: Batch, status) -> None:
        st = np.asarray(status, dtype=np.uint8)
        if st.ndim == 0:
            st = np.full(b.n, int(st), np.uint8)
        if not self.s.is_abandoned(b.tid):
            self.s.release_blocks(b.tid, b.index, st)

    def _worker_failure(self, tid: str, text: str, out: list, *, job_end: bool = False) -> None:
        """A batch lost to its worker (death, timeout, init_fn): the pool's dirty exit. dask replaces
        the worker at once (a restart), until ``max_worker_restarts``: then the task is abandoned."""
        c = self.s.counters[tid]
        worker_failure(c, tid, text, job_end=job_end)
        if job_end or self.s.is_abandoned(tid):
            return
        if not self.trs[tid].restarts.cap_reached(c):
            self.trs[tid].restarts.replaced(c)  # the restart rule (common/failures.py)
            return
        for a in abandon(self.s, tid, AbandonReason.RESTARTS):
            gone = [b for b in self.batches.values() if b.tid == a]
            for b in gone:  # the scheduler counted them orphaned already
                del self.batches[b.bid]
            if gone:
                out.append(Cancel(tuple(b.bid for b in gone)))

    # --------------------------------------------------------------- invariants
    def validate(self) -> None:
        """Raise ``AssertionError`` unless every block handed out is in exactly one batch and the
        blocks in batches of each task equal the Scheduler's processing count."""
        by_task: dict[str, list] = {}
        for bid, b in self.batches.items():
            assert bid == b.bid and b.tid in self.trs and b.n == len(b.index) > 0, bid
            by_task.setdefault(b.tid, []).append(b.index)
        for tid in self.s.task_ids:
            idx = np.concatenate(by_task[tid]) if tid in by_task else np.empty(0, np.int64)
            assert len(np.unique(idx)) == len(idx), f"task {tid!r}: a block in two batches"
            if self.s.is_abandoned(tid):
                assert not len(idx) and self.s.processing_count(tid) == 0, tid
            else:
                assert len(idx) == self.s.processing_count(tid), (tid, len(idx), self.s.processing_count(tid))
        for addr, z in self.zombies.items():
            assert z and not (z & self.batches.keys()), addr
        assert self.next_bid > max(self.batches, default=-1)
        assert set(self.pass_failures) <= set(self.trs)
