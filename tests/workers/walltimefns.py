"""0-argument worker functions of ``tests/test_walltime.py``: each runs ``walltimeprog.py`` as its
job and waits for it (as ``sbatch --wait`` would). The first job of the run knows its end,
``WALLTIME_SECS`` after its worker function started: given to ``Client(end_time=...)``
(``WALLTIME_HOW=keyword``) or in ``SLURM_JOB_END_TIME`` (``WALLTIME_HOW=slurm``, whole seconds as
SLURM writes it); later jobs know none."""

import math
import os
import subprocess
import sys
import time

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "walltimeprog.py")


def first_job():
    """True for the first job of the run only (an exclusive create in the test's directory)."""
    try:
        os.close(os.open(os.path.join(os.environ["DAISY_NB_TEST_OUT"], "first_job"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def job():
    env = dict(os.environ)
    env.pop("SLURM_JOB_END_TIME", None)
    if first_job():
        end = time.time() + float(os.environ["WALLTIME_SECS"])
        if os.environ["WALLTIME_HOW"] == "slurm":
            env["SLURM_JOB_END_TIME"] = str(math.ceil(end))
        else:
            env["JOB_END"] = repr(end)
    subprocess.run([sys.executable, PROG], env=env, check=True)
