"""The block workers' batches in shared memory: the part of the shell that reads and writes them.

:class:`Batches` writes the batches :class:`.blocks.BlockCore` hands out into a worker's
segment (layout in :mod:`._shm`), reads back what the worker wrote (a status per block,
the batch's run time, per-block stats when the task tracks resources, the block running
now and since when), and tells the core (batch done, a block raised, the worker exited),
drawing the batches on the dashboard's timeline. Signals to the worker and its process
are :class:`.processes.Processes`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from daisy_nb.block import BlockStatus
from daisy_nb.errors import WorkerError
from daisy_nb.runtime.common.failures import record_error
from daisy_nb.runtime.local import _shm, wire
from daisy_nb.runtime.local.blocks import BlockCore, ExitReport
from daisy_nb.runtime.local.giveback import Running
from daisy_nb.runtime.local.records import BUSY, BlockProcess

__all__ = ["Batches"]

_CREATED, _SUCCESS, _FAILED = BlockStatus.CREATED, BlockStatus.SUCCESS, BlockStatus.FAILED


class Batches:
    """Batches in block workers' shared memory (see the module docstring)."""

    def __init__(self, scheduler, core: BlockCore):
        self.s = scheduler
        self.core = core
        self.timeline: Any = None  # a dashboard.timeline.Timeline, or None

    def write(self, w: BlockProcess, k: int, b) -> None:
        """Write batch ``b`` (a :class:`daisy_nb.scheduler.BlockBatch`) into ``w``'s slot ``k``."""
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
        a[_shm.H_LIMIT] = n
        a[_shm.H_DROP] = 0
        a[_shm.H_CUR] = -1
        if w.tr.t_first is None:
            w.tr.t_first = time.monotonic()

    def statuses(self, w: BlockProcess, k: int, n: int) -> np.ndarray:
        o = w.off["status"]
        return w.bufs[k][o : o + n].astype(np.uint8)

    def done(self, w: BlockProcess, redispatch: bool) -> list:
        """The oldest batch of ``w`` is done: its statuses and stats read, the core told; its actions."""
        tr = w.tr
        k, index = w.queue[0]
        a, n = w.bufs[k], len(index)
        st = self.statuses(w, k, n)
        elapsed = int(a[_shm.H_ELAPSED])
        if tr.res is not None:
            self.add_stats(w, k, n, st)
        secs = None
        if self.core.backups.on:  # a speculative task's workers write each block's own time
            o = w.off["secs"]
            secs = a[o : o + n].copy()
        actions = self.core.batch_done(w.wid, st, elapsed, dispatch=redispatch, now_ns=time.monotonic_ns(), secs=secs)
        t = self.core.tasks[tr.tid]
        tr.per_block, tr.batch_k = t.per_block, t.batch_k
        ran = n - int(np.count_nonzero(st == _CREATED))  # not the blocks it left (given back: they run elsewhere)
        if self.timeline is not None and ran:  # one bar per batch: its run time is in shared memory
            t1 = time.monotonic()
            self.timeline.bar(("w", w.wid), tr.tid, t1 - elapsed / 1e9, t1, ran, int(np.count_nonzero(st == _FAILED)))
        return actions

    def raised(self, w: BlockProcess, error: wire.Raised) -> None:
        """A block raised (status FAILED: none is left running): the worker exits (daisy 2.0's dirty
        exit); blocks it ran count, the rest and a batch sent ahead were never started: given back."""
        tr = w.tr
        statuses = [self.statuses(w, k, len(index)) for k, index in w.queue]
        if tr.res is not None:
            for (k, index), st in zip(w.queue, statuses):
                self.add_stats(w, k, len(index), st, st >= _SUCCESS)
        k0 = w.queue[0][0]
        st0 = statuses[0]
        ran = self.core.batch_raised(w.wid, statuses)
        if self.timeline is not None:
            t1 = time.monotonic()
            elapsed = int(w.bufs[k0][_shm.H_ELAPSED]) / 1e9
            self.timeline.bar(("w", w.wid), tr.tid, t1 - elapsed, t1, ran, int(np.count_nonzero(st0 == _FAILED)))
        structured = WorkerError(error.type, error.message, error.traceback, error.block_id)
        record_error(self.s.counters[tr.tid], error.text(tr.tid), log=w.err_path, error=structured)

    def add_stats(self, w: BlockProcess, k: int, n: int, st, measured=None) -> None:
        """Fold the per-block stats of slot ``k``'s first ``n`` blocks into the task's totals."""
        o = w.off["stats"]
        rows = w.fbufs[k][o : o + n * _shm.NSTATS].reshape(n, _shm.NSTATS)
        failed = st == _FAILED
        if measured is not None:
            rows, failed = rows[measured], failed[measured]
        w.tr.res.add(rows, failed)

    def exited(self, w: BlockProcess, rc: int, orphan: bool) -> ExitReport:
        """``w``'s process ended: its batches' statuses (and stats) read, the core told."""
        statuses = [self.statuses(w, k, len(index)) for k, index in w.queue]
        if w.tr.res is not None:  # blocks it finished have their stats written
            for (k, index), st in zip(w.queue, statuses):
                self.add_stats(w, k, len(index), st, st >= _SUCCESS)
        if self.timeline is not None and w.state == BUSY and w.queue:
            self._timeline_died(w, fails=not (self.core.aborting or orphan))
        return self.core.exited(w.wid, statuses, rc, orphaned=orphan)

    def started(self, workers: Iterable) -> dict[int, int]:
        """For busy block workers of tasks with a timeout: when the block they run started (``cur``
        and its start in shared memory: time a batch waited in its slot does not count)."""
        out: dict[int, int] = {}
        for w in workers:
            if isinstance(w, BlockProcess) and w.tr.timeout_ns is not None and w.state == BUSY:
                for k, _ in w.queue:  # only the batch being run has cur >= 0
                    a = w.bufs[k]
                    if int(a[_shm.H_CUR]) >= 0:
                        out[w.wid] = int(a[_shm.H_START])
                        break
        return out

    def running(self, workers: Iterable) -> dict[int, Running]:
        """For busy block workers: their oldest batch's running row, its start and its status
        (read in that order: a worker that moves on meanwhile shows another start or status)."""
        out: dict[int, Running] = {}
        for w in workers:
            if isinstance(w, BlockProcess) and w.state == BUSY and w.queue and w.bufs is not None:
                k, idx = w.queue[0]
                a = w.bufs[k]
                c = int(a[_shm.H_CUR])
                if 0 <= c < len(idx):
                    out[w.wid] = Running(c, int(a[_shm.H_START]), int(a[w.off["status"] + c]))
        return out

    def cut(self, w: BlockProcess, k: int, keep: int) -> None:
        """Lower the limit of ``w``'s batch in slot ``k``: it starts none of its blocks from ``keep`` on."""
        w.bufs[k][_shm.H_LIMIT] = keep

    def drop(self, w: BlockProcess, k: int, pos: int) -> None:
        """Interrupt block ``pos`` of ``w``'s batch in slot ``k`` if it runs it (``_shm``'s ``drop``)."""
        from daisy_nb.runtime.net.drops import DROP_SIGNAL  # (with the Client's frames: only speculative runs)

        w.bufs[k][_shm.H_DROP] = pos + 1
        try:
            os.kill(w.proc.pid, DROP_SIGNAL)
        except (ProcessLookupError, PermissionError):  # it has just ended: its exit is reaped as any
            pass

    def current_block(self, w: BlockProcess) -> tuple[int | None, float | None]:
        """The block ``w`` runs now (its row) and since when (monotonic seconds), else ``(None, None)``."""
        if not w.queue or w.bufs is None:
            return None, None
        k, idx = w.queue[0]
        c = int(w.bufs[k][_shm.H_CUR])
        if 0 <= c < len(idx):
            return int(idx[c]), int(w.bufs[k][_shm.H_START]) / 1e9
        return None, None

    def running_blocks(self, workers: Iterable) -> list:
        """The block each block worker runs (from ``cur`` in its segment), for the hang alarm:
        ``(task id, block rows, label, pid, started or None)``."""
        out: list[tuple] = []
        for w in list(workers):
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
