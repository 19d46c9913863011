"""A dask worker killed in the middle of a batch: how long until blocks complete again?

    python benchmarks/bench_dask_lost_worker.py [--quick] [--repeat N] [--blocks N]

A fresh ``distributed.LocalCluster`` (2 worker processes of 1 thread, nannies) per
repeat runs ``run_blockwise(task, executor=client)`` on ``--blocks`` independent
blocks of ``time.sleep(0.03)``; when one worker has finished 10 blocks it is sent
SIGKILL (its nanny starts a new one). Every block leaves a file with the time it
ended. Reported per repeat: the run's wall time, the time from the kill to the first
block that ended after it, the **longest pause** between two consecutive block ends
after the kill (what a stalled driver shows), the blocks that ended within 8 s of the
kill, and the worker counters. Before daisy_nb stopped calling removed workers the
pause was dask's connect timeout (29.9 s); daisy 2.0.0 has no dask executor.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import daisy_nb  # noqa: E402
from daisy_nb import Roi  # noqa: E402


def mark(block, out, sleep):
    time.sleep(sleep)
    with open(os.path.join(out, f"done_{block.spatial_id}_{os.getpid()}"), "w") as f:
        f.write(repr(time.time()))


def one_run(n: int, sleep: float, kill_after: int) -> dict:
    import dask
    from distributed import Client, LocalCluster

    out = tempfile.mkdtemp(prefix="bench_lost_worker_")
    with (
        tempfile.TemporaryDirectory(prefix="bench_lost_worker_dask_") as scratch,  # dask leaves its lock files
        dask.config.set({"temporary-directory": scratch}),
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        victim = sorted(client.run(os.getpid).values())[0]
        task = daisy_nb.Task(
            "k",
            Roi((0,), (n,)),
            Roi((0,), (1,)),
            Roi((0,), (1,)),
            process_function=functools.partial(mark, out=out, sleep=sleep),
            read_write_conflict=False,
            tracking_path=False,
        )
        killed_at: list[float] = []

        def killer():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if sum(1 for f in os.listdir(out) if f.endswith(f"_{victim}")) >= kill_after:
                    time.sleep(sleep / 3)  # inside its next block
                    killed_at.append(time.time())
                    os.kill(victim, signal.SIGKILL)
                    return
                time.sleep(0.005)

        th = threading.Thread(target=killer)
        th.start()
        t0 = time.monotonic()
        st = daisy_nb.run_blockwise(task, executor=client, progress=False, summary=False, return_states=True)["k"]
        wall = time.monotonic() - t0
        th.join()
    ends = sorted(float(open(os.path.join(out, f)).read()) for f in os.listdir(out))
    for f in os.listdir(out):
        os.unlink(os.path.join(out, f))
    os.rmdir(out)
    k = killed_at[0]
    after = [t for t in ends if t > k]
    gaps = [b - a for a, b in zip([k, *after], after)]
    return {
        "wall": wall,
        "first": after[0] - k,
        "pause": max(gaps),
        "within8": sum(1 for t in after if t - k <= 8.0),
        "completed": st.completed_count,
        "counters": f"{st.worker_failure_count}/{st.worker_job_end_count}/{st.worker_restart_count}",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 blocks, 1 repeat")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=300)
    a = ap.parse_args()
    n, repeat = (100, 1) if a.quick else (a.blocks, a.repeat)
    print(f"{n} blocks of 30 ms, 2 dask workers, one SIGKILLed after 10 blocks; load {os.getloadavg()[0]:.1f}\n")
    print(
        "| run | wall | kill → next block end | longest pause after the kill | blocks ended ≤ 8 s after | completed | failures/job ends/restarts |"
    )
    print("|---|---|---|---|---|---|---|")
    for i in range(repeat):
        r = one_run(n, 0.03, 10)
        print(
            f"| {i + 1} | {r['wall']:.2f} s | {r['first']:.2f} s | {r['pause']:.2f} s | {r['within8']} | "
            f"{r['completed']}/{n} | {r['counters']} |"
        )


if __name__ == "__main__":
    main()
