"""Backup copies of stragglers for ``Client`` jobs: :mod:`daisy_nb.scheduling.speculation` on the TCP hand-out.

For a ``Task(speculative=k)`` whose blocks run in ``Client`` jobs (a worker function that
takes no argument, on this machine or a cluster), :class:`ClientBackups` tells the
speculation core what the hand-out sees and says what to do; the hand-out
(:class:`daisy_nb.runtime.net.handout.HandOut`) does it. No I/O, no clock: times come in.

* **what it sees.** A connection runs the first block it holds (the one behind it, sent
  ahead, starts when the first is released): that block is a *copy* of it, started when it
  became the first (sent to a connection that held nothing, or the previous one released).
  Its end is the connection's release or failure frame, or the connection's loss (dropped,
  silent, past the task's timeout, a goodbye), or its give-back (a block the job never started).
* **who runs it.** At its tail (nothing ready or pending, blocks in flight) a speculative task
  keeps up to one parked job per block in flight that may still get a copy (one copy running,
  none launched in this attempt), instead of telling them to end (``net/tail.py``); they run the
  backups. A job costs while it waits, so once every block in flight had its copy the others
  end. A plain task keeps at most one (for a retry).
* **the backup.** When the hand-out serves its parked connections, the core names the blocks
  to copy (once the task's median is settled, run past ``k`` times it, or 1.5 times at the
  task's tail, where a parked job would idle anyway; at most one per parked job). In the bulk
  of a task no job is parked: at most every ``COPY_LOOK_SECS`` the core
  names the blocks due for a copy, and the next jobs of the task that ask for a block (holding
  none) get those copies before fresh blocks (:meth:`ClientBackups.take_due`); meanwhile no
  block is sent ahead to the task's jobs (:meth:`ClientBackups.has_due`), so one soon asks
  holding none. A copy is the
  same block, described again by the Scheduler (``ListedCalls.describe``), sent to a job, not
  acquired again: it stays in flight once.
* **the first success wins.** Its release counts (tracking and counters count it once); the
  other copy is forgotten and its job is told to drop it (``DROP``): a ``Client`` whose block
  runs in its main thread interrupts it and asks for the next block (at the tail: it is told
  to end); its release or failure, when it comes, counts for nothing. A copy that fails or
  is lost while its twin runs is dropped: the twin decides, and the Scheduler sees one end
  of the attempt. A copy that runs past ``2k`` times the median itself (and past the far end
  of the task's usual spread) is dropped the same way (:meth:`ClientBackups.slow`: the block
  is slow, not its first attempt); its twin runs on.

``read_write_conflict`` needs no neighbour check: a block's conflicting neighbours are on
other dependency levels, and none of them runs while it is in flight.

Invariant (:meth:`ClientBackups.validate`, in the hand-out's): a block held by two connections
is a copied block, held by its two copies' connections, counted once in flight; every copy
the core counts as running is the first block its connection holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from daisy_nb.runtime.net.tail import at_tail
from daisy_nb.scheduling.speculation import Speculation

__all__ = ["ClientBackups"]


COPY_LOOK_SECS = 0.02  # how often the pool looks for a due copy while jobs wait parked for one


class ClientBackups:
    """The hand-out's side of the backups of speculative tasks (module docstring).

    Parameters
    ----------
    scheduler : Scheduler
        The run's scheduler: the tasks' ``speculative`` factors and their blocks in this run.
    describe : callable
        ``describe(task_id, rows)``: those blocks as the hand-out sends them, without acquiring
        them (:meth:`daisy_nb.scheduling.listed.ListedCalls.describe`).
    """

    def __init__(self, scheduler, describe: Callable[[str, list[int]], list[list[int]]]) -> None:
        s = self.s = scheduler
        self.describe = describe
        tids = list(s.task_ids)
        factors = [getattr(s.tasks[tid], "speculative", None) for tid in tids]
        self.t = {tid: i for i, tid in enumerate(tids)}
        self.spec = Speculation(factors, [s.remaining_count(tid) for tid in tids]) if any(factors) else None
        self._ids = itertools.count()
        self.running: dict[Any, tuple[int, str, int]] = {}  # connection -> (copy id, task id, index) it runs
        self.holders: dict[tuple[str, int], list[Any]] = {}  # (task id, index) -> connections running a copy
        self.launched = 0  # backups sent
        self.due: dict[str, list] = {}  # per task, the backups due at the last look, for the next asking jobs
        self.looked_ns: int | None = None  # when the core last looked for due backups

    def factor(self, tid: str) -> float | None:
        """Task ``tid``'s slowness factor, or None: no backups."""
        return None if self.spec is None else self.spec.tasks[self.t[tid]].factor

    # ------------------------------------------------------------------ copies start and end
    def started(self, cc, index: int, now_ns: int) -> None:
        """``cc``'s first held block is now ``index`` (sent to it, or the one before it ended)."""
        tid = cc.tr.tid
        spec = self.spec
        if spec is None or self.factor(tid) is None:
            return
        copy = next(self._ids)
        try:
            spec.started(self.t[tid], index, copy, now_ns / 1e9)
        except ValueError:  # a third copy (its attempt had its backup): not a copy the core follows
            return
        self.running[cc] = (copy, tid, index)
        self.holders.setdefault((tid, index), []).append(cc)

    def ended(self, cc, index: int, ok: bool, now_ns: int) -> tuple[bool, Any]:
        """``cc`` reported the end of block ``index`` (``ok``: a success). Returns whether that end
        counts (the hand-out releases the block with it) and the twin's connection to tell to drop
        the block (None: none)."""
        mine = self._end(cc, index)
        if mine is None:
            return True, None
        copy, tid = mine
        t = self.t[tid]
        spec = self.spec
        assert spec is not None  # a copy is followed only for a speculative task
        start = spec.start_of(copy)
        o = spec.finished(t, index, copy, max(now_ns / 1e9, start or 0.0), ok)
        twin = None if o.interrupt is None else self._told_to_stop(tid, index, o.interrupt.copy)
        return o.counts, twin

    def lost(self, cc) -> bool:
        """``cc``'s running block ended without a result (its connection lost, a timeout, a
        goodbye): whether that end counts (False: its twin runs on and decides)."""
        r = self.running.get(cc)
        if r is None:
            return True
        self._end(cc, r[2])
        return self.spec.lost(r[0]).counts  # type: ignore[union-attr]

    def given_back(self, cc, index: int, now_ns: int) -> bool:
        """``cc`` gave block ``index`` back unstarted (``GIVE_BACK``; the caller took it from ``cc.held``):
        whether it goes back to the Scheduler (False: a copy whose twin runs on). The block behind
        it, if it was ``cc``'s first, starts now."""
        r = self.running.get(cc)
        if r is None or r[2] != index:
            return True
        counts = self.lost(cc)
        self.next_started(cc, now_ns)
        return counts

    def next_started(self, cc, now_ns: int) -> None:
        """``cc``'s first block ended or went elsewhere: the block behind it, if any, is its copy now."""
        if cc.held:
            self.started(cc, next(iter(cc.held)), now_ns)

    def _end(self, cc, index: int) -> tuple[int, str] | None:
        """Forget ``cc``'s copy of ``index``: its copy id and task, or None if it ran no such copy."""
        r = self.running.get(cc)
        if r is None or r[2] != index:
            return None
        del self.running[cc]
        key = (r[1], index)
        ccs = self.holders[key]
        ccs.remove(cc)
        if not ccs:
            del self.holders[key]
        return r[0], r[1]

    # ------------------------------------------------------------------ the tail and the backups
    def keep_at_tail(self, tid: str, kept_others: int) -> bool:
        """A job of ``tid`` asking at its tail stays parked for backups: a speculative task whose other
        parked jobs are fewer than its blocks in flight that may still get a copy (a job costs while
        it waits: none stays for a block that had its copy)."""
        s = self.s
        if self.factor(tid) is None or s.is_abandoned(tid) or s.is_task_done(tid):
            return False
        return kept_others < self.spec.can_back(self.t[tid])  # type: ignore[union-attr]

    def copies_due(self, parked: Iterable[Any]) -> bool:
        """Jobs are parked (``parked``: their task runs) for a block that may still get a copy: one
        may be due at any moment, so the pool wakes every ``COPY_LOOK_SECS``, not every 0.1 s."""
        spec = self.spec
        return spec is not None and any(
            self.factor(tr.tid) is not None and spec.can_back(self.t[tr.tid]) for tr in parked
        )

    def launch(self, parked: Mapping[Any, Iterable[Any]], now_ns: int) -> list[tuple[Any, list[int]]]:
        """The backups to send now: ``(connection, block row)`` pairs, a parked connection of the
        task each (``parked``: task run -> its parked connections, oldest first)."""
        spec = self.spec
        if spec is None:
            return []
        out: list[tuple[Any, list[int]]] = []
        for tr, ccs in parked.items():
            tid = tr.tid
            if self.factor(tid) is None or self.s.is_abandoned(tid):
                continue
            idle = list(ccs)
            for b in spec.candidates(self.t[tid], now_ns / 1e9, len(idle), at_tail=at_tail(self.s, tid)):
                (row,) = self.describe(tid, [b.row])
                out.append((idle.pop(0), row))
                self.launched += 1
        return out

    def take_due(self, tid: str, k: int, now_ns: int) -> list[list[int]]:
        """Up to ``k`` backups of ``tid`` for jobs that ask for a block and hold none, before
        fresh blocks: the blocks due for a copy (looked for at most every ``COPY_LOOK_SECS``), as
        the hand-out sends them."""
        spec = self.spec
        if spec is None or self.factor(tid) is None or k <= 0 or self.s.is_abandoned(tid):
            return []
        self._look(now_ns)
        due = self.due.get(tid)
        out: list[list[int]] = []
        while due and len(out) < k:
            b = due.pop(0)
            if spec.alone(b.task, b.row, b.copy):
                (row,) = self.describe(tid, [b.row])
                out.append(row)
                self.launched += 1
        return out

    def has_due(self, tid: str, now_ns: int) -> bool:
        """A backup of ``tid`` waits for a job that asks holding nothing: the hand-out sends no
        block ahead to the task's jobs meanwhile (else, with blocks ready, none would ever ask
        holding nothing before the task's tail)."""
        if self.spec is None or self.factor(tid) is None:
            return False
        self._look(now_ns)
        spec, due = self.spec, self.due.get(tid)
        while due and not spec.alone(due[0].task, due[0].row, due[0].copy):
            due.pop(0)
        return bool(due)

    def _look(self, now_ns: int) -> None:
        """The blocks due for a backup, per speculative task, at most every ``COPY_LOOK_SECS``."""
        spec = self.spec
        if spec is None or (self.looked_ns is not None and now_ns - self.looked_ns < COPY_LOOK_SECS * 1e9):
            return
        self.looked_ns = now_ns
        self.due = {}
        for tid, t in self.t.items():
            if spec.tasks[t].factor is not None and not self.s.is_abandoned(tid):
                self.due[tid] = spec.candidates(t, now_ns / 1e9, spec.can_back(t), at_tail=at_tail(self.s, tid))

    def slow(self, now_ns: int) -> list[tuple[Any, int]]:
        """Backups that ran past ``2k`` times the median and the usual spread's far end themselves
        (the block is slow, not its first attempt): ``(connection, block)`` pairs to tell to drop
        it; the core forgets them (their ends, when they come, count for nothing) and their twins
        run on."""
        spec = self.spec
        if spec is None or not self.holders:
            return []
        out: list[tuple[Any, int]] = []
        for tid, t in self.t.items():
            for i in spec.slow_backups(t, now_ns / 1e9):
                cc = self._told_to_stop(tid, i.row, i.copy)
                if cc is not None:
                    out.append((cc, i.row))
        return out

    def _told_to_stop(self, tid: str, index: int, copy: int):
        """Copy ``copy`` of block ``index`` was told to stop (its twin won, or it is slow itself):
        forgotten, its end reported to the core (when it comes, it counts for nothing); returns
        the connection running it, or None."""
        cc = next((c for c in self.holders.get((tid, index), ()) if self.running[c][0] == copy), None)
        if cc is not None:
            self._end(cc, index)
            self.spec.lost(copy)  # type: ignore[union-attr]
        return cc

    # ------------------------------------------------------------------ invariants
    def copied(self, tid: str, index: int, ccs: list) -> bool:
        """Block ``index`` of ``tid``, held by the connections ``ccs``, is a copied block run by them."""
        return sorted(map(id, self.holders.get((tid, index), ()))) == sorted(map(id, ccs)) and len(ccs) == 2

    def validate(self, conns: Mapping[Any, Any]) -> None:
        """Raise ``AssertionError`` unless every copy followed is the first block its (open) connection holds."""
        if self.spec is None:
            assert not self.running and not self.holders, "copies followed without a speculative task"
            return
        self.spec.validate()
        for c, (copy, tid, index) in self.running.items():
            assert c.cid in conns and conns[c.cid] is c, f"copy {copy}: connection {c.cid!r} is gone"
            assert c.held and next(iter(c.held)) == index, f"copy {copy}: {c.cid!r} does not run block {index}"
            assert c in self.holders.get((tid, index), ()), f"copy {copy} not listed at its block"
        listed = sum(len(v) for v in self.holders.values())
        assert listed == len(self.running), f"{listed} copies listed at blocks, {len(self.running)} running"
        spec = self.spec
        running = {(t, row): len(cs) for t in range(len(spec.tasks)) for row, cs in spec.running(t).items()}
        mine = {(self.t[tid], index): len(ccs) for (tid, index), ccs in self.holders.items()}
        assert running == mine, f"the core runs {running}, the connections {mine}"
