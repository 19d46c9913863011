"""A pipeline's block state before the first hand-out: which blocks are skipped, which are ready.

Two decisions, both made once when the Scheduler is built (the state is its, packed for the
kernels, ``kernels/surface.py``):

* :func:`flag_skips`: the blocks that will not run. A block its task's tracking records as done
  is flagged 1 (by :class:`~daisy_nb.scheduling.tracking.PipelineTracking`); a block a task's
  ``skip_mask`` covers is flagged 2 here. Both count as skipped when the surface reaches them.
* :func:`seed_ready`: the blocks ready at the start. A source task (no upstream task) hands out
  its level-0 blocks lazily, so only their count is set. A downstream task starts with its
  level-0 blocks that depend on no upstream block: daisy never queues those
  (``docs/explanation/defects.md``, "Blocks that read nothing from their upstream tasks"); here
  they are queued at once.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from daisy_nb.kernels import surface as ks
from daisy_nb.kernels import tables as kt

from .geometry import PipelineGeometry

__all__ = ["flag_skips", "seed_ready"]


def flag_skips(geo: PipelineGeometry, skip_masks: Mapping[str, np.ndarray | None], preskip: np.ndarray) -> None:
    """Flag 2 in ``preskip`` for every block a task's skip mask covers (one flag per grid cell)."""
    tt = geo.tt
    for t, tid in enumerate(geo.task_ids):
        mask = skip_masks.get(tid)
        if mask is None:
            continue
        lay = geo.layouts[t]
        ks.flag_grid_cells(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, t, mask.reshape(-1),
                           lay.grid_shape, np.zeros(lay.ndim, np.int64), preskip, np.uint8(2))  # fmt: skip


def seed_ready(geo: PipelineGeometry, cnt: np.ndarray, status: np.ndarray, queue: np.ndarray) -> None:
    """Set each task's ready blocks at the start (see the module docstring)."""
    tt, e, p = geo.tt, geo.e, geo.tptr
    for t in range(len(geo.task_ids)):
        lay = geo.layouts[t]
        if not geo.up_tasks[t]:
            cnt[t, kt.C_ROOTS_LEFT] = lay.num_roots
            cnt[t, kt.C_READY] = lay.num_roots
        elif lay.num_roots and geo.may_have_free_blocks(t):
            ks.seed_free_blocks(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.conf_ptr, tt.conf_jump,
                                e[1], e[2], p[0], p[1], status, queue, cnt, t)  # fmt: skip
