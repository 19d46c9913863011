"""Which jobs get no more blocks because their walltime is near, on the TCP hand-out, without I/O.

A job that knows when it ends (its hello carries the seconds it has left:
``Client(end_time=...)``, ``SLURM_JOB_END_TIME``; the end is kept on the hand-out's clock,
so no clock need agree) is handed no block it is unlikely to finish: when the time it has
left is under ``WALLTIME_FACTOR`` (2) times the task's median block time (of its recent
finished blocks; before the first, no rule), it is told to end (``NO_MORE``) exactly as at
the tail, whether or not a block is ready, and a parked one is told once its time runs that
short (:meth:`daisy_nb.runtime.net.handout.HandOut.serve_parked`). Its worker function's
return is a clean end, not a crash (``Jobs.job_released``), and ready blocks that no waiting
job can take make the pool start another. A block sent ahead needs one more median: the one
the job runs first.

Why twice: a block of median time is as likely to take longer as shorter, and a job killed
at its walltime mid-block costs the block's attempt, its retry and a job start counted as a
crash; twice the median turns those into a clean end and one job start.

Invariants: a job with a known end had, when its newest block was sent, at least the time
the rule asked for (``Conn.need_ns``, checked by ``handout.check_invariants``); after the
parked connections were served, none whose time ran short is parked (:func:`check_walltime`).
"""

from __future__ import annotations

import logging
from typing import Any

from daisy_nb.scheduling.median import median

__all__ = ["WALLTIME_FACTOR", "WalltimeRule", "check_walltime"]

logger = logging.getLogger("daisy")

WALLTIME_FACTOR = 2.0  # a job gets a block only while its time left covers this many median block times


def median_block_secs(tr) -> float | None:
    """The median time of ``tr``'s recent finished blocks (its last 64), None before the first."""
    return median(tr.block_secs) if tr.block_secs else None


def _short(cc, med: float | None, before: int, now_ns: int) -> int | None:
    """The time left (ns) of ``cc``'s job if it is too short for a block behind the ``before`` it
    holds (``WALLTIME_FACTOR`` medians, plus one per block before it); None: long enough, or not known."""
    if cc.end_ns is None or med is None:
        return None
    left = cc.end_ns - now_ns
    return left if left < (WALLTIME_FACTOR + before) * med * 1e9 else None


class WalltimeRule:
    """The rule, asked by the hand-out about the connections of one task at a time."""

    def split(self, tr, group: list, now_ns: int, ending: bool) -> tuple[list, list]:
        """``group`` (connections asking for a block of ``tr``) as those that may get one and those
        whose job ends too soon (``ending``: they are told to end, and it is logged). Sets the
        kept timed connections' ``need_ns`` (what the rule asks when their block goes out)."""
        if all(cc.end_ns is None for cc in group):
            return group, []
        med = median_block_secs(tr)
        keep, short = [], []
        for cc in group:
            left = _short(cc, med, len(cc.held), now_ns)
            if left is None:
                if cc.end_ns is not None:
                    cc.need_ns = None if med is None else int((WALLTIME_FACTOR + len(cc.held)) * med * 1e9)
                keep.append(cc)
                continue
            short.append(cc)
            if ending:
                logger.info(
                    "task %r: worker %s has %.1f s left, under %g times the median block time (%.3f s): told to end",
                    tr.tid, cc.wid, left / 1e9, WALLTIME_FACTOR, med,
                )  # fmt: skip
        return keep, short

    def short_parked(self, tr, parked: Any, now_ns: int) -> list:
        """The parked connections of ``tr`` whose time ran short while they waited."""
        med = median_block_secs(tr)
        return [cc for cc in parked if _short(cc, med, 0, now_ns) is not None]


def check_walltime(core, now_ns: int) -> None:
    """Raise ``AssertionError`` if, after ``HandOut.serve_parked`` at ``now_ns``, a parked
    connection's job has less time left than the walltime rule asks for a block (it must have
    been told to end)."""
    if core.stopped:
        return
    for tr, ccs in core.parked.items():
        med = median_block_secs(tr)
        for cc in ccs:
            left = _short(cc, med, 0, now_ns)
            assert left is None, (
                f"task {tr.tid!r}: connection {cc.cid!r} parked with {left / 1e9:.3f} s left, under "
                f"{WALLTIME_FACTOR:g} median block times ({med:.3f} s)"
            )
