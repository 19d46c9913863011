"""Cluster-style run: detached worker programs that connect back over TCP, daisy_nb vs daisy 2.0.0.

    python benchmarks/bench_cluster.py --daisy-python /work/venv-daisy2/bin/python [--quick] [--rounds N]

The way daisy users run on a cluster: the task's function takes no argument and
submits a job (here: starts a detached program in its own session, with an
environment of nothing but ``PATH``, ``DAISY_CONTEXT`` and ``PYTHONPATH``, and waits
for it, like ``bsub -K``/``sbatch --wait``); the job builds a ``Client()`` from
``DAISY_CONTEXT``, connects to the scheduler over TCP and loops over
``acquire_block()``. 2 workers, 1,000 blocks of ``time.sleep(0.001)`` (``--quick``:
100 blocks, one round). Both schedulers listen on 127.0.0.1 (daisy 2.0.0 would
auto-detect an address and listen on every interface: it is given
``host="127.0.0.1"``).

Each run is its own interpreter (``_util.spawn``); the clock runs around
``run_blockwise`` only (imports and daisy_nb's JIT warm-up come first), so it
includes starting the 2 worker functions and the 2 job programs: the fixed cost of a
cluster-style run. Reported: wall time and the share of the ideal, where the ideal
is blocks x (a ``time.sleep(0.001)`` as measured in that child) / 2 workers. Each
round also times a 10-block run (the fixed cost: starting and ending the worker
functions and jobs); "overhead per block" is ``(wall - fixed) x 2 / (blocks - 10)``
minus the sleep. Rounds alternate daisy_nb and daisy so that load bursts hit both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the job programs and worker functions import only what they use (their start-up is timed)

SLEEP = 0.001


# Every BENCH_* variable is passed on to the job programs (bench_server_cpu.py and
# bench_connections.py set them): BENCH_CLUSTER_PROGRAM, the job's script (default: this one);
# BENCH_CLUSTER_SLEEP, the block time; BENCH_CLUSTER_TIMES, a folder where each job writes its
# connect time and block end times (time.monotonic: one clock for the machine);
# BENCH_CLUSTER_BARRIER, the number of jobs to wait for (in that folder) before the first block.
BARRIER_SECS = 600.0  # a job starts anyway after this long (a worker that never connected)


def barrier_arrive(folder: str, name: str = "ready") -> None:
    """This job has reached barrier ``name`` (a file ``name.<pid>`` in ``folder``)."""
    open(os.path.join(folder, f"{name}.{os.getpid()}"), "w").close()


def barrier_passed(folder: str, jobs: int, name: str = "ready") -> bool:
    """``jobs`` jobs have reached barrier ``name``."""
    return sum(1 for n in os.listdir(folder) if n.startswith(name + ".")) >= jobs


def barrier_wait(folder: str, jobs: int, name: str = "ready") -> None:
    """Reach barrier ``name`` and wait until ``jobs`` jobs have (so that all of them run together)."""
    barrier_arrive(folder, name)
    deadline = time.monotonic() + BARRIER_SECS
    while time.monotonic() < deadline and not barrier_passed(folder, jobs, name):
        time.sleep(0.1)


def job(lib: str) -> None:
    """The detached worker program (a cluster job): the canonical ``Client`` loop."""
    if lib == "daisy":
        import daisy
    else:
        import daisy_nb as daisy
    sleep = float(os.environ.get("BENCH_CLUSTER_SLEEP") or SLEEP)
    times_dir = os.environ.get("BENCH_CLUSTER_TIMES")
    client = daisy.Client()
    ends = [time.monotonic()]  # connected
    if times_dir and os.environ.get("BENCH_CLUSTER_BARRIER"):
        barrier_wait(times_dir, int(os.environ["BENCH_CLUSTER_BARRIER"]))
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            time.sleep(sleep)
            block.status = daisy.BlockStatus.SUCCESS
        ends.append(time.monotonic())
    if times_dir:
        path = os.path.join(times_dir, f"{os.getpid()}.txt")
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(repr(t) for t in ends))
        os.replace(path + ".tmp", path)


def submit() -> None:
    """The 0-argument worker function: start the job detached and wait for it (``bsub -K``)."""
    env = {"PATH": os.environ.get("PATH", ""), "DAISY_CONTEXT": os.environ["DAISY_CONTEXT"]}
    env.update((k, v) for k, v in os.environ.items() if k == "PYTHONPATH" or k.startswith("BENCH_"))
    lib = os.environ["BENCH_CLUSTER_LIB"]
    program = os.environ.get("BENCH_CLUSTER_PROGRAM") or os.path.abspath(__file__)
    p = subprocess.Popen(
        [sys.executable, program, "--job", lib],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    if p.wait():
        raise SystemExit(f"job exited with {p.returncode}")


def measured_sleep(n: int = 300) -> float:
    t = time.perf_counter()
    for _ in range(n):
        time.sleep(SLEEP)
    return (time.perf_counter() - t) / n


def child(lib: str, n: int, workers: int) -> dict:
    import _util

    os.environ["BENCH_CLUSTER_LIB"] = lib
    if lib == "daisy":
        import daisy
        from funlib.geometry import Roi

        kw = {"host": "127.0.0.1"}
    else:
        _util.warm_daisy_nb()
        import daisy_nb as daisy
        from daisy_nb import Roi

        kw = {}
    sys.path.insert(0, HERE)
    import bench_cluster  # the worker function must be importable by reference in the workers

    task = daisy.Task(
        "cluster",
        Roi((0,), (n,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=bench_cluster.submit,
        read_write_conflict=False,
        max_workers=workers,
        max_retries=0,
        tracking_path=False,
    )
    real = measured_sleep()
    t0 = time.perf_counter()
    states = daisy.run_blockwise(task, progress=False, summary=False, return_states=True, **kw)
    secs = time.perf_counter() - t0
    st = states["cluster"]
    return {"secs": secs, "sleep": real, "completed": st.completed_count, "n": n}


def run_one(python: str, lib: str, n: int, workers: int) -> dict:
    import tempfile

    import _util

    with tempfile.TemporaryDirectory() as d:  # daisy's logs land in the cwd
        old = tempfile.tempdir
        tempfile.tempdir = d
        try:
            r = _util.spawn(python, os.path.abspath(__file__), [lib, n, workers], timeout=600)
        finally:
            tempfile.tempdir = old
    if r["completed"] != n:
        raise RuntimeError(f"{lib}: {r['completed']} of {n} blocks completed")
    return r


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--job":  # a job program: nothing else to import
        job(sys.argv[2])
        return
    import argparse

    sys.path.insert(0, HERE)
    import _util

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daisy-python", default=None, help="a python with daisy==2.0.0 installed")
    ap.add_argument("--quick", action="store_true", help="100 blocks, one round (smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        lib, n, w = args.worker
        _util.emit(child(lib, int(n), int(w)))
        return

    n = args.blocks or (100 if args.quick else 1000)
    rounds = args.rounds or (1 if args.quick else 3)
    workers = 2
    note = _util.machine_note()
    bc = _util.as_installed()
    if bc:
        note += "; " + bc
    libs = [("daisy_nb", sys.executable)] + ([("daisy 2.0.0", args.daisy_python)] if args.daisy_python else [])
    res: dict[str, list[dict]] = {name: [] for name, _ in libs}
    fixed: dict[str, list[float]] = {name: [] for name, _ in libs}  # a 10-block run: start-up and shut-down
    for _ in range(rounds):
        for name, py in libs:
            lib = "daisy" if name.startswith("daisy 2") else "daisy_nb"
            res[name].append(run_one(py, lib, n, workers))
            fixed[name].append(run_one(py, lib, 10, workers)["secs"])

    def share(r):
        return n * r["sleep"] / workers / r["secs"]

    print(
        f"\ncluster-style run: {n:,} blocks of time.sleep({SLEEP}), {workers} detached worker programs over TCP "
        f"(127.0.0.1), {rounds} round(s)\n{note}\n"
    )
    rows = []
    for name, _ in libs:
        rs = res[name]
        best = min(rs, key=lambda r: r["secs"])
        f = min(fixed[name])
        # per block, beyond its sleep: what the run costs above a 10-block run, per worker
        over = (best["secs"] - f) * workers / (n - 10) - best["sleep"]
        rows.append(
            [
                name,
                ", ".join(f"{r['secs']:.2f}" for r in rs) + " s",
                f"{share(best):.0%} (ideal {n * best['sleep'] / workers:.2f} s; sleep {best['sleep'] * 1e3:.3f} ms)",
                ", ".join(f"{share(r):.0%}" for r in rs),
                f"{f:.2f} s",
                f"{over * 1e6:,.0f} µs",
            ]
        )
    print(
        _util.table(
            [
                "library",
                "wall time per round",
                "share of ideal, best round",
                "share per round",
                "10-block run (fixed cost), best",
                "overhead per block (best round)",
            ],
            rows,
        )
    )
    if args.daisy_python:
        ratios = [d["secs"] / b["secs"] for b, d in zip(res["daisy_nb"], res["daisy 2.0.0"], strict=True)]
        print(f"\ndaisy 2.0.0 / daisy_nb wall time per round: {', '.join(f'{x:.2f}x' for x in ratios)}")


if __name__ == "__main__":
    main()
