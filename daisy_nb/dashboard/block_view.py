"""What the dashboard reads from the scheduler on request: the picture of block states and the
blocks under a clicked pixel.

Plain reads of the scheduler's status bytes and geometry tables, without locks (see
:mod:`.picture`); ROIs come from the geometry kernels. :class:`BlockView` owns the pictures'
cache (a picture costs what its grid costs: it is recomputed at most every ``max(0.5 s, 20 x its
cost)``); :class:`.live.LiveSource` hands it the run's scheduler and knows the tracebacks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from daisy_nb.kernels import tables as kt
from daisy_nb.layout import block_id_to_grid

from . import picture as pic

__all__ = ["BlockView"]

_STATUS_NAMES = {
    kt.PENDING: "pending",
    kt.READY: "ready",
    kt.PROCESSING: "processing",
    kt.DONE: "done",
    kt.FAILED: "failed",
    kt.ORPHANED: "orphaned",
}
# the blocks of a clicked pixel listed first: failed, orphaned, processing, ready, pending, done
_LIST_PRIORITY = np.zeros(len(_STATUS_NAMES), np.int64)
_LIST_PRIORITY[[kt.FAILED, kt.ORPHANED, kt.PROCESSING, kt.READY, kt.PENDING, kt.DONE]] = np.arange(1, 7)
MAX_LISTED = 12  # blocks described per clicked pixel


class BlockView:
    """The picture of each task's block states and the blocks under a pixel, read on request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.forget()

    def forget(self) -> None:
        """A new run: the cached pictures are another run's (caller holds :attr:`lock`)."""
        self._pics: dict | None = None
        self._pics_t = -1e9
        self._pics_cost = 0.0
        self._pics_final = False

    def pictures(self, s, final: bool) -> dict:
        """``GET /api/pictures``: one picture per task of scheduler ``s``, recomputed at most every
        ``max(0.5 s, 20 x its cost)`` so that huge grids take at most ~5 % of a core; ``final``:
        the run has ended (its picture stands still)."""
        if s is None:
            return {"tasks": {}}
        now = time.monotonic()
        with self.lock:
            fresh = self._pics is not None and (self._pics_final or now - self._pics_t < max(0.5, 20 * self._pics_cost))
            if fresh:
                return self._pics
            t0 = time.perf_counter()
            out = {}
            for tid in s.task_ids:
                lay = s.tasks[tid].layout
                bs = s.block_states(tid)
                out[tid] = pic.picture(lay.grid_shape, pic.live_slabs(lay, bs.status, bs.preskip))
            self._pics_cost = time.perf_counter() - t0
            self._pics_t = time.monotonic()
            self._pics = {"tasks": out, "t": time.time()}
            self._pics_final = final
            return self._pics

    def block(self, s, query: dict, traceback: Callable[[str, int], str | None]) -> dict:
        """``GET /api/block?task=T&panel=P&r=R&c=C`` (a pixel) or ``?task=T&block_id=ID`` on
        scheduler ``s``; ``traceback(task, block_id)`` finds a failed block's traceback."""
        tid = str(query.get("task"))
        if s is None or tid not in s.tasks:
            raise KeyError(f"no task {tid!r}")
        lay = s.tasks[tid].layout
        if "block_id" in query:
            g = block_id_to_grid(lay, int(query["block_id"]))
            boxes = [] if g is None else [(g, tuple(v + 1 for v in g))]
        else:
            pl = pic.PictureLayout(lay.grid_shape)
            boxes = pl.pixel_box(int(query.get("panel", 0)), int(query["r"]), int(query["c"]))
        parts = []
        for lo, hi in boxes:
            n = int(np.prod(np.subtract(hi, lo)))
            if n <= 0 or n > 4_000_000:
                continue
            parts.append(s.rows_in_grid_box(tid, lo, hi)[0])
        rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        bs = s.block_states(tid)
        st = bs.status[rows]
        n_codes = len(_STATUS_NAMES)
        counts = {_STATUS_NAMES[i]: int(c) for i, c in enumerate(np.bincount(st, minlength=n_codes)[:n_codes]) if c}
        prio = _LIST_PRIORITY[np.minimum(st, n_codes - 1)]
        pick = rows[np.argsort(prio, kind="stable")[:MAX_LISTED]]
        blocks = []
        if len(pick):
            d = s.describe(tid, pick)
            for i, row in enumerate(pick.tolist()):
                code = int(bs.status[row])
                bid = int(d.block_id[i])
                retries = int(bs.retries[row])
                tb = traceback(tid, bid) if code == kt.FAILED or retries > 0 else None
                blocks.append(
                    {
                        "block_id": bid,
                        "row": int(row),
                        "status": _STATUS_NAMES.get(code, str(code)),
                        "skipped": bool(code == kt.DONE and bs.preskip[row]),
                        "failed_attempts": retries + (1 if code == kt.FAILED else 0),
                        "read_roi": {"offset": d.read_offset[i].tolist(), "shape": d.read_shape[i].tolist()},
                        "write_roi": {"offset": d.write_offset[i].tolist(), "shape": d.write_shape[i].tolist()},
                        "traceback": tb,
                    }
                )
        return {
            "task": tid,
            "blocks_in_pixel": len(rows),
            "counts": counts,
            "blocks": blocks,
            "boxes": [[list(map(int, lo)), list(map(int, hi))] for lo, hi in boxes],
        }
