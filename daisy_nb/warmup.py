"""Explicit JIT warm-up: compile (or load from numba's cache) every kernel once.

Runs a tiny two-task pipeline with conflicts, tracking-free, through every kernel
path (enumeration, single-block queries, acquire/release, failure and orphaning,
free downstream blocks, tracking cells), so the first real call pays nothing. Call it
before timing anything, and before a runtime starts workers, so that compile time is
not mistaken for scheduling time. Small runs do not need it: they run the kernels as
plain Python (``kernels/_jit.py``).

``python -m daisy_nb warmup`` (or ``daisy-nb warmup``) does the same from the command
line, once after installing, so that the first large run does not compile (~15 s).
"""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["add_arguments", "main", "warmup"]

_done = False  # warmed up with compiled kernels


def warmup() -> float:
    """Compile or load every kernel; returns the seconds it took (0 after the first call).

    Under ``DAISY_NB_JIT=0`` the kernels stay plain Python and this only runs them once.
    """
    global _done
    from .kernels import _jit

    if _jit.mode() != "python":
        _jit.use_numba()
    if _done and _jit.compiled():
        return 0.0
    t0 = time.perf_counter()
    import numpy as np
    from funlib.geometry import Roi

    from .block import BlockStatus
    from .graph import BlockwiseDependencyGraph
    from .kernels import block_id as kb
    from .kernels import surface as ks
    from .layout import pack_layouts
    from .scheduler import Scheduler
    from .task import Task

    g = BlockwiseDependencyGraph(
        "w", Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), True, "shrink", total_read_roi=Roi((0, 0), (9, 9))
    )
    g.to_arrays()
    b = g.root_gen()[0]
    g.upstream(b)
    g.downstream(b)
    g.get_subgraph_blocks(Roi((0, 0), (5, 5)))
    kb.cantor_ids(np.zeros((1, 2), np.int64), np.zeros(1, np.int64))
    mask = np.zeros((3, 3), np.uint8)
    mask[0, 0] = 1
    a = Task(
        "a",
        Roi((0, 0), (9, 9)),
        Roi((0, 0), (4, 4)),
        Roi((1, 1), (2, 2)),
        max_retries=0,
        tracking_path=False,
        skip_mask=mask,
    )
    # c reaches past a: its far blocks read nothing of a and are ready from the start
    c = Task("c", Roi((0, 0), (15, 15)), Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), tracking_path=False)
    s = Scheduler(a + c)
    tt = pack_layouts([a.layout, c.layout])  # the tables rows_to_cells reads (tracking), as the Scheduler packs them
    ks.rows_to_cells(
        tt.geo,
        tt.info,
        tt.lvl_off,
        tt.lvl_cnt,
        tt.lvl_start,
        0,
        np.zeros(1, np.int64),
        np.ones(2, np.int64),
        np.zeros(2, np.int64),
        np.zeros(1, np.int64),
    )
    first = True
    a_block = c_block = None
    while True:
        batch = s.acquire_blocks("a", 4)
        blk = s.acquire_block("c")
        if len(batch) == 0 and blk is None:
            break
        if len(batch):
            if a_block is None:
                a_block = batch.blocks()[0]
            codes = np.full(len(batch), BlockStatus.SUCCESS, np.uint8)
            if first:
                codes[0] = BlockStatus.FAILED
                first = False
            s.release_blocks("a", batch.index, codes)
        if blk is not None:
            c_block = c_block or blk
            blk.status = BlockStatus.SUCCESS
            s.release_block(blk)
    s.dependency_graph.upstream(c_block)
    s.dependency_graph.downstream(a_block)
    _done = _jit.compiled()
    return time.perf_counter() - t0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check", action="store_true", help="only report whether the kernels are compiled (exit code 1 if not)"
    )


def main(args: argparse.Namespace) -> int:
    """``python -m daisy_nb warmup``: compile every kernel into numba's on-disk cache."""
    from .kernels import _jit

    if not _jit.CACHE:
        print("daisy_nb warmup: DAISY_NB_CACHE=0 switches numba's cache off; nothing would be kept", file=sys.stderr)
        return 2
    if _jit.mode() == "python":
        print("daisy_nb warmup: DAISY_NB_JIT=0 keeps the kernels plain Python; nothing to compile", file=sys.stderr)
        return 2
    warm = _jit.cache_is_warm()
    if args.check:
        print("daisy_nb kernels: " + ("compiled (numba's cache is current)" if warm else "not compiled yet"))
        return 0 if warm else 1
    if not warm:
        print(f"daisy_nb warmup: compiling every kernel, once, ~{_jit.WARMUP_SECONDS} s ...", flush=True)
        _jit._told = True  # this message replaces the run-time notice
    secs = warmup()
    if _jit.cache_is_warm():
        print(f"daisy_nb warmup: kernels {'compiled' if not warm else 'already compiled, loaded'} in {secs:.1f} s")
        return 0
    print("daisy_nb warmup: the kernels ran but numba's cache is not current (read-only install?)", file=sys.stderr)
    return 1
