"""0-argument worker functions of ``tests/test_tail.py``: each runs ``tailprog.py`` as its job and
waits for it (as ``sbatch --wait`` or a launcher of ``daisy_nb.launch`` would), after
``TAIL_QUEUE_SECS`` in the batch system's queue (the job's start-up, as the scheduler measures it)."""

import os
import subprocess
import sys
import time

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tailprog.py")


def queued():
    time.sleep(float(os.environ.get("TAIL_QUEUE_SECS", "0")))  # a model of the queue, not a wait for an event


def one_straggler():
    queued()
    subprocess.run([sys.executable, PROG, "1"], check=True)


def two_stragglers():
    queued()
    subprocess.run([sys.executable, PROG, "2"], check=True)
