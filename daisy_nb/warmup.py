"""Explicit JIT warm-up: compile (or load from numba's cache) every kernel once.

Runs a tiny two-task pipeline with conflicts, tracking-free, through every kernel
path (enumeration, single-block queries, acquire/release, failure and orphaning),
so the first real call pays nothing. Call it before timing anything, and before a
runtime starts workers, so that compile time is not mistaken for scheduling time.
"""

from __future__ import annotations

import time

import numpy as np
from funlib.geometry import Roi

__all__ = ["warmup"]

_done = False


def warmup() -> float:
    """Compile or load every kernel; returns the seconds it took (0 after the first call)."""
    global _done
    if _done:
        return 0.0
    t0 = time.perf_counter()
    from .block import BlockStatus
    from .graph import BlockwiseDependencyGraph
    from .scheduler import Scheduler
    from .task import Task

    g = BlockwiseDependencyGraph("w", Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), True, "shrink", total_read_roi=Roi((0, 0), (9, 9)))
    g.to_arrays()
    b = g.root_gen()[0]
    g.upstream(b)
    g.downstream(b)
    g.get_subgraph_blocks(Roi((0, 0), (5, 5)))
    mask = np.zeros((3, 3), np.uint8)
    mask[0, 0] = 1
    a = Task("a", Roi((0, 0), (9, 9)), Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), max_retries=0, tracking_path=False, skip_mask=mask)
    c = Task("c", Roi((0, 0), (9, 9)), Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), tracking_path=False)
    s = Scheduler(a + c)
    first = True
    while True:
        batch = s.acquire_blocks("a", 4)
        blk = s.acquire_block("c")
        if len(batch) == 0 and blk is None:
            break
        if len(batch):
            codes = np.full(len(batch), BlockStatus.SUCCESS, np.uint8)
            if first:
                codes[0] = BlockStatus.FAILED
                first = False
            s.release_blocks("a", batch.index, codes)
        if blk is not None:
            blk.status = BlockStatus.SUCCESS
            s.release_block(blk)
    s.dependency_graph.upstream(b if False else s._batch("c", 1, np.zeros(1, np.int64)).blocks()[0])
    _done = True
    return time.perf_counter() - t0
