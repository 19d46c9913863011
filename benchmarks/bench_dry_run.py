"""Dry run (``run_blockwise(..., dry_run=True)``): how long a plan takes, and its memory figure against a real run.

1. Time of :func:`daisy_nb.plan.make_plan` for a 3-D task with ``read_write_conflict=True``
   at 10^6 and 10^8 blocks: without tracking, and with a tracking store half done
   (every other cell marked, as an earlier run leaves it; read with file reads in 1 MiB
   pieces, page cache warm since the store was just written) plus a ``skip_mask``.
   First call of the process (imports included) and best of 3.
2. The plan's expected scheduler memory against the peak that ``tracemalloc`` sees while
   a Scheduler for the same task is built and every block is acquired and released
   (batch API, 4096 at a time; kernels warmed up first, so numba's own allocations are
   not counted).

``python benchmarks/bench_dry_run.py`` (``--quick``: 10^5 and 10^6 blocks).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _task(side: int, tracking_path=False, skip_mask=None):
    import daisy_nb as daisy
    from daisy_nb import Roi

    n = side * 10 + 2  # side^3 blocks of 10^3 with a context of 1
    return daisy.Task(
        f"t{side}", Roi((0, 0, 0), (n, n, n)), Roi((0, 0, 0), (12, 12, 12)), Roi((1, 1, 1), (10, 10, 10)),
        read_write_conflict=True, tracking_path=tracking_path, skip_mask=skip_mask,
    )  # fmt: skip


def _half_done_store(task, path):
    """A tracking store with every other cell done (what a run interrupted half-way leaves)."""
    from daisy_nb.tracking import TrackingStore

    store = TrackingStore.open(path, task.total_roi, task.read_roi, task.write_roi, task.fit, durable=False)
    flat = store.done.reshape(-1)
    step = 1 << 24
    for s in range(0, flat.size, step):
        flat[s : s + step : 2] = 1
    store.mark_dirty(failures=False)
    store.close()


def time_plans(side: int, tmp: str) -> list[dict]:
    import numpy as np

    from daisy_nb.plan import make_plan

    rows = []
    for case in ("no tracking", "half-done tracking + skip_mask"):
        if case == "no tracking":
            task = _task(side)
        else:
            path = os.path.join(tmp, f"trk{side}")
            mask = np.zeros((side, side, side), bool)
            mask[: side // 4] = True
            _half_done_store(_task(side, path), path)
            task = _task(side, path, mask)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            plan = make_plan(task)
            times.append(time.perf_counter() - t0)
        tp = plan.tasks[0]
        rows.append(
            {
                "blocks": tp.blocks,
                "case": case,
                "first": times[0],
                "best": min(times),
                "done": tp.done_by_tracking,
                "masked": tp.skipped_by_mask,
                "to_run": tp.to_run,
                "levels": tp.levels,
                "expected": plan.expected_bytes,
            }
        )
    return rows


def memory_check(side: int) -> dict:
    import numpy as np

    from daisy_nb.plan import make_plan
    from daisy_nb.scheduler import Scheduler

    task = _task(side)
    plan = make_plan(task, block_tracking=False)
    tracemalloc.start()
    try:
        with Scheduler(task, block_tracking=False) as s:
            built = tracemalloc.get_traced_memory()[0]
            while not s.is_done():
                b = s.acquire_blocks(task.task_id, 4096)
                s.release_blocks(task.task_id, b.index, np.full(len(b), 2, np.uint8))
            peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {"blocks": plan.blocks, "expected": plan.expected_bytes, "built": built, "peak": peak}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10^5 and 10^6 blocks (a smoke run)")
    args = ap.parse_args()
    sides = (46, 100) if args.quick else (100, 464)
    mem_sides = (46,) if args.quick else (100, 216)
    from daisy_nb.warmup import warmup

    warmup()
    tmp = tempfile.mkdtemp(prefix="bench_dry_run_")
    try:
        rows = [r for side in sides for r in time_plans(side, tmp)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| blocks | case | plan, first call | best of 3 | levels | done (tracking) | skipped (mask) | to run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        done = "-" if r["done"] is None else f"{r['done']:,}"
        print(
            f"| {r['blocks']:,} | {r['case']} | {r['first'] * 1e3:,.1f} ms | {r['best'] * 1e3:,.1f} ms | "
            f"{r['levels']} | {done} | {r['masked']:,} | {r['to_run']:,} |"
        )
    print()
    print(
        "| blocks | plan's expected scheduler memory | traced after building | traced peak of the run | peak / plan |"
    )
    print("|---|---|---|---|---|")
    for side in mem_sides:
        m = memory_check(side)
        print(
            f"| {m['blocks']:,} | {m['expected'] / 1e6:,.2f} MB | {m['built'] / 1e6:,.2f} MB | "
            f"{m['peak'] / 1e6:,.2f} MB | {m['peak'] / m['expected']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
