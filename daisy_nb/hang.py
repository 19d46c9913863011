"""The hang alarm: say so when a task's blocks stop finishing while some are running.

A task *hangs* when no block of it has finished for ``max(secs, factor x its median
block time)`` while blocks of it are running (defaults 60 s and 10; the median is
over the task's last :data:`SAMPLES` measured block times, and ``secs`` alone until
one is measured). Then the alarm

* logs a warning on the ``"daisy"`` logger naming the running blocks (id, write
  ROI), their workers (worker number and pid, ``Client`` connection, dask worker)
  and for how long each has run;
* sends the observers that have an ``on_alarm(event)`` method an event dict
  (``event: "hang"``; the JSON observer writes it as a line, the live dashboard
  shows a banner);
* repeats at doubling intervals (after T, 2T, 4T, ... without progress), so it
  never floods, and says ``"resumed"`` (a warning and an ``event: "resumed"``)
  when a block of the task finishes again, or when none is running any more.

A failed block waiting for its retry (``Task(retry_backoff=...)``) is pending, not
running: the wait never raises the alarm.

Configuration: ``run_blockwise(..., hang_alarm=...)``: None (the default: on, with
``DAISY_NB_HANG_SECS`` / ``DAISY_NB_HANG_FACTOR`` from the environment, else 60
and 10), False (off; also ``DAISY_NB_HANG_SECS=0``), a number of seconds (the
floor ``secs``), or a dict ``{"secs": 1.0, "factor": 10.0}``.

The runtimes say what is running (``running()``: a list of
:class:`daisy_nb.runtime.snapshot.RunningBlock`, one per worker; the older tuples
``(task_id, rows, worker label, pid, started monotonic seconds)`` are read too) and
record block times on their
:class:`daisy_nb.runtime.common.taskrun.TaskRun` (``block_secs``); the checks are here,
once. The pool and dask run them from :class:`daisy_nb.progress.Heartbeat` (their
loops never block); the serial runner, whose loop is inside the block, from a
small daemon thread (:meth:`HangAlarm.start_thread`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from daisy_nb import config
from daisy_nb.scheduling.median import median

__all__ = ["HangAlarm", "HangConfig", "resolve_hang_alarm"]

logger = logging.getLogger("daisy")

DEFAULT_SECS = config.HANG_SECS.default
DEFAULT_FACTOR = config.HANG_FACTOR.default
CHECK_SECS = 0.5  # how often the alarm looks
SAMPLES = 64  # block times per task the median is taken over
MAX_NAMED = 20  # running blocks named per event


class HangConfig(NamedTuple):
    secs: float  # the floor of the threshold
    factor: float  # times the median block time


def _positive(v, what: str, allow_zero: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{what} must be a number, got {type(v).__name__}")
    f = float(v)
    if math.isnan(f) or f < 0 or (f == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {v!r}")
    return f


def resolve_hang_alarm(hang_alarm) -> HangConfig | None:
    """``run_blockwise``'s ``hang_alarm=`` as a :class:`HangConfig`, or None (off); bad values raise."""
    if hang_alarm is False:
        return None
    secs = config.HANG_SECS.get()
    factor = config.HANG_FACTOR.get()
    if hang_alarm is None or hang_alarm is True:
        pass
    elif isinstance(hang_alarm, dict):
        unknown = set(hang_alarm) - {"secs", "factor"}
        if unknown:
            raise ValueError(f"hang_alarm: unknown keys {sorted(unknown)} (use 'secs' and 'factor')")
        secs = _positive(hang_alarm.get("secs", secs), "hang_alarm['secs']")
        factor = _positive(hang_alarm.get("factor", factor), "hang_alarm['factor']", allow_zero=True)
    elif isinstance(hang_alarm, (int, float)) and not isinstance(hang_alarm, bool):
        secs = _positive(hang_alarm, "hang_alarm (seconds)")
    else:
        raise TypeError(
            "hang_alarm must be None (defaults), False (off), a number of seconds or a dict "
            f"{{'secs': ..., 'factor': ...}}, got {type(hang_alarm).__name__}"
        )
    if secs == 0:
        return None  # DAISY_NB_HANG_SECS=0
    return HangConfig(secs, factor)


class _TaskWatch:
    __slots__ = ("alarms", "last", "next_at", "sig")

    def __init__(self, now: float):
        self.sig: tuple = ()
        self.last = now  # the last progress, or when blocks started running again
        self.alarms = 0  # alarms given since the last progress
        self.next_at = 0.0  # stalled seconds at which the next alarm is due


def _roi(offset, shape) -> str:
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(offset, shape)) + "]"


class HangAlarm:
    """Watches one run (see the module docstring); call :meth:`check` with ``time.monotonic()``."""

    def __init__(
        self,
        scheduler,
        observer,
        config: HangConfig,
        running: Callable[[], list],
        trs: dict,
    ):
        self.s = scheduler
        self.observer = observer
        self.config = config
        self.running = running
        self.trs = trs
        now = time.monotonic()
        self.watch = {tid: _TaskWatch(now) for tid in scheduler.task_ids}
        self.last_check = now
        self.events: list[dict] = []  # every event sent, in order (small: alarms double their interval)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._running_failed = False

    # ------------------------------------------------------------------ checks
    def median_block_secs(self, tid: str) -> float | None:
        tr = self.trs.get(tid)
        samples = getattr(tr, "block_secs", None)
        return median(samples) if samples else None

    def threshold(self, tid: str) -> tuple[float, float | None]:
        med = self.median_block_secs(tid)
        t = self.config.secs if med is None else max(self.config.secs, self.config.factor * med)
        return t, med

    def check(self, now: float, force: bool = False) -> None:
        """Look at every task (at most every :data:`CHECK_SECS`); alarm or say resumed."""
        if now - self.last_check < CHECK_SECS and not force:
            return
        self.last_check = now
        s = self.s
        due = []
        for tid in s.task_ids:
            w = self.watch[tid]
            c = s.counts(tid)
            ctr = s.counters[tid]
            sig = (c.completed, c.failed, int(ctr.worker_failure_count), int(ctr.timeout_reclaim_count))
            busy = c.processing > 0
            if sig != w.sig or not busy:
                if w.alarms:
                    why = "a block finished" if sig != w.sig else "no block is running any more"
                    self._resumed(tid, now - w.last, why)
                w.sig, w.last, w.alarms = sig, now, 0
                continue
            stalled = now - w.last
            limit, med = self.threshold(tid)
            if w.alarms == 0:
                w.next_at = limit
            if stalled >= w.next_at:
                due.append((tid, stalled, limit, med, c.processing))
        if due:
            running = self._running_by_task(now)
            for tid, stalled, limit, med, n_proc in due:
                w = self.watch[tid]
                w.alarms += 1
                w.next_at = limit * 2**w.alarms  # T, 2T, 4T, ... without progress
                self._alarm(tid, stalled, limit, med, n_proc, running.get(tid, []), w.next_at - stalled)

    def _running_by_task(self, now: float) -> dict[str, list[dict]]:
        """The running blocks per task, described (ids, ROIs, workers, how long)."""
        from daisy_nb.runtime.snapshot import RunningBlock

        out: dict[str, list[dict]] = {}
        s = self.s
        try:
            entries = list(self.running())
        except Exception:  # the runtime's bug: the alarm still warns, naming no block; said once
            if not self._running_failed:
                self._running_failed = True
                logger.warning("hang alarm: could not list the running blocks", exc_info=True)
            entries = []
        for entry in entries:
            r = RunningBlock.of(entry)
            if r.task_id not in s.tasks or not r.rows:
                continue
            lst = out.setdefault(r.task_id, [])
            if len(lst) >= MAX_NAMED:
                continue
            d = s.describe(r.task_id, list(r.rows[:5]))
            lst.append(
                {
                    "block_id": int(d.block_id[0]),
                    "block_ids": [int(v) for v in d.block_id],
                    "blocks": len(d.block_id),
                    "read_roi": {"offset": d.read_offset[0].tolist(), "shape": d.read_shape[0].tolist()},
                    "write_roi": {"offset": d.write_offset[0].tolist(), "shape": d.write_shape[0].tolist()},
                    "worker": r.worker,
                    "pid": r.pid,
                    "running_secs": None if r.started is None else round(now - r.started, 1),
                }
            )
        return out

    # ------------------------------------------------------------------ telling
    def _send(self, event: dict) -> None:
        event = dict(event, t=time.time())
        self.events.append(event)
        if self.observer is not None:
            from daisy_nb.progress import call_observer

            call_observer(self.observer, "on_alarm", event)  # one that raises: reported once

    def _alarm(self, tid, stalled, limit, med, n_proc, running, next_in) -> None:
        how = f"max({self.config.secs:g} s, {self.config.factor:g} x median block time " + (
            f"{med:.3g} s)" if med is not None else "not measured yet)"
        )
        named = "; ".join(
            f"block {r['block_id']} (write ROI {_roi(r['write_roi']['offset'], r['write_roi']['shape'])}"
            + (f", 1 of a batch of {r['blocks']}" if r["blocks"] > 1 else "")
            + f") on {r['worker']}"
            + (f" (pid {r['pid']})" if r["pid"] else "")
            + (f" for {r['running_secs']:.0f} s" if r["running_secs"] is not None else "")
            for r in running
        )
        logger.warning(
            "task %r: no block finished for %.0f s (threshold %.3g s = %s) while %d block(s) are in flight%s; "
            "next warning in %.0f s unless one finishes",
            tid, stalled, limit, how, n_proc, f": {named}" if named else "", next_in,
        )  # fmt: skip
        self._send(
            {
                "event": "hang",
                "task": tid,
                "stalled_secs": round(stalled, 3),
                "threshold_secs": round(limit, 3),
                "median_block_secs": None if med is None else round(med, 6),
                "alarm": self.watch[tid].alarms,
                "next_in_secs": round(next_in, 1),
                "processing": n_proc,
                "running": running,
            }
        )

    def _resumed(self, tid, stalled, why) -> None:
        logger.warning("task %r: resumed (%s after %.0f s without progress)", tid, why, stalled)
        self._send({"event": "resumed", "task": tid, "stalled_secs": round(stalled, 3), "reason": why})

    # ------------------------------------------------------------------ serial runner
    def start_thread(self) -> None:
        """Check from a daemon thread (the serial runner's loop is inside the block)."""

        def loop():
            while not self._stop.wait(CHECK_SECS / 2):
                try:
                    self.check(time.monotonic())
                except Exception:  # a bug here must not end the run: said once, with the traceback, then quiet
                    logger.warning("hang alarm: its check failed; it stops watching this run", exc_info=True)
                    return

        self._thread = threading.Thread(target=loop, name="daisy_nb-hang-alarm", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The run's loop ended: a last look, so that a task alarmed about says it resumed."""
        self.stop()
        if any(w.alarms for w in self.watch.values()):
            self.check(time.monotonic(), force=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None


def make_alarm(config: HangConfig | None, scheduler, observer, running, trs) -> Any:
    """A :class:`HangAlarm`, or None when the alarm is off."""
    if config is None:
        return None
    return HangAlarm(scheduler, observer, config, running, trs)
