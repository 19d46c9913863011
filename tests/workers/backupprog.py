"""A worker program (a "cluster job") for ``tests/test_client_backups.py``: ``python backupprog.py MODE``.

A ``daisy_nb.Client`` loop over a ``Task(speculative=True)``. Block 0 straggles on one of its
two copies, by ``MODE``:

* ``first-hangs``: its first attempt runs (polling) until it is interrupted, or for
  ``DEADLINE_SECS``; its copy finishes at once, so the run ends in time only if the copy
  runs and wins and the first attempt is stopped;
* ``copy-hangs``: its first attempt waits (polling, with a deadline) until the copy has
  started, then finishes; the copy runs until it is interrupted.

Other blocks take ``BLOCK_SECS``. Every attempt of a block appends a byte to
``attempt_<block>``; a finished block leaves ``done_<block>`` (pid, attempt), an
interrupted one ``interrupted_<block>`` (pid, attempt, the exception's name); the program
leaves ``ended_<pid>`` when its loop ends.
"""

import os
import sys
import time

OUT = os.environ["DAISY_NB_TEST_OUT"]
DEADLINE_SECS = 60.0
BLOCK_SECS = 0.02


def touch(name, text=""):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(text)


def attempts(sid):
    p = os.path.join(OUT, f"attempt_{sid}")
    return os.path.getsize(p) if os.path.exists(p) else 0


def run_until(cond):
    """Poll ``cond`` until it holds (True) or ``DEADLINE_SECS`` pass (False)."""
    deadline = time.monotonic() + DEADLINE_SECS
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def run_block(block, mode):
    sid = block.block_id[1]
    touch(f"attempt_{sid}", "x")
    k = attempts(sid)
    if sid == 0:
        try:
            if (mode == "first-hangs" and k == 1) or (mode == "copy-hangs" and k == 2):
                run_until(lambda: False)  # until interrupted (or the deadline: the test fails)
            elif mode == "copy-hangs":
                run_until(lambda: attempts(0) >= 2)
        except BaseException as e:
            touch(f"interrupted_{sid}", f"{os.getpid()} {k} {type(e).__name__}\n")
            raise
    else:
        time.sleep(BLOCK_SECS)  # the block's work
    touch(f"done_{sid}", f"{os.getpid()} {k}\n")


def main():
    import daisy_nb

    mode = sys.argv[1]
    client = daisy_nb.Client()
    ran = 0
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            run_block(block, mode)
            ran += 1
    touch(f"ended_{os.getpid()}", f"{time.time()} {ran}\n")


if __name__ == "__main__":
    main()
