"""A worker program (a "cluster job") for ``tests/test_tail.py``: ``python tailprog.py N_STRAGGLERS``.

A ``daisy_nb.Client`` loop. Blocks ``0 .. N_STRAGGLERS - 1`` are the stragglers: their
first attempt waits (polling, with a deadline) until ``TAIL_ENDS`` other jobs of the task
have ended, that is until the task's tail released them, then either finishes
(``STRAGGLER_FAILS`` unset) or ends this program as a walltime or OOM kill would
(``os._exit``); a retry waits until every straggler's retry has started (so that one job
cannot run them one after the other), then finishes. Other blocks finish at once. Every block leaves ``done_<block>`` (the pid that ran it and when), every
attempt ``attempt_<block>``; the program leaves ``ended_<pid>`` (when, blocks it ran)
when its loop ends.
"""

import os
import sys
import time

OUT = os.environ["DAISY_NB_TEST_OUT"]
DEADLINE_SECS = 60.0


def touch(name, text=""):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(text)


def count(prefix):
    return sum(1 for n in os.listdir(OUT) if n.startswith(prefix))


def wait_for(prefix, n):
    """Poll until ``n`` files named ``prefix*`` exist; False after ``DEADLINE_SECS``."""
    deadline = time.monotonic() + DEADLINE_SECS
    while count(prefix) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_block(block, stragglers, fails):
    sid = block.block_id[1]
    touch(f"attempt_{sid}", "x")
    k = os.path.getsize(os.path.join(OUT, f"attempt_{sid}"))
    if sid < stragglers:
        if k == 1:
            # the tail: every other block is done or in flight; another job must end while this one runs
            saw = wait_for("ended_", int(os.environ["TAIL_ENDS"]))
            touch(f"straggler_{sid}", f"{time.time()} {count('ended_')} {saw}\n")
            if fails:
                touch(f"failed_{sid}")
                os._exit(3)  # the job is killed in the middle of the block
        else:  # every straggler's retry has started
            deadline = time.monotonic() + DEADLINE_SECS
            while time.monotonic() < deadline and any(
                os.path.getsize(os.path.join(OUT, f"attempt_{s}")) < 2 for s in range(stragglers)
            ):
                time.sleep(0.01)
    touch(f"done_{sid}", f"{os.getpid()} {time.time()} {k}\n")


def main():
    import daisy_nb

    stragglers = int(sys.argv[1])
    fails = bool(os.environ.get("STRAGGLER_FAILS"))
    client = daisy_nb.Client()
    ran = 0
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            run_block(block, stragglers, fails)
            ran += 1
    touch(f"ended_{os.getpid()}", f"{time.time()} {ran}\n")


if __name__ == "__main__":
    main()
