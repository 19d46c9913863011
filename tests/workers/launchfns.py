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


def marks(out: str, prefix: str) -> list:
    """The marks ``launch_job.py`` left in ``out`` whose names start with ``prefix``."""
    return [n for n in os.listdir(out) if n.startswith(prefix)]


def up_block(block, out: str, ok: int):
    """The block function of the upstream task of ``LAUNCH_UPSTREAM=crash``: blocks before ``ok``
    succeed (their downstream blocks become ready for the jobs); any other block waits until a
    job runs a block, then ends its worker process (a crash, unless that worker finished blocks
    before: the restart cap abandons the task, and the launcher task downstream of it, while its
    jobs run). Waiting for more than one job could wait for ever: a batch's successes are only
    released when the batch ends, so block 1 may still be held with the block that waits."""
    import time

    if block.write_roi.begin[0] < ok:
        return
    deadline = time.monotonic() + 60
    while not marks(out, "inblock_") and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(3)
