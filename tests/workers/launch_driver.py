"""A driver for tests/test_launch.py and benchmarks: ``python launch_driver.py OUT HOW BLOCKS WORKERS BLOCK_SECS MODE``.

Runs one task of ``BLOCKS`` blocks on ``WORKERS`` worker functions (loopback only) whose
jobs run ``launch_job.py OUT BLOCK_SECS MODE``. ``HOW``: ``slurm``/``lsf``/``local`` (the
launchers of ``daisy_nb.launch``), ``plain`` (a hand-written worker function: the job
program detached in its own session, waited for) or ``fireforget`` (``sbatch`` without
``--wait``: the worker function returns at once). ``MODE`` ``exit3``: the job is
``python -c "raise SystemExit(3)"`` instead (it fails before it connects). Progress as
JSON lines in ``OUT/progress.jsonl``; ``LAUNCH_TIMEOUT``: the task's ``timeout``.

Other switches (environment):

* ``LAUNCH_UPSTREAM=crash``: the task runs downstream of a block-function task ``up``
  (``launchfns.up_block``: its blocks 0 and 1 succeed, the others end their worker
  process once a job runs a block), which hits its restart cap: ``up`` is abandoned,
  and with it the launcher task while its jobs run (or wait for) their blocks.
* ``LAUNCH_RAISE=signal``: a ``SIGTERM`` handler raises ``Preempted`` (an ``Exception``)
  in the driver, as a driver that is itself a batch job does at its walltime;
  ``LAUNCH_RAISE=observer``: the progress observer raises ``SystemExit(7)`` from
  ``on_progress`` once 2 jobs run a block (``notify`` swallows only ``Exception``).

Prints ``RUNNING`` once the run started; at its end ``DRIVER_STATES <json>`` (per task:
abandoned, abandon_reason, completed, failed, orphaned, worker_failures, worker_restarts,
worker_job_ends, first_worker_error;
also when the run raises with the states attached, as an abandoned task does) and
``DRIVER_DONE <completed>`` after a run that returned, ``DRIVER_RAISED <type>: <message>``
after one that raised (then re-raised; daisy_nb's exceptions by the built-in type they are).
"""

import functools
import json
import os
import signal
import sys

out, how, blocks, workers, block_secs, mode = sys.argv[1:7]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import launchfns  # noqa: E402

import daisy_nb  # noqa: E402
import daisy_nb.logging  # noqa: E402
from daisy_nb import launch  # noqa: E402

if mode == "exit3":
    job = [sys.executable, "-c", "raise SystemExit(3)"]
else:
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
ONE = daisy_nb.Roi((0,), (1,))
TOTAL = daisy_nb.Roi((0,), (int(blocks),))
task = daisy_nb.Task(
    "launch",
    TOTAL,
    ONE,
    ONE,
    process_function=fn,
    read_write_conflict=False,
    max_workers=int(workers),
    max_retries=0,
    max_worker_restarts=1,
    tracking_path=False,
    timeout=float(os.environ["LAUNCH_TIMEOUT"]) if os.environ.get("LAUNCH_TIMEOUT") else None,
)
pipeline = task
upstream = os.environ.get("LAUNCH_UPSTREAM", "")
if upstream == "crash":
    up = daisy_nb.Task(
        "up",
        TOTAL,
        ONE,
        ONE,
        process_function=functools.partial(launchfns.up_block, out=out, ok=2),
        read_write_conflict=False,
        max_workers=1,
        max_retries=3,  # its blocks stay ready until the restart cap abandons it
        max_worker_restarts=1,
        tracking_path=False,
    )
    pipeline = up + task
elif upstream:
    raise SystemExit(f"unknown LAUNCH_UPSTREAM {upstream}")


class Preempted(Exception):
    pass


def _preempted(signum, frame):
    raise Preempted(f"the driver got signal {signum}")


class _RaisingObserver(daisy_nb.JsonProgressObserver):
    def on_progress(self, states):
        super().on_progress(states)
        if len(launchfns.marks(out, "inblock_")) >= 2:
            raise SystemExit(7)


raising = os.environ.get("LAUNCH_RAISE", "")
observer_cls = daisy_nb.JsonProgressObserver
if raising == "signal":
    signal.signal(signal.SIGTERM, _preempted)
elif raising == "observer":
    observer_cls = _RaisingObserver
elif raising:
    raise SystemExit(f"unknown LAUNCH_RAISE {raising}")


def print_states(states) -> None:
    fields = {
        "abandoned": "abandoned",
        "abandon_reason": "abandon_reason",
        "completed": "completed_count",
        "failed": "failed_count",
        "orphaned": "orphaned_count",
        "worker_failures": "worker_failure_count",
        "worker_restarts": "worker_restart_count",
        "worker_job_ends": "worker_job_end_count",
        "first_worker_error": "first_worker_error",
    }
    view = {tid: {k: getattr(st, a, None) for k, a in fields.items()} for tid, st in states.items()}
    print("DRIVER_STATES", json.dumps(view, default=str), flush=True)


print("RUNNING", flush=True)
observer = observer_cls(path=os.path.join(out, "progress.jsonl"))
try:
    states = daisy_nb.run_blockwise(pipeline, progress=observer, summary=False, return_states=True, host="127.0.0.1")
except BaseException as e:
    if getattr(e, "daisy_states", None) is not None:
        print_states(e.daisy_states)
    kind = type(e)
    if kind.__module__.startswith("daisy_nb."):  # daisy_nb's own (TaskAbandonedError): the built-in it is
        kind = next(c for c in kind.__mro__ if c.__module__ == "builtins")
    print(f"DRIVER_RAISED {kind.__name__}: {e}", flush=True)
    raise
print_states(states)
print("DRIVER_DONE", states["launch"].completed_count, flush=True)
