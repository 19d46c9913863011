"""What a task's workers cost: worker-seconds held, and the share of them that ran blocks.

Kept per task by the Scheduler (its ``WorkerCounters``), filled by every runtime, read by
the summary, the JSON observer and the dashboard. Part of the core: imports nothing.
"""

from __future__ import annotations

__all__ = ["JobSeconds"]


class JobSeconds:
    """What a task's workers cost: worker-seconds held, and the share of them that ran blocks.

    What a user pays for on a cluster (docs/explanation/pool.md#job-seconds). ``held``:
    each worker's life as the scheduler process sees it, from its start (a local worker
    process, or a worker function that submits a job and waits for it) to its end;
    ``busy``: the time blocks of the task ran, on any worker (local workers' batches,
    Clients' blocks from the moment they started them, dask batches). Their ratio is the
    task's efficiency; a job held while it has nothing to run lowers it. Times are
    ``time.monotonic()`` seconds; kept in the scheduler process only.
    """

    __slots__ = ("_open", "_closed", "busy")

    def __init__(self) -> None:
        self._open: dict[object, float] = {}  # a worker held now -> when it started
        self._closed = 0.0  # seconds held by workers that ended
        self.busy = 0.0

    def started(self, key: object, now: float) -> None:
        """Worker ``key`` started at ``now``: held from then until :meth:`ended`."""
        self._open[key] = now

    def ended(self, key: object, now: float) -> None:
        """Worker ``key`` ended at ``now`` (a key never started, or ended already, is ignored)."""
        t0 = self._open.pop(key, None)
        if t0 is not None:
            self._closed += max(0.0, now - t0)

    def ran(self, secs: float) -> None:
        """Blocks of the task ran ``secs`` seconds."""
        self.busy += max(0.0, secs)

    def held(self, now: float) -> float:
        """Seconds held by the task's workers up to ``now``, those still running included."""
        return self._closed + sum(max(0.0, now - t0) for t0 in self._open.values())
