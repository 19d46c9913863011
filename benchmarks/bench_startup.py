"""Start-up before the first block (issue 27, item 6): numba loaded before the first hand-out
("before") against loaded in the background while the plain kernels serve ("after").

    python benchmarks/bench_startup.py [--rounds 5] [--only 1d,3d,pipeline] [--quick]

Each measurement is a fresh interpreter (this script with ``--child``) in the default compile
mode (``auto``), the numba cache warm (the script warms it first). In the child, from just
before ``Scheduler(...)``:

* **first block**: until the first ``acquire_block`` returns (the Scheduler built, its
  tables packed, numba loaded or not);
* **total**: until every block was handed out and released as a success, one by one, round
  robin over the tasks (no workers: the scheduler's own cost, the worst case for the
  background thread, which shares the GIL with a scheduler that never waits);
* **switched at**: blocks handed out when the kernels switched to compiled ones.

Workloads: ``1d`` (8,000 one-unit blocks, no conflict: plain Python, never compiles), ``3d``
(46³ blocks, ``read_write_conflict``: compiles at once), ``pipeline`` (three chained 3-D tasks
of 24³ blocks, conflict: compiles at once). "before" sets ``kernels._jit.BACKGROUND = False``: the code path of
the previous release. Medians over ``--rounds``, before and after alternating; the ratios are
after / before. ``--quick``: one round (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.abspath(__file__)
WORKLOADS = ("1d", "3d", "pipeline")


def _tasks(daisy, Roi, workload: str, quick: bool):
    if workload == "1d":
        n = 8_000
        return [daisy.Task("a", Roi((0,), (n,)), Roi((0,), (1,)), Roi((0,), (1,)), read_write_conflict=False)]
    k, names = (46, "a") if workload == "3d" else (24, "abc")
    tasks = [
        daisy.Task(n, Roi((-1,) * 3, (4 * k + 2,) * 3), Roi((-1,) * 3, (6,) * 3), Roi((0,) * 3, (4,) * 3))
        for n in names
    ]
    if len(tasks) == 1:
        return tasks
    return daisy.Pipeline(tasks, list(zip(tasks[:-1], tasks[1:])))


def child(workload: str, background: bool, quick: bool) -> None:
    t_import = time.perf_counter()
    import daisy_nb as daisy
    from daisy_nb import Roi
    from daisy_nb.kernels import _jit

    t_import = time.perf_counter() - t_import
    _jit.BACKGROUND = background
    tasks = _tasks(daisy, Roi, workload, quick)
    t0 = time.perf_counter()
    s = daisy.Scheduler(tasks, block_tracking=False)
    first = None
    handed = 0
    switched_at = 0 if _jit.compiled() else None
    live = list(s.task_ids)
    while live:
        for tid in list(live):
            b = s.acquire_block(tid)
            if b is None:
                if s.is_task_done(tid):
                    live.remove(tid)
                continue
            if first is None:
                first = time.perf_counter() - t0
                compiled_at_first = _jit.compiled()
            handed += 1
            if switched_at is None and _jit.compiled():
                switched_at = handed
            b.status = daisy.BlockStatus.SUCCESS
            s.release_block(b)
    total = time.perf_counter() - t0
    getattr(_jit, "settle", lambda: None)()  # (absent before the background load)
    print(
        json.dumps(
            {
                "first": first,
                "total": total,
                "import": t_import,
                "blocks": handed,
                "switched_at": switched_at,
                "compiled_at_first": compiled_at_first,
                "compiled": _jit.compiled(),
            }
        )
    )


def run(workload: str, background: bool, quick: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DAISY_NB_JIT"}
    env["PYTHONPATH"] = ROOT
    args = [sys.executable, SCRIPT, "--child", workload, "--background", str(int(background))]
    r = subprocess.run(args + (["--quick"] if quick else []), capture_output=True, text=True, env=env, check=False)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--background", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, bool(a.background), a.quick)
        return
    subprocess.run([sys.executable, "-m", "daisy_nb", "warmup"], env={**os.environ, "PYTHONPATH": ROOT}, check=True,
                   capture_output=True)  # fmt: skip
    rounds = 1 if a.quick else a.rounds
    print("| workload | blocks | first block before | after | ratio | total before | after | ratio "
          "| switched at (after) | compiled at first block (before / after) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in a.only.split(","):
        res: dict[bool, list[dict]] = {False: [], True: []}
        for i in range(rounds):
            for bg in (False, True) if i % 2 == 0 else (True, False):
                res[bg].append(run(w, bg, a.quick))

        def med(bg: bool, key: str) -> float:
            return statistics.median(r[key] for r in res[bg])

        sw = [r["switched_at"] for r in res[True]]
        print(f"| {w} | {res[True][0]['blocks']} | {med(False, 'first'):.3f} s | {med(True, 'first'):.3f} s "
              f"| {med(True, 'first') / med(False, 'first'):.2f} | {med(False, 'total'):.3f} s | {med(True, 'total'):.3f} s "
              f"| {med(True, 'total') / med(False, 'total'):.2f} | {sw} "
              f"| {res[False][0]['compiled_at_first']} / {res[True][0]['compiled_at_first']} |")  # fmt: skip


if __name__ == "__main__":
    main()
