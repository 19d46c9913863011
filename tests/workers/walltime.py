"""Workers whose job ends after it finished blocks (a walltime kill, a preemption), and crash loops.

Block functions (the pool's block workers) and 0-argument worker functions that run
``walltime_prog.py`` as their "cluster job" (``subprocess.run(..., check=True)``, as
``sbatch --wait``/``srun`` would). A worker ends itself with SIGKILL in the middle of
a block, as a walltime or preemption kill would, and leaves a file saying why:

* ``jobend_<pid>``: after it had finished ``FINISH`` blocks (a job end);
* ``crash_<pid>``: at its first block, before finishing any (a crash).

Modes: ``end`` (every worker: a job end after ``FINISH`` blocks), ``crash`` (every
worker: a crash at its first block), ``ends_then_crash`` (the first ``ENDS`` workers
end as in ``end``, every later one crashes: meant for ``max_workers=1``), ``raise``
(after ``FINISH`` blocks, a block raises: daisy 2.0's crash, not a job end). A job end or a raise happens only at a
block's first attempt, so every block succeeds on its retry (retries are handed out
after every fresh block).
"""

import os
import signal
import subprocess
import sys
import time

import blockfns

HERE = os.path.dirname(os.path.abspath(__file__))
PROG = os.path.join(HERE, "walltime_prog.py")
FINISH = 3  # blocks a worker finishes before its job ends
ENDS = 5  # ends_then_crash: job ends before the crash loop starts
BLOCK_SECS = 0.02  # slower than the pool's batch target: one block per batch, none sent ahead

_finished = 0  # blocks this worker process finished


def _ends_so_far(out):
    return sum(1 for n in os.listdir(out) if n.startswith("jobend_"))


def step(block, mode, finished):
    """Run ``block`` in worker mode ``mode`` after ``finished`` blocks; may end the process."""
    out = blockfns.out_dir()
    k = blockfns.attempt(block)
    if mode == "ends_then_crash":
        mode = "end" if _ends_so_far(out) < ENDS else "crash"
    if mode == "crash" and finished == 0:
        blockfns._touch(f"crash_{os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)
    if k == 1 and finished >= FINISH:
        if mode == "end":
            blockfns._touch(f"jobend_{os.getpid()}", str(finished))
            time.sleep(BLOCK_SECS / 2)  # killed in the middle of the block
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "raise":
            raise RuntimeError(f"block {block.spatial_id} raised after {finished} finished blocks")
    time.sleep(BLOCK_SECS)
    blockfns.done(block)


def _block(block, mode):
    global _finished
    step(block, mode, _finished)
    _finished += 1


def end_block(block):
    _block(block, "end")


def crash_block(block):
    _block(block, "crash")


def ends_then_crash_block(block):
    _block(block, "ends_then_crash")


def raise_block(block):
    _block(block, "raise")


def _job(mode):
    subprocess.run([sys.executable, PROG, mode], check=True, stdin=subprocess.DEVNULL)  # a job that ends


def end_job():
    _job("end")


def crash_job():
    _job("crash")


def ends_then_crash_job():
    _job("ends_then_crash")


def raise_job():
    _job("raise")
