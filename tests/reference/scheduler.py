"""Set-based reference model of daisy's Scheduler (CORE sections 5 and 6).

What it keeps from daisy 2.0.0 (CORE 6.2-6.6): one processing queue per task
that hands out its roots first (in enumeration order) and then a FIFO of
queued blocks; retries go to the back of the FIFO; a block is attempted
``max_retries + 1`` times; a precheck skip counts as skipped *and* completed
and is released as a success; the same counters, with
``pending = total - ready - processing - completed - failed - orphaned``.

What it fixes (CORE section 10), deliberately:

* (a) a permanent failure orphans exactly the blocks that transitively depend
  on it and have not succeeded, failed or already been orphaned, so nothing is
  counted twice (10.2, 10.7; daisy's ReadySurface walk in 5.4/5.5 can
  over-count and then never finish);
* (b) every task's roots are its blocks with **no upstream block at all**
  (intra- and inter-task), not "level 0 of source tasks only": for a source
  task that is exactly level 0, for a downstream task normally nothing, and a
  downstream block that reads nothing upstream still runs (10.3);
* (c) downstream lists are the exact inverse of upstream lists (via
  :class:`RefPipeline`, 10.1, 10.5).

Instead of daisy's surface/boundary sets (CORE 5) it keeps a per-block status
and a count of upstream blocks that have not succeeded yet; a block becomes
ready when that count drops to 0. With (c) this is equivalent to daisy's
``mark_success`` readiness rule. It does not model done markers, timeouts,
workers or the v2 typestate.
"""

from __future__ import annotations

from collections import deque

from .pipeline import RefPipeline

__all__ = ["RefScheduler"]

# Per-block status values (blocks not in the map are waiting / ready / processing).
SUCCESS = "success"
FAILED = "failed"
ORPHANED = "orphaned"


class _TaskQueue:
    """daisy's ``ProcessingQueue`` (CORE 6.2): roots first, then the FIFO."""

    def __init__(self, roots: list[int]):
        """``ProcessingQueue(num_roots, root generator)`` of CORE 6.1/6.2, with the roots as a list."""
        self.roots: deque[int] = deque(roots)
        self.ready: deque[int] = deque()
        self.processing: set[int] = set()
        self.retries: dict[int, int] = {}

    def get_next(self) -> int | None:
        """``get_next()`` of CORE 6.2: the next root if any is left, else the front of the FIFO, else None."""
        if self.roots:
            return self.roots.popleft()
        if self.ready:
            return self.ready.popleft()
        return None


class RefScheduler:
    """Reference scheduler over a :class:`RefPipeline` (CORE 6, with 10.2/10.3/10.7 fixed).

    Parameters
    ----------
    pipeline : RefPipeline
    max_retries : dict[str, int]
        Per task; a block is attempted ``max_retries + 1`` times. Missing tasks
        default to 2 (daisy's default).
    skip : dict[str, set[int]] or None
        Per task, the spatial IDs the precheck (done marker / ``check_function``)
        reports as already done.
    """

    def __init__(self, pipeline: RefPipeline, max_retries: dict[str, int], skip: dict[str, set[int]] | None = None):
        """Scheduler construction (CORE 6.1): queues and counters per task, roots per fix (b)."""
        self.pipeline = pipeline
        self.max_retries = {t: int(max_retries.get(t, 2)) for t in pipeline.tasks}
        self.skip = {t: set((skip or {}).get(t, ())) for t in pipeline.tasks}

        self.status: dict[tuple[str, int], str] = {}
        self.unmet: dict[tuple[str, int], int] = {}
        self.queues: dict[str, _TaskQueue] = {}
        self.counters: dict[str, dict[str, int]] = {}
        for t in pipeline.task_order:
            roots = []
            for b in pipeline.tasks[t].blocks():
                n_up = len(pipeline.upstream(t, b))
                self.unmet[(t, b.spatial_id)] = n_up
                if n_up == 0:
                    roots.append(b.spatial_id)
            self.queues[t] = _TaskQueue(roots)
            self.counters[t] = {
                "total": pipeline.tasks[t].num_blocks,
                "ready": len(roots),
                "processing": 0,
                "completed": 0,
                "skipped": 0,
                "failed": 0,
                "orphaned": 0,
            }

    # ------------------------------------------------------------------
    # CORE 6.3
    # ------------------------------------------------------------------

    def acquire_block(self, task_id: str) -> int | None:
        """Hand out the next block of ``task_id`` (its spatial ID) or None (CORE 6.3).

        Loops like daisy: a block the precheck reports as done is counted as
        skipped, released as a success (so also counted completed, and its
        downstream blocks are unlocked) and the next one is tried. Unknown task
        ids give None.
        """
        if task_id not in self.queues:
            return None
        queue, c = self.queues[task_id], self.counters[task_id]
        while True:
            sid = queue.get_next()
            if sid is None:
                return None
            c["ready"] -= 1
            c["processing"] += 1
            queue.processing.add(sid)
            if sid in self.skip[task_id]:
                c["skipped"] += 1
                self.release_block(task_id, sid, True)
                continue
            return sid

    # ------------------------------------------------------------------
    # CORE 6.4
    # ------------------------------------------------------------------

    def release_block(self, task_id: str, spatial_id: int, success: bool) -> None:
        """Return a block handed out by :meth:`acquire_block` (CORE 6.4).

        Success: completed; every downstream block whose last unmet upstream
        this was, and that is not orphaned, is appended to *its own* task's
        FIFO in increasing spatial-ID order. Failure: retried at the back of
        the FIFO while ``retries < max_retries``; otherwise failed, and the
        blocks that transitively depend on it (and have not succeeded, failed
        or been orphaned yet) are orphaned, each counted once on its own task.
        Releasing a block that is not processing raises ValueError (daisy 2.0
        would silently count it).
        """
        queue, c = self.queues[task_id], self.counters[task_id]
        if spatial_id not in queue.processing:
            raise ValueError(f"block {task_id}/{spatial_id} is not being processed")
        queue.processing.remove(spatial_id)
        c["processing"] -= 1
        block = self.pipeline.block(task_id, spatial_id)

        if success:
            self.status[(task_id, spatial_id)] = SUCCESS
            c["completed"] += 1
            for d_task, d in self.pipeline.downstream(task_id, block):
                key = (d_task, d.spatial_id)
                self.unmet[key] -= 1
                if self.unmet[key] == 0 and key not in self.status:
                    self.queues[d_task].ready.append(d.spatial_id)
                    self.counters[d_task]["ready"] += 1
            return

        retries = queue.retries.get(spatial_id, 0)
        if retries < self.max_retries[task_id]:
            queue.retries[spatial_id] = retries + 1
            queue.ready.append(spatial_id)
            c["ready"] += 1
            return

        self.status[(task_id, spatial_id)] = FAILED
        c["failed"] += 1
        for key in self._new_orphans(task_id, block):
            self.status[key] = ORPHANED
            self.counters[key[0]]["orphaned"] += 1

    def _new_orphans(self, task_id: str, block) -> list[tuple[str, int]]:
        """All blocks reachable downstream of ``block`` with no status yet (CORE 5.4 as fixed by 10.2/10.7).

        A breadth-first walk over :meth:`RefPipeline.downstream` with a visited
        set, so each block is reported at most once.
        """
        seen: set[tuple[str, int]] = set()
        todo = deque(self.pipeline.downstream(task_id, block))
        orphans = []
        while todo:
            t, b = todo.popleft()
            key = (t, b.spatial_id)
            if key in seen:
                continue
            seen.add(key)
            if key not in self.status:
                orphans.append(key)
            todo.extend(self.pipeline.downstream(t, b))
        return orphans

    # ------------------------------------------------------------------
    # CORE 6.6
    # ------------------------------------------------------------------

    def states(self) -> dict[str, dict]:
        """Per task: total, ready, processing, completed, skipped, failed, orphaned, pending, is_done (CORE 6.6)."""
        out = {}
        for t in self.pipeline.task_order:
            c = dict(self.counters[t])
            c["pending"] = c["total"] - c["ready"] - c["processing"] - c["completed"] - c["failed"] - c["orphaned"]
            c["is_done"] = c["completed"] + c["failed"] + c["orphaned"] == c["total"]
            out[t] = c
        return out

    def is_done(self) -> bool:
        """True when every task is done, ``completed + failed + orphaned == total`` (CORE 6.6)."""
        return all(s["is_done"] for s in self.states().values())
