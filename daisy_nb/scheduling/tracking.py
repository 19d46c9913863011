"""The block tracking of a pipeline's tasks: :class:`PipelineTracking`.

It owns one :class:`~daisy_nb.tracking.TrackingStore` per task that has a tracking path
(daisy 2.0.0's on-disk layout): it opens them (a store written for another layout is an
invalid configuration), says which rows a store already marks done (the Scheduler skips
them), records every release (done and skipped blocks marked, failures counted), and
flushes and closes every store even after one fails.
"""

from __future__ import annotations

import logging

import numpy as np

from daisy_nb.kernels import surface as ks
from daisy_nb.kernels import tables as kt
from daisy_nb.tracking import TrackingStore

from .geometry import PipelineGeometry

__all__ = ["PipelineTracking"]

logger = logging.getLogger("daisy_nb.scheduler")


class PipelineTracking:
    """The tracking stores of a pipeline's tasks (see the module docstring); ``stores`` is
    ``{task_id: TrackingStore}`` for the tasks that have one (none if ``enabled`` is False).

    Raises
    ------
    RuntimeError
        A store written for a different task layout ("invalid configuration"); the stores
        opened before it are closed.
    """

    def __init__(self, geometry: PipelineGeometry, enabled: bool = True) -> None:
        self.geometry = geometry
        self.stores: dict[str, TrackingStore] = {}
        if not enabled:
            return
        for tid, task in geometry.tasks.items():
            path = task.resolved_tracking_path()
            if path is None:
                continue
            try:
                store = TrackingStore.open(
                    path, task.total_roi, task.read_roi, task.write_roi, task.fit,
                    read_write_conflict=task.read_write_conflict,
                )  # fmt: skip
            except RuntimeError as e:
                self.close()
                raise RuntimeError(f"invalid configuration: {e}") from None
            self.stores[tid] = store

    def flag_done(self, preskip: np.ndarray) -> None:
        """Set ``preskip`` to 1 on the rows each store marks done (a resumed run skips them)."""
        g = self.geometry
        tt = g.tt
        for tid, store in self.stores.items():
            t = g.tindex[tid]
            lay = g.layouts[t]
            n = ks.flag_grid_cells(
                tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, t, store.done.reshape(-1),
                np.asarray(store.grid_shape, np.int64), lay.id_offset, preskip, np.uint8(1),
            )  # fmt: skip
            if n:
                logger.info("task %r: resumed — %d/%d blocks skipped via block tracking", tid, n, lay.num_blocks)

    def record(self, t: int, rows: np.ndarray, codes: np.ndarray) -> None:
        """Task ``t``'s ``rows`` were released with ``codes`` (``kernels.tables`` release codes):
        mark the done and skipped ones, count the failed ones."""
        g = self.geometry
        store = self.stores.get(g.task_ids[t])
        if store is None or len(rows) == 0:
            return
        cells = np.empty(len(rows), np.int64)
        tt = g.tt
        ks.rows_to_cells(
            tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, t, rows,
            np.asarray(store.grid_shape, np.int64), g.layouts[t].id_offset, cells,
        )  # fmt: skip
        ok = cells >= 0
        done = ok & ((codes == kt.R_SUCCESS) | (codes == kt.R_SKIPPED))
        if done.any():
            store.mark_done(cells[done])
        failed = ok & (codes == kt.R_FAILED)
        if failed.any():
            store.add_failures(cells[failed])

    def flush(self) -> None:
        """Write the marks made so far to disk (every store, even after one fails); raises the
        first ``OSError`` (a full disk...)."""
        self._each("flush")

    def close(self) -> None:
        """Flush and release every store, even after one fails; raises the first ``OSError``."""
        self._each("close")

    def _each(self, method: str) -> None:
        error = None
        for store in self.stores.values():
            try:
                getattr(store, method)()
            except OSError as e:  # a TrackingWriteError (a full disk...): ends the run
                error = error or e
        if error is not None:
            raise error
