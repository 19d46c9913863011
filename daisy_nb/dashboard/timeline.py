"""The worker timeline: one row per worker, a bar per batch of blocks, idle gaps visible.

Rows are block-function workers of the pool, ``Client`` connections (0-argument
worker functions, which a cluster job runs: their job id shows when the worker
carries one in ``Worker.job``), and dask workers. Each row has a state
(``starting`` until its first bar, ``running``, ``idle``, ``lost`` when it
failed, ``exited``).

**Where the times come from (the hot path).** Nothing per block in the
scheduler process beyond what is measured anyway: the pool's block workers
report each *batch* (``D``/``X``; its run time is in shared memory,
``batch_elapsed_ns``), so a batch of fast blocks is one bar ending when the
scheduler read the result; a ``Client`` reports each block (its release frame,
started when it was sent or when the previous one ended); a dask batch, when
its result arrives (``elapsed_ns``). Each is one :meth:`Timeline.bar` call, and
only when a timeline is attached (``dashboard=`` or ``report=``).

**Bounded memory, whatever the run's length.** Per row:

* the bars of the last :data:`WINDOW_S` seconds at full resolution, except that
  a bar that starts less than 1/3000 of the run so far (at most of the window:
  0.2 s) after the previous one of the same task extends it, as a pixel of the
  drawing would; a bar keeps its busy seconds, so its shade still says how much
  of it was work; at most :data:`MAX_BARS` (beyond, the oldest fold early);
* older bars are folded into fixed time buckets: busy seconds per task per
  bucket. When a row would need more than :data:`MAX_BUCKETS` buckets, every
  bucket width doubles (neighbours merge), so the history of a week-long run
  takes as much memory as an hour's, at a coarser resolution.

At most :data:`MAX_ROWS` rows: beyond, the oldest finished rows are dropped
(their block counts stay in ``retired``). So the timeline holds at most
``MAX_ROWS * (MAX_BARS + MAX_BUCKETS * tasks)`` small records.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

__all__ = ["MAX_BARS", "MAX_BUCKETS", "MAX_ROWS", "WINDOW_S", "Timeline"]

WINDOW_S = 600.0  # full-resolution window
MAX_BARS = 3000  # bars per row within the window
MAX_BUCKETS = 240  # aggregated history per row
MAX_ROWS = 256
RUNNING_SLACK_S = 1.0  # a row whose last bar ended this recently counts as running


class _Row:
    __slots__ = (
        "key", "label", "task", "kind", "pid", "job", "t_start", "t_end", "lost",
        "bars", "buckets", "blocks", "failed", "busy", "t_first",
    )  # fmt: skip

    def __init__(self, key, task, kind, label, pid, job, t):
        self.key, self.task, self.kind, self.label = key, task, kind, label
        self.pid, self.job = pid, job
        self.t_start, self.t_end, self.lost = t, None, False
        self.bars: deque = deque()  # [t0, t1, task index, blocks, failed, busy seconds]
        self.buckets: dict[int, dict[int, float]] = {}  # bucket index -> {task index: busy seconds}
        self.blocks = self.failed = 0
        self.busy = 0.0
        self.t_first = None  # first bar's start


class Timeline:
    """Recent bars and aggregated history per worker (see the module docstring).

    Times are ``time.monotonic()`` seconds. Written by the runtime's thread
    (:meth:`worker`, :meth:`bar`, :meth:`ended`); :meth:`to_json` may run on
    another thread (it takes the lock that the writers take only when they
    reshape history).
    """

    def __init__(self, window_s: float = WINDOW_S, max_bars: int = MAX_BARS, max_buckets: int = MAX_BUCKETS):
        self.window = float(window_s)
        self.t0 = time.monotonic()
        self.max_bars = int(max_bars)
        self.max_buckets = int(max_buckets)
        self.bucket_s = max(1.0, self.window / 60)
        self.rows: dict = {}
        self.tasks: list[str] = []
        self._ti: dict[str, int] = {}
        self.retired = {"rows": 0, "blocks": 0, "failed": 0, "busy_s": 0.0}
        self.lock = threading.Lock()

    # -------------------------------------------------------------- writers
    def _task(self, tid: str) -> int:
        i = self._ti.get(tid)
        if i is None:
            i = self._ti[tid] = len(self.tasks)
            self.tasks.append(tid)
        return i

    def worker(self, key, task: str, kind: str = "worker", label: str | None = None, pid=None, job=None, t=None):
        """A worker (or job, client, dask worker) appears: its row, ``starting`` until its first bar."""
        self._task(task)
        row = self.rows.get(key)
        if row is None:
            if len(self.rows) >= MAX_ROWS:
                self._retire_one()
            row = self.rows[key] = _Row(
                key, task, kind, label or str(key), pid, job, time.monotonic() if t is None else t
            )
        elif job is not None:
            row.job = job
        return row

    def moved(self, key, task: str) -> None:
        """The worker serves ``task`` from now on (a local block worker that moved: its row shows it)."""
        self._task(task)
        row = self.rows.get(key)
        if row is not None:
            row.task = task

    def ended(self, key, lost: bool = False, t: float | None = None, job=None) -> None:
        """The worker is gone; ``lost``: it failed (died, killed after a timeout, went silent);
        ``job``: its job id, if it was learnt after it started."""
        row = self.rows.get(key)
        if row is not None and job is not None:
            row.job = job
        if row is not None and row.t_end is None:
            row.t_end = time.monotonic() if t is None else t
            row.lost = bool(lost)

    def bar(self, key, task: str, t0: float, t1: float, n: int = 1, failed: int = 0) -> None:
        """``n`` blocks of ``task`` ran on ``key`` from ``t0`` to ``t1`` (``failed`` of them failed)."""
        row = self.rows.get(key)
        if row is None:
            row = self.worker(key, task, t=t0)
        ti = self._ti.get(task)
        if ti is None:
            ti = self._task(task)
        busy = t1 - t0 if t1 > t0 else 0.0
        row.blocks += n
        row.failed += failed
        row.busy += busy
        bars = row.bars
        if row.t_first is None:
            row.t_first = t0
        if bars:
            last = bars[-1]
            # merge below the drawing resolution: 1/3000 of the run so far, at most of the window
            span = t1 - self.t0
            if last[2] == ti and t0 - last[1] < (span if span < self.window else self.window) / 3000:
                if t1 > last[1]:
                    last[1] = t1
                last[3] += n
                last[4] += failed
                last[5] += busy
                if t1 - bars[0][1] > self.window:
                    self._age(row, t1)
                return
        bars.append([t0, t1, ti, n, failed, busy])
        if len(bars) > self.max_bars or t1 - bars[0][1] > self.window:
            self._age(row, t1)

    def _age(self, row: _Row, now: float) -> None:
        """Fold bars older than the window (or beyond ``max_bars``) into the row's buckets."""
        bars, w = row.bars, self.bucket_s
        with self.lock:
            while bars and (len(bars) > self.max_bars or now - bars[0][1] > self.window):
                t0, t1, ti, _n, _f, busy = bars.popleft()
                span = t1 - t0
                k0, k1 = math.floor(t0 / w), math.floor(t1 / w)
                for k in range(k0, k1 + 1):
                    part = busy if k0 == k1 else busy * (min(t1, (k + 1) * w) - max(t0, k * w)) / span
                    b = row.buckets.setdefault(k, {})
                    b[ti] = b.get(ti, 0.0) + part
            if len(row.buckets) > self.max_buckets:
                self._coarsen()

    def _coarsen(self) -> None:
        """Double the bucket width of every row (neighbouring buckets merge)."""
        while any(len(r.buckets) > self.max_buckets for r in self.rows.values()):
            self.bucket_s *= 2
            for r in self.rows.values():
                merged: dict[int, dict[int, float]] = {}
                for k, b in r.buckets.items():
                    m = merged.setdefault(k // 2, {})
                    for ti, v in b.items():
                        m[ti] = m.get(ti, 0.0) + v
                r.buckets = merged

    def _retire_one(self) -> None:
        ended = [r for r in self.rows.values() if r.t_end is not None]
        victim = min(ended or self.rows.values(), key=lambda r: r.t_end if r.t_end is not None else r.t_start)
        with self.lock:
            del self.rows[victim.key]
        self.retired["rows"] += 1
        self.retired["blocks"] += victim.blocks
        self.retired["failed"] += victim.failed
        self.retired["busy_s"] += victim.busy

    # -------------------------------------------------------------- readers
    def size(self) -> int:
        """Records held (bars + bucket entries + rows): bounded, see the module docstring."""
        return sum(1 + len(r.bars) + sum(len(b) for b in r.buckets.values()) for r in list(self.rows.values()))

    def to_json(self, now: float, t_ref: float, live: dict | None = None, max_bars_total: int = 20000) -> dict:
        """The timeline for the page: times in seconds since ``t_ref``.

        ``live``: ``{key: (state, running_since or None, job or None)}`` from the runtime's
        worker table, when known (a row then shows that state and an open bar). Rows get at
        most ``max_bars_total / rows`` bars (neighbours merged below that resolution).
        """
        with self.lock:
            rows = list(self.rows.values())
            snap = [(r, list(r.bars), {k: dict(b) for k, b in r.buckets.items()}) for r in rows]
        live = live or {}
        per_row = max(100, max_bars_total // max(1, len(rows)))
        out = []
        for r, bars, buckets in snap:
            st = live.get(r.key)
            since = None
            if r.t_end is not None:
                state = "lost" if r.lost else "exited"
            elif st is not None:
                state, since = st[0], st[1]
            elif bars and now - bars[-1][1] <= RUNNING_SLACK_S:
                state = "running"
            elif bars or buckets:
                state = "idle"
            else:
                state = "starting"
            if len(bars) > per_row:
                bars = _thin(bars, (bars[-1][1] - bars[0][0]) / per_row)
            rb = [
                [round(b[0] - t_ref, 3), round(b[1] - t_ref, 3), b[2], b[3], b[4], round(min(1.0, b[5] / (b[1] - b[0])), 2) if b[1] > b[0] else 1.0]
                for b in bars
            ]  # fmt: skip
            w = self.bucket_s
            bk = []
            for k in sorted(buckets):
                for ti, v in buckets[k].items():
                    bk.append([round(k * w - t_ref, 3), ti, round(min(1.0, v / w), 3)])
            out.append(
                {
                    "key": _key_text(r.key),
                    "label": r.label,
                    "task": r.task,
                    "kind": r.kind,
                    "pid": r.pid,
                    "job": st[2] if st is not None and len(st) > 2 and st[2] is not None else r.job,
                    "state": state,
                    "start": round(r.t_start - t_ref, 3),
                    "end": None if r.t_end is None else round(r.t_end - t_ref, 3),
                    "running_since": None if since is None else round(since - t_ref, 3),
                    "blocks": r.blocks,
                    "failed": r.failed,
                    "busy_s": round(r.busy, 3),
                    "bars": rb,
                    "buckets": bk,
                }
            )
        return {
            "now": round(now - t_ref, 3),
            "window_s": self.window,
            "bucket_s": self.bucket_s,
            "tasks": list(self.tasks),
            "rows": out,
            "retired": dict(self.retired),
        }


def _thin(bars: list, gap: float) -> list:
    """Merge neighbouring bars of one task closer than ``gap`` (for drawing: below a pixel)."""
    out: list = []
    for b in bars:
        if out and out[-1][2] == b[2] and b[0] - out[-1][1] < gap:
            last = out[-1]
            last[1] = max(last[1], b[1])
            last[3] += b[3]
            last[4] += b[4]
            last[5] += b[5]
        else:
            out.append(list(b))
    return out


def _key_text(key) -> str:
    if isinstance(key, tuple):
        return "-".join(str(k) for k in key)
    return str(key)
