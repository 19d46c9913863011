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


SLOW_BLOCK_SECS = 0.4  # a's blocks in the pipeline test: modelled work
FAST_BLOCK_SECS = 0.01  # b's


def _client_loop(secs: float) -> None:
    import daisy_nb

    client = daisy_nb.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                return
            time.sleep(secs)


def slow_client():
    """A job of the upstream task: a Client loop in the worker function itself, slow blocks."""
    _client_loop(SLOW_BLOCK_SECS)


def fast_client():
    """A job of the downstream task: fast blocks, which wait on the slow ones."""
    _client_loop(FAST_BLOCK_SECS)
