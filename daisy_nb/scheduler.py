"""``Scheduler``: hands out ready blocks and takes results back (daisy's order and counters).

The Scheduler owns the pipeline's state arrays (see :mod:`daisy_nb.kernels.surface`),
calls the kernels once per call (``acquire_block``/``release_block``) or once per
batch (``acquire_blocks``/``release_blocks``), runs ``check_function`` prechecks, and
keeps block tracking on disk in daisy 2.0.0's format. It does not run anything:
the serial runner, the process pool and the dask executor drive it.

Here: :class:`Scheduler` (the state and the decisions on it), :class:`SchedulerViews`
(what observers read of it), the snapshot types they return, :class:`DependencyGraph`.
What the Scheduler uses without deciding lives in :mod:`daisy_nb.scheduling` (the
pipeline's geometry, the tracking stores, the prechecks, the compile decision).
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .block import Block, BlockStatus
from .kernels import graph as kg
from .kernels import surface as ks
from .kernels import surface_plain
from .kernels import tables as kt
from .scheduling.backoff import RetryBackoff
from .scheduling.geometry import PipelineGeometry
from .scheduling.geometry import edge_tables as _edge_tables  # noqa: F401  (daisy_nb.plan imports it here)
from .scheduling.job_seconds import JobSeconds
from .scheduling.pace import US_BLOCK as _US_BLOCK  # noqa: F401  (the cost model, as tests read it)
from .scheduling.pace import US_PER_DOWNSTREAM as _US_PER_DOWNSTREAM  # noqa: F401
from .scheduling.pace import CompilePace
from .scheduling.prechecks import Prechecks
from .scheduling.start import flag_skips, seed_ready
from .scheduling.tracking import PipelineTracking
from .task import Pipeline, Task, as_pipeline
from .tracking import TrackingStore

if TYPE_CHECKING:
    import numpy.typing as npt

    from .kernels.surface_plain import PlainSurface
    from .task import Tasks

__all__ = [
    "BlockBatch",
    "BlockDescription",
    "BlockStates",
    "DependencyGraph",
    "Scheduler",
    "SchedulerViews",
    "TaskCounts",
    "TaskState",
    "WorkerCounters",
]

logger = logging.getLogger(__name__)

_EMPTY = np.zeros(0, dtype=np.int64)
_PACE_SECS = 1.0  # hand-outs watched before a deferred compile decision (scheduling/pace.py)


class BlockBatch(NamedTuple):
    """Blocks handed out together; ``index`` is each block's row in its task."""

    task_id: str
    index: np.ndarray  # type: ignore[assignment]  # int64[k] (daisy_nb's name; shadows tuple.index)
    spatial_id: np.ndarray  # int64[k]
    read_offset: np.ndarray  # int64[k, nd]
    read_shape: np.ndarray
    write_offset: np.ndarray
    write_shape: np.ndarray

    def __len__(self):  # noqa: D105
        return len(self.index)

    def blocks(self) -> list[Block]:
        """The batch as :class:`Block` objects (each with its ``index``)."""
        make = Block._make
        tid = self.task_id
        return [
            make(tid, i, (tuple(a), tuple(b)), (tuple(c), tuple(d)), r)
            for i, a, b, c, d, r in zip(
                self.spatial_id.tolist(),
                self.read_offset.tolist(),
                self.read_shape.tolist(),
                self.write_offset.tolist(),
                self.write_shape.tolist(),
                self.index.tolist(),
            )
        ]


class BlockDescription(NamedTuple):
    """Blocks of one task described by their rows (:meth:`Scheduler.describe`): int64 arrays,
    one entry (offsets and shapes: one row of ``ndim`` values) per row asked for."""

    block_id: np.ndarray  # int64[k]
    read_offset: np.ndarray  # int64[k, nd]
    read_shape: np.ndarray
    write_offset: np.ndarray
    write_shape: np.ndarray


class TaskCounts(NamedTuple):
    """One task's block counts now (:meth:`Scheduler.counts`; cheaper than ``task_states``)."""

    total: int
    ready: int
    processing: int
    completed: int  # skipped blocks included, as daisy counts them
    skipped: int
    failed: int
    orphaned: int


class BlockStates(NamedTuple):
    """Read-only views of one task's per-row state (:meth:`Scheduler.block_states`), indexed by row.

    ``status``: ``kernels.tables`` codes (PENDING, READY, PROCESSING, DONE, FAILED, ORPHANED);
    ``preskip``: 1 done by block tracking, 2 skipped by ``skip_mask``; ``retries``: failed
    attempts so far. The views follow the run (no copy): read them, never write."""

    status: np.ndarray  # uint8[num_blocks]
    preskip: np.ndarray
    retries: np.ndarray


class WorkerCounters:
    """Per-task counters the runtime keeps (daisy 2.0 wheel's TaskState additions)."""

    def __init__(self, task_id: str = ""):
        from daisy_nb.errors import ErrorGroups

        self.error_groups = ErrorGroups(task_id)  # every recorded failure, grouped (daisy_nb extension)
        self.worker_failure_count = 0
        self.worker_restart_count = 0
        self.worker_job_end_count = 0  # dirty exits after finished blocks (policy.is_job_end): not restarts
        self.worker_start_count = 0
        self.timeout_reclaim_count = 0
        self.first_worker_error = None
        self.last_worker_error = None
        self.job_seconds = JobSeconds()  # worker-seconds held and busy (daisy_nb extension)


class TaskState:
    """A snapshot of one task's counters (daisy's ``TaskState``); made by :attr:`Scheduler.task_states`.

    Parameters
    ----------
    task_id : str
        The task.
    total : int
        Its number of blocks (``total_block_count``).
    cnt_row : numpy.ndarray
        The scheduler's counter row of the task.
    counters : WorkerCounters
        The runtime's worker counters of the task.
    abandoned : bool
        Whether the task was abandoned.
    abandon_reason : str or None
        Why.
    timeout_secs : float
        The task's block timeout.

    Attributes
    ----------
    total_block_count, ready_count, processing_count, completed_count, skipped_count, failed_count, orphaned_count : int
        Block counts (skipped blocks count as completed too).
    started, abandoned : bool
        Whether a block was handed out; whether the task was abandoned.
    worker_failure_count, worker_restart_count, worker_start_count, timeout_reclaim_count : int
        Worker counts of the runtimes.
    job_seconds_held, job_seconds_busy : float
        Worker-seconds the task's workers were held, and those its blocks ran (daisy_nb extension;
        :class:`~daisy_nb.scheduling.job_seconds.JobSeconds`).
    """

    def __init__(
        self,
        task_id: str,
        total: int,
        cnt_row: np.ndarray,
        counters: WorkerCounters,
        abandoned: bool,
        abandon_reason: str | None,
        timeout_secs: float,
    ) -> None:
        self.task_id = task_id
        self.total_block_count = int(total)
        self.ready_count = int(cnt_row[kt.C_READY])
        self.processing_count = int(cnt_row[kt.C_PROC])
        self.completed_count = int(cnt_row[kt.C_COMPLETED])
        self.skipped_count = int(cnt_row[kt.C_SKIPPED])
        self.failed_count = int(cnt_row[kt.C_FAILED])
        self.orphaned_count = int(cnt_row[kt.C_ORPHANED])
        self.started = bool(cnt_row[kt.C_STARTED])
        self.worker_failure_count = counters.worker_failure_count
        self.worker_restart_count = counters.worker_restart_count
        self.worker_job_end_count = counters.worker_job_end_count
        self.worker_start_count = counters.worker_start_count
        self.timeout_reclaim_count = counters.timeout_reclaim_count
        self.first_worker_error = counters.first_worker_error
        self.last_worker_error = counters.last_worker_error
        self.error_groups = counters.error_groups  # the live groups (daisy_nb extension): .as_list()
        self.job_seconds_held = counters.job_seconds.held(time.monotonic())
        self.job_seconds_busy = counters.job_seconds.busy
        self.abandoned = bool(abandoned)
        self.abandon_reason = abandon_reason
        self.timeout_secs = timeout_secs

    @property
    def pending_count(self) -> int:
        """Blocks not ready yet (waiting for upstream blocks), neither done nor running."""
        return (
            self.total_block_count
            - self.ready_count
            - self.processing_count
            - self.completed_count
            - self.failed_count
            - self.orphaned_count
        )

    def is_done(self) -> bool:
        """Whether every block is completed, failed or orphaned."""
        return self.completed_count + self.failed_count + self.orphaned_count == self.total_block_count

    def __repr__(self):
        return (
            f"Started: {self.started}\nTotal Blocks: {self.total_block_count}\nReady: {self.ready_count}\n"
            f"Processing: {self.processing_count}\nPending: {self.pending_count}\nCompleted: {self.completed_count}\n"
            f"Skipped: {self.skipped_count}\nFailed: {self.failed_count}\nOrphaned: {self.orphaned_count}"
        )


class SchedulerViews:
    """What observers read of a run (the dashboard, the hang alarm, tools, the runtimes' loops):
    block counts, per-row states, ROIs, task snapshots. Nothing here changes state.

    The base of :class:`Scheduler`, which owns what these read: ``geometry`` (a
    :class:`~daisy_nb.scheduling.geometry.PipelineGeometry`), the counter rows ``cnt`` and
    task configuration ``tcfg``, the per-row ``status``/``preskip``/``retries``, the
    runtime's ``counters`` and the abandonment reasons. An observer that only reads can
    be typed against this class.
    """

    geometry: PipelineGeometry
    task_ids: list[str]
    tasks: dict[str, Task]
    counters: dict[str, WorkerCounters]
    cnt: np.ndarray
    tcfg: np.ndarray
    status: np.ndarray
    preskip: np.ndarray
    retries: np.ndarray
    _tindex: dict[str, int]
    _nblocks: list[int]
    _abandon_reason: dict[str, str]
    _backoff: RetryBackoff | None

    def _tid(self, task_id: str) -> int:
        t = self._tindex.get(task_id)
        if t is None:
            raise KeyError(f"no task {task_id!r} in this scheduler")
        return t

    def describe(self, task_id: str, rows: npt.ArrayLike) -> BlockDescription:
        """Block ids, read and write ROIs (offsets and shapes) of rows ``rows`` of ``task_id``."""
        t = self._tid(task_id)
        r = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if len(r) and (int(r.min()) < 0 or int(r.max()) >= self._nblocks[t]):
            raise ValueError(f"rows of task {task_id!r} are 0..{self._nblocks[t] - 1}")
        ids, ro, rs, wo, ws = self.geometry.describe(t, r)
        return BlockDescription(ids, ro, rs, wo, ws)

    def row_of(self, task_id: str, block_id: int) -> int | None:
        """The row of the block with id ``block_id`` in ``task_id``, or None if it is not one of its blocks."""
        return self.geometry.row_of_id(self._tid(task_id), block_id)

    def rows_in_grid_box(self, task_id: str, lo: Sequence[int], hi: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, block ids)`` of the blocks at grid positions in ``[lo, hi)`` (C order), clipped to the grid."""
        return self.geometry.rows_in_grid_box(self._tid(task_id), lo, hi)

    def block_rois(self, t: int, block_id: int) -> dict | None:
        """``{"read_roi", "write_roi"}`` (offset/shape lists) of block ``block_id`` of task ``t``, or None."""
        return self.geometry.block_rois(t, block_id)

    def block_states(self, task_id: str) -> BlockStates:
        """Read-only views of ``task_id``'s per-row status, preskip and retries (see :class:`BlockStates`)."""
        t = self._tid(task_id)
        base = int(self.geometry.tt.info[t, kt.I_BLOCK_BASE])
        out = []
        for a in (self.status, self.preskip, self.retries):
            v = a[base : base + self._nblocks[t]]
            v.flags.writeable = False
            out.append(v)
        return BlockStates(*out)

    def counts(self, task_id: str) -> TaskCounts:
        """``task_id``'s block counts now (see :class:`TaskCounts`)."""
        t = self._tid(task_id)
        item = self.cnt.item
        return TaskCounts(
            self._nblocks[t],
            item(t, kt.C_READY),
            item(t, kt.C_PROC),
            item(t, kt.C_COMPLETED),
            item(t, kt.C_SKIPPED),
            item(t, kt.C_FAILED),
            item(t, kt.C_ORPHANED),
        )

    def ready_count(self, task_id: str) -> int:
        """Blocks of ``task_id`` ready to be handed out now."""
        return self.cnt.item(self._tindex[task_id], kt.C_READY)

    def retry_waiting_count(self, task_id: str) -> int:
        """Failed blocks of ``task_id`` waiting for their retry (``Task(retry_backoff=...)``; they
        count as pending, docs/explanation/algorithms.md#retry-backoff)."""
        bo = self._backoff
        return 0 if bo is None else bo.held(self._tindex[task_id])

    def remaining_count(self, task_id: str) -> int:
        """Blocks of ``task_id`` neither completed, failed nor orphaned."""
        # .item: plain ints, no numpy scalars (runtimes ask this several times per loop turn)
        t = self._tindex[task_id]
        item = self.cnt.item
        return self._nblocks[t] - item(t, kt.C_COMPLETED) - item(t, kt.C_FAILED) - item(t, kt.C_ORPHANED)

    def processing_count(self, task_id: str) -> int:
        """Blocks of ``task_id`` handed out and not yet released (0 once the task is abandoned)."""
        return self.cnt.item(self._tindex[task_id], kt.C_PROC)

    def is_abandoned(self, task_id: str) -> bool:
        """Whether ``task_id`` was abandoned (its own failures, or an upstream task's)."""
        return bool(self.tcfg[self._tindex[task_id], kt.F_STATE] == kt.ABANDONED)

    def abandon_reason(self, task_id: str) -> str | None:
        """Why ``task_id`` was abandoned (the reason given to ``abandon_task``), or None."""
        return self._abandon_reason.get(task_id)

    def is_task_done(self, task_id: str) -> bool:
        """Whether no block of ``task_id`` remains (see :meth:`remaining_count`)."""
        return self.remaining_count(task_id) <= 0

    def is_done(self) -> bool:
        """Whether every task is done."""
        return all(self.is_task_done(tid) for tid in self.task_ids)

    def upstream_task_ids(self, task_id: str) -> list[str]:
        """The tasks ``task_id`` depends on directly."""
        return [self.task_ids[u] for u in self.geometry.up_tasks[self._tindex[task_id]]]

    def downstream_task_ids(self, task_id: str) -> list[str]:
        """The tasks that depend on ``task_id`` directly."""
        return [self.task_ids[d] for d in self.geometry.down_tasks[self._tindex[task_id]]]

    @property
    def task_states(self) -> dict[str, TaskState]:
        """A snapshot of every task's counters, ``{task_id: TaskState}`` in task order."""
        return {
            tid: TaskState(
                tid,
                self._nblocks[t],
                self.cnt[t],
                self.counters[tid],
                self.tcfg[t, kt.F_STATE] == kt.ABANDONED,
                self._abandon_reason.get(tid),
                self.tasks[tid].timeout_secs,
            )
            for t, tid in enumerate(self.task_ids)
        }


class SchedulerRetries(SchedulerViews):
    """The Scheduler's retry backoff (``Task(retry_backoff=...)``, :mod:`.scheduling.backoff`):
    failed blocks held back as pending until their retry time, then released as failures by
    the kernels (docs/explanation/algorithms.md#retry-backoff)."""

    _block_base: list[int]
    _clock: Any
    retries: np.ndarray
    status: np.ndarray

    def _release_rows(self, t: int, rows: np.ndarray, codes: np.ndarray) -> None:
        raise NotImplementedError  # the Scheduler's

    def _hold(self, t: int, row: int) -> bool:
        """Row ``row`` of task ``t`` failed: hold it for its retry time if it would be retried (its
        task has a backoff and runs, the block is in flight and has retries left). A held block
        leaves the blocks in flight for the pending ones (status PENDING, ``C_PROC`` - 1); the
        kernels' release does the rest when it is due (:meth:`wake_retries`)."""
        bo = self._backoff
        if bo is None or not bo.on(t) or self.tcfg[t, kt.F_STATE] != kt.RUNNING:
            return False
        gi = self._block_base[t] + row
        attempt = int(self.retries[gi]) + 1  # this failure included
        if self.status[gi] != kt.PROCESSING or attempt > self.tcfg[t, kt.F_MAX_RETRIES]:
            return False  # not in flight (a late release: ignored), or its last attempt: fails for good
        bo.failed(t, row, attempt, self._clock())
        self.status[gi] = kt.PENDING
        self.cnt[t, kt.C_PROC] -= 1
        return True

    def _hold_failures(self, t: int, rows: Any, codes: Any) -> tuple[Any, Any]:
        """``rows``/``codes`` (arrays or lists) without the failed rows :meth:`_hold` kept back."""
        bo = self._backoff
        if bo is None or not bo.on(t):
            return rows, codes
        keep = [i for i in range(len(rows)) if not (codes[i] == kt.R_FAILED and self._hold(t, int(rows[i])))]
        if len(keep) == len(rows):
            return rows, codes
        if isinstance(rows, np.ndarray):
            return rows[keep], codes[keep]
        return [rows[i] for i in keep], [codes[i] for i in keep]

    def wake_retries(self, now: float | None = None) -> float | None:
        """Put the failed blocks whose retry time has come back in their ready queues.

        A no-op without ``Task(retry_backoff=...)``. The runtimes call it once per turn of their
        loop and bound their waits by what it returns; :meth:`acquire_block` and
        :meth:`acquire_blocks` call it too.

        Parameters
        ----------
        now : float, optional
            The time (``time.monotonic()`` seconds; default: now).

        Returns
        -------
        float or None
            When the next held block becomes due (``time.monotonic()`` seconds), or None if
            no block waits for a retry.
        """
        bo = self._backoff
        if bo is None:
            return None
        at = bo.next_at()
        if at is None:
            return None
        if now is None:
            now = self._clock()
        if at > now:
            return at
        by_task: dict[int, list[int]] = {}
        for t, row in bo.due(now):
            if self.tcfg[t, kt.F_STATE] != kt.RUNNING:
                continue  # abandoned (drop_task let its blocks go already)
            self.status[self._block_base[t] + row] = kt.PROCESSING  # back in flight for one step:
            self.cnt[t, kt.C_PROC] += 1  # the kernels' release of a failure (retries + 1, to the back)
            by_task.setdefault(t, []).append(row)
        for t, rows in by_task.items():
            self._release_rows(t, np.array(rows, np.int64), np.full(len(rows), kt.R_FAILED, np.uint8))
        return bo.next_at()

    def next_retry_at(self) -> float | None:
        """When the next block waiting for a retry becomes due (``time.monotonic()`` seconds), or None."""
        bo = self._backoff
        return None if bo is None else bo.next_at()


class SchedulerEnds(SchedulerRetries):
    """How a Scheduler's tasks and the Scheduler itself end: abandonment (a task and every task
    downstream of it) and the block tracking stores' flush and close."""

    geometry: PipelineGeometry
    _tracking: Any
    _b: np.ndarray  # the blocks' packed state (Scheduler.__init__)

    def abandon_task(self, task_id: str, reason: str) -> list[str]:
        """Abandon a task and every task downstream of it: remaining blocks become orphaned."""
        out = []
        stack = [(self._tindex[task_id], reason)]
        while stack:
            t, why = stack.pop()
            if self.tcfg[t, kt.F_STATE] == kt.ABANDONED:
                continue
            tid = self.task_ids[t]
            c = self.cnt[t]
            c[kt.C_ORPHANED] += max(0, self._nblocks[t] - c[kt.C_COMPLETED] - c[kt.C_FAILED] - c[kt.C_ORPHANED])
            c[[kt.C_READY, kt.C_PROC, kt.C_ROOTS_LEFT, kt.C_QLEN, kt.C_GIVEN]] = 0  # nothing ready, queued or in flight
            self.tcfg[t, kt.F_STATE] = kt.ABANDONED
            if self._backoff is not None:
                self._backoff.drop_task(t)  # blocks waiting for a retry: orphaned with the rest
            self._abandon_reason[tid] = why
            out.append(tid)
            stack.extend((d, "upstream task abandoned") for d in self.geometry.down_tasks[t])
        return out

    def flush_tracking(self) -> None:
        """Write the block tracking marks made so far to disk (every store, even after one fails).

        Raises
        ------
        OSError
            The first store that could not be flushed (a full disk...).
        """
        self._tracking.flush()

    def close(self) -> None:
        """Flush and release the block tracking stores, and let go of the blocks' state (the
        plain kernels keep the last Scheduler's); the scheduler is not used afterwards.

        Raises
        ------
        OSError
            The first store that could not be closed.
        """
        surface_plain.forget(self._b)
        self._tracking.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Scheduler(SchedulerEnds):
    """Hands out ready blocks of a pipeline and takes their results back.

    ``Scheduler(pipeline_or_task_or_list, count_all_orphans=True, block_tracking=True)``.
    Order and counters are daisy 2.0.0's (roots first, then FIFO; retries to the back;
    ``max_retries + 1`` attempts; skipped blocks count as completed), with daisy's
    defects fixed (docs/explanation/defects.md).

    The Scheduler owns the blocks' state (packed for the kernels, ``kernels/surface.py``)
    and decides what every call does to it: hand-out with ``check_function`` prechecks,
    release (retries, permanent failures, orphans), abandonment. What it decides from it
    has homes of its own (:mod:`daisy_nb.scheduling`): where the blocks are
    (:attr:`geometry`), the tasks' block tracking on disk, when compiling pays, and the
    read-only views observers take (:class:`SchedulerViews`, above).

    Parameters
    ----------
    tasks : Pipeline or Task or list of Task
        What to schedule.
    count_all_orphans : bool, default True
        daisy's flag; orphans are always counted in full here (accepted for compatibility).
    block_tracking : bool, default True
        Open each task's block tracking: blocks recorded as done are skipped, and
        released blocks are recorded.

    Raises
    ------
    TypeError, ValueError
        Bad tasks (duplicate ids, cycles, connected tasks of different dimensions).
    RuntimeError
        A tracking store written for a different task layout.
    """

    def __init__(self, tasks: Tasks, count_all_orphans: bool = True, block_tracking: bool = True) -> None:
        self.pipeline: Pipeline = as_pipeline(tasks)
        self.geometry = geo = PipelineGeometry(self.pipeline)
        self.task_ids: list[str] = geo.task_ids
        self.tasks: dict[str, Task] = geo.tasks
        self._tindex, self._ndim, self._nblocks = geo.tindex, geo.ndim, geo.nblocks
        self.num_blocks_total = N = geo.num_blocks_total
        order, tt, T = geo.task_ids, geo.tt, len(geo.task_ids)
        # the compile decision first: when it is to compile, numba loads in the background and the
        # kernels called below run plain; the hand-outs switch once it is loaded (scheduling/pace.py)
        self._pace: CompilePace | None = CompilePace(N, geo.downstream_entries, _PACE_SECS)
        if self._pace.decided:
            self._pace = None

        # state: packed into one int64 and one uint8 buffer (see kernels/surface.py);
        # the attributes below are views into them
        cap, maxnd = geo.down_cap, tt.geo.shape[2]
        tables = geo.kernel_tables()
        shapes = {name: a.shape for name, a in tables.items()}
        shapes.update(
            queue=(max(N, 1),),
            cnt=(T, kt.N_CNT),
            tcfg=(T, kt.N_CFG),
            buf_t=(cap,),
            buf_row=(cap,),
            buf_id=(cap,),
            buf_lev=(cap,),
            buf_j=(cap, maxnd),
            scr=(8, max(maxnd, 3)),
            row1=(1,),
        )
        self._b, views = kt.pack_int64(tables, shapes, N)
        self.queue, self.cnt, self.tcfg = views["queue"], views["cnt"], views["tcfg"]
        self._u8 = kt.pack_u8(N)
        self.n_met = np.zeros(N, dtype=np.int32)
        # the plain kernels keep this state for their next call (surface_plain.of_buffers):
        # it goes with this Scheduler, closed or not
        weakref.finalize(self, surface_plain.forget, self._b)
        # fail_block's arguments (one call per permanent failure): the (T, S, W) tuples step builds
        self._groups = kt.groups(views, self._u8, self.n_met, N)
        self.status, _, self.retries, self.preskip = self._groups[1][:4]
        for t, tid in enumerate(order):
            self.tcfg[t, kt.F_MAX_RETRIES] = self.tasks[tid].max_retries
        # retry backoff (scheduling/backoff.py): None when no task has one, so that nothing
        # of the hand-out and release paths changes for daisy's behaviour
        bases = [getattr(self.tasks[tid], "retry_backoff", 0.0) for tid in order]  # 0.0 for a Task pickled before it
        self._backoff = RetryBackoff(bases) if any(b > 0 for b in bases) else None
        self._block_base = [int(tt.info[t, kt.I_BLOCK_BASE]) for t in range(T)]
        self._clock = time.monotonic  # the backoff's clock (tests pass a fake one)

        self.counters = {tid: WorkerCounters(tid) for tid in order}
        for t, tid in enumerate(order):
            self.counters[tid].error_groups.roi_of = functools.partial(geo.block_rois, t)
        self._abandon_reason: dict[str, str] = {}

        # block tracking (daisy 2.0.0 layout) and skip masks: preskip 1 done on disk, 2 skipped by the mask
        self._tracking = PipelineTracking(geo, block_tracking)
        self.tracking: dict[str, TrackingStore] = self._tracking.stores
        self._tracking.flag_done(self.preskip)
        flag_skips(geo, {tid: self.tasks[tid].skip_mask for tid in order}, self.preskip)
        seed_ready(geo, self.cnt, self.status, self.queue)  # scheduling/start.py
        self._dependency_graph: DependencyGraph | None = None
        # one-block buffers and bound values reused by the per-block API (each
        # allocation or lookup costs about as much as the kernel call itself)
        self._one = [np.empty(2 + 4 * nd, np.int64) for nd in self._ndim]
        self._prechecks = Prechecks({tid: self.tasks[tid].check_function for tid in self.task_ids})
        self._checks = self._prechecks.fns
        self._no_rows = np.zeros(1, np.int64)  # placeholders for step()'s unused array arguments
        self._no_codes = np.zeros(1, np.uint8)

    # -- kernel calls ---------------------------------------------------------------
    def _task_of(self, block: Block) -> int:
        """The task number of ``block``; raises if it belongs to no task of this pipeline."""
        t = self._tindex.get(block._task_id)
        if t is None:
            raise ValueError(f"block {block.block_id} belongs to no task of this pipeline")
        return t

    def _acquire_rows(self, t: int, max_n: int, out: np.ndarray) -> int:
        n = ks.step(self._b, self._u8, self.n_met, kt.OP_ACQUIRE, t, max_n, 0, out, self._no_codes)
        if n < 0:
            raise RuntimeError("internal error: scratch buffer too small")
        self._handed_out(n)
        return n

    def _acquire_one(self, t: int) -> list[int] | None:
        """Task ``t``'s next ready block, one kernel call into a preallocated row: ``[row, spatial id,
        *read offset, *read shape, *write offset, *write shape]``, or None if none is ready."""
        out = self._one[t]
        n = ks.step(self._b, self._u8, self.n_met, kt.OP_ACQUIRE_ONE, t, 0, 0, out, self._no_codes)
        if n <= 0:
            if n < 0:
                raise RuntimeError("internal error: scratch buffer too small")
            return None
        if self._pace is not None:  # checked here: the per-block path makes no call once it is decided
            self._handed_out(1)
        return out.tolist()

    def _handed_out(self, n: int) -> None:
        """``n`` more blocks went out: the deferred compile decision counts them until it is taken."""
        if self._pace is not None and self._pace.handed_out(n):
            self._pace = None

    def _plain_surface(self) -> PlainSurface:
        """The plain surface over this scheduler's state (plain mode only: ``ks.step`` is its step)."""
        return ks.plain_surface(self._b, self._u8, self.n_met)

    def _release_rows(self, t: int, rows: np.ndarray, codes: np.ndarray) -> None:
        b, u8, met = self._b, self._u8, self.n_met
        self._released(t, rows, lambda start: ks.step(b, u8, met, kt.OP_RELEASE, t, start, 0, rows, codes))

    def _released(self, t: int, rows, release) -> None:
        """``release(start)`` until every row is released: a block that failed for good (its
        ``max_retries`` used up) stops the release; its dependents are orphaned, then it goes on."""
        start = 0
        while True:
            n = release(start)
            if n >= 0:
                return
            if n == kt.RC_SCRATCH:
                raise RuntimeError("internal error: scratch buffer too small")
            start = kt.failed_at(n)
            self._fail(t, int(rows[start]))
            start += 1

    def _fail(self, t: int, row: int) -> None:
        if ks.fail_block(*self._groups, t, row) == kt.RC_SCRATCH:
            raise RuntimeError("internal error: scratch buffer too small")

    # -- daisy's per-block API --------------------------------------------------------
    def acquire_block(self, task_id: str) -> Block | None:
        """The next ready block of ``task_id`` (status CREATED), or None."""
        t = self._tindex.get(task_id)
        if t is None:
            return None
        if self._backoff is not None:
            self.wake_retries()
        check = self._checks[task_id]
        nd = self._ndim[t]
        while True:
            v = self._acquire_one(t)
            if v is None:
                return None
            row = v[0]
            block = Block._make(
                task_id,
                v[1],
                (tuple(v[2 : 2 + nd]), tuple(v[2 + nd : 2 + 2 * nd])),
                (tuple(v[2 + 2 * nd : 2 + 3 * nd]), tuple(v[2 + 3 * nd :])),
                row,
            )
            if check is not None and self._prechecks.done(task_id, block):
                self._release_one(t, row, kt.R_SKIPPED)  # done already: completed, recorded as done
                continue
            return block

    def release_block(self, block: Block) -> None:
        """Take a block back: SUCCESS completes it, FAILED retries or fails it for good."""
        t = self._task_of(block)
        status = block._status
        if status == 2:  # BlockStatus.SUCCESS
            code = kt.R_SUCCESS
        elif status == 3:  # BlockStatus.FAILED
            code = kt.R_FAILED
        else:
            raise ValueError(
                f"unexpected status for released block: {BlockStatus.name(status)} (set SUCCESS or FAILED)"
            )
        row = block.index
        if row < 0 or row >= self._nblocks[t]:
            row = self.geometry.row_of_block(t, block)
        self._release_one(t, row, code)

    def _release_one(self, t: int, row: int, code: int) -> None:
        if code == kt.R_FAILED and self._backoff is not None and self._hold(t, row):
            if self.tracking:  # the failed attempt is recorded now, as without backoff
                self._tracking.record(t, np.full(1, row, np.int64), np.full(1, code, np.uint8))
            return
        n = ks.step(self._b, self._u8, self.n_met, kt.OP_RELEASE_ONE, t, row, code, self._no_rows, self._no_codes)
        if n < 0:
            if n == kt.RC_SCRATCH:
                raise RuntimeError("internal error: scratch buffer too small")
            self._fail(t, row)
        if self.tracking:  # checked here: the per-block path builds no lists without a store
            self._tracking.record(t, np.full(1, row, np.int64), np.full(1, code, np.uint8))

    def _record(self, t: int, rows: npt.ArrayLike, codes: npt.ArrayLike) -> None:
        """Block tracking of task ``t``'s released ``rows`` and ``codes`` (lists or arrays, built only for a store)."""
        if self.tracking:
            self._tracking.record(t, np.asarray(rows, np.int64), np.asarray(codes, np.uint8))

    # -- batch API (runtimes) ---------------------------------------------------------
    def acquire_blocks(self, task_id: str, max_n: int) -> BlockBatch:
        """Up to ``max_n`` ready blocks of ``task_id`` as arrays (same order and prechecks)."""
        t = self._tindex.get(task_id)
        if t is None or max_n <= 0:
            return self._batch(task_id, 0, _EMPTY)
        if self._backoff is not None:
            self.wake_retries()
        check = self.tasks[task_id].check_function
        out = np.empty(max_n, np.int64)
        n = self._acquire_rows(t, max_n, out)
        if check is None or n == 0:
            return self._batch(task_id, t, out[:n])
        kept = []
        rows = out[:n]
        while len(rows):
            batch = self._batch(task_id, t, rows)
            skip = np.array([self._prechecks.done(task_id, b) for b in batch.blocks()], dtype=bool)
            if skip.any():
                codes = np.full(int(skip.sum()), kt.R_SKIPPED, np.uint8)
                self._release_rows(t, rows[skip], codes)
                self._record(t, rows[skip], codes)
            kept.append(rows[~skip])
            need = max_n - sum(len(k) for k in kept)
            if not skip.any() or need <= 0:
                break
            more = np.empty(need, np.int64)
            rows = more[: self._acquire_rows(t, need, more)]
        return self._batch(task_id, t, np.concatenate(kept) if kept else _EMPTY)

    def describe_blocks(self, task_id: str, rows: npt.ArrayLike) -> BlockBatch:
        """Blocks of ``task_id`` by row, as a batch, without acquiring them (a backup copy of a
        block in flight, ``daisy_nb/runtime/local/backups.py``)."""
        return self._batch(task_id, self._tindex[task_id], rows)

    def _batch(self, task_id, t, rows) -> BlockBatch:
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if len(rows) == 0:
            nd = self._ndim[t] if isinstance(t, int) and t < len(self._ndim) and task_id in self._tindex else 0
            z = np.zeros((0, nd), np.int64)
            return BlockBatch(task_id, rows, _EMPTY, z, z, z, z)
        ids, ro, rs, wo, ws = self.geometry.describe(t, rows)
        return BlockBatch(task_id, rows, ids, ro, rs, wo, ws)

    def release_blocks(self, task_id: str, index: npt.ArrayLike, status: npt.ArrayLike) -> None:
        """Release many blocks: ``status`` per block is SUCCESS (2), FAILED (3), or
        CREATED (0: never started, given back to the front of the queue uncounted)."""
        t = self._tindex.get(task_id)
        if t is None:
            raise ValueError(f"unknown task {task_id!r}")
        rows = np.ascontiguousarray(index, dtype=np.int64)
        codes = np.ascontiguousarray(status, dtype=np.uint8)
        if rows.shape != codes.shape:
            raise ValueError("index and status must have the same length")
        bad = (codes == 1) | (codes > kt.R_FAILED)  # allowed: R_GIVE_BACK, R_SUCCESS, R_FAILED (np.isin is 8x slower)
        if bad.any():
            raise ValueError(f"unexpected status for released blocks: {sorted(set(codes[bad].tolist()))}")
        kept_rows, kept_codes = self._hold_failures(t, rows, codes)
        self._release_rows(t, kept_rows, kept_codes)
        self._record(t, rows, codes)

    # -- the dependency graph ------------------------------------------------------------
    @property
    def dependency_graph(self) -> DependencyGraph:
        """Block dependencies across the pipeline's tasks (made on first use)."""
        if self._dependency_graph is None:
            self._dependency_graph = DependencyGraph(self)
        return self._dependency_graph


class DependencyGraph:
    """Block dependencies across the tasks of a pipeline (``Scheduler.dependency_graph``).

    ``downstream`` is the exact inverse of ``upstream``; both are sorted by spatial ID.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        """Use :attr:`Scheduler.dependency_graph` rather than this.

        Parameters
        ----------
        scheduler : Scheduler
            The scheduler whose pipeline this describes.
        """
        self._s = scheduler

    def downstream(self, block: Block) -> list[Block]:
        """Blocks (of any task) that wait for ``block``, sorted by spatial id."""
        s = self._s
        t = s._task_of(block)
        g = s.geometry
        row = g.row_of_block(t, block)
        cap = g.down_cap
        maxnd = g.tt.geo.shape[2]
        bt, br, bl = (np.empty(cap, np.int64) for _ in range(3))
        bj = np.empty((cap, maxnd), np.int64)
        scr = np.empty((8, max(maxnd, 3)), np.int64)
        scr[7, 0] = -1
        tt, e, p = g.tt, g.e, g.tptr
        n = ks._down_lj(
            tt.geo,
            tt.info,
            tt.lvl_off,
            tt.lvl_cnt,
            tt.lvl_start,
            tt.conf_ptr,
            tt.conf_jump,
            e[0],
            e[3],
            e[4],
            p[2],
            p[3],
            t,
            row,
            scr,
            bt,
            br,
            bl,
            bj,
        )
        ids = np.empty(n, np.int64)
        for u in set(bt[:n].tolist()):
            sel = bt[:n] == u
            ids[sel] = g.describe(u, br[:n][sel])[0]
        return self._blocks(bt[:n], br[:n], ids)

    def upstream(self, block: Block) -> list[Block]:
        """Blocks (of any task) that ``block`` waits for, sorted by spatial id."""
        s = self._s
        t = s._task_of(block)
        geo = s.geometry
        row = geo.row_of_block(t, block)
        tt = geo.tt
        lay = geo.layouts[t]
        ts, rs, ids = [], [], []
        out = np.empty(max(1, len(lay.conf_offsets)), np.int64)
        n = kg.intra_neighbours(
            tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.conf_ptr, tt.conf_jump, t, row, False, out
        )
        rows = out[:n].copy()
        ts.append(np.full(n, t, np.int64))
        rs.append(rows)
        ids.append(geo.describe(t, rows)[0])
        g = np.empty((1, lay.ndim), np.int64)
        kg.rows_to_grid(tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.geo, t, np.array([row], np.int64), g)
        for k, (u, d) in enumerate(geo.edges):
            if d != t:
                continue
            lo = np.array([geo.e[1][geo.e[2][k, ax] + g[0, ax], 0] for ax in range(lay.ndim)], np.int64)
            hi = np.array([geo.e[1][geo.e[2][k, ax] + g[0, ax], 1] for ax in range(lay.ndim)], np.int64)
            m = int(np.prod(np.maximum(hi - lo, 0)))
            if m:
                r2, i2 = np.empty(m, np.int64), np.empty(m, np.int64)
                kg.grid_box_rows(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, u, lo, hi, r2, i2)
                ts.append(np.full(m, u, np.int64))
                rs.append(r2)
                ids.append(i2)
        return self._blocks(np.concatenate(ts), np.concatenate(rs), np.concatenate(ids))

    def _blocks(self, ts, rs, ids) -> list[Block]:
        s = self._s
        order = np.argsort(ids, kind="stable")
        out = []
        for k in order:
            t = int(ts[k])
            b = s._batch(s.task_ids[t], t, rs[k : k + 1]).blocks()[0]
            out.append(b)
        return out
