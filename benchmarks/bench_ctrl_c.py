"""Ctrl-C latency until the last job is gone: daisy_nb vs daisy 2.0.0, cluster-style jobs.

    python benchmarks/bench_ctrl_c.py --daisy-python /work/venv-daisy2/bin/python [--quick] [--rounds N]

A driver (its own interpreter) runs one task of 16 blocks of ``time.sleep(20)`` on 8
worker functions; each launches a job program that runs a ``Client`` loop. Once all
8 jobs are inside a block, the driver gets ``SIGINT`` (Ctrl-C). Reported: the time
until the driver exited and until the last job program's pid is gone (a zombie counts
as gone), medians over the rounds. How the worker functions launch their jobs:

* ``sbatch --wait``: ``subprocess.run(["sbatch", "--parsable", "--wait", "--wrap", ...])``
  (what a daisy user writes), with the fake ``sbatch`` of ``tests/workers/fakebatch.py``
  on ``PATH``: each job runs in its own session (as on another node: no signal of the
  driver reaches it) and an interrupted ``sbatch --wait`` does not cancel it, as the
  real one.
* ``daisy_nb.launch.slurm``: daisy_nb's launcher around the same fake ``sbatch``
  (records the job id, ``scancel`` when the worker function is ended).
* ``plain subprocess``: ``subprocess.run(job, start_new_session=True)``: the job
  program detached in its own session (a hand-written worker function).

Both schedulers listen on 127.0.0.1. ``--quick``: blocks of 4 s, 2 jobs, one round,
daisy_nb only unless ``--daisy-python`` is given (a smoke run).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---------------------------------------------------------------- in the children
def job(lib: str, out: str, secs: float) -> None:
    """The job program: a Client loop; ``inblock_<pid>`` marks a block started."""
    if lib == "daisy":
        import daisy
    else:
        import daisy_nb as daisy
    client = daisy.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            open(os.path.join(out, f"inblock_{os.getpid()}"), "w").close()
            time.sleep(secs)


def _job_argv() -> list[str]:
    return os.environ["BENCH_CTRL_C_JOB"].split("\n")


def sbatch_wait() -> None:
    """Worker function: the job through ``sbatch --wait`` (hand-written)."""
    subprocess.run(
        ["sbatch", "--parsable", "--wait", "--wrap", shlex.join(_job_argv())], check=True, stdin=subprocess.DEVNULL
    )


def plain() -> None:
    """Worker function: the job program detached in its own session, waited for."""
    subprocess.run(_job_argv(), check=True, start_new_session=True, stdin=subprocess.DEVNULL)


def driver(lib: str, how: str, out: str, secs: float, jobs: int) -> None:
    sys.path.insert(0, HERE)
    import bench_ctrl_c  # the worker functions must be importable by reference in the workers

    if lib == "daisy":
        import daisy
        from funlib.geometry import Roi
    else:
        import daisy_nb as daisy
        from daisy_nb import Roi
    argv = [sys.executable, os.path.abspath(__file__), "--job", lib, out, str(secs)]
    os.environ["BENCH_CTRL_C_JOB"] = "\n".join(argv)
    if how == "launch":
        from daisy_nb import launch

        fn = launch.slurm(argv)
    else:
        fn = {"sbatch": bench_ctrl_c.sbatch_wait, "plain": bench_ctrl_c.plain}[how]
    task = daisy.Task(
        "ctrl_c",
        Roi((0,), (2 * jobs,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=jobs,
        max_retries=0,
    )
    daisy.run_blockwise([task], progress=False, host="127.0.0.1")


# ------------------------------------------------------------------ in the parent
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def one(python: str, lib: str, how: str, secs: float, jobs: int) -> dict:
    import _util

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        os.mkdir(out)
        env = _util.fake_batch_env(d, {"PYTHONUNBUFFERED": "1"})
        if lib == "daisy":  # daisy 2.0.0 from its own environment, nothing of this checkout
            env.pop("PYTHONPATH", None)
        drv = subprocess.Popen(
            [python, os.path.abspath(__file__), "--driver", lib, how, out, str(secs), str(jobs)],
            env=env,
            cwd=d,  # daisy's logs land in the cwd
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        pids: set[int] = set()
        try:
            deadline = time.monotonic() + 120
            while True:
                pids = {int(n.split("_")[1]) for n in os.listdir(out) if n.startswith("inblock_")}
                if len(pids) >= jobs:
                    break
                if drv.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{lib}/{how}: {len(pids)} of {jobs} jobs started:\n{drv.stderr.read()[-3000:]}")
                time.sleep(0.02)
            t0 = time.monotonic()
            drv.send_signal(signal.SIGINT)
            t_exit = t_gone = None
            deadline = t0 + 5 * secs + 60
            while time.monotonic() < deadline and (t_exit is None or t_gone is None):
                now = time.monotonic()
                if t_exit is None and drv.poll() is not None:
                    t_exit = now - t0
                if t_gone is None and not any(_alive(p) for p in pids):
                    t_gone = now - t0
                time.sleep(0.01)
        finally:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            if drv.poll() is None:
                drv.kill()
            drv.wait()
            drv.stderr.close()
    return {"exit": t_exit, "gone": t_gone}


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--job":
        job(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    if len(sys.argv) == 7 and sys.argv[1] == "--driver":
        driver(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6]))
        return
    import argparse
    import statistics

    sys.path.insert(0, HERE)
    import _util

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daisy-python", default=None, help="a python with daisy==2.0.0 installed")
    ap.add_argument("--quick", action="store_true", help="blocks of 4 s, 2 jobs, one round (smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    args = ap.parse_args()
    secs, jobs = (4.0, 2) if args.quick else (20.0, 8)
    rounds = args.rounds or (1 if args.quick else 3)
    cases = [
        ("daisy_nb", sys.executable, "daisy_nb", "launch", "daisy_nb.launch.slurm"),
        ("daisy_nb", sys.executable, "daisy_nb", "sbatch", "sbatch --wait"),
        ("daisy_nb", sys.executable, "daisy_nb", "plain", "plain subprocess"),
    ]
    if args.daisy_python:
        cases += [
            ("daisy 2.0.0", args.daisy_python, "daisy", "sbatch", "sbatch --wait"),
            ("daisy 2.0.0", args.daisy_python, "daisy", "plain", "plain subprocess"),
        ]
    res: dict[tuple, list[dict]] = {c: [] for c in cases}
    for _ in range(rounds):  # rounds alternate the cases, so that load bursts hit all alike
        for c in cases:
            res[c].append(one(c[1], c[2], c[3], secs, jobs))

    def fmt(vals) -> str:
        if any(v is None for v in vals):
            return "not within the deadline"
        return f"{statistics.median(vals):.2f} s ({', '.join(f'{v:.2f}' for v in vals)})"

    print(
        f"\nCtrl-C with every job inside a block: {jobs} jobs, blocks of time.sleep({secs:g}), "
        f"{rounds} round(s), medians (per round)\n{_util.machine_note()}\n"
    )
    rows = [
        [name, label, fmt([r["exit"] for r in res[c]]), fmt([r["gone"] for r in res[c]])]
        for c in cases
        for name, label in [(c[0], c[4])]
    ]
    print(_util.table(["library", "worker function", "driver exited after", "last job gone after"], rows))


if __name__ == "__main__":
    main()
