"""A task's tail on the TCP hand-out: which of its jobs end and which one stays, without I/O.

A task is at its **tail** when no block of it is ready and none is pending (waiting for
upstream blocks): every block it has left is in flight. A ``Client`` that asks for a
block then is told to end (``NO_MORE``: its ``acquire_block()`` yields None, its program
and worker function return, a launcher's job ends), as daisy does, instead of holding a
job (a GPU, on a cluster) idle while the last, slowest blocks run.

**One job stays** per task (``KEEP_AT_TAIL``), parked, while a block in flight could still
need a retry (its failed attempts are fewer than the task's ``max_retries``), and it is
told to end as soon as none can (the last retryable block finished, or failed for good,
or the task was abandoned). When a block fails at the tail, the kept job takes its
retry at once instead of a new job waiting in the batch system's queue; a second
failure at the same moment (or one after the kept job has gone) is served by the pool's
spawn plan, which starts one worker function per ready block that no waiting job can
take (:meth:`daisy_nb.runtime.local.functions.Functions.waiting` counts the parked and the
not yet connected jobs). Why one, not none and not one per retryable block: none makes
every tail failure wait for a job to be submitted, queued and started (seconds on a
local launcher, minutes on a busy cluster); one per block keeps most of the jobs idle
for the whole straggler time to cover failures that rarely come together. One costs at
most one idle job per task for the length of its tail, and is none with
``max_retries=0``.

:class:`TailKeep` decides; :class:`daisy_nb.runtime.net.handout.HandOut` asks it when a
connection asks at a task's tail and, for the one it keeps, again once the blocks in
flight changed (a release or an acquisition of the task: :meth:`TailKeep.touch`).
:func:`check_tail` is the invariant after the parked connections were served: at a
task's tail, at most ``KEEP_AT_TAIL`` of its connections are parked, and only while a
block in flight could still need a retry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["KEEP_AT_TAIL", "TailKeep", "at_tail", "check_tail"]

KEEP_AT_TAIL = 1  # jobs of a task kept parked at its tail while a retry could need one


def at_tail(s, tid: str) -> bool:
    """No block of ``tid`` is ready or pending: what it has left is in flight (or it was abandoned)."""
    return s.is_abandoned(tid) or (s.ready_count(tid) == 0 and s.remaining_count(tid) - s.processing_count(tid) <= 0)


def retry_possible(s, tid: str, held: Iterable[int]) -> bool:
    """One of the blocks ``held`` (rows of ``tid`` in flight) would be retried if it failed now."""
    max_r = s.tasks[tid].max_retries
    if max_r <= 0 or s.is_abandoned(tid):
        return False
    retries = s.block_states(tid).retries  # failed attempts so far, per row
    return any(int(retries[i]) < max_r for i in held)


class TailKeep:
    """Whether a job that asks at its task's tail stays parked (see the module docstring)."""

    def __init__(self, scheduler, keep: int = KEEP_AT_TAIL):
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self.s = scheduler
        self.keep = keep
        self._changed: set[str] = set()  # tasks whose blocks in flight changed since their kept job was judged

    def touch(self, tid: str) -> None:
        """Blocks of ``tid`` were released or acquired: a kept job of it is judged again."""
        self._changed.add(tid)

    def stays(self, tid: str, kept_others: int, held: Callable[[], Iterable[int]]) -> bool:
        """A job of ``tid`` asks at its tail: True if it stays parked. ``kept_others``: the task's
        other parked jobs; ``held``: the rows of ``tid`` in flight (asked only when it matters)."""
        if kept_others >= self.keep:
            return False
        self._changed.discard(tid)
        return retry_possible(self.s, tid, held())

    def rejudge(self, tid: str, n_parked: int) -> bool:
        """``tid`` is at its tail with ``n_parked`` parked jobs: judge them again (more than are
        kept, its blocks in flight changed since they were judged, or none is left in flight)?"""
        return n_parked > self.keep or tid in self._changed or self.s.processing_count(tid) == 0


def check_tail(core: Any, trs: Mapping[str, Any]) -> None:
    """Raise ``AssertionError`` unless, at every task's tail, at most ``keep`` connections are parked,
    and only while a block in flight could still need a retry (after ``serve_parked``)."""
    s = core.s
    for tid, tr in trs.items():
        ccs = core.parked.get(tr, {})
        if not ccs or not at_tail(s, tid):
            continue
        assert len(ccs) <= core.tail.keep, f"task {tid!r}: {len(ccs)} connections parked at its tail"
        held = [i for cc in core.conns.values() if cc.tr is tr for i in cc.held]
        assert retry_possible(s, tid, held), f"task {tid!r}: a connection kept at its tail, but no retry can come"
