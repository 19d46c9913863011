"""Which worker processes the pool has: :class:`Roster`.

A part of the pool's worker processes (:class:`.processes.Processes`, which starts,
signals and reaps them): the workers not reaped yet, by id and by task, the ids given
out, how many are block workers, the share of the run's ``resources`` they hold
(:class:`.budget.Budget`: taken when a worker joins, given back when it leaves), and
how they look to the dashboard and the hang alarm (:class:`.records.WorkerView`).

It decides nothing about a worker and touches no process, socket or shared memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from daisy_nb.runtime.local.budget import Budget
from daisy_nb.runtime.local.pool_parts import PoolTaskRun
from daisy_nb.runtime.local.records import (
    PARKED,
    QUITTING,
    STATE_NAMES,
    BlockProcess,
    FunctionWorker,
    WorkerView,
    job_text,
)

__all__ = ["Roster", "Worker"]

Worker = BlockProcess | FunctionWorker


class Roster:
    """The pool's worker processes not reaped yet (see the module docstring).

    Parameters
    ----------
    budget : mapping of str to int
        The run's ``resources``.
    """

    def __init__(self, budget: Mapping[str, int]) -> None:
        self.workers: dict[int, Worker] = {}  # by worker id (the block workers' shell reads it too)
        self.budget = Budget(budget)  # the run's resources and what the workers here hold
        self.block_workers = 0  # workers of block-function tasks here
        self._of_task: dict[str, set[Worker]] = {}
        self._next_wid = 0

    def new_wid(self) -> int:
        """The id of the next worker (ids are never reused in a run)."""
        wid = self._next_wid
        self._next_wid += 1
        return wid

    def add(self, w: Worker) -> None:
        """``w`` has started: it holds its task's ``requires`` until :meth:`remove`."""
        self.budget.take(w.tr.requires)
        self.workers[w.wid] = w
        self.block_workers += w.block_worker
        self.of(w.tr).add(w)

    def remove(self, w: Worker) -> None:
        """``w`` has ended (reaped, or given up on): it is no longer counted and gives its resources back."""
        self.of(w.tr).discard(w)
        self.block_workers -= w.block_worker
        self.workers.pop(w.wid, None)
        self.budget.give(w.tr.requires)

    def move(self, w: Worker, tr: PoolTaskRun) -> None:
        """``w`` serves ``tr`` from now on (its ``requires`` are the same: the budget does not change)."""
        self.of(w.tr).discard(w)
        self.budget.give(w.tr.requires)
        w.tr = tr
        self.budget.take(tr.requires)
        self.of(tr).add(w)

    def __iter__(self) -> Iterator[Worker]:
        """Every worker, on a copy (callers may remove workers while iterating)."""
        return iter(list(self.workers.values()))

    def __len__(self) -> int:
        return len(self.workers)

    def of(self, tr: PoolTaskRun) -> set[Worker]:
        """``tr``'s workers (the set itself)."""
        ws = self._of_task.get(tr.tid)
        if ws is None:
            ws = self._of_task[tr.tid] = set()
        return ws

    def is_current(self, w: Worker) -> bool:
        """``w`` is here (not reaped nor forgotten yet)."""
        return self.workers.get(w.wid) is w

    def function_worker(self, wid: int, tr: PoolTaskRun | None = None) -> FunctionWorker | None:
        """Worker function ``wid`` (of ``tr``, when given), or None if there is no such one here."""
        w = self.workers.get(wid)
        if not isinstance(w, FunctionWorker) or (tr is not None and w.tr is not tr):
            return None
        return w

    def functions_alive(self, tr: PoolTaskRun) -> int:
        """``tr``'s worker functions not asked to quit (they count toward ``max_workers``)."""
        return sum(1 for w in self.of(tr) if w.state != QUITTING)

    def parked_holding(self, tr: PoolTaskRun) -> Worker | None:
        """A parked worker of another task that holds a resource ``tr`` needs, or None."""
        for w in self:
            if w.tr is not tr and w.state == PARKED and set(w.tr.requires) & set(tr.requires):
                return w
        return None

    def views(self, current_block: Callable[[BlockProcess], tuple[int | None, float | None]]) -> list[WorkerView]:
        """Every worker now, as the dashboard and the hang alarm see it; ``current_block``: a block
        worker's running block and since when (the block workers' batches know)."""
        out = []
        for w in self:
            row, since = current_block(w) if isinstance(w, BlockProcess) else (None, None)
            out.append(
                WorkerView(
                    wid=w.wid,
                    task=w.tr.tid,
                    kind="block" if w.block_worker else "function",
                    pid=int(w.proc.pid) if w.proc is not None else None,
                    state=STATE_NAMES.get(w.state, str(w.state)),
                    row=row,
                    since=since,
                    t_spawn=w.t_spawn,
                    job=job_text(w.job),
                )
            )
        return out
