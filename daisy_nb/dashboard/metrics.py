"""``GET /metrics``: the dashboard's state in the Prometheus text exposition format (version 0.0.4).

Written by hand from :meth:`LiveSource.state` (or the offline source's), since
nothing of the official client library would be used but its text format. One
sample per task (label ``task``) and, where it applies, per ``state``:

=================================== ======= ==================================================
metric                              type    what
=================================== ======= ==================================================
``daisy_nb_blocks``                 gauge   blocks by ``state``: done, skipped, processing,
                                            ready, pending, failed, orphaned (they add up to
                                            the task's blocks)
``daisy_nb_task_blocks``            gauge   the task's blocks
``daisy_nb_blocks_run_total``       counter blocks run so far (done + failed, skipped not counted)
``daisy_nb_blocks_per_second``      gauge   blocks run per second over the last 5 s
``daisy_nb_eta_seconds``            gauge   estimated time left (absent when unknown)
``daisy_nb_workers``                gauge   the pool's workers by ``state``: starting, idle, busy,
                                            parked, quitting, exited (recently)
``daisy_nb_worker_restarts_total``  counter workers replaced after a failure
``daisy_nb_worker_failures_total``  counter worker failures (exits, lost clients, timeouts)
``daisy_nb_task_hung``              gauge   1 while the hang alarm is raised for the task
``daisy_nb_run_finished``           gauge   1 once the run is over (no ``task`` label)
``daisy_nb_run_elapsed_seconds``    gauge   seconds since the run started (no ``task`` label)
=================================== ======= ==================================================

Behind the same access rule as the page: on another address than 127.0.0.1 the
scrape needs the token (``params: {token: [...]}`` in a Prometheus scrape config).
"""

from __future__ import annotations

import math

__all__ = ["CONTENT_TYPE", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_BLOCK_STATES = ("done", "skipped", "processing", "ready", "pending", "failed", "orphaned")
_WORKER_STATES = ("starting", "idle", "busy", "parked", "quitting", "exited")


def _label(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v) -> str:
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    return repr(int(f)) if f.is_integer() and abs(f) < 2**53 else repr(f)


class _Out:
    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{lab}}} {_num(value)}" if lab else f"{name} {_num(value)}")


def render(state: dict) -> str:
    """The Prometheus text of one ``/api/state`` document."""
    tasks = state.get("tasks") or []
    o = _Out()
    blocks = []
    for t in tasks:
        tid = t["task_id"]
        skipped = int(t.get("skipped", 0))
        proc, ready = int(t.get("processing", 0) or 0), int(t.get("ready", 0) or 0)
        pending = t.get("pending")  # from tracking (daisy-nb dashboard): the never-run blocks are "remaining"
        pending = int(pending) if pending is not None else max(0, int(t.get("remaining", 0) or 0) - proc - ready)
        counts = {
            "done": int(t.get("completed", 0)) - skipped,
            "skipped": skipped,
            "processing": proc,
            "ready": ready,
            "pending": pending,
            "failed": int(t.get("failed", 0)),
            "orphaned": int(t.get("orphaned", 0) or 0),
        }
        blocks += [({"task": tid, "state": k}, counts[k]) for k in _BLOCK_STATES]
    o.family("daisy_nb_blocks", "gauge", "Blocks of a task by state.", blocks)
    o.family(
        "daisy_nb_task_blocks", "gauge", "Blocks of a task.", [({"task": t["task_id"]}, t["total"]) for t in tasks]
    )
    o.family(
        "daisy_nb_blocks_run_total",
        "counter",
        "Blocks run so far (done or failed; skipped blocks not counted).",
        [({"task": t["task_id"]}, int(t["completed"]) - int(t.get("skipped", 0)) + int(t["failed"])) for t in tasks],
    )
    o.family(
        "daisy_nb_blocks_per_second",
        "gauge",
        "Blocks run per second over the last 5 seconds.",
        [({"task": t["task_id"]}, t.get("blocks_per_s") or 0) for t in tasks],
    )
    o.family(
        "daisy_nb_eta_seconds",
        "gauge",
        "Estimated seconds left (absent when unknown).",
        [({"task": t["task_id"]}, t["eta_s"]) for t in tasks if t.get("eta_s") is not None],
    )
    by = {(t["task_id"], s): 0 for t in tasks for s in _WORKER_STATES}
    for w in state.get("workers") or []:
        key = (w.get("task"), w.get("state"))
        if key in by:
            by[key] += 1
    o.family(
        "daisy_nb_workers",
        "gauge",
        "Worker processes of a task by state (exited: recently).",
        [({"task": tid, "state": s}, n) for (tid, s), n in by.items()],
    )
    o.family(
        "daisy_nb_worker_restarts_total",
        "counter",
        "Workers replaced after a failure.",
        [({"task": t["task_id"]}, t.get("worker_restarts", 0) or 0) for t in tasks],
    )
    o.family(
        "daisy_nb_worker_failures_total",
        "counter",
        "Worker failures (exits, lost clients, timeouts).",
        [({"task": t["task_id"]}, t.get("worker_failures", 0) or 0) for t in tasks],
    )
    hung = {a.get("task") for a in state.get("alarms") or []}
    o.family(
        "daisy_nb_task_hung",
        "gauge",
        "1 while the hang alarm is raised for the task.",
        [({"task": t["task_id"]}, 1 if t["task_id"] in hung else 0) for t in tasks],
    )
    o.family("daisy_nb_run_finished", "gauge", "1 once the run is over.", [({}, 1 if state.get("finished") else 0)])
    if state.get("elapsed_s") is not None:
        o.family("daisy_nb_run_elapsed_seconds", "gauge", "Seconds since the run started.", [({}, state["elapsed_s"])])
    return "\n".join(o.lines) + "\n"
