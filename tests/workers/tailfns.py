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


def _client_loop(run) -> int:
    """A Client loop in the worker function itself: ``run(block)`` for every block; returns how many ran."""
    import daisy_nb

    client = daisy_nb.Client()
    ran = 0
    while True:
        with client.acquire_block() as block:
            if block is None:
                return ran
            run(block)
            ran += 1


def slow_client():
    """A job of the upstream task: a Client loop in the worker function itself, slow blocks."""
    _client_loop(lambda block: time.sleep(SLOW_BLOCK_SECS))


def fast_client():
    """A job of the downstream task: fast blocks, which wait on the slow ones."""
    _client_loop(lambda block: time.sleep(FAST_BLOCK_SECS))


PIPE_BLOCK_SECS = 0.1  # every block of the pipeline test but the straggler: modelled work
PIPE_DEADLINE_SECS = 60.0


def _pipe_note(name: str, text: str) -> None:
    with open(os.path.join(os.environ["DAISY_NB_TEST_OUT"], name), "w") as f:
        f.write(text)


def _pipe_loop(tid: str) -> None:
    """A Client loop in the worker function itself (its job, after the queue): ``a``'s block 0 waits
    (polling, with a deadline) until ``TAIL_B_JOBS`` jobs of ``b`` have ended, then finishes;
    other blocks take ``PIPE_BLOCK_SECS``. Leaves ``done_<tid>_<block>`` and
    ``ended_<tid>_<pid>`` (when, blocks run)."""
    out = os.environ["DAISY_NB_TEST_OUT"]

    def run(block):
        sid = block.block_id[1]
        if tid == "a" and sid == 0:
            jobs = int(os.environ["TAIL_B_JOBS"])
            deadline = time.monotonic() + PIPE_DEADLINE_SECS
            while sum(n.startswith("ended_b_") for n in os.listdir(out)) < jobs:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)  # polling, with the deadline above
        else:
            time.sleep(PIPE_BLOCK_SECS)
        _pipe_note(f"done_{tid}_{sid}", repr(time.time()))

    queued()
    ran = _client_loop(run)
    _pipe_note(f"ended_{tid}_{os.getpid()}", f"{time.time()} {ran}")


def pipe_a():
    _pipe_loop("a")


def pipe_b():
    _pipe_loop("b")
