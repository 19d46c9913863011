"""Backup copies of stragglers: which running blocks get a second copy, and which copy's end counts.

``Task(speculative=...)`` (a daisy_nb keyword; None or False, the default: off; True: the
factor ``DEFAULT_FACTOR``; a finite number > 1: that factor ``k``). The rule, per task:

* **when**: once the task's median block time is settled: twice as many of its blocks have
  succeeded as run now (``SETTLE_PER_RUNNING``: about two blocks per worker), or ``WINDOW`` (64)
  of them, or half of them (``total``: the blocks this run runs); the median is of the task's
  last ``WINDOW`` successful block times (and is not taken from fewer than ``MIN_SAMPLES``, 5),
  and until ``WINDOW`` blocks have succeeded, every block still running counts in it as longer
  than all of them (:meth:`Speculation.median`);
* **which**: a block whose one running copy has run longer than ``k`` x that median (strictly)
  and, in the bulk of the task, longer than 99 in 100 blocks of the task's usual spread take
  (:meth:`TaskTimes.usual`, from the window: for block times as spread as lognormal with sigma
  0.5 that is 3.2 medians, little more than ``k`` = 3; for sigma 1, 10 medians: at 3 medians
  one block in seven would get a copy, and where a block is long wherever it runs, as a dense
  region is, that copy cannot win and only takes a fresh block's worker), or, at the task's
  **tail** (no block of it ready or waiting: every block it has left is in flight; the caller
  says so, ``at_tail``), longer than ``TAIL_FACTOR`` (1.5) x the median
  when ``k`` is larger, oldest start first, at most one per idle worker; never a block that
  has had a second copy in this attempt (so never a third copy, also after one of two copies
  failed), and never one a ``read_write_conflict`` neighbour of which is running (the caller
  says which: ``busy_neighbours``, so the geometry stays out of here);
* **who wins**: the first *success* of a block's copies counts (block tracking records the
  block once, the counters count it once, its time goes into the window) and the other copy,
  if it still runs, is to be interrupted (:class:`Interrupt`: a local worker's block body
  interrupted by a signal, the worker killed only if that fails; a ``Client`` told to drop
  it); its end, when it comes, counts for nothing. A failure (or loss: its worker died) of a
  copy whose twin still runs is dropped silently and the twin decides; the failure of the last
  copy counts, so when both fail exactly one failure counts, and the Scheduler retries or fails
  the block as it would have without a backup;
* **a slow block, not a slow attempt**: a backup that has itself run longer than any block
  of the task's usual spread takes while its first copy still runs is stopped
  (:meth:`Speculation.slow_backups`: an :class:`Interrupt` of the backup); the first copy,
  ahead of it, runs on, and the block gets no other backup in this attempt. The usual spread
  ends at the larger of ``BACKUP_GIVE_UP`` (2) x ``k`` x the median and the window's **far
  end** (:meth:`TaskTimes.far_end`: the window's spread from its median to its 90th
  percentile, carried on to three standard deviations of a lognormal, about one block in
  740). So a block that is slow wherever it runs costs a backup at most that long, while a
  block that is long anyway and slow on its first attempt still gets the backup that saves
  it (``k`` alone stopped such backups a moment before they won; ``2k`` alone, on blocks as
  spread as lognormal with sigma 1, stopped the backups of the one or two stragglers in a
  thousand that are also long anyway, whose first attempts then ran on for many seconds:
  ``benchmarks/bench_heavy_tail.py --sigma 1``, W2b).

Why a smaller factor at the tail: there a copy takes no fresh block's worker, only one that
would idle (a local worker, or a ``Client`` job kept parked for copies anyway), and the task,
and whatever waits on it, waits for its last block; so a copy pays as soon as a straggler can
be told from the usual spread at all. 1.5 is Spark's default ``spark.speculation.multiplier``
(Spark copies only after 75% of a stage is done; our tail is later still). A block of the usual
spread (lognormal, sigma 0.5) runs past 1.5 medians one time in five; its copy then mostly
loses and is dropped, at the cost of a worker that had nothing to do, while a straggler's copy
starts ``k - 1.5`` median block times sooner than in the bulk. The give-up of a slow backup
stays at ``2k`` medians: a block slow wherever it runs costs no more at the tail.

Why a settled median, not half the task (cubed's and Spark's rule): a backup that wins frees
the worker its straggler held, so it pays in the bulk of a task as much as at its tail, and
the runtimes give a due backup the next free worker, before fresh blocks (a straggler of the
first half, left alone, held its worker many block times). Why about two blocks per worker, not
a full window: on a cluster of 8 jobs with minute-long blocks, 64 successes are eight minutes,
in which a slow first attempt held its job (a window on so few jobs came after the straggler
had mostly run). The first blocks to succeed are the task's short ones (the long ones still
run), so their median alone is too short and would copy blocks of the usual spread; counting
every running block as longer than all of them gives a median that is, if anything, too long:
a backup may come late, never for a block that is not slow. Each worker's first block (cold
caches, the JIT) is half of the blocks then, and slower first blocks also make it longer. Why
``k`` = 3 by default: a backup costs a worker up to ``2k`` block times (it is stopped after
that, above), so only blocks far out of the usual spread are worth one. A block function of a
speculative task must be idempotent (chunk-aligned zarr writes are): both copies may write
its output, the loser until it is stopped.

:class:`Speculation` is the rule and the bookkeeping of copies, without I/O and without a
clock: times come in as ``now`` (float seconds on any clock that does not go back). Its
events are :meth:`Speculation.started` (a copy of a block started: the first, or a backup),
:meth:`Speculation.finished` (a copy's block function returned: success or failure) and
:meth:`Speculation.lost` (a copy's worker died); each started copy ends with exactly one of
the last two, interrupted ones included (``lost`` once it is killed, or ``finished`` if its
result came first). The query :meth:`Speculation.candidates` says which blocks get a backup now,
and :meth:`Speculation.slow_backups` which backups to stop now (it marks them told to stop).
Copy ids are the caller's (any int unique among the live copies, e.g. a worker id);
rows are the task's block rows.

The local pool carries it out (``daisy_nb/runtime/local/backups.py``: copy ids are its worker
ids and rows). So does the TCP hand-out for ``Client`` jobs (``daisy_nb/runtime/net/backups.py``: a copy id
per block a connection starts running); dask and the serial runner launch no copies (they
warn that the keyword does nothing there). Not here: the hand-out of a backup (the runtime's,
with the Scheduler's block), the neighbour geometry (the caller's ``busy_neighbours``), the kill, the clock, the Scheduler's
counters and retries (it is told about one end per attempt: the one that counts).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from daisy_nb.scheduling.median import median

__all__ = [
    "BACKUP_GIVE_UP",
    "DEFAULT_FACTOR",
    "MIN_SAMPLES",
    "SETTLE_PER_RUNNING",
    "SPREAD_QUANTILE",
    "TAIL_FACTOR",
    "WINDOW",
    "Z_FAR",
    "Z_SPREAD",
    "Z_STRAGGLER",
    "Backup",
    "Interrupt",
    "Outcome",
    "Speculation",
    "TaskTimes",
]

DEFAULT_FACTOR = 3.0  # Task(speculative=True): a backup once a block ran 3 x the median block time
WINDOW = 64  # the median is of the task's last 64 successful block times (as the walltime rule's)
MIN_SAMPLES = 5  # no median, hence no backup, before 5 successful blocks of the task
SETTLE_PER_RUNNING = 2  # the median settles once twice as many blocks succeeded as run (or a window)
BACKUP_GIVE_UP = 2.0  # a backup still running after 2 x k x the median (and the far end) is stopped
SPREAD_QUANTILE = 0.9  # the usual spread is carried on from the window's median and this quantile (nearest rank)
Z_SPREAD = 1.2815515655446004  # ... which is this many sigmas above the median of a lognormal ...
Z_STRAGGLER = 2.3263478740408408  # ... to its 99th percentile: no backup in the bulk before it (one block in 100)
Z_FAR = 3.0  # ... and to 3 sigmas, the far end: no backup is given up before it (one block in 740)
TAIL_FACTOR = 1.5  # at a task's tail, a backup once a block ran 1.5 x the median (k if smaller): Spark's multiplier


class Backup(NamedTuple):
    """Answer of :meth:`Speculation.candidates`: start a second copy of row ``row`` of task
    ``task``, whose one running copy is ``copy``."""

    task: int
    row: int
    copy: int


class Interrupt(NamedTuple):
    """Action: stop copy ``copy`` of row ``row`` of task ``task``; its twin won."""

    task: int
    row: int
    copy: int


class Outcome(NamedTuple):
    """What the end of a copy means (:meth:`Speculation.finished`, :meth:`Speculation.lost`).

    Attributes
    ----------
    counts : bool
        This end is the block's one recorded end of this attempt: the runtime releases the
        block to the Scheduler with it (success or failure). False: the runtime does nothing
        with the block (its twin decides, or its twin won already).
    interrupt : Interrupt or None
        The twin to stop now (this copy succeeded first).
    interrupted : bool
        This copy had been told to stop (an :class:`Interrupt`): its end is expected, not a
        crash of its worker.
    """

    counts: bool
    interrupt: Interrupt | None = None
    interrupted: bool = False


class _Copy(NamedTuple):
    task: int
    row: int
    start: float
    seq: int  # start order, the tie-break of equal start times


class TaskTimes:
    """One task's side of the rule: its factor, its progress and its recent block times.

    Parameters
    ----------
    factor : float or None
        ``k`` (> 1), or None: the task has no backups.
    total : int
        The task's blocks in this run (>= 0): the half rule's whole.
    """

    __slots__ = ("factor", "total", "n_done", "_secs", "_median", "_q", "_done")

    def __init__(self, factor: float | None, total: int) -> None:
        if factor is not None and not (math.isfinite(factor) and factor > 1):
            raise ValueError(f"factor must be a finite number > 1 or None, got {factor!r}")
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.factor = factor
        self.total = total
        self.n_done = 0
        self._secs: deque[float] = deque(maxlen=WINDOW)
        self._median: float | None = None  # of _secs, once it holds MIN_SAMPLES
        self._q: float | None = None  # the window's SPREAD_QUANTILE, once asked after the last success
        self._done = bytearray()  # 1 at a row that succeeded (grown on demand: a byte per row)

    def is_done(self, row: int) -> bool:
        """Whether row ``row`` succeeded (a copy of it counted as a success)."""
        return row < len(self._done) and self._done[row] == 1

    def add_done(self, row: int, secs: float) -> None:
        """Row ``row`` succeeded after ``secs`` seconds (its winning copy's run time)."""
        if row >= len(self._done):
            self._done.extend(bytes(row + 1 - len(self._done)))
        self._done[row] = 1
        self.n_done += 1
        self._secs.append(secs)
        self._median = median(self._secs) if len(self._secs) >= MIN_SAMPLES else None
        self._q = None

    def median(self) -> float | None:
        """The median of the last ``WINDOW`` successful block times, None before ``MIN_SAMPLES``
        (without the blocks still running: :meth:`median_with` counts those)."""
        return self._median

    def usual(self, z: float) -> float | None:
        """How long a block of the task's usual spread takes at most, ``z`` sigmas out: the
        window's median ``m`` times ``(q / m) ** (z / Z_SPREAD)``, ``q`` its ``SPREAD_QUANTILE``
        (nearest rank, and never the largest: the 58th of 64, the 4th of 5). For lognormal
        block times that is the time ``z`` standard deviations above the median: with
        ``Z_FAR`` (3) about 4.5 medians for sigma 0.5 and about 20 for sigma 1, with
        ``Z_STRAGGLER`` (the 99th percentile) 3.2 and 10. A tenth of the window, and always its
        largest time, may be outliers (a first attempt slow wherever it ran, which ended)
        without moving it. None before ``MIN_SAMPLES`` successes."""
        m = self._median
        if m is None:
            return None
        if self._q is None:
            secs = sorted(self._secs)
            self._q = secs[min(math.ceil(SPREAD_QUANTILE * len(secs)), len(secs) - 1) - 1]
        return m * (self._q / m) ** (z / Z_SPREAD) if m > 0 else self._q

    def far_end(self) -> float | None:
        """The far end of the usual spread (``usual(Z_FAR)``): a backup that runs longer is given up."""
        return self.usual(Z_FAR)

    def settled(self, running: int) -> bool:
        """Whether the median is settled (the module docstring's **when**) while ``running`` blocks
        run: twice as many blocks succeeded as run, or ``WINDOW`` of them, or half of the task's."""
        n = self.n_done
        return n >= WINDOW or 2 * n >= self.total or n >= max(MIN_SAMPLES, SETTLE_PER_RUNNING * running)

    def median_with(self, running: int) -> float | None:
        """The median block time for the rule while ``running`` blocks run: of the last ``WINDOW``
        successful block times; until ``WINDOW`` blocks have succeeded, with each block running
        counted as longer than all of them (the first successes are the short blocks). None
        before ``MIN_SAMPLES`` successes, or when the running blocks are half of all or more."""
        med = self._median
        if med is None or self.n_done >= WINDOW or not running:
            return med
        secs = sorted(self._secs)
        n = len(secs) + running  # the running ones are the last, past every success
        hi = n // 2  # the upper middle one (the middle one of an odd count)
        if hi >= len(secs):
            return None
        return secs[hi] if n % 2 else (secs[hi - 1] + secs[hi]) / 2

    def factor_now(self, at_tail: bool) -> float:
        """The factor for a new backup: ``k``, at most ``TAIL_FACTOR`` at the task's tail."""
        if self.factor is None:
            raise ValueError("the task has no backups")
        return min(self.factor, TAIL_FACTOR) if at_tail else self.factor

    def backup_after(self, med: float, at_tail: bool) -> float:
        """How long a block runs alone before it gets a backup, with the median ``med`` (the
        rule's, running blocks counted): :meth:`factor_now` times it, and in the bulk no less
        than the usual spread's 99th percentile (``usual(Z_STRAGGLER)``)."""
        limit = self.factor_now(at_tail) * med
        return limit if at_tail else max(limit, self.usual(Z_STRAGGLER) or 0.0)

    def give_up_after(self, med: float) -> float:
        """How long a backup runs, its first copy running too, before it is stopped as slow
        itself: ``BACKUP_GIVE_UP`` x ``k`` x the median ``med``, and no less than the far end."""
        if self.factor is None:
            raise ValueError("the task has no backups")
        return max(BACKUP_GIVE_UP * self.factor * med, self.far_end() or 0.0)

    def validate(self) -> None:
        """Raise ``AssertionError`` if this task's counts and times disagree."""
        assert 0 <= self.n_done <= self.total, f"{self.n_done} blocks done of {self.total}"
        assert self._done.count(1) == self.n_done, f"done rows {self._done.count(1)}, count {self.n_done}"
        assert set(self._done) <= {0, 1}, "a done flag that is neither 0 nor 1"
        assert len(self._secs) == min(self.n_done, WINDOW), "the window holds other than the last blocks"
        assert all(math.isfinite(s) and s >= 0 for s in self._secs), "a block time that is not >= 0"
        want = median(self._secs) if len(self._secs) >= MIN_SAMPLES else None
        assert self._median == want, f"median {self._median}, window's {want}"
        if self._q is not None:
            q, self._q = self._q, None
            self.usual(Z_FAR)
            assert q == self._q, f"quantile {q}, window's {self._q}"
        assert self.n_done == 0 or self.factor is not None, "a task without backups has done blocks here"


class Speculation:
    """The backup rule and the copies running, of one pipeline (module docstring).

    Parameters
    ----------
    factors : sequence of float or None
        Per task number, its factor ``k`` (> 1, finite), or None: no backups (the task's
        blocks are then never reported here).
    totals : sequence of int
        Per task number, its blocks in this run.

    Notes
    -----
    Invariants (:meth:`validate`): a row has one or two copies running, never more, and two
    only if it is marked as backed in this attempt; each live copy id maps to exactly one
    running row, and that row lists it; a copy told to stop is neither live nor listed, and
    its row succeeded or it was a slow backup; a row that succeeded runs no copy; per task,
    the done count is its done rows and never exceeds its total; only tasks with a factor
    have rows.
    """

    __slots__ = ("tasks", "_copies", "_rows", "_backed", "_stopping", "_slow", "_seq")

    def __init__(self, factors: Sequence[float | None], totals: Sequence[int]) -> None:
        if len(factors) != len(totals):
            raise ValueError(f"{len(factors)} factors for {len(totals)} totals")
        self.tasks = [TaskTimes(None if k is None else float(k), int(n)) for k, n in zip(factors, totals, strict=True)]
        self._copies: dict[int, _Copy] = {}  # live copy id -> its row and start
        self._rows: list[dict[int, list[int]]] = [{} for _ in self.tasks]  # per task: row -> its live copies
        self._backed: list[set[int]] = [set() for _ in self.tasks]  # per task: rows with a second copy this attempt
        self._stopping: dict[int, _Copy] = {}  # copies told to stop, until their end is reported
        self._slow: set[int] = set()  # of those, the backups stopped as slow (their row may run on)
        self._seq = 0

    def on(self, t: int) -> bool:
        """Whether task ``t`` has backups."""
        return self.tasks[t].factor is not None

    def running(self, t: int) -> dict[int, list[int]]:
        """Task ``t``'s running rows and their live copies (start order); a copy."""
        return {row: list(cs) for row, cs in self._rows[t].items()}

    def settled(self, t: int) -> bool:
        """Whether task ``t``'s median is settled, with its blocks running now (:meth:`TaskTimes.settled`)."""
        return self.tasks[t].settled(len(self._rows[t]))

    def median(self, t: int) -> float | None:
        """Task ``t``'s median block time for the rule, with its blocks running now
        (:meth:`TaskTimes.median_with`)."""
        return self.tasks[t].median_with(len(self._rows[t]))

    def can_back(self, t: int) -> int:
        """How many of task ``t``'s running rows may still get a backup: one copy running and no
        backup in this attempt (whether they will depends on time: :meth:`candidates`)."""
        return sum(1 for _ in self._alone(t))

    def is_backed(self, t: int, row: int) -> bool:
        """Whether row ``row`` of task ``t`` had its backup in this attempt (it gets no other)."""
        return row in self._backed[t]

    def alone(self, t: int, row: int, copy: int) -> bool:
        """Whether row ``row`` of task ``t`` runs in copy ``copy`` alone, with no backup in this
        attempt (a candidate still waiting for its backup)."""
        return self._rows[t].get(row) == [copy] and row not in self._backed[t]

    def start_of(self, copy: int) -> float | None:
        """When live copy ``copy`` started, or None if it is not a live copy."""
        c = self._copies.get(copy)
        return None if c is None else c.start

    def stopping(self) -> list[int]:
        """Copies told to stop whose end has not been reported yet, oldest start first."""
        return [c for c, _ in sorted(self._stopping.items(), key=lambda kv: kv[1].seq)]

    # -- events ------------------------------------------------------------------------------
    def started(self, t: int, row: int, copy: int, now: float) -> None:
        """Copy ``copy`` of row ``row`` of task ``t`` started at ``now`` (a first copy or a backup).

        Raises
        ------
        ValueError
            The task has no backups, ``copy`` is in use (live or stopping), the row succeeded
            already, or it would be the row's third copy (or a second backup in one attempt).
        """
        if not self.on(t):
            raise ValueError(f"task {t} has no backups")
        if copy in self._copies or copy in self._stopping:
            raise ValueError(f"copy {copy} is in use")
        if row < 0:
            raise ValueError(f"row must be >= 0, got {row}")
        if self.tasks[t].is_done(row):
            raise ValueError(f"row {row} of task {t} succeeded already")
        copies = self._rows[t].get(row)
        if copies is None:
            self._rows[t][row] = [copy]
        elif len(copies) >= 2 or row in self._backed[t]:
            raise ValueError(f"row {row} of task {t} had its backup in this attempt: never a third copy")
        else:
            copies.append(copy)
            self._backed[t].add(row)
        self._copies[copy] = _Copy(t, row, float(now), self._seq)
        self._seq += 1

    def finished(self, t: int, row: int, copy: int, now: float, ok: bool) -> Outcome:
        """Copy ``copy`` of row ``row`` of task ``t`` returned at ``now``: succeeded (``ok``) or failed.

        Returns
        -------
        Outcome
            Whether this end counts, and the twin to interrupt (the first success wins).

        Raises
        ------
        ValueError
            ``copy`` is not a live or stopping copy of that row, or the clock went back.
        """
        c = self._copies.get(copy) or self._stopping.get(copy)
        if c is None or (c.task, c.row) != (t, row):
            raise ValueError(f"copy {copy} is not running row {row} of task {t}")
        if copy in self._stopping:
            del self._stopping[copy]
            self._slow.discard(copy)
            return Outcome(False, None, True)
        if now < c.start:
            raise ValueError(f"copy {copy} finished at {now}, before its start {c.start}")
        if ok and self.tasks[t].n_done >= self.tasks[t].total:
            raise ValueError(f"task {t} has {self.tasks[t].total} blocks, all succeeded already")
        return self._end(copy, c, now if ok else None)

    def lost(self, copy: int) -> Outcome:
        """Copy ``copy``'s worker died (or it was killed after an :class:`Interrupt`).

        Returns
        -------
        Outcome
            As a failure of the copy (:meth:`finished` with ``ok=False``); ``interrupted`` if
            it had been told to stop.

        Raises
        ------
        ValueError
            ``copy`` is not a live or stopping copy.
        """
        if copy in self._stopping:
            del self._stopping[copy]
            self._slow.discard(copy)
            return Outcome(False, None, True)
        c = self._copies.get(copy)
        if c is None:
            raise ValueError(f"copy {copy} is not running")
        return self._end(copy, c, None)

    def _end(self, copy: int, c: _Copy, ok_at: float | None) -> Outcome:
        """End live copy ``c``: a success at ``ok_at``, or a failure (None)."""
        t, row = c.task, c.row
        copies = self._rows[t][row]
        copies.remove(copy)
        del self._copies[copy]
        if ok_at is None and copies:
            return Outcome(False)  # its twin runs on and decides
        del self._rows[t][row]  # the attempt ends: this end counts
        self._backed[t].discard(row)
        if ok_at is None:
            return Outcome(True)
        self.tasks[t].add_done(row, ok_at - c.start)
        if not copies:
            return Outcome(True)
        twin = copies[0]
        self._stopping[twin] = self._copies.pop(twin)
        return Outcome(True, Interrupt(t, row, twin))

    # -- the query -----------------------------------------------------------------------------
    def candidates(
        self,
        t: int,
        now: float,
        idle_workers: int,
        busy_neighbours: Callable[[int], bool] | None = None,
        at_tail: bool = False,
    ) -> list[Backup]:
        """The rows of task ``t`` that get a backup at ``now`` (the module docstring's rule).

        Parameters
        ----------
        t : int
            The task number.
        now : float
            The clock, as given to :meth:`started`.
        idle_workers : int
            Workers free to run a backup: at most this many rows are returned.
        busy_neighbours : callable, optional
            ``busy_neighbours(row) -> bool``: True when a ``read_write_conflict`` neighbour of
            ``row`` is running (such a row gets no backup). None: no conflicts (e.g. a set's
            ``__contains__`` can be given).
        at_tail : bool
            No block of task ``t`` is ready or waiting (every one it has left is in flight):
            the factor is at most ``TAIL_FACTOR``.

        Returns
        -------
        list of Backup
            Oldest start first (ties: first started first); nothing is changed (the backups
            are reported with :meth:`started` when they start).
        """
        limit = self._limit(t, at_tail) if idle_workers > 0 else None
        if limit is None:
            return []
        late = sorted(
            (c.start, c.seq, row, copy) for row, copy in self._alone(t) if now - (c := self._copies[copy]).start > limit
        )
        out: list[Backup] = []
        for _, _, row, copy in late:
            if len(out) == idle_workers:
                break
            if busy_neighbours is None or not busy_neighbours(row):
                out.append(Backup(t, row, copy))
        return out

    def next_due(self, t: int, now: float, at_tail: bool = False) -> float | None:
        """When the next row of task ``t`` reaches the backup limit, at ``now`` or later (with the
        median as it is now): just after it, :meth:`candidates` names the row. None: none will (no
        backups, the median not settled, or no row that runs alone without a backup reaches it).

        A runtime with idle workers waiting for a copy looks again then, rather than at its next
        periodic look (the local pool at a task's tail: ``daisy_nb/runtime/local/backups.py``)."""
        limit = self._limit(t, at_tail)
        if limit is None:
            return None
        return min((d for _, copy in self._alone(t) if (d := self._copies[copy].start + limit) >= now), default=None)

    def _limit(self, t: int, at_tail: bool) -> float | None:
        """How long a row of task ``t`` runs alone before it gets a backup now
        (:meth:`TaskTimes.backup_after`); None without backups or a settled median."""
        tt = self.tasks[t]
        med = self.median(t) if tt.factor is not None and self.settled(t) else None
        return None if med is None else tt.backup_after(med, at_tail)

    def _alone(self, t: int) -> Iterator[tuple[int, int]]:
        """Task ``t``'s rows that run in one copy and had no backup in this attempt, each with that copy."""
        backed = self._backed[t]
        return ((row, cs[0]) for row, cs in self._rows[t].items() if len(cs) == 1 and row not in backed)

    def slow_backups(self, t: int, now: float) -> list[Interrupt]:
        """The backups of task ``t`` to stop at ``now``: second copies that have run longer than
        the usual spread themselves while their first copy still runs (the block is slow, not
        its first attempt): longer than ``BACKUP_GIVE_UP`` x ``k`` x the median and than the
        window's far end (:meth:`TaskTimes.far_end`). They are told to stop (their ends, when
        reported, count for nothing); their rows run on in their first copies and get no other
        backup in this attempt.

        Returns
        -------
        list of Interrupt
            Oldest start first.
        """
        tt = self.tasks[t]
        med = self.median(t)
        if tt.factor is None or med is None or not self._backed[t]:
            return []
        limit = tt.give_up_after(med)
        late = []
        for row in self._backed[t]:  # (the rows with two copies are among them)
            copies = self._rows[t][row]
            if len(copies) == 2:
                c = self._copies[copies[1]]
                if now - c.start > limit:
                    late.append((c.start, c.seq, row, copies[1]))
        out: list[Interrupt] = []
        for _, _, row, copy in sorted(late):
            self._rows[t][row].remove(copy)
            self._stopping[copy] = self._copies.pop(copy)
            self._slow.add(copy)
            out.append(Interrupt(t, row, copy))
        return out

    # -- invariants ----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``AssertionError`` if an invariant does not hold (see Notes)."""
        listed = 0
        for t, rows in enumerate(self._rows):
            tt = self.tasks[t]
            tt.validate()
            assert not rows or tt.factor is not None, f"task {t} has running rows but no backups"
            for row, copies in rows.items():
                assert 1 <= len(copies) <= 2, f"row {row} of task {t} runs {len(copies)} copies"
                assert len(set(copies)) == len(copies), f"row {row} of task {t} lists a copy twice"
                assert len(copies) == 1 or row in self._backed[t], f"row {row} of task {t}: two copies, not backed"
                assert not tt.is_done(row), f"row {row} of task {t} succeeded and still runs"
                for cid in copies:
                    c = self._copies.get(cid)
                    assert c is not None, f"copy {cid} of row {row} of task {t} is not live"
                    assert (c.task, c.row) == (t, row), f"copy {cid} is listed at ({t}, {row}), runs {c[:2]}"
                listed += len(copies)
            assert self._backed[t] <= rows.keys(), f"task {t}: a backed row that does not run"
        assert listed == len(self._copies), f"{len(self._copies)} live copies, {listed} listed at rows"
        assert not self._copies.keys() & self._stopping.keys(), "a copy both live and stopping"
        assert self._slow <= self._stopping.keys(), "a slow backup that is not stopping"
        for cid, c in self._stopping.items():
            ok = self.tasks[c.task].is_done(c.row) or cid in self._slow
            assert ok, f"stopping copy {cid}: its row did not succeed, and it was not a slow backup"
        seqs = [c.seq for c in self._copies.values()] + [c.seq for c in self._stopping.values()]
        assert len(set(seqs)) == len(seqs) and all(s < self._seq for s in seqs), "start numbers broken"
