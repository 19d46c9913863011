"""What a runtime shows its observers: frozen, typed snapshots (standard library only).

The dashboard and the hang alarm read a run through these and the Scheduler's public
reads (``describe``, ``counts``, ``block_states``...), never through a runtime's own
records or its workers' shared memory. A runtime that runs blocks offers

* ``running_blocks() -> list[RunningBlock]``: what runs now, per worker or connection
  (the hang alarm names these);
* ``worker_snapshots() -> list[WorkerSnapshot]``: its workers as the dashboard lists
  them (optional: a runtime without it shows no worker table).

Times are ``time.monotonic()`` seconds. Built on the runtime's own thread, so a snapshot
never sees a half-updated worker.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WORKER_STATES", "RunningBlock", "WorkerSnapshot"]

# the states a WorkerSnapshot can be in
WORKER_STATES = ("starting", "idle", "busy", "parked", "quitting", "dead")


@dataclass(frozen=True)
class RunningBlock:
    """The block a worker runs now (or the batch it was sent and has not started)."""

    task_id: str
    rows: tuple[int, ...]  # scheduler rows of ``task_id``: the running block first (at most a few more of its batch)
    worker: str  # a label: "worker 3", "Client of worker 4 at 10.0.0.5:40112", "dask worker tcp://... (a batch of 8)"
    pid: int | None  # its process, when known
    started: float | None  # when the block started (monotonic seconds); None: sent, not started yet

    @classmethod
    def of(cls, entry) -> RunningBlock:
        """``entry`` itself, or one from the tuple ``(task_id, rows, worker, pid, started)`` that
        runtimes returned before this type existed."""
        if isinstance(entry, cls):
            return entry
        tid, rows, worker, pid, started = entry
        return cls(
            str(tid),
            tuple(int(r) for r in rows),
            str(worker),
            None if pid is None else int(pid),
            None if started is None else float(started),
        )


@dataclass(frozen=True)
class WorkerSnapshot:
    """One worker of a run, as the dashboard's worker table and timeline show it."""

    worker_id: int
    task_id: str
    state: str  # one of WORKER_STATES
    pid: int | None
    row: int | None  # the row it runs now, when known
    since: float | None  # when that block started (monotonic seconds), when known
    spawned: float  # when the worker was started (monotonic seconds)
    job: str | None = None  # a launcher's job, as text (daisy_nb.launch), for worker functions

    def __post_init__(self):
        if self.state not in WORKER_STATES:
            raise ValueError(f"WorkerSnapshot.state must be one of {WORKER_STATES}, got {self.state!r}")
