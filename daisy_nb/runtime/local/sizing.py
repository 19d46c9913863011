"""How many blocks a block worker's batch holds, and whether one is sent ahead (sans-I/O).

:class:`BatchSizing` is the part of the block workers' decisions (:class:`.blocks.BlockCore`)
that measures: per task, the time per block of the last finished batch, and from it the
batch size and whether a second batch may wait behind a running one. Which worker gets
the batch, parking, quitting and exits stay the core's; it asks this part how many.

**Batching.** Per task, the batch size starts at 1 and follows the typical time per
block (the median over the last ``TYPICAL_OF`` batches: one batch that held a straggler
does not shrink the next ones to single blocks, nor does a batch of quick ones grow them
into batches that a straggler then holds hostage; a lasting change of speed is followed
after half of them) so that a batch takes about ``target`` seconds (``PER_WORKER_BATCH_SECS`` per
worker when that is longer; :func:`daisy_nb.runtime.common.batching.next_batch`), capped by
``ceil(ready / workers)`` so that workers share the ready blocks and dependent levels are
not held back by one worker's batch.

**Sent ahead (prefetch).** A second batch waits behind the running one, so that a worker
goes on to its next block at once instead of asking the pool between blocks (a round trip
through the pool's loop: ~0.4 ms, 1-3% of a 15-40 ms block). A whole batch for fast blocks
(measured faster than ``target``), a single block for slower ones, none for blocks longer
than ``AHEAD_MAX_SECS`` (the round trip is lost in them) or not measured yet. Only when the
ready blocks cover a running and a queued batch for every active worker of the task (the
core also requires that no worker of the task waits for work), and a straggler gives the
blocks sent ahead back (``giveback.py``): a block waits behind another one only while that
one runs about as long as the task's blocks usually do.

Invariants (:meth:`BatchSizing.validate`): every batch size is between 1 and ``capacity``;
a measured time per block is not negative.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from daisy_nb.runtime.common.batching import next_batch
from daisy_nb.scheduling.median import median

__all__ = ["AHEAD_MAX_SECS", "PER_WORKER_BATCH_SECS", "BatchSizing", "BlockTask"]

PER_WORKER_BATCH_SECS = 0.002  # batch target floor per running worker (16 workers: 32 ms batches)
AHEAD_MAX_SECS = 1.0  # blocks longer than this are never sent ahead (a ~0.4 ms round trip is < 0.05%)
TYPICAL_OF = 5  # batches whose median time per block sizes the next batch


@dataclass
class BlockTask:
    """What is measured of a task (the batch size, the time per block) and its block timeout."""

    tid: str
    timeout_ns: int | None = None  # a block's timeout, None: none
    batch_k: int = 1
    per_block: float | None = None  # seconds, typical of the last batches (None: not measured yet)
    block_secs: deque = field(default_factory=lambda: deque(maxlen=64))  # recent times per block
    t_first_batch: bool = False  # a batch was sent
    given_back: int = 0  # blocks given back from batches a straggler held (``giveback.py``)


class BatchSizing:
    """Batch sizes from measured block times (see the module docstring)."""

    def __init__(self, *, target_secs: float, capacity: int, workers_total: Callable[[], int]):
        self.target = float(target_secs)
        self.capacity = int(capacity)
        self._workers_total = workers_total  # every worker process of the run (the batch target's floor)
        self.tasks: dict[str, BlockTask] = {}

    def add_task(self, tid: str, timeout_ns: int | None = None) -> tuple[BlockTask, bool]:
        """The task's record, and whether it is new."""
        t = self.tasks.get(tid)
        if t is not None:
            return t, False
        t = self.tasks[tid] = BlockTask(tid, timeout_ns)
        return t, True

    def measured(self, tid: str, elapsed_ns: int, n: int) -> None:
        """A batch of ``n`` blocks of ``tid`` ran in ``elapsed_ns``: the time per block, the next size."""
        t = self.tasks[tid]
        t.block_secs.append(elapsed_ns / n / 1e9)
        k = min(TYPICAL_OF, len(t.block_secs))
        t.per_block = median(itertools.islice(reversed(t.block_secs), k))
        t.batch_k = next_batch(t.batch_k, t.per_block, self.batch_target(), self.capacity)

    def batch_target(self) -> float:
        """The work a batch carries (s): ``target``, longer with many workers, so that the
        scheduler's batches per second stay bounded."""
        return max(self.target, self._workers_total() * PER_WORKER_BATCH_SECS)

    def straggler_secs(self, tid: str, factor: float, at_least_a_batch: bool = True) -> float | None:
        """How long a block of ``tid`` runs before it counts as a straggler: ``factor`` typical
        block times, and (``at_least_a_batch``) at least a batch's target; None before a batch
        was measured."""
        per = self.tasks[tid].per_block
        if per is None:
            return None
        return max(factor * per, self.batch_target()) if at_least_a_batch else factor * per

    def size(self, tid: str, ready: int, sharing: int) -> int:
        """The next batch of ``tid`` for one of ``sharing`` workers, with ``ready`` blocks ready."""
        return max(1, min(self.tasks[tid].batch_k, -(-ready // max(1, sharing)), self.capacity))

    def ahead(self, tid: str, ready: int, active: int) -> int:
        """The size of a batch sent ahead to a busy worker of ``tid`` (0: none): blocks measured no
        longer than ``AHEAD_MAX_SECS`` (one block for blocks slower than the batch target), and
        ``ready`` blocks enough for a running and a queued batch on each of the ``active`` workers
        (near the end of a task, or of a level, blocks go to whoever is free instead)."""
        t = self.tasks[tid]
        if t.per_block is None or t.per_block > AHEAD_MAX_SECS:
            return 0  # not measured yet, or so long that a round trip between blocks is lost in it
        k = 1 if t.per_block > self.target else min(t.batch_k, self.capacity)  # slow blocks: one at a time
        return k if ready >= 2 * active * k else 0

    def validate(self) -> None:
        for tid, t in self.tasks.items():
            assert t.tid == tid and 1 <= t.batch_k <= max(1, self.capacity), f"task {tid}: batch size {t.batch_k}"
            assert t.per_block is None or t.per_block >= 0, f"task {tid}: time per block {t.per_block}"
