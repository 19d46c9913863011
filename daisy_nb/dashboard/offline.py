"""``daisy-nb dashboard PATH...``: the dashboard page, read-only, from block-tracking stores.

Each request re-reads the stores (at most once a second), so the page follows a
run that is going on elsewhere (the stores are flushed about once a second) as
well as showing a finished one. Tracking knows per cell only "done" and the
number of failed attempts, so the counts are done / failed (failures recorded,
not done) / remaining; workers, processing and orphaned blocks are not known
here. Without the task's ROIs (``--total-roi/--read-roi/--write-roi``, as for
``daisy-nb status``) every cell of the tracking grid counts as a block, and a
clicked block shows its tracking cell and id but no ROIs. Tracebacks come from
the worker logs (``--logs``, default ``$DAISY_NB_LOG_DIR``, else ``./daisy_logs``,
if present). Access as for the live dashboard: the printed URL carries the token
every request needs (``--token``, ``$DAISY_NB_DASHBOARD_TOKEN``; ``--no-token``
turns it off), IPv4 or IPv6 (``--bind ::1``).
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time

import numpy as np

from . import picture as pic
from .live import _History, find_traceback_in_logs

__all__ = ["TrackingSource", "add_arguments", "main"]

REREAD_SECS = 1.0


class TrackingSource:
    """The dashboard's source over tracking stores (``state``, ``pictures``, ``block``)."""

    mode = "tracking"

    def __init__(self, targets, paths, logs=None, geometry=None):
        self.targets = {t.name: t for t in targets}
        self.paths = [str(p) for p in paths]
        self.logs = logs
        self.geometry = geometry
        self.lock = threading.Lock()
        self.t_mono = time.monotonic()
        self.history = {name: _History() for name in self.targets}
        self._state = None
        self._state_t = -1e9
        self._pics = None
        self._pics_t = -1e9
        self._failed: dict = {}  # task -> [(cell, failures)] found by the last picture pass
        self._tb_cache: dict = {}
        self._groups: list = []
        self._groups_t = -1e9

    def _status(self):
        from daisy_nb.status import StatusError, task_status

        out = {}
        for name, t in self.targets.items():
            try:
                out[name] = task_status(t)
            except StatusError as e:
                out[name] = {"error": str(e)}
        return out

    def state(self) -> dict:
        now = time.monotonic()
        with self.lock:
            if self._state is not None and now - self._state_t < REREAD_SECS:
                return dict(self._state, errors=self._errors())
            tasks = []
            for name, s in self._status().items():
                if "error" in s:
                    tasks.append(
                        {
                            "task_id": name,
                            "error": s["error"],
                            "total": 0,
                            "completed": 0,
                            "skipped": 0,
                            "failed": 0,
                            "orphaned": 0,
                            "processing": 0,
                            "remaining": 0,
                            "blocks_per_s": 0.0,
                            "eta_s": None,
                            "done": False,
                            "rate_history": [],
                        }
                    )
                    continue
                h = self.history[name]
                h.add(now, s["done"])
                rate, slow = h.rate(now, s["done"], 5.0), h.rate(now, s["done"], 30.0)
                remaining = s["total"] - s["done"] - s["skipped_by_mask"] - s["failed"]
                hist = []
                smp = h.samples()[-241:]
                for (t0, r0), (t1, r1) in zip(smp, smp[1:]):
                    if t1 > t0:
                        hist.append([round(t1 - self.t_mono, 2), round(max(0, r1 - r0) / (t1 - t0), 1)])
                tasks.append(
                    {
                        "task_id": name,
                        "total": s["total"],
                        "completed": s["done"] + s["skipped_by_mask"],
                        "skipped": s["skipped_by_mask"],
                        "failed": s["failed"],
                        "orphaned": 0,
                        "processing": 0,
                        "remaining": remaining,
                        "blocks_per_s": round(rate, 1),
                        "eta_s": 0.0 if remaining == 0 else (round(remaining / slow, 1) if slow > 0 else None),
                        "done": bool(s["complete"]),
                        "counted": s["counted"],
                        "path": s["path"],
                        "failure_histogram": {str(k): v for k, v in s["failure_histogram"].items()},
                        "rate_history": hist,
                    }
                )
            self._state = {
                "mode": self.mode,
                "runtime": "tracking",
                "paths": self.paths,
                "elapsed_s": round(now - self.t_mono, 2),
                "finished": all(t.get("done") for t in tasks),
                "tasks": tasks,
                "workers": [],
                "errors": self._errors(),
                "error_groups": self._error_groups(now),
                "log_dir": None if self.logs is None else str(self.logs),
            }
            self._state_t = now
            return self._state

    def _error_groups(self, now: float) -> list:
        """The worker logs' failures grouped by kind (:mod:`daisy_nb.errors`), re-read every 10 s."""
        if self.logs is None or now - self._groups_t < 10.0:
            return self._groups
        from daisy_nb.errors import groups_from_logs

        self._groups = [g for name in self.targets for g in groups_from_logs(self.logs, name).as_list()]
        self._groups_t = now
        return self._groups

    def _errors(self) -> list:
        """The first failed blocks of each task (found by the picture pass), tracebacks from the logs."""
        from daisy_nb.block import cantor_number

        out = []
        for name, found in self._failed.items():
            for cell, failures in found:
                bid = cantor_number(cell)
                key = (name, bid, failures)
                if key not in self._tb_cache:
                    tb = find_traceback_in_logs(self.logs, name, bid) if self.logs is not None else None
                    self._tb_cache[key] = tb or f"failed {failures} time(s); no traceback in the worker logs"
                    if len(self._tb_cache) > 5000:
                        self._tb_cache.pop(next(iter(self._tb_cache)))
                out.append({"task": name, "block_id": bid, "text": self._tb_cache[key], "t": None})
        return out[:60]

    def pictures(self) -> dict:
        now = time.monotonic()
        with self.lock:
            if self._pics is not None and now - self._pics_t < REREAD_SECS:
                return self._pics
            out = {}
            for name, t in self.targets.items():
                try:
                    with t.open() as reader:
                        lo, hi = (t.block_lo, t.block_hi) if t.knows_blocks else (None, None)
                        shape = (
                            tuple(b - a for a, b in zip(lo, hi))
                            if lo is not None and hi is not None
                            else reader.grid_shape
                        )
                        found: list = []
                        out[name] = pic.picture(shape, pic.tracking_slabs(reader, lo, hi, found))
                        self._failed[name] = found
                except (OSError, ValueError, RuntimeError):  # unreadable right now (being rewritten): keep the last one
                    if self._pics and name in self._pics["tasks"]:
                        out[name] = self._pics["tasks"][name]
            self._pics = {"tasks": out, "t": time.time()}
            self._pics_t = now
            return self._pics

    def block(self, query: dict) -> dict:
        from daisy_nb.block import cantor_number
        from daisy_nb.layout import _id_in_box

        name = str(query.get("task"))
        t = self.targets.get(name)
        if t is None:
            raise KeyError(f"no task {name!r}")
        with t.open() as reader:
            grid = reader.grid_shape
            lo0 = t.block_lo if t.knows_blocks else (0,) * len(grid)
            hi0 = t.block_hi if t.knows_blocks else grid
            shape = tuple(b - a for a, b in zip(lo0, hi0))
            if "block_id" in query:
                g = _id_in_box(int(query["block_id"]), lo0, shape)
                if g is None:
                    raise KeyError("not a block of this task")
                boxes = [(g, tuple(v + 1 for v in g))]
            else:
                boxes = pic.PictureLayout(shape).pixel_box(int(query.get("panel", 0)), int(query["r"]), int(query["c"]))
            inner = math.prod(grid[1:])
            cell_parts, done_parts, fail_parts = [], [], []
            for lo, hi in boxes:
                lo_c = [a + b for a, b in zip(lo, lo0)]
                hi_c = [a + b for a, b in zip(hi, lo0)]
                d, f = reader.read(lo_c[0] * inner, (hi_c[0] - lo_c[0]) * inner)
                sel = (slice(None), *(slice(a, b) for a, b in zip(lo_c[1:], hi_c[1:])))
                d = d.reshape(hi_c[0] - lo_c[0], *grid[1:])[sel]
                f = f.reshape(hi_c[0] - lo_c[0], *grid[1:])[sel]
                idx = np.indices(d.shape).reshape(len(grid), -1).T + np.asarray(lo_c)
                cell_parts.append(idx)
                done_parts.append(d.reshape(-1))
                fail_parts.append(f.reshape(-1))
        cells = np.concatenate(cell_parts) if cell_parts else np.zeros((0, len(grid)), np.int64)
        done = np.concatenate(done_parts) if done_parts else np.zeros(0, np.uint8)
        fails = np.concatenate(fail_parts) if fail_parts else np.zeros(0, np.uint32)
        status = np.where(done != 0, 1, np.where(fails != 0, 2, 0))  # waiting, done, failed
        names = ["waiting", "done", "failed"]
        counts = {names[i]: int(c) for i, c in enumerate(np.bincount(status, minlength=3)) if c}
        prio = (status == 2).astype(np.int64) * 2 + (fails > 0)  # failed, then done after failures
        order = np.argsort(-prio, kind="stable")[:12]
        blocks = []
        for i in order.tolist():
            c = [int(v) for v in cells[i]]
            bid = cantor_number(c)
            b = {
                "block_id": bid,
                "cell": c,
                "status": names[int(status[i])],
                "skipped": False,
                "failed_attempts": int(fails[i]),
                "read_roi": None,
                "write_roi": None,
                "traceback": None,
            }
            if self.geometry is not None:
                b["read_roi"], b["write_roi"] = _rois(self.geometry, c)
            if fails[i] and self.logs is not None:
                b["traceback"] = find_traceback_in_logs(self.logs, name, bid)
            blocks.append(b)
        return {
            "task": name,
            "blocks_in_pixel": len(status),
            "counts": counts,
            "blocks": blocks,
            "boxes": [[list(map(int, lo)), list(map(int, hi))] for lo, hi in boxes],
        }


def _rois(lay, cell):
    g = np.asarray(cell, np.int64) - lay.id_offset
    wo = lay.tw_offset + g * lay.write_shape
    ws = lay.write_shape.copy()
    if lay.fit == "shrink":
        ws = np.minimum(ws, lay.tw_offset + lay.tw_shape - wo)
    ro = wo - lay.cul
    rs = ws + lay.cul + lay.clr
    return ({"offset": ro.tolist(), "shape": rs.tolist()}, {"offset": wo.tolist(), "shape": ws.tolist()})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``daisy-nb dashboard``."""
    from daisy_nb.status_cli import add_target_arguments

    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument(
        "--bind",
        metavar="ADDRESS",
        default=None,
        help="listen on this address instead of 127.0.0.1 (IPv4 or IPv6: ::1, :: for every address)",
    )
    tok = parser.add_mutually_exclusive_group()
    tok.add_argument(
        "--token",
        default=None,
        help="the token every request must carry (in the printed URL); default: $DAISY_NB_DASHBOARD_TOKEN "
        "if set (off: none), else a random one",
    )
    tok.add_argument(
        "--no-token",
        action="store_true",
        help="no token: anyone who can reach the address (other users on 127.0.0.1 too) can read it",
    )
    parser.add_argument(
        "--logs",
        metavar="DIR",
        default=None,
        help="worker log basedir for tracebacks (default: $DAISY_NB_LOG_DIR, else ./daisy_logs, if it exists)",
    )
    add_target_arguments(parser, "the task's ROIs, to count its real blocks and show ROIs (as for `status`)")


def make_source(args) -> TrackingSource:
    from daisy_nb.status_cli import targets_from_args

    targets, geometry = targets_from_args(args)
    logs = args.logs
    if logs is None:
        from daisy_nb.logging import existing_log_basedir

        logs = existing_log_basedir()
    return TrackingSource(targets, args.paths, logs=logs, geometry=geometry)


class _Stop(Exception):
    """SIGINT or SIGTERM: end the offline dashboard."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def main(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C (or SIGTERM). Exit code 2 on bad input."""
    import signal

    from daisy_nb.status import StatusError

    from . import Dashboard

    try:
        source = make_source(args)
        source.state()  # fail now on unreadable stores
    except StatusError as e:
        print(f"daisy_nb dashboard: error: {e}", file=sys.stderr)
        return 2
    try:
        token = False if getattr(args, "no_token", False) else getattr(args, "token", None)
        dash = Dashboard(port=args.port, host=args.bind or "127.0.0.1", token=token, quiet=True)
    except (TypeError, ValueError) as e:
        print(f"daisy_nb dashboard: error: {e}", file=sys.stderr)
        return 2
    dash.source = source
    try:
        dash.start()
    except OSError as e:
        print(f"daisy_nb dashboard: error: {e}", file=sys.stderr)
        return 2
    # SIGINT is handled as SIGTERM, not left to Python: a process started with SIGINT ignored (a shell
    # script's background job, `cmd &`) keeps it ignored and gets no KeyboardInterrupt, so `kill -INT`
    # would not end it. The handler raises (setting an Event from a handler can deadlock on its lock).
    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:  # Ctrl-C as soon as the URL is printed ends it as cleanly as later (exit code 0)
        print(
            f"daisy_nb dashboard (read-only, {len(source.targets)} task(s) from block tracking): {dash.url}", flush=True
        )
        while True:
            time.sleep(3600)
    except _Stop:
        pass
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        dash.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(prog="python -m daisy_nb.dashboard.offline")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
