"""The live source of the dashboard: a progress observer plus read-only views of a run.

:class:`LiveSource` is what ``run_blockwise(..., dashboard=...)`` plugs into the
runtime as a progress observer. The runtimes call ``on_start/on_progress/
on_finish`` with ``{task_id: TaskState}`` snapshots on their own thread (the pool
every 0.2 s); the source keeps the last snapshot, a short history of counts for
blocks/s, and the worker errors it sees appear in the states
(``last_worker_error``). What an observer does not see is read on request:

* the picture of block states and the blocks under a clicked pixel (:mod:`.block_view`): the
  scheduler's status bytes and geometry tables (read without locks, see
  :mod:`.picture`); ROIs come from the geometry kernels;
* the workers: the pool hands itself over with ``attach_runtime(pool)``; its
  worker table is copied on the runtime's thread during ``on_progress``, and
  only while a page asked for it in the last few seconds, so a run nobody
  watches pays nothing for it;
* a traceback not seen in the states (several blocks of one batch failed): the
  ``block <id> failed:`` entries of the task's worker ``.err`` logs;
* the errors by kind: ``TaskState.error_groups`` (:mod:`daisy_nb.errors`);
* the worker timeline (:mod:`.timeline`): ``attach_runtime`` hands the runtime
  ``self.timeline``, to which it reports each batch (one call per batch).

Nothing here is called per block: the run's cost is one snapshot every 0.2 s,
plus the timeline's one call per batch.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict, deque

from daisy_nb.layout import _id_in_box, block_id_to_grid, inverse_cantor  # noqa: F401  (moved; imported from here before)
from daisy_nb.progress import _ran, call_observer

from .block_view import BlockView
from .timeline import Timeline

__all__ = ["LiveSource", "Tee", "block_id_to_grid", "find_traceback_in_logs"]

# "block 7 failed:" or, with daisy's tuple block ids, "block ('task', 7) failed:"
_BLOCK_RE = re.compile(r"""^block (?:\((?:'[^'\n]*'|"[^"\n]*"), )?(\d+)\)? failed:""", re.MULTILINE)
WANT_SECS = 3.0  # copy the worker table while a page asked within this many seconds
MAX_ERRORS = 100


def find_traceback_in_logs(log_base, task_id: str, block_id: int, max_bytes: int = 4 << 20) -> str | None:
    """The last ``block <id> failed:`` entry in the task's worker ``.err`` logs, or None."""
    if log_base is None:
        return None
    from pathlib import Path

    d = Path(log_base) / task_id
    try:
        files = sorted(d.glob("worker_*.err"))
    except OSError:
        return None
    markers = (f"block {int(block_id)} failed:\n", f"block {(task_id, int(block_id))!r} failed:\n")
    best = None
    for p in files:
        try:
            with open(p, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        hits = [(text.rfind(mk), mk) for mk in markers]
        i, marker = max(hits)
        if i < 0:
            continue
        body = text[i:]
        m = _BLOCK_RE.search(body, len(marker))
        cut = [j for j in (m.start() if m else -1, body.find("\n=== daisy run ")) if j > 0]
        body = body[: min(cut)] if cut else body
        best = "\n".join(body.rstrip().splitlines()[:60])[:8192]
    return best


class Tee:
    """Calls a :class:`LiveSource` and the user's observer (either may be None)."""

    def __init__(self, source, user):
        self.source, self.user = source, user

    def _both(self, what, states):
        for obs in (self.source, self.user):
            if obs is not None:
                call_observer(obs, what, states)  # one that raises: reported once, the other still called

    def on_start(self, states):
        self._both("on_start", states)

    def on_progress(self, states):
        self._both("on_progress", states)

    def on_finish(self, states):
        self._both("on_finish", states)

    def on_worker_job(self, info):
        """A launcher's job report (``daisy_nb.launch``): the user's observer gets it (the worker
        list reads the pool's table)."""
        if self.user is not None:
            call_observer(self.user, "on_worker_job", info)

    def on_alarm(self, event):
        for obs in (self.source, self.user):
            if obs is not None:
                call_observer(obs, "on_alarm", event)

    def attach_runtime(self, runtime):
        self.source.attach_runtime(runtime)
        attach = getattr(self.user, "attach_runtime", None)
        if attach is not None:
            attach(runtime)


class _History:
    """(t, blocks run) samples of one task: 1 s apart for 20 min, then 30 s apart."""

    def __init__(self):
        self.fine: deque = deque(maxlen=1200)
        self.coarse: deque = deque(maxlen=2000)

    def add(self, t: float, ran: int) -> None:
        if not self.fine or t - self.fine[-1][0] >= 1.0:
            self.fine.append((t, ran))
        if not self.coarse or t - self.coarse[-1][0] >= 30.0:
            self.coarse.append((t, ran))

    def samples(self) -> list:
        fine = list(self.fine)
        t0 = fine[0][0] if fine else float("inf")
        return [s for s in self.coarse if s[0] < t0] + fine

    def rate(self, now: float, ran: int, window: float) -> float:
        """Blocks per second over the last ``window`` seconds (0 without history)."""
        best = None
        for t, r in reversed(self.fine):
            best = (t, r)
            if now - t >= window:
                break
        if best is None or now - best[0] <= 0.05:
            return 0.0
        return max(0.0, (ran - best[1]) / (now - best[0]))


class _ErrorLog:
    """The worker errors a run's snapshots show (``first/last_worker_error``): the last
    :data:`MAX_ERRORS` for the page, and the tracebacks of the last 1000 failed blocks by id."""

    def __init__(self) -> None:
        self.errors: deque = deque(maxlen=MAX_ERRORS)
        self.tracebacks: OrderedDict = OrderedDict()
        self._seen: dict = {}  # task id -> the last first/last error objects seen

    def take(self, tid: str, st) -> None:
        """A new snapshot ``st`` of task ``tid``: keep the errors not seen before (caller holds the lock)."""
        seen = self._seen.setdefault(tid, [None, None])
        first, last = st.first_worker_error, st.last_worker_error
        new = []
        if first is not None and first is not seen[0]:
            new.append(first)
        if last is not None and last is not seen[1] and last is not first:
            new.append(last)
        seen[0], seen[1] = first, last  # the counters keep an object until the next error replaces it
        for text in new:
            if self.errors and self.errors[-1]["task"] == tid and self.errors[-1]["text"] == text:
                continue
            m = _BLOCK_RE.match(text)
            bid = int(m.group(1)) if m else None
            self.errors.append({"task": tid, "block_id": bid, "text": text, "t": time.time()})
            if bid is not None:
                self.tracebacks[(tid, bid)] = text
                if len(self.tracebacks) > 1000:
                    self.tracebacks.popitem(last=False)


class LiveSource:
    """State of one run for the dashboard (see the module docstring)."""

    mode = "live"

    def __init__(self):
        self.lock = threading.Lock()
        self.view = BlockView()
        self.final_served = threading.Event()  # a page fetched the state after the run ended
        self._reset()

    def _reset(self):
        self.scheduler = None
        self.runtime = None
        self.runtime_name = "-"
        self.states = None
        self.t_states = 0.0
        self.t_start = time.time()
        self.t_mono = time.monotonic()
        self.finished = False
        self.t_end = 0.0
        self.elapsed: dict = {}
        self.history: dict[str, _History] = {}
        self.t_first: dict[str, float] = {}
        self.t_done: dict[str, float] = {}
        self.error_log = _ErrorLog()
        self.workers: list = []
        self.alarms: dict = {}  # task id -> the hang alarm's last "hang" event, until it resumes
        self.exited: deque = deque(maxlen=20)
        # a page that asked just before this run began (the server starts first) still watches it
        self.wanted_until = getattr(self, "wanted_until", 0.0)
        self.log_base = None
        self.view.forget()
        self.timeline = Timeline()

    # ------------------------------------------------------------- run plumbing
    def begin(self, scheduler, runtime_name: str) -> None:
        """A new run starts on ``scheduler`` (the page then shows this run)."""
        from daisy_nb import logging as dlog

        with self.lock, self.view.lock:
            self._reset()
            self.final_served.clear()
            self.scheduler = scheduler
            self.runtime_name = runtime_name
            self.log_base = dlog.get_log_basedir()
            self.history = {tid: _History() for tid in scheduler.task_ids}

    def end(self, states) -> None:
        """The run is over; ``states`` are the final TaskStates (what ``run_blockwise`` returns)."""
        if states is not None:
            self._take(states, time.monotonic())
        with self.lock:
            if not self.elapsed:
                now = time.monotonic()
                self.elapsed = {tid: (self.t_done.get(tid, now) - t0) for tid, t0 in self.t_first.items()}
            self.finished = True
            self.t_end = time.monotonic()
            self.runtime = None
            self.workers = []

    # ----------------------------------------------------------- observer side
    def attach_runtime(self, runtime) -> None:
        self.runtime = runtime
        try:  # the runtime reports batches to it (see .timeline); None-checked on its side
            runtime.timeline = self.timeline
        except AttributeError:
            pass

    def on_start(self, states):
        from daisy_nb import logging as dlog

        self.log_base = dlog.get_log_basedir()  # run_pool(log_dir=...) has set it by now
        self._take(states, time.monotonic())

    def on_alarm(self, event):
        """The hang alarm (:mod:`daisy_nb.hang`): the page shows a banner until the task resumes."""
        with self.lock:
            if event.get("event") == "hang":
                self.alarms[event.get("task")] = dict(event)
            else:
                self.alarms.pop(event.get("task"), None)

    def on_progress(self, states):
        now = time.monotonic()
        self._take(states, now)
        if self.runtime is not None and now < self.wanted_until:
            self._copy_workers(now)

    def on_finish(self, states):
        now = time.monotonic()
        rt = self.runtime
        trs = getattr(rt, "trs", None)
        if trs:  # the pool's own per-task times: blocks/s as in the execution summary
            self.elapsed = {tid: tr.elapsed(now) for tid, tr in trs.items()}
        self._take(states, now)
        with self.lock:
            self.workers = []

    def _take(self, states, now: float) -> None:
        with self.lock:
            for tid, st in states.items():
                h = self.history.get(tid)
                ran = _ran(st)
                if h is not None:
                    h.add(now, ran)
                if ran > 0 and tid not in self.t_first:
                    self.t_first[tid] = now
                if st.is_done() and tid not in self.t_done:
                    self.t_done[tid] = now
                self.error_log.take(tid, st)
            self.states, self.t_states = states, now

    def _copy_workers(self, now: float) -> None:
        """Copy the runtime's worker table (``worker_snapshots()``, typed snapshots built on the
        runtime's thread: see ``daisy_nb/runtime/snapshot.py``); a runtime without one shows none."""
        snap = getattr(self.runtime, "worker_snapshots", None)
        out = []
        if snap is not None:
            for w in snap():
                out.append(
                    {
                        "id": w.worker_id,
                        "task": w.task_id,
                        "pid": w.pid,
                        "state": w.state,
                        "alive": True,
                        "row": w.row,
                        "age_s": round(now - w.spawned, 1),
                        "since": w.since,
                        "job": w.job,
                    }
                )
        with self.lock:
            old = {w["id"]: w for w in self.workers}
            cur = {w["id"] for w in out}
            for wid, w in old.items():
                if wid not in cur:
                    self.exited.appendleft(dict(w, alive=False, state="exited", row=None, since=None))
            self.workers = out
            self._t_workers = now

    # ------------------------------------------------------------- page side
    def _states_now(self):
        """The last snapshot; read the scheduler directly if the runtime sends none (serial runner)."""
        now = time.monotonic()
        with self.lock:
            states, t, sched, fin = self.states, self.t_states, self.scheduler, self.finished
        if sched is not None and not fin and (states is None or now - t > 1.0):
            states = sched.task_states  # plain reads of the scheduler's arrays and counters
            self._take(states, now)
        return states

    def _block_ids(self, tid: str, rows: list) -> list:
        if not rows:
            return []
        return [int(v) for v in self.scheduler.describe(tid, rows).block_id]

    def state(self) -> dict:
        """``GET /api/state``."""
        self.wanted_until = time.monotonic() + WANT_SECS
        states = self._states_now()
        now = time.monotonic()
        s = self.scheduler
        tasks = []
        order = list(s.task_ids) if s is not None else sorted(states or {})
        for tid in order:
            st = (states or {}).get(tid)
            if st is None:
                continue
            tasks.append(self._task_json(tid, st, now))
        with self.lock:
            workers = [dict(w) for w in self.workers] + [dict(w) for w in self.exited]
            errors = list(self.error_log.errors)[::-1][:30]
            alarms = list(self.alarms.values())
        if s is not None:
            rows_by_task: dict = {}
            for w in workers:
                if w.get("row") is not None:
                    rows_by_task.setdefault(w["task"], []).append(w)
            for tid, ws in rows_by_task.items():
                try:
                    ids = self._block_ids(tid, [w["row"] for w in ws])
                except (KeyError, ValueError):  # a worker of a task (or row) this scheduler does not have
                    ids = [None] * len(ws)
                for w, bid in zip(ws, ids):
                    w["block_id"] = bid
        for w in workers:
            w.pop("row", None)
            w.pop("since", None)
        if self.finished:
            self.final_served.set()
        return {
            "mode": self.mode,
            "runtime": self.runtime_name,
            "started": self.t_start,
            "elapsed_s": round((self.t_end if self.finished else now) - self.t_mono, 2),
            "finished": bool(self.finished),
            "tasks": tasks,
            "workers": workers,
            "errors": [{k: v for k, v in e.items()} for e in errors],
            "alarms": alarms,
            "error_groups": self.error_groups(states),
            "log_dir": None if self.log_base is None else str(self.log_base),
        }

    def _task_json(self, tid: str, st, now: float) -> dict:
        total = int(st.total_block_count)
        done = int(st.completed_count)
        failed, orphaned = int(st.failed_count), int(st.orphaned_count)
        remaining = total - done - failed - orphaned
        h = self.history.get(tid)
        ran = _ran(st)
        if self.finished:
            secs = float(self.elapsed.get(tid, 0.0) or 0.0)
            rate = ran / secs if secs > 0 else 0.0
            eta = 0.0 if remaining == 0 else None
        else:
            rate = h.rate(now, ran, 5.0) if h else 0.0
            slow = h.rate(now, ran, 30.0) if h else 0.0
            eta = 0.0 if remaining == 0 else (remaining / slow if slow > 0 else None)
        hist = []
        if h is not None:
            smp = h.samples()
            if len(smp) > 241:
                step = len(smp) / 240
                smp = [smp[int(i * step)] for i in range(240)] + [smp[-1]]
            for (t0, r0), (t1, r1) in zip(smp, smp[1:]):
                if t1 > t0:
                    hist.append([round(t1 - self.t_mono, 2), round(max(0, r1 - r0) / (t1 - t0), 1)])
        return {
            "task_id": tid,
            "total": total,
            "completed": done,
            "skipped": int(st.skipped_count),
            "failed": failed,
            "orphaned": orphaned,
            "processing": int(st.processing_count),
            "ready": int(st.ready_count),
            "pending": int(st.pending_count),
            "remaining": remaining,
            "blocks_per_s": round(rate, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "elapsed_s": round(float(self.elapsed.get(tid, 0.0) or 0.0), 3) if self.finished else None,
            "done": bool(st.is_done()),
            "abandoned": bool(getattr(st, "abandoned", False)),
            "rate_history": hist,
            "worker_restarts": int(st.worker_restart_count),
            "worker_failures": int(st.worker_failure_count),
            "workers_started": int(st.worker_start_count),
            # worker-seconds held and busy (daisy_nb.scheduling.job_seconds.JobSeconds): what a cluster bills
            "job_secs_held": round(float(getattr(st, "job_seconds_held", 0.0)), 2),
            "job_secs_busy": round(float(getattr(st, "job_seconds_busy", 0.0)), 2),
        }

    def error_groups(self, states=None, tb_chars: int = 4000) -> list:
        """Every task's grouped errors (:mod:`daisy_nb.errors`), most frequent first."""
        states = self._states_now() if states is None else states
        out = []
        for st in (states or {}).values():
            eg = getattr(st, "error_groups", None)
            if eg is None or not len(eg):
                continue
            for g in eg.as_list():
                if g.get("traceback") and len(g["traceback"]) > tb_chars:
                    g["traceback"] = g["traceback"][:tb_chars] + "\n…"
                out.append(g)
        return out

    def timeline_json(self, max_bars_total: int = 8000) -> dict:
        """``GET /api/timeline``: the worker timeline (:mod:`.timeline`)."""
        self.wanted_until = time.monotonic() + WANT_SECS
        now = self.t_end if self.finished else time.monotonic()  # a finished run's time stands still
        live = {}
        with self.lock:
            fresh = not self.finished and now - getattr(self, "_t_workers", -1e9) < WANT_SECS
            workers = list(self.workers) if fresh else []
        names = {"busy": "running", "idle": "idle", "parked": "idle", "starting": "starting", "quitting": "running"}
        for w in workers:
            live[("w", w["id"])] = (names.get(w["state"], w["state"]), w.get("since"), w.get("job"))
        return self.timeline.to_json(now, self.t_mono, live, max_bars_total)

    def pictures(self) -> dict:
        """``GET /api/pictures`` (see :class:`.block_view.BlockView`)."""
        return self.view.pictures(self.scheduler, self.finished)

    def block(self, query: dict) -> dict:
        """``GET /api/block?task=T&panel=P&r=R&c=C`` (a pixel) or ``?task=T&block_id=ID``."""
        return self.view.block(self.scheduler, query, self._traceback)

    def _traceback(self, tid: str, bid: int) -> str | None:
        """A failed block's traceback: seen in the states, else in the task's worker logs."""
        with self.lock:
            tb = self.error_log.tracebacks.get((tid, bid))
        return find_traceback_in_logs(self.log_base, tid, bid) if tb is None else tb
