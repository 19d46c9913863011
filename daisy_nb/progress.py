"""What users see: tqdm bars per task, a JSON-lines observer, the execution summary.

Observers get ``on_start/on_progress/on_finish(states)`` with a ``{task_id:
TaskState}`` snapshot; every runtime (serial, pool, dask) calls ``on_progress`` at
most every 0.2 s through :class:`Heartbeat`; an observer that raises is reported once per
observer and event, at WARNING with its traceback, and never stops the run. Looks follow
daisy 2.0 (docs/how-to/migrate.md#progress); the summary adds time and blocks/s per task.

``tqdm`` (~30-40 ms to import, most of it ``importlib.metadata`` finding its version) is
imported when the bars' observer is made, at a pool run's start: the worker template starts
in its own process meanwhile, so a small run's wall time does not show it. (It was imported
on a thread, which was no faster, and whatever a thread allocates goes to a malloc arena of
its own: the main process kept ~0.6 MiB more.) Outside IPython the bar class is
``tqdm.std``'s: ``tqdm.auto`` is the same bar plus an asyncio mixin (~30 ms of imports a
script never uses); under IPython it is ``tqdm.auto``'s, as in daisy.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    from daisy_nb.scheduler import TaskState

# one abandonment policy for every runtime; re-exported where it was
from daisy_nb.runtime.common.failures import ABANDON_NOT_WAITING, ABANDON_RESTARTS, raise_if_abandoned  # noqa: F401

logger = logging.getLogger("daisy")

__all__ = ["JsonProgressObserver", "TqdmObserver", "print_error_groups", "print_resource_utilization", "print_summary"]


def one_line(tid: str) -> str:
    """A task id as one line of a table: control characters (``\\n``, ``\\t``...) escaped as in
    Python's repr, everything else (non-ASCII names included) as is."""
    return tid if tid.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in tid)


def _ordered(states, task_order):
    if task_order is None:
        return sorted(states)
    seen = set(task_order)
    return [t for t in task_order if t in states] + sorted(t for t in states if t not in seen)


def _printer(file):
    """``p(line="")``: print a line of a panel to ``file`` (else stdout), ignoring a closed stream."""
    out = file if file is not None else (sys.stdout or sys.__stdout__)

    def p(s=""):
        try:
            print(s, file=out)
        except ValueError:
            pass

    return p


def _ran(st) -> int:
    """Blocks a task has run (completed or failed, skipped ones not counted): what blocks/s counts."""
    return int(st.completed_count) - int(st.skipped_count) + int(st.failed_count)


def tqdm_class():
    """The bar class: ``tqdm.auto``'s under IPython (a notebook widget there), else ``tqdm.std``'s."""
    if "IPython" in sys.modules:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


class TqdmObserver:
    """One ``tqdm`` bar per task, in display order: ``"<task> ▶ ♻=<restarts>"``.

    On a terminal bars refresh at most every 0.1 s; when stdout is not a terminal
    (logs, CI) at most every 10 s, so a long run does not write a line per update.
    """

    def __init__(self, task_order=None, file=None):
        self._order = list(task_order) if task_order else None
        self._bars = {}
        self._desc = {}
        self._file = file
        self._tqdm = tqdm_class()

    def _bar(self, tid, total):
        bar = self._bars.get(tid)
        if bar is None:
            tqdm = self._tqdm
            out = self._file if self._file is not None else sys.stderr
            tty = getattr(out, "isatty", lambda: False)()
            bar = tqdm(
                total=total,
                desc=f"{one_line(tid)} ▶ ♻=0",
                unit="block",
                leave=True,
                dynamic_ncols=True,
                file=out,
                mininterval=0.1 if tty else 10.0,
                maxinterval=10.0 if tty else 60.0,
            )
            self._bars[tid] = bar
            self._desc[tid] = f"{one_line(tid)} ▶ ♻=0"
        return bar

    def _set_desc(self, tid, sym, restarts, refresh=False):
        d = f"{one_line(tid)} {sym} ♻={restarts}"
        if self._desc.get(tid) != d:
            self._bars[tid].set_description(d, refresh=refresh)
            self._desc[tid] = d

    def on_start(self, states):
        for tid in _ordered(states, self._order):
            self._bar(tid, int(states[tid].total_block_count))

    def on_progress(self, states):
        for tid in _ordered(states, self._order):
            st = states[tid]
            bar = self._bar(tid, int(st.total_block_count))
            self._set_desc(tid, "▶", int(st.worker_restart_count))
            bar.set_postfix(
                {
                    "⧗": int(st.pending_count),
                    "▶": int(st.processing_count),
                    "✔": int(st.completed_count),
                    "✗": int(st.failed_count),
                    "∅": int(st.orphaned_count),
                },
                refresh=False,
            )
            delta = int(st.completed_count) - bar.n
            if delta > 0:
                bar.update(delta)

    def on_finish(self, states):
        for tid in _ordered(states, self._order):
            st = states[tid]
            bar = self._bar(tid, int(st.total_block_count))
            delta = int(st.completed_count) - bar.n
            if delta > 0:
                bar.update(delta)
            sym = "✗" if st.failed_count else ("∅" if st.orphaned_count else "✔")
            self._set_desc(tid, sym, int(st.worker_restart_count), refresh=True)
            bar.close()


class JsonProgressObserver:
    """One JSON line per task per event (``start``/``progress``/``finish``), daisy 2.0's schema
    plus ``job_ends`` (``worker_job_end_count``: the ``failures`` that were job ends, not crashes)
    and ``job_secs_held``/``job_secs_busy`` (worker-seconds the task's workers were held, and
    those its blocks ran: :class:`~daisy_nb.scheduling.job_seconds.JobSeconds`).

    The hang alarm's events (:mod:`daisy_nb.hang`) are lines too: ``{"t", "event":
    "hang" | "resumed", "task", "stalled_secs", ...}`` (a ``hang`` line names the
    running blocks and their workers in ``running``).

    Parameters
    ----------
    path : str or os.PathLike, optional
        A file to write the lines to (created or truncated; closed at ``finish``).
    stream : file object, optional
        A text stream to write the lines to instead (default: ``sys.stdout``); it is
        not closed.

    Raises
    ------
    ValueError
        Both ``path`` and ``stream`` are given.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, stream: IO[str] | None = None) -> None:
        if path is not None and stream is not None:
            raise ValueError("specify path OR stream, not both")
        if path is not None:
            self._sink = open(path, "w", buffering=1)
            self._owns = True
        else:
            self._sink = stream if stream is not None else sys.stdout
            self._owns = False

    def _emit(self, event, states):
        t = time.time()
        for tid, st in states.items():
            line = {
                "t": t,
                "event": event,
                "task": tid,
                "total": int(st.total_block_count),
                "ready": int(st.ready_count),
                "processing": int(st.processing_count),
                "completed": int(st.completed_count),
                "skipped": int(st.skipped_count),
                "failed": int(st.failed_count),
                "orphaned": int(st.orphaned_count),
                "restarts": int(st.worker_restart_count),
                "failures": int(st.worker_failure_count),
                "job_ends": int(getattr(st, "worker_job_end_count", 0)),
                "job_secs_held": round(float(getattr(st, "job_seconds_held", 0.0)), 3),
                "job_secs_busy": round(float(getattr(st, "job_seconds_busy", 0.0)), 3),
            }
            self._sink.write(json.dumps(line) + "\n")
        try:
            self._sink.flush()
        except (OSError, ValueError):  # a full disk, a closed pipe or stream: the lines are best effort
            pass

    def on_alarm(self, event: Mapping[str, Any]) -> None:
        """A hang alarm's event (``hang``/``resumed``) as one line, with its time ``t``."""
        line = dict(event)
        line.setdefault("t", time.time())
        try:
            self._sink.write(json.dumps(line) + "\n")
            self._sink.flush()
        except (OSError, ValueError):
            pass

    def on_start(self, states: Mapping[str, TaskState]) -> None:
        """One ``start`` line per task."""
        self._emit("start", states)

    def on_progress(self, states: Mapping[str, TaskState]) -> None:
        """One ``progress`` line per task."""
        self._emit("progress", states)

    def on_worker_job(self, info: Mapping[str, Any]) -> None:
        """A launcher's job (``daisy_nb.launch``): ``{"event": "job", "task", "worker", "scheduler",
        "job", "state"}``, and ``"cause"`` when a failed job's batch system said why
        (``"OUT_OF_MEMORY (used 15.8 GiB of 16 GiB requested)"``; a daisy_nb extension; daisy
        2.0's lines are unchanged)."""
        self._sink.write(json.dumps({"t": time.time(), "event": "job", **info}) + "\n")
        try:
            self._sink.flush()
        except (OSError, ValueError):  # a full disk, a closed pipe or stream: the lines are best effort
            pass

    def on_finish(self, states: Mapping[str, TaskState]) -> None:
        """One ``finish`` line per task; a file given as ``path`` is then closed."""
        self._emit("finish", states)
        if self._owns:
            try:
                self._sink.close()
            except (OSError, ValueError):
                pass


def print_summary(states, task_order=None, elapsed_per_task=None, *, interrupted=False, file=None):
    """Print daisy's "Execution Summary" table, plus time and blocks/s per task.

    Then the first failure's traceback (if any), timeout attribution, and where the
    worker logs are. ``interrupted`` prefixes "Run interrupted; counts at shutdown:".
    """
    from daisy_nb import logging as dlog

    p = _printer(file)

    if interrupted:
        p()
        p("Run interrupted; counts at shutdown:")
    p()
    p("Execution Summary")
    p("-----------------")
    if not states:
        return
    elapsed_per_task = elapsed_per_task or {}
    rows, failed_tasks = [], []
    for tid in _ordered(states, task_order):
        st = states[tid]
        if st.failed_count > 0:
            sym = "✗"
            failed_tasks.append(tid)
        elif st.orphaned_count > 0:
            sym = "∅"
        elif st.pending_count > 0 or st.processing_count > 0 or getattr(st, "ready_count", 0) > 0:
            sym = "…"
        else:
            sym = "✔"
        secs = float(elapsed_per_task.get(tid, 0.0) or 0.0)
        ran = _ran(st)
        rate = f"{ran / secs:,.0f}" if secs > 0 else "-"
        rows.append(
            (
                one_line(tid),
                sym,
                st.total_block_count,
                st.completed_count,
                st.skipped_count,
                st.failed_count,
                st.orphaned_count,
                f"{secs:.2f}s",
                rate,
            )
        )
    name_w = max(len("task"), *(len(r[0]) for r in rows))
    heads = [
        (name_w + 2, "task", "<"),
        (7, "blocks", ">"),
        (10, "completed", ">"),
        (7, "skipped", ">"),
        (6, "failed", ">"),
        (8, "orphaned", ">"),
        (9, "time", ">"),
        (10, "blocks/s", ">"),
    ]
    p()
    p("    " + "  ".join(f"{h:{a}{w}}" for w, h, a in heads))
    p("    " + "  ".join("─" * w for w, _, _ in heads))
    for tid, sym, *vals in rows:
        first = f"{tid} {sym}".ljust(name_w + 2)
        p("    " + "  ".join([first] + [f"{v:>{w}}" for (w, _, _), v in zip(heads[1:], vals)]))
    for tid in failed_tasks:
        tb = getattr(states[tid], "first_worker_error", None)
        if tb:
            n_more = states[tid].failed_count - 1
            p()
            p(f"    First failure in task '{tid}':")
            for line in str(tb).splitlines():
                p(f"      {line}")
            if n_more > 0:
                p(f"      (+ {n_more} more failed blocks — see worker logs)")
            break
    for tid in _ordered(states, task_order):
        st = states[tid]
        reclaims = getattr(st, "timeout_reclaim_count", 0)
        if reclaims:
            t = getattr(st, "timeout_secs", None)
            shown = f"{t:g}s" if t is not None else "the configured timeout"
            default = " — the default" if t == 600.0 else ""
            p()
            p(
                f"    {reclaims} block attempt(s) in task '{tid}' exceeded the block timeout ({shown}{default}; "
                "pass Task(timeout=...) to raise it for slow blocks)"
            )
    base = dlog.get_log_basedir()
    if failed_tasks and base is not None and dlog.get_log_mode() != "console":
        p()
        if len(failed_tasks) == 1:
            p(f"    See worker logs for details under {base / failed_tasks[0]}/")
        else:
            p(f"    See worker logs for failed tasks under {base}/")
            for tid in failed_tasks:
                p(f"      {base / tid}/")
    print_resource_utilization(states, task_order, file=file)
    print_error_groups(states, task_order, file=file)


def print_error_groups(states, task_order=None, *, file=None, traceback_lines: int = 6) -> bool:
    """The failures of each task grouped by exception type and message shape (daisy_nb extension,
    after daisy's panels): count, first/last block and ROI, the worker's log, a traceback tail.
    Reads ``TaskState.error_groups`` (:mod:`daisy_nb.errors`); prints nothing without errors."""
    from daisy_nb.errors import format_groups

    per_task = []
    for tid in _ordered(states, task_order):
        eg = getattr(states[tid], "error_groups", None)
        if eg is not None and len(eg):
            per_task.append((tid, eg.total, eg.as_list()))
    if not per_task:
        return False
    p = _printer(file)

    p()
    p("Errors by kind")
    p("--------------")
    for tid, total, groups in per_task:
        blocks = sum(g["count"] for g in groups if g["type"] != "worker error")
        workers = total - blocks
        what = [f"{blocks:,} block error(s)"] if blocks else []
        what += [f"{workers:,} worker error(s)"] if workers else []
        p(f"    task '{tid}': {' and '.join(what)}, {len(groups)} kind(s)")
        for line in format_groups(groups, indent="      ", traceback_lines=traceback_lines):
            p(line)
    return True


def _bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def print_resource_utilization(states, task_order=None, *, file=None) -> bool:
    """daisy 2.0 wheel's "Resource Utilization" panel, for tasks with ``resource_tracking=True``.

    Reads ``TaskState.resource_stats`` (a :class:`daisy_nb.profiling.TaskResourceStats`,
    None for untracked tasks); prints nothing, and returns False, when no task has
    one. ``mean ms ∠ slope``: mean block duration and the OLS slope of the duration
    (ms per block) against the release index, over successful blocks. Peak RSS is
    the largest worker-process peak seen (``ru_maxrss``), not a sum over workers.
    """
    tracked = [
        (tid, states[tid].resource_stats)
        for tid in _ordered(states, task_order)
        if getattr(states[tid], "resource_stats", None) is not None
    ]
    if not tracked:
        return False
    p = _printer(file)

    rs = [r for _, r in tracked]
    blocks = sum(r.blocks for r in rs)
    cpu = sum(r.cpu_seconds for r in rs)
    wall = sum(r.wall_seconds for r in rs)
    per = f"{cpu / wall:.2f}" if wall > 0 else "-"
    p()
    p("Resource Utilization")
    p("--------------------")
    for label, value in (
        ("blocks measured", f"{blocks:,}"),
        ("CPU time", f"{cpu:.2f}s"),
        ("in-block time", f"{wall:.2f}s"),
        ("CPU per block-s", per),
        ("peak RSS", _bytes(max(r.peak_rss_bytes for r in rs))),
        ("IO read", _bytes(sum(r.io_read_bytes for r in rs))),
        ("IO write", _bytes(sum(r.io_write_bytes for r in rs))),
    ):
        p(f"    {label:<16}{value:>12}")
    rows = []
    for tid, r in tracked:
        mean, slope = r.mean_block_ms, r.block_ms_slope
        ms = "-" if mean != mean else (f"{mean:.1f} ∠ " + ("-" if slope != slope else f"{slope:+.3f}"))
        rows.append(
            (one_line(tid), f"{r.blocks:,}", f"{r.failed:,}", ms, f"{r.cpu_seconds:.2f}", _bytes(r.peak_rss_bytes))
        )
    name_w = max(len("task"), *(len(r[0]) for r in rows))
    heads = [
        (name_w, "task", "<"),
        (8, "blocks", ">"),
        (6, "fails", ">"),
        (18, "mean ms ∠ slope", ">"),
        (8, "cpu s", ">"),
        (10, "peak RSS", ">"),
    ]
    p()
    p("    " + "  ".join(f"{h:{a}{w}}" for w, h, a in heads))
    p("    " + "  ".join("─" * w for w, _, _ in heads))
    for row in rows:
        p("    " + "  ".join(f"{v:{a}{w}}" for (w, _, a), v in zip(heads, row)))
    return True


def finish_run(states, task_order, elapsed, *, summary: bool, interrupted: bool, interrupt=None):
    """End of a run, shared by every runtime: print the summary, then re-raise a Ctrl-C
    as ``KeyboardInterrupt`` (``interrupt``, else a new one) carrying the states (daisy
    2.0 wheel behaviour)."""
    for st in states.values():  # runtimes that measure nothing (dask) still answer the attribute
        if not hasattr(st, "resource_stats"):
            st.resource_stats = None
    if summary:
        print_summary(states, task_order, elapsed, interrupted=interrupted)
    if interrupted:
        e = interrupt if interrupt is not None else KeyboardInterrupt("run aborted by SIGINT")
        e.daisy_states = states
        e.daisy_task_order = list(task_order)
        raise e


def resolve_observer(progress, task_order):
    """``progress=`` of run_blockwise: True -> tqdm bars, False/None -> none, else the object."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return TqdmObserver(task_order=task_order)
    return progress


PROGRESS_SECS = 0.2  # how often the runtimes call the observer's on_progress
FLUSH_SECS = 1.0  # how often they flush block tracking to disk


class Heartbeat:
    """The runtimes' periodic chores, called from their loops with the current
    ``time.monotonic()``: ``on_progress`` every ``PROGRESS_SECS`` and a tracking flush
    every ``FLUSH_SECS`` (an msync of the pages marked since the last one: the marks
    themselves are in the tracking files already, see :mod:`daisy_nb.tracking`),
    and the hang alarm's check (``alarm``, a :class:`daisy_nb.hang.HangAlarm`).
    The serial runner calls it between blocks."""

    def __init__(self, observer, scheduler, alarm=None):
        self.observer, self.scheduler = observer, scheduler
        self.alarm = alarm
        self.last_progress = self.last_flush = time.monotonic()

    def __call__(self, now: float) -> None:
        if now - self.last_progress >= PROGRESS_SECS:
            self.last_progress = now
            notify(self.observer, "on_progress", self.scheduler)
        if now - self.last_flush >= FLUSH_SECS:
            self.last_flush = now
            self.scheduler.flush_tracking()
        if self.alarm is not None:
            self.alarm.check(now)


_reported: set = set()  # (id of the observer, event) already reported as raising


def notify(observer, what: str, scheduler) -> None:
    """Call ``observer.<what>(states)``. An observer never breaks a run: one that raises is
    reported once per observer and event, at WARNING with the traceback; later raises of the
    same kind are counted at DEBUG only."""
    if observer is None:
        return
    call_observer(observer, what, scheduler.task_states)


def call_observer(observer, what: str, *args) -> None:
    """``observer.<what>(*args)`` if it has it; what it raises is reported (see :func:`notify`)."""
    fn = getattr(observer, what, None)
    if fn is None:
        return
    try:
        fn(*args)
    except Exception:  # a user's observer: any bug of theirs, reported once, never fatal
        key = (id(observer), what)
        if key in _reported:
            logger.debug("progress observer %r raised again in %s", observer, what, exc_info=True)
            return
        _reported.add(key)
        logger.warning(
            "progress observer %s raised in %s (reported once; the run goes on)",
            type(observer).__name__, what, exc_info=True,
        )  # fmt: skip
