"""Block workers that serve the next task: a worker with nothing left in its task joins another (sans-I/O).

A block worker that has nothing to take while every block its task has left is in flight (the
task's tail), or whose task is done, used to quit; the next task's workers were then started
afresh: a fork, the worker's set-up, its first imports, while the slots stood idle (32 workers
on 2 cores: about 0.15 s per task of a pipeline). With :class:`Reuse`, such a worker *moves* to
another task of the run that it can serve: a block-function task (``process_function(block)``)
that runs the same function (``DAISY_NB_REUSE_WORKERS=same``, the default; ``any``: whatever its
function), with the same ``requires`` (so the ``resources`` it holds are the same), the same
number of dimensions and the same ``resource_tracking`` (its batches' shared-memory layout). The worker
gets that task's set-up (its function, log files, ``DAISY_CONTEXT``) and runs the task's
``init_fn``: ``init_fn`` still runs once per worker process of each task. What a worker keeps
from its earlier task is what a process keeps: the modules it imported, and what the block
functions kept in module globals (``docs/explanation/pool.md#reuse``), which is why by default
only a task with the same function is served. ``DAISY_NB_REUSE_WORKERS=off`` turns reuse off (every
task's workers are new processes, as with daisy).

The decisions, for a worker of task ``t`` with nothing more of ``t`` to run (:meth:`Reuse.leave`):

* **join** a task ``u`` that ``t``'s workers can serve (in the run's task order) that wants a
  worker now: ``u`` is not done nor abandoned, may start a worker (its restart cap: ``may_join``),
  has fewer than ``max_workers`` workers, and more ready blocks than its starting and waiting
  workers can take (the spawn plan's rule, :func:`.budget.plan_spawns`). The worker is ``u``'s
  from then on, starting (:class:`~.actions.Retask`), and counts as a worker start of ``u``.
* **wait** parked, while such a task ``u`` has blocks not handed out yet (pending on its
  upstream tasks, or ready) and room for one more worker: ``max_workers`` less its workers, less
  the workers already waiting at their tails for it. Parked workers try again whenever the pool
  dispatches them, so a waiting worker joins ``u`` as soon as ``u``'s blocks are ready, before
  the spawn plan would start a new process for them.
* **quit** otherwise (nothing it can serve, or the run is being aborted).

Invariant (in :func:`.blocks.check_tail`): a worker parked at its task's tail waits for a task it
can serve, with room for it (or for backups of its own task, :mod:`.backups`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from daisy_nb.runtime.local.actions import Action, Retask
from daisy_nb.runtime.local.states import WorkerState

__all__ = ["Reuse"]


class Reuse:
    """Which task a block worker with nothing left in its own serves next (module docstring)."""

    def __init__(self, core):  # a .blocks.BlockCore (not imported: it imports this module)
        self.core = core
        self.serves: dict[str, tuple[str, ...]] = {}  # per task, the tasks its workers can serve
        self.max_workers: dict[str, int] = {}
        self.may_join: Callable[[str], bool] = lambda tid: True  # the shell's: the task's restart cap

    def add_task(self, tid: str, max_workers: int, serves: Iterable[str]) -> None:
        """Task ``tid`` (``max_workers``) and the tasks its workers may move to, in order."""
        self.max_workers[tid] = int(max_workers)
        self.serves[tid] = tuple(u for u in serves if u != tid)

    def leave(self, w) -> list[Action]:
        """``w`` (idle, no batch) has nothing more of its task to run: join, wait, or quit."""
        core = self.core
        if not core.aborting:
            for u in self._open(w.tid):
                if core.alive(u) < self.max_workers[u] and core.s.ready_count(u) > core.waiting(u):
                    return self._move(w, u)
            if self.waits_for(w) is not None:
                core.park(w)
                return []
        return core.quit(w.wid)

    def _move(self, w, tid: str) -> list[Action]:
        """``w`` (no batch) is task ``tid``'s worker from now on; it starts again."""
        core = self.core
        if w.queue or w.doomed or w.raised:
            raise RuntimeError(f"block worker {w.wid} moved to task {tid!r} while it holds batches or exits")
        core.of_task[w.tid].discard(w)
        core._parked.discard(w)
        core.add_task(tid)
        core.of_task[tid].add(w)
        w.tid, w.state, w.finished, w.timed_out = tid, WorkerState.STARTING, 0, False
        return [Retask(w.wid, tid)]

    def waiting(self) -> set:
        """The parked workers with nothing left in their task that may serve another (they look again
        after the others: :meth:`.blocks.BlockCore.dispatch_parked`)."""
        core = self.core
        return {w for w in core.parked() if self.serves.get(w.tid) and core.nothing_left(w.tid)}

    def waits_for(self, w) -> str | None:
        """The task ``w`` may wait parked for (blocks left and room for one more worker), or None."""
        core = self.core
        for u in self._open(w.tid):
            if core.nothing_left(u):
                continue
            room = self.max_workers[u] - core.alive(u) - self._waiting_for(u, w)
            if room > 0:
                return u
        return None

    def _open(self, tid: str) -> list[str]:
        s = self.core.s
        return [
            u for u in self.serves.get(tid, ()) if not s.is_abandoned(u) and not s.is_task_done(u) and self.may_join(u)
        ]

    def _waiting_for(self, u: str, but) -> int:
        """Workers other than ``but`` parked with nothing left in their task that can serve ``u``."""
        return sum(1 for x in self.waiting() if x is not but and u in self.serves[x.tid])
