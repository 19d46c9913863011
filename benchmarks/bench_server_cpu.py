"""The scheduler's CPU per block over TCP, daisy_nb vs daisy 2.0.0 (issue 21).

    python benchmarks/bench_server_cpu.py --daisy-python /work/venv-daisy2/bin/python \\
        [--workers 32,64,128,256] [--block-ms 1,10,20] [--blocks-per-worker 400] [--rounds N]
    python benchmarks/bench_server_cpu.py --micro   # the scheduler calls per block alone

The cluster pattern of ``bench_cluster.py`` (whose worker function and job program
this reuses): a task whose 0-argument worker function starts a detached job
program and waits for it; the job builds a ``Client()`` from ``DAISY_CONTEXT``,
connects back over TCP (both schedulers get ``host="127.0.0.1"``) and loops over ``acquire_block()``, each block a
``time.sleep(block_ms)``. ``workers`` job programs, ``blocks_per_worker x workers``
blocks. Defaults (a quick run, ~1-2 min): 32 workers, blocks of 1, 10 and 20 ms.

Measured in the driver (the scheduler process), each run its own interpreter:

* **CPU per block**: ``getrusage(RUSAGE_SELF)`` (user + system) around
  ``run_blockwise``, divided by the blocks. ``RUSAGE_SELF`` counts every thread of
  the process: daisy_nb's main loop and its listener thread, daisy 2.0.0's tokio
  and worker-slot threads. Only the benchmark's own sampler thread (below) is
  subtracted; the figure includes starting the worker functions. "main thread" is ``RUSAGE_THREAD`` of the calling thread (daisy_nb's
  main loop; daisy 2.0.0 waits in Rust there).
* **steady state**: the job programs wait at a barrier (a file each in a shared
  folder) until all of them are connected, so that no worker finishes the task
  before the last one starts; they record each block's end (``time.monotonic``,
  one clock for the machine). The window runs from the moment 90% of the jobs have
  finished their first block to the moment 10% have finished their last; blocks/s
  counts the block ends inside it, and a sampler thread in the driver
  (``getrusage`` every 20 ms) gives the scheduler's CPU in it: CPU per block
  without start-up and shut-down. Utilisation = blocks/s x block time (a
  ``time.sleep`` as measured in the child) / workers (ideal: every worker always
  in a block).
* **jobs CPU**: ``RUSAGE_CHILDREN`` of the driver around the run (worker functions
  and the job programs they waited for, all reaped by then): what the clients take
  from the same 2 cores.

Each configuration runs daisy_nb and daisy 2.0.0 back to back (rounds alternate),
and the best round (lowest CPU per block) is reported, or with ``--pick median`` the median
one (by whole-process CPU under ``--cold``). ``--also ROOT`` (repeatable) runs another daisy_nb
checkout in the same rounds, labelled ``@`` and the directory's name: a before/after under the same load.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SAMPLE_SECS = 0.02


class Sampler:
    """Driver side: ``(monotonic, CPU seconds of the process, threads)`` every ``SAMPLE_SECS``.

    The CPU is the process's less this sampler thread's own (``self_cpu`` in the end),
    so that every figure is the scheduler's alone.
    """

    def __init__(self):
        self.samples: list[tuple[float, float, int]] = []
        self.self_cpu = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)

    @staticmethod
    def cpu(who=resource.RUSAGE_SELF) -> float:
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    def _loop(self):
        while not self._stop.wait(SAMPLE_SECS):
            try:
                n = len(os.listdir("/proc/self/task"))
            except OSError:  # out of file descriptors (bench_connections --scheduler-nofile)
                n = 0
            t = time.monotonic()
            self.self_cpu = self.cpu(resource.RUSAGE_THREAD)
            self.samples.append((t, self.cpu() - self.self_cpu, n))
        self.self_cpu = self.cpu(resource.RUSAGE_THREAD)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def cpu_at(self, t: float) -> float:
        """CPU seconds at monotonic time ``t`` (linear between the samples around it)."""
        s = self.samples
        for (t0, c0, _), (t1, c1, _) in zip(s, s[1:], strict=False):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c0
        return s[-1][1] if s and t > s[-1][0] else (s[0][1] if s else 0.0)


def read_times(times_dir: str) -> list[list[float]]:
    """Per job: ``[connected, end of block 1, end of block 2, ...]``."""
    out = []
    for name in os.listdir(times_dir):
        if name.endswith(".txt"):
            with open(os.path.join(times_dir, name)) as f:
                out.append([float(x) for x in f.read().split()])
    return out


def steady_window(jobs: list[list[float]]) -> tuple[float, float] | None:
    """``(start, end)``: from 90% of the jobs past their first block to 10% past their last."""
    firsts = sorted(j[1] for j in jobs if len(j) > 1)
    lasts = sorted(j[-1] for j in jobs if len(j) > 1)
    if len(firsts) < 2:
        return None
    start = firsts[min(len(firsts) - 1, int(0.9 * len(firsts)))]
    end = lasts[int(0.1 * len(lasts))]
    return (start, end) if end > start else None


def measured_sleep(secs: float, total: float = 0.3) -> float:
    n = max(5, int(total / secs))
    t = time.perf_counter()
    for _ in range(n):
        time.sleep(secs)
    return (time.perf_counter() - t) / n


def child(lib: str, workers: int, block_ms: float, per_worker: int) -> dict:
    import _util

    sys.path.insert(0, HERE)
    import bench_cluster  # the worker function, importable by reference in the workers

    if lib == "daisy":
        import daisy
        from funlib.geometry import Roi
    else:
        if os.environ.get("BENCH_SERVER_COLD") != "1":  # --cold: as a user's script meets it
            _util.warm_daisy_nb()
        import daisy_nb as daisy
        from daisy_nb import Roi
    n = workers * per_worker
    times_dir = tempfile.mkdtemp(prefix="bench_server_cpu.")
    os.environ.update(
        BENCH_CLUSTER_LIB=lib,
        BENCH_CLUSTER_SLEEP=repr(block_ms / 1e3),
        BENCH_CLUSTER_TIMES=times_dir,
        BENCH_CLUSTER_BARRIER=str(workers),
    )
    task = daisy.Task(
        "cpu",
        Roi((0,), (n,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=bench_cluster.submit,
        read_write_conflict=False,
        max_workers=workers,
        max_retries=0,
        tracking_path=False,
    )
    real = measured_sleep(block_ms / 1e3)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    th0 = resource.getrusage(resource.RUSAGE_THREAD)
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with Sampler() as sampler:
        states = daisy.run_blockwise(task, progress=False, summary=False, return_states=True, host="127.0.0.1")
    secs = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    th1 = resource.getrusage(resource.RUSAGE_THREAD)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    jobs = read_times(times_dir)
    import shutil

    shutil.rmtree(times_dir, ignore_errors=True)
    out = {
        "lib": lib,
        "n": n,
        "completed": states["cpu"].completed_count,
        "secs": secs,
        "sleep": real,
        "cpu": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime) - sampler.self_cpu,
        "sampler_cpu": sampler.self_cpu,
        "cpu_sys": r1.ru_stime - r0.ru_stime,
        # from the interpreter's start: imports, start-up (numba, if the run loads it) and the run
        "cpu_process": r1.ru_utime + r1.ru_stime - sampler.self_cpu,
        "cpu_main": (th1.ru_utime - th0.ru_utime) + (th1.ru_stime - th0.ru_stime),
        "cpu_jobs": (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime),
        "ctx_vol": r1.ru_nvcsw - r0.ru_nvcsw,
        "ctx_invol": r1.ru_nivcsw - r0.ru_nivcsw,
        "threads": max((s[2] for s in sampler.samples), default=0) - 1,  # less the sampler
        "jobs": len(jobs),
        "load": os.getloadavg()[0],
    }
    win = steady_window(jobs)
    if win is not None:
        a, b = win
        done = sum(1 for j in jobs for t in j[1:] if a < t <= b)
        out.update(win_secs=b - a, win_blocks=done, win_cpu=sampler.cpu_at(b) - sampler.cpu_at(a))
    return out


def micro(n: int = 20000) -> dict:
    """The scheduler calls behind one block over TCP, in this process without any I/O:
    one block at a time (as ``clients.py`` calls them today: ``acquire_blocks(tid, 1)``,
    ``pack_block`` from the batch's rows, ``release_blocks`` of a 1-element array) and in
    batches (what a batch scheduler API behind a window or a readable pass costs per block)."""
    import _util

    _util.warm_daisy_nb()
    import numpy as np

    import daisy_nb as daisy
    from daisy_nb import Roi
    from daisy_nb.runtime.client import pack_block
    from daisy_nb.scheduler import Scheduler

    def scheduler():
        task = daisy.Task(
            "t",
            Roi((0,), (n,)),
            Roi((0,), (1,)),
            Roi((0,), (1,)),
            process_function=measured_sleep,
            read_write_conflict=False,
            max_retries=0,
            tracking_path=False,
        )
        return Scheduler([task])

    out = {}
    for k in (1, 8, 64):
        s = scheduler()
        t = time.process_time()
        for _ in range(n // k):
            b = s.acquire_blocks("t", k)
            if k == 1:  # clients.py's per-block path
                i = int(b.index[0])
                pack_block(
                    i,
                    int(b.spatial_id[0]),
                    b.read_offset[0].tolist(),
                    b.read_shape[0].tolist(),
                    b.write_offset[0].tolist(),
                    b.write_shape[0].tolist(),
                )
                s.release_blocks("t", np.array([i], np.int64), np.array([2], np.uint8))
            else:
                cols = [b.index, b.spatial_id, b.read_offset, b.read_shape, b.write_offset, b.write_shape]
                for i, sid, ro, rs, wo, ws in zip(*(c.tolist() for c in cols), strict=True):
                    pack_block(i, sid, ro, rs, wo, ws)
                s.release_blocks("t", b.index, np.full(len(b.index), 2, np.uint8))
        out[k] = (time.process_time() - t) / (n // k * k)
    return out


def run_one(python: str, lib: str, workers: int, block_ms: float, per_worker: int, env: dict | None = None) -> dict:
    import _util

    with tempfile.TemporaryDirectory() as d:  # daisy's logs land in the cwd
        old = tempfile.tempdir
        tempfile.tempdir = d
        try:
            r = _util.spawn(
                python, os.path.abspath(__file__), [lib, workers, block_ms, per_worker], env_extra=env, timeout=1800
            )
        finally:
            tempfile.tempdir = old
    if r["completed"] != r["n"]:
        raise RuntimeError(f"{lib}: {r['completed']} of {r['n']} blocks completed")
    return r


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def main() -> None:
    import argparse

    sys.path.insert(0, HERE)
    import _util

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daisy-python", default=None, help="a python with daisy==2.0.0 installed")
    ap.add_argument("--workers", type=_ints, default=[32], help="worker programs, comma-separated (32,64,128,256)")
    ap.add_argument("--block-ms", type=_floats, default=[1.0, 10.0, 20.0], help="block times in ms, comma-separated")
    ap.add_argument("--blocks-per-worker", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 workers, 50 blocks each of 1 ms")
    ap.add_argument(
        "--micro", action="store_true", help="only the scheduler calls per block, one at a time vs batched (no I/O)"
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="no kernel warm-up in the driver before the clock: the compile decision as a user's script meets "
        "it (the 'whole process' column counts every import and start-up from the interpreter's start)",
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="ROOT",
        help="another daisy_nb checkout (its root directory) run in the same rounds (before/after)",
    )
    ap.add_argument(
        "--pick",
        choices=("best", "median"),
        default="best",
        help="which round to report: the lowest CPU per block, or the median one (odd --rounds)",
    )
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold:
        os.environ["BENCH_SERVER_COLD"] = "1"
    if args.micro:
        r = _util.spawn(sys.executable, os.path.abspath(__file__), ["micro", 0, 0, 0])
        print(
            f"\nscheduler calls per block (acquire_blocks + pack_block + release_blocks), CPU time, no I/O\n{note_of()}"
        )
        print(_util.table(["blocks per call", "CPU per block"], [[k, f"{v * 1e6:.1f} µs"] for k, v in r.items()]))
        return
    if args.worker and args.worker[0] == "micro":
        _util.emit(micro())
        return
    if args.worker:
        lib, w, ms, per = args.worker
        _util.emit(child(lib, int(w), float(ms), int(per)))
        return
    if args.quick:
        args.workers, args.block_ms, args.blocks_per_worker, args.rounds = [4], [1.0], 50, 1
    note = note_of()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # the other checkouts as installed too (see as_installed)
        import compileall

        for root in args.also:
            compileall.compile_dir(os.path.join(root, "daisy_nb"), quiet=1)
    libs: list[tuple[str, str, str, dict | None]] = [("daisy_nb", sys.executable, "daisy_nb", None)]
    libs += [
        (f"daisy_nb @ {os.path.basename(os.path.normpath(root))}", sys.executable, "daisy_nb", {"PYTHONPATH": root})
        for root in args.also
    ]
    if args.daisy_python:
        libs.append(("daisy 2.0.0", args.daisy_python, "daisy", None))
    # --cold compares whole processes (start-up included); otherwise the run alone
    key = "cpu_process" if args.cold else "cpu"
    rows = []
    for workers in args.workers:
        for ms in args.block_ms:
            runs: dict[str, list[dict]] = {name: [] for name, *_ in libs}
            for _ in range(args.rounds):
                for name, py, lib, env in libs:
                    r = run_one(py, lib, workers, ms, args.blocks_per_worker, env)
                    print(f"  {name}, {workers} workers, {ms:g} ms: {r}", file=sys.stderr, flush=True)
                    runs[name].append(r)
            for name, *_ in libs:
                rs = sorted(runs[name], key=lambda r: r[key])
                spread = ", ".join(f"{r[key] * 1e6 / r['n']:.0f}" for r in runs[name])  # in the rounds' order
                rows.append([*_row(name, workers, ms, rs[0] if args.pick == "best" else rs[len(rs) // 2]), spread])
    pick = f"best of {args.rounds}" if args.pick == "best" else f"median of {args.rounds}"
    print(
        f"\nscheduler CPU over TCP: detached Client programs on 127.0.0.1, {args.blocks_per_worker} blocks per "
        f"worker, {pick} round(s){' (by whole-process CPU, --cold)' if args.cold else ''}\n{note}\n"
    )
    print(
        _util.table(
            [
                "library",
                "workers",
                "block",
                "CPU/block, whole run (sys)",
                "CPU/block, whole process",
                "main thread",
                "CPU/block, steady",
                "blocks/s, steady",
                "utilisation, steady",
                "wall (utilisation)",
                "jobs CPU/block",
                "threads",
                f"CPU/block, {'whole process' if args.cold else 'whole run'}, each round (µs)",
            ],
            rows,
        )
    )
    print(
        "\nCPU/block: getrusage(RUSAGE_SELF) of the driver (all its threads) around run_blockwise / blocks; "
        "steady: inside the window where >= 90% of the jobs run (see the docstring)."
    )


def note_of() -> str:
    import _util

    note = _util.machine_note()
    bc = _util.as_installed()
    return note + ("; " + bc if bc else "")


def _row(name: str, workers: int, ms: float, r: dict) -> list:
    n = r["n"]
    us = 1e6 / n
    ideal = n * r["sleep"] / workers
    if "win_secs" in r and r["win_blocks"]:
        rate = r["win_blocks"] / r["win_secs"]
        steady = [
            f"{r['win_cpu'] * 1e6 / r['win_blocks']:.0f} µs",
            f"{rate:,.0f}",
            f"{rate * r['sleep'] / workers:.0%}",
        ]
    else:
        steady = ["n/a", "n/a", "n/a"]
    return [
        name,
        workers,
        f"{ms:g} ms",
        f"{r['cpu'] * us:.0f} µs ({r['cpu_sys'] * us:.0f})",
        f"{r['cpu_process'] * us:.0f} µs" if "cpu_process" in r else "n/a",
        f"{r['cpu_main'] * us:.0f} µs",
        *steady,
        f"{r['secs']:.2f} s ({ideal / r['secs']:.0%})",
        f"{r['cpu_jobs'] * us:.0f} µs",
        r["threads"],
    ]


if __name__ == "__main__":
    main()
