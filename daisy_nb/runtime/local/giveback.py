"""Giving back the blocks a straggler holds hostage in its worker's batches (sans-I/O).

A block worker runs its batch's blocks one after another, and may hold a second batch sent
ahead (:mod:`.sizing`). When one block of a batch runs far longer than the task's blocks
usually do (a straggler: dense tissue, a slow disk), the blocks after it, and the whole
batch sent ahead, wait for it while other workers may have nothing to do. So once the
running block has run longer than ``GIVEBACK_FACTOR`` (4) times the task's typical time per
block, and longer than a whole batch is meant to take (a batch's target time: the
blocks of a batch carry no more work than that), the pool gives the blocks it has not
started back to the task's ready queue (to its front, uncounted, as a dead worker's
unstarted blocks go back), where idle or newly started workers take them. For a speculative
task the factor is its backup factor when smaller (the backup waits for the cut): ``min(4, k)``,
and at its tail (nothing ready or waiting, a worker parked for the copy) ``min(k, 1.5)`` typical
block times, however short a batch is meant to be (:mod:`daisy_nb.scheduling.speculation`).

**Without a lock.** The worker reads its batch's ``limit`` word in shared memory just
before it starts each block, and starts block ``i`` only while ``i < limit``
(``daisy_nb/runtime/local/_shm.py``). The pool lowers ``limit`` to the running block + 1
(:class:`Cut`; 0 for a batch sent ahead, not started), and then gives the blocks back
only once it is *sure* the worker cannot start them: at a later look, at least
``CONFIRM_NS`` after the cut, the same block is still running (same row, same start time,
its status still "running"). The worker writes a block's status after the block returns,
and reads ``limit`` only after that, so a block still running then will be followed by a
read of the lowered ``limit``. If the block finished in between, nothing is given back
early: the worker's "batch done" says which blocks it ran (status 1-3) and which it left
(status 0, given back then). So a block is never run twice and never lost, and the
decision costs the worker one word read per block.

:func:`straggling` is the rule, run by :class:`.blocks.BlockCore` on every look at the
running blocks (the pool's timeout scan, ``CHECK_SECS``); it also says when the next look is
due sooner than that (``core.look_again_ns``: ``CONFIRM_NS`` after a cut, so the blocks go
back, and a speculative task's backup copy goes out, a few ms after the cut rather than a
scan later). :class:`CutMark` is what the core remembers of a cut, per batch slot, until the
batch's "done" (or the worker's exit).

Invariants (checked by :func:`.blocks.check_invariants`): a worker's batches carry marks
only for slots it holds; a settled mark's batch holds exactly its ``keep`` rows, an
unsettled one's at least that many; only a cut batch may hold no row.

Not here: the worker's side (``daisy_nb/runtime/local/worker.py``), the shared memory
(:class:`.batches.Batches`), the TCP hand-out (a Client holds at most one block sent ahead,
given back when its job ends, ``daisy_nb/runtime/net/handout.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from daisy_nb.block import BlockStatus
from daisy_nb.runtime.local.actions import Cut

__all__ = ["CONFIRM_NS", "GIVEBACK_FACTOR", "Cut", "CutMark", "Running", "straggling"]

GIVEBACK_FACTOR = 4.0  # a running block past this many typical block times holds the rest of its batches hostage
CONFIRM_NS = 2_000_000  # a cut is trusted only at a later look, at least this long after it (ns)

_PROCESSING = int(BlockStatus.PROCESSING)

logger = logging.getLogger("daisy")


class Running(NamedTuple):
    """What a busy worker's oldest batch says in shared memory at one look."""

    cur: int  # the row (position in the batch) it runs, -1: none
    start_ns: int  # when that block started (``time.monotonic_ns``)
    status: int  # that block's status as the worker last wrote it


@dataclass
class CutMark:
    """A cut of one batch, until its blocks are given back (``settled``) or its "done" comes."""

    keep: int
    at_slot: int  # the slot of the batch running when cut
    cur: int  # its running row then
    start_ns: int  # and when that block started
    t_ns: int  # when the cut was made
    settled: bool = False  # the blocks from ``keep`` on were given back and the batch trimmed


def straggling(core, now_ns: int, running: Mapping[int, Running]) -> list[Cut]:
    """One look at the running blocks: new cuts to make, and cuts confirmed (their blocks given
    back to the scheduler, the batches trimmed)."""
    out: list[Cut] = []
    again = None
    for wid, r in running.items():
        w = core.workers.get(wid)
        if w is None or not w.queue or core.aborting or core.s.is_abandoned(w.tid):
            continue
        if w.cuts:
            _settle(core, w, now_ns, r)
        else:
            out += _cut(core, w, now_ns, r)
        for m in w.cuts.values():  # a cut not yet confirmable: the look that confirms it is due then
            due = m.t_ns + CONFIRM_NS
            if not m.settled and due > now_ns:
                again = due if again is None else min(again, due)
    core.look_again_ns = again
    return out


def _cut(core, w, now_ns: int, r: Running) -> list[Cut]:
    """Cut ``w``'s batches if their running block is a straggler and holds blocks back."""
    backup = core.backups.cut_factor(w.tid)  # a speculative task's backup needs the cut first
    factor = GIVEBACK_FACTOR if backup is None else min(GIVEBACK_FACTOR, backup[0])
    secs = core.sizing.straggler_secs(w.tid, factor, at_least_a_batch=backup is None or not backup[1])
    slot0, rows0 = w.queue[0]
    if secs is None or r.status != _PROCESSING or not 0 <= r.cur < len(rows0):
        return []
    if now_ns - r.start_ns <= secs * 1e9:
        return []
    out = []
    for i, (slot, rows) in enumerate(w.queue):
        keep = r.cur + 1 if i == 0 else 0
        if keep < len(rows):
            w.cuts[slot] = CutMark(keep, slot0, r.cur, r.start_ns, now_ns)
            out.append(Cut(w.wid, slot, keep))
    return out


def _settle(core, w, now_ns: int, r: Running) -> None:
    """Give back the cut blocks of ``w`` if the block running at the cut still runs (see the
    module docstring), and trim its batches to the blocks it keeps."""
    mark = next(iter(w.cuts.values()))
    if mark.settled or now_ns - mark.t_ns < CONFIRM_NS:
        return
    if w.queue[0][0] != mark.at_slot or (r.cur, r.start_ns, r.status) != (mark.cur, mark.start_ns, _PROCESSING):
        return  # it finished meanwhile: its "done" says which blocks it left
    n = 0
    for i, (slot, rows) in enumerate(w.queue):
        m = w.cuts.get(slot)
        if m is None or m.settled:
            continue
        back = rows[m.keep :]
        core.s.release_blocks(w.tid, back, np.zeros(len(back), dtype=np.uint8))
        w.queue[i] = (slot, rows[: m.keep])
        m.settled = True
        n += len(back)
    core.tasks[w.tid].given_back += n
    logger.debug(
        "daisy_nb: task %s: %d blocks given back from worker %d's batches, behind a block running for %.2f s",
        w.tid, n, w.wid, (now_ns - mark.start_ns) / 1e9,
    )  # fmt: skip
