"""Retry backoff: when a failed block may be tried again, and where it waits until then.

``Task(retry_backoff=base)`` (seconds; None or 0: off, daisy's behaviour). A block that failed
and has retries left is not put back in its task's ready queue at once: it waits here, and
goes back (to the back of the queue, as daisy puts a retry) once its time has come:

    delay = min(base * 2 ** (attempt - 1), base * 2 ** MAX_DOUBLINGS) * (0.5 + u)

``attempt`` is the block's failed attempts so far, the one that just failed included (1 after
its first failure); ``u`` is uniform in ``[0, 1)``, drawn once per failure. So the delay doubles
with every failure of the block, stops growing after ``MAX_DOUBLINGS`` doublings (32 x base),
and is spread evenly over [0.5, 1.5] of that: blocks that fail together (a file server that is
down) come back spread out instead of all at once. Why a factor and not "full jitter" ([0, 1]
of the delay): the smallest delay is half the nominal one, never zero, so ``retry_backoff``
is also a promise of a minimum pause, which users can reason about ("no retry sooner than
base / 2 after a failure").

:class:`RetryBackoff` is the rule and the holding area, without I/O and without a clock: the
clock and the random draws come in as arguments (``now``, ``rng``), the events are
:meth:`RetryBackoff.failed` (a block failed with retries left), :meth:`RetryBackoff.due` (the
clock moved: which blocks go back, in the order they became due) and
:meth:`RetryBackoff.drop_task` (the task was abandoned). The Scheduler (``daisy_nb/scheduler.py``)
executes what it says on its state: a held block counts as *pending* (not ready, not in
flight; docs/explanation/algorithms.md#retry-backoff), so the run does not end, no worker
waits on it as if it ran, and the hang alarm (``daisy_nb/hang.py``, which watches blocks in
flight) does not fire for it. The runtimes ask the Scheduler for the earliest time
(:meth:`RetryBackoff.next_at`) and bound their waits by it.

Not here: the retry count and the decision to fail a block for good (the kernels'), the
tracking records (the Scheduler's), the runtimes' waits.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from typing import NamedTuple

__all__ = ["JITTER", "MAX_DOUBLINGS", "Hold", "Retry", "RetryBackoff", "retry_delay"]

MAX_DOUBLINGS = 5  # the delay stops growing at base * 2**5 (the 6th failure of a block)
JITTER = (0.5, 1.5)  # the delay's factor: uniform in [0.5, 1.5)


def retry_delay(base: float, attempt: int, u: float) -> float:
    """Seconds a block waits after its ``attempt``-th failed attempt (the module docstring's rule).

    Parameters
    ----------
    base : float
        The task's ``retry_backoff`` (seconds, > 0).
    attempt : int
        Failed attempts of the block so far, this one included (>= 1).
    u : float
        A uniform draw in ``[0, 1)``: the jitter.

    Returns
    -------
    float
        The delay, in ``[0.5, 1.5) x min(base x 2**(attempt - 1), base x 2**MAX_DOUBLINGS)``.
    """
    lo, hi = JITTER
    return base * 2.0 ** min(attempt - 1, MAX_DOUBLINGS) * (lo + (hi - lo) * u)


class Hold(NamedTuple):
    """Action: row ``row`` of task ``task`` waits until ``at`` (the clock's seconds)."""

    task: int
    row: int
    at: float


class Retry(NamedTuple):
    """Action: row ``row`` of task ``task`` goes back to its ready queue now."""

    task: int
    row: int


class RetryBackoff:
    """The retry rule and the blocks waiting for their retry, of one pipeline (module docstring).

    Parameters
    ----------
    bases : sequence of float
        Per task number, its ``retry_backoff`` in seconds; 0 for a task without backoff.
    rng : callable, optional
        ``rng() -> float`` in ``[0, 1)``, one draw per failure (default :func:`random.random`;
        tests pass their own).

    Notes
    -----
    Invariants (:meth:`validate`): a block is held at most once; the heap holds exactly the
    held blocks, each with the time it was given; per task, the held count is its entries;
    only tasks with a base hold blocks. Entries with the same time come out in the order
    they went in (a sequence number breaks ties), so order does not depend on the heap.
    """

    __slots__ = ("bases", "_rng", "_heap", "_at", "_seq", "_n_held")

    def __init__(self, bases: Sequence[float], rng: Callable[[], float] | None = None) -> None:
        self.bases = [float(b) for b in bases]
        self._rng = rng if rng is not None else random.random
        self._heap: list[tuple[float, int, int, int]] = []  # (at, seq, task, row)
        self._at: dict[tuple[int, int], float] = {}  # (task, row) -> at, of every held block
        self._seq = 0
        self._n_held = [0] * len(self.bases)

    def on(self, t: int) -> bool:
        """Whether task ``t`` has a retry backoff."""
        return self.bases[t] > 0

    def held(self, t: int) -> int:
        """Blocks of task ``t`` waiting for their retry."""
        return self._n_held[t]

    def __len__(self) -> int:
        return len(self._at)

    def next_at(self) -> float | None:
        """The earliest time a held block becomes due, or None if none is held."""
        return self._heap[0][0] if self._heap else None

    # -- events ------------------------------------------------------------------------------
    def failed(self, t: int, row: int, attempt: int, now: float) -> Hold:
        """Row ``row`` of task ``t`` failed its ``attempt``-th attempt at ``now`` and has retries left.

        Returns
        -------
        Hold
            Where it waits until: ``now + retry_delay(base, attempt, rng())``.

        Raises
        ------
        ValueError
            The task has no backoff, the block is held already, ``attempt < 1``, or ``rng``
            gave a value outside ``[0, 1)``.
        """
        base = self.bases[t]
        if base <= 0:
            raise ValueError(f"task {t} has no retry backoff")
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        key = (t, row)
        if key in self._at:
            raise ValueError(f"row {row} of task {t} is held already")
        u = self._rng()
        if not 0.0 <= u < 1.0:
            raise ValueError(f"rng() must be in [0, 1), got {u!r}")
        at = now + retry_delay(base, attempt, u)
        self._at[key] = at
        heapq.heappush(self._heap, (at, self._seq, t, row))
        self._seq += 1
        self._n_held[t] += 1
        return Hold(t, row, at)

    def due(self, now: float) -> list[Retry]:
        """The held blocks whose time is ``<= now``, taken out, earliest first (ties: first held first)."""
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now:
            _, _, t, row = heapq.heappop(heap)
            del self._at[(t, row)]
            self._n_held[t] -= 1
            out.append(Retry(t, row))
        return out

    def drop_task(self, t: int) -> list[int]:
        """Task ``t`` was abandoned: its held blocks are let go (they are orphaned); returns their rows."""
        if not self._n_held[t]:
            return []
        rows = [e[3] for e in sorted(self._heap) if e[2] == t]
        self._heap = [e for e in self._heap if e[2] != t]
        heapq.heapify(self._heap)
        for row in rows:
            del self._at[(t, row)]
        self._n_held[t] = 0
        return rows

    # -- invariants ----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``AssertionError`` if an invariant does not hold (see Notes)."""
        heap = self._heap
        for i in range(1, len(heap)):
            assert heap[(i - 1) // 2] <= heap[i], f"heap order broken at {i}"
        keys = [(t, row) for _, _, t, row in heap]
        assert len(set(keys)) == len(keys), "a block is held twice"
        assert {(t, row): at for at, _, t, row in heap} == self._at, "the heap and the index differ"
        counts = [0] * len(self.bases)
        for t, _ in keys:
            counts[t] += 1
        assert counts == self._n_held, f"held counts {self._n_held}, entries {counts}"
        for t, n in enumerate(counts):
            assert n == 0 or self.bases[t] > 0, f"task {t} holds {n} blocks without a backoff"
        assert all(math.isfinite(at) for at in self._at.values()), "a time that is not finite"
        assert all(seq < self._seq for _, seq, _, _ in heap), "a sequence number from the future"
