"""The shell's record of a worker process: one type per kind of worker.

* :class:`BlockProcess`: a block function's worker: its process, socket pair, pidfd, and
  the shared-memory segment its batches travel in; its decisions (state, batches sent)
  are the core's (:class:`.blocks.BlockWorker`, ``core``);
* :class:`FunctionWorker`: a 0-argument worker function's process (its own
  ``daisy_nb.Client`` loop, often a cluster job): what its job did (connected, blocks
  acquired and finished), how it is being ended (``SIGTERM`` first: ``t_term``), and its
  launcher's last job report.

Both carry what the dashboard's worker list shows (``wid``, ``tr``, ``proc``, ``state``,
``t_spawn``, ``job``); :func:`job_text` is how a job is shown.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from daisy_nb.runtime.local.blocks import BlockWorker, WorkerState

__all__ = [
    "BUSY",
    "DEAD",
    "IDLE",
    "PARKED",
    "QUITTING",
    "STARTING",
    "BlockProcess",
    "FunctionWorker",
    "WorkerView",
    "job_text",
]

STARTING, IDLE, BUSY, PARKED, QUITTING, DEAD = (int(s) for s in WorkerState)


class WorkerView(NamedTuple):
    """One worker process as the dashboard and the hang alarm see it (:meth:`.processes.Processes.snapshot`)."""

    wid: int
    task: str  # its task's id
    kind: str  # "block" (a block function's worker) or "function" (a 0-argument worker function)
    pid: int | None
    state: str  # "starting", "idle", "busy", "parked", "quitting"
    row: int | None  # the block (its row in the task) it runs now, None: none or unknown
    since: float | None  # monotonic seconds when that block started
    t_spawn: float  # monotonic seconds when the process was started
    job: str | None  # a worker function's launcher job ("slurm 123 running"), see job_text


STATE_NAMES = {STARTING: "starting", IDLE: "idle", BUSY: "busy", PARKED: "parked", QUITTING: "quitting", DEAD: "dead"}


def job_text(job) -> str | None:
    """A worker function's launcher job (``daisy_nb.launch``) as the worker list and timeline show
    it: ``slurm 123 failed (exit status 1): OUT_OF_MEMORY (used 15.8 GiB of 16 GiB requested)``."""
    if not job:
        return None
    text = f"{job.get('scheduler', '')} {job.get('job', '')} {job.get('state', '')}".strip()
    return f"{text}: {job['cause']}" if job.get("cause") else text


class _Process:
    """What every worker process has (set by :class:`.starter.Starter`)."""

    block_worker = False

    def __init__(self, wid: int, tr, slot: int):
        self.wid = wid
        self.tr = tr
        self.slot = slot  # its log files' number
        # its process (subprocess.Popen, or _zygote.ForkedProcess), socket pair
        # (multiprocessing.connection.Connection), pidfd
        self.proc: Any = None
        self.conn: Any = None
        self.pidfd: int | None = None
        # a block worker's _shm.Segment, one int64 array per batch slot (bufs), the same as float64
        # (fbufs, stats region, when tracking), the offsets of the slots' regions (off); None here
        self.shm: Any = None
        self.bufs: Any = None
        self.fbufs: Any = None
        self.off: Any = None
        self.err_path: str | None = None
        self.err_offset = 0
        self.t_spawn = time.monotonic()
        self.t_term: float | None = None  # a worker function: when it was sent SIGTERM
        self.job: dict | None = None  # a worker function's launcher: its last job report


class BlockProcess(_Process):
    """A block function's worker process; its decisions are the core's record ``core``."""

    block_worker = True

    def __init__(self, wid: int, tr, slot: int, core: BlockWorker):
        super().__init__(wid, tr, slot)
        self.core = core

    @property
    def state(self) -> int:
        return int(self.core.state)

    @property
    def queue(self):
        """The batches it holds, ``(slot, block rows)`` in run order (the core's)."""
        return self.core.queue


class FunctionWorker(_Process):
    """A 0-argument worker function's process and what its job did."""

    queue = ()  # it holds no batch

    def __init__(self, wid: int, tr, slot: int):
        super().__init__(wid, tr, slot)
        self.state = BUSY  # it runs from its start to its exit
        self.expected_exit = False  # we asked it to end (the run's end, abandonment)
        self.timed_out = False  # a client of its job exceeded the block timeout: killed
        self.lost = False  # a client of its job went silent (heartbeat): killed
        self.connected = False  # a Client of its job said hello
        self.ready = False  # and asked for its first block (Functions.job_ready)
        self.acquired = 0  # blocks its job's clients acquired
        self.finished = 0  # blocks its job's clients finished successfully
        self.raised = False  # its job's last block raised (its exit is a crash)
