"""Block and worker functions for ``tests/test_local_compat.py`` (imported by workers: keep light).

* :func:`exit3_after_three`: a block function whose worker dies mid-block (``os._exit(3)``)
  after it finished 3 blocks, once per run (a marker file): daisy 2.0 counts it as a crash;
* :func:`raises_boom`: a block function that raises ``ValueError("boom <block id>")`` for every
  block (daisy 2.0 ends the worker; the task's last worker error is the block's traceback);
* :func:`fire_and_forget`: a 0-argument worker function that starts ``late_prog.py`` with
  ``subprocess.Popen`` and returns at once (a plain ``sbatch``); the program connects
  ``LATE_SECS`` later.
"""

import os
import subprocess
import sys
import time

import blockfns

HERE = os.path.dirname(os.path.abspath(__file__))
LATE_SECS = 1.5  # the fire-and-forget program connects this long after it started

_finished = 0


def exit3_after_three(block):
    global _finished
    blockfns.attempt(block)
    if _finished >= 3 and not os.path.exists(os.path.join(blockfns.out_dir(), "died")):
        blockfns._touch("died", str(os.getpid()))
        time.sleep(0.005)
        os._exit(3)
    time.sleep(0.005)
    blockfns.done(block)
    _finished += 1


def raises_boom(block):
    raise ValueError(f"boom {block.block_id}")


def fire_and_forget():
    blockfns._touch(f"spawn_{os.getpid()}")
    subprocess.Popen([sys.executable, os.path.join(HERE, "late_prog.py"), str(LATE_SECS)])
