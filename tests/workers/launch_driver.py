"""A driver for tests/test_launch.py and benchmarks: ``python launch_driver.py OUT HOW BLOCKS WORKERS BLOCK_SECS MODE``.

Runs one task of ``BLOCKS`` blocks on ``WORKERS`` worker functions (loopback only) whose
jobs run ``launch_job.py OUT BLOCK_SECS MODE``. ``HOW``: ``slurm``/``lsf``/``local`` (the
launchers of ``daisy_nb.launch``), ``plain`` (a hand-written worker function: the job
program detached in its own session, waited for) or ``fireforget`` (``sbatch`` without
``--wait``: the worker function returns at once). Progress as JSON lines in
``OUT/progress.jsonl``; ``LAUNCH_TIMEOUT``: the task's ``timeout``; prints ``RUNNING`` once the run started and ``DRIVER_DONE
<completed>`` at its end.
"""

import os
import sys

out, how, blocks, workers, block_secs, mode = sys.argv[1:7]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import launchfns  # noqa: E402

import daisy_nb  # noqa: E402
import daisy_nb.logging  # noqa: E402
from daisy_nb import launch  # noqa: E402

job = [sys.executable, launchfns.JOB, out, block_secs, mode]
if how == "slurm":
    fn = launch.slurm(job, partition="debug", args=["--mem=1G"])
elif how == "lsf":
    fn = launch.lsf(job, queue="short")
elif how == "local":
    fn = launch.local(job)
elif how == "plain":
    fn = launchfns.plain
elif how == "fireforget":
    fn = launchfns.fire_and_forget
else:
    raise SystemExit(f"unknown HOW {how}")
os.environ["LAUNCH_JOB_ARGV"] = "\n".join(job)
daisy_nb.logging.set_log_basedir(os.path.join(out, "logs"))
task = daisy_nb.Task(
    "launch",
    daisy_nb.Roi((0,), (int(blocks),)),
    daisy_nb.Roi((0,), (1,)),
    daisy_nb.Roi((0,), (1,)),
    process_function=fn,
    read_write_conflict=False,
    max_workers=int(workers),
    max_retries=0,
    max_worker_restarts=1,
    tracking_path=False,
    timeout=float(os.environ["LAUNCH_TIMEOUT"]) if os.environ.get("LAUNCH_TIMEOUT") else None,
)
print("RUNNING", flush=True)
observer = daisy_nb.JsonProgressObserver(path=os.path.join(out, "progress.jsonl"))
states = daisy_nb.run_blockwise(task, progress=observer, summary=False, return_states=True, host="127.0.0.1")
print("DRIVER_DONE", states["launch"].completed_count, flush=True)
