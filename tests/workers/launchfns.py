"""Hand-written worker functions for tests/workers/launch_driver.py (importable by reference)."""

import os
import subprocess

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_job.py")


def plain():
    """The general form: the job program detached (own session, as on another node), waited for."""
    argv = os.environ["LAUNCH_JOB_ARGV"].split("\n")
    subprocess.run(argv, check=True, start_new_session=True, stdin=subprocess.DEVNULL)


def fire_and_forget():
    """The common mistake: ``sbatch`` without ``--wait`` (returns at once, its job goes on); this one
    then fails once a job runs a block, so that the task is abandoned while jobs hold blocks."""
    import glob
    import shlex
    import time

    argv = os.environ["LAUNCH_JOB_ARGV"].split("\n")
    subprocess.run(["sbatch", "--parsable", "--wrap", shlex.join(argv)], check=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not glob.glob(os.path.join(argv[2], "inblock_*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError("the worker function gives up while its job goes on")
