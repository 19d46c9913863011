"""Which workers to start: the ``resources`` budget and the spawn plan, without processes or clocks.

:class:`Budget` is what the run's ``resources`` allow and what its workers hold.
:func:`plan_spawns` decides which tasks get a new worker this loop turn: per task up to
``max_workers`` (workers told to quit do not count), only while the task has more ready
blocks than its starting and waiting workers can take, not after its restarts are
exhausted, not before the time a task must wait (a worker function that returned
without its worker), within the budget, and at most ``burst`` in all (the first workers
get their batches while the rest are forked). A task that does not fit the budget asks
for a parked worker of another task to give its share up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Budget", "SpawnPlan", "TaskNeed", "plan_spawns"]


class Budget:
    """The run's ``resources`` (``{name: amount}``) and what the live workers hold."""

    def __init__(self, total: Mapping[str, int]):
        self.total = {k: int(v) for k, v in total.items()}
        self.used = dict.fromkeys(self.total, 0)

    def fits(self, requires: Mapping[str, int]) -> bool:
        return all(self.used.get(k, 0) + v <= self.total.get(k, 0) for k, v in requires.items())

    def take(self, requires: Mapping[str, int]) -> None:
        for k, v in requires.items():
            self.used[k] = self.used.get(k, 0) + v

    def give(self, requires: Mapping[str, int]) -> None:
        for k, v in requires.items():
            self.used[k] -= v
            if self.used[k] < 0:
                raise RuntimeError(f"resource {k!r} given back more often than taken")

    def validate(self) -> None:
        for k, v in self.used.items():
            assert 0 <= v <= self.total.get(k, 0), f"resource {k!r}: {v} in use of {self.total.get(k, 0)}"


@dataclass
class TaskNeed:
    """What the spawn plan needs to know of a task this turn."""

    tid: str
    ready: int  # ready blocks
    alive: int  # workers that count toward max_workers
    waiting: int  # workers starting or waiting for work
    max_workers: int
    requires: Mapping[str, int] = field(default_factory=dict)
    closed: bool = False  # done, abandoned, its restarts exhausted, or told to wait: no new worker


@dataclass
class SpawnPlan:
    start: list[str]  # task ids, one entry per worker to start, in order
    more: bool  # the burst was used up with more to start (the loop should come back at once)
    free_for: list[str]  # tasks that want a parked worker of another task to give its budget up


def plan_spawns(tasks: Iterable[TaskNeed], budget: Budget, burst: int) -> SpawnPlan:
    """Which workers to start now (see the module docstring). ``budget`` is not changed."""
    need = [t for t in tasks if not t.closed]
    used = dict(budget.used)

    def fits(req: Mapping[str, int]) -> bool:
        return all(used.get(k, 0) + v <= budget.total.get(k, 0) for k, v in req.items())

    start: list[str] = []
    free_for: list[str] = []
    progress = True
    while progress:
        progress = False
        for t in need:
            if t.alive >= t.max_workers or t.ready <= t.waiting:
                continue
            if not fits(t.requires):
                if t.tid not in free_for:
                    free_for.append(t.tid)
                continue
            if len(start) >= burst:
                return SpawnPlan(start, True, free_for)
            start.append(t.tid)
            t.alive += 1
            t.waiting += 1
            for k, v in t.requires.items():
                used[k] = used.get(k, 0) + v
            progress = True
    return SpawnPlan(start, False, free_for)
