"""Ctrl-C drains what already arrived (tests/test_net_drain.py): a driver and its job program.

``drainprog.py driver OUT TRACKING RUN``: one task of ``N_BLOCKS`` blocks of 20 ms on 8
worker functions, each ``sbatch --parsable --wait --wrap "<this file> job OUT RUN"`` (the
fake ``sbatch`` of ``fakebatch.py``: the job runs in its own session, as on another node).
Prints ``KI`` and exits 42 on ``KeyboardInterrupt``, prints ``DONE`` at a normal end.

``drainprog.py job OUT RUN``: a ``Client`` loop. In each block: 20 ms, then ``fin<RUN>_<id>``
(the block finished); after the ``with`` (its release has been sent: on loopback, in the
scheduler's receive buffer): ``sent<RUN>_<id>``. ``<id>`` is the block's spatial id (its row
in the tracking store of this 1-D task).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

N_BLOCKS = 400
JOBS = 8


def _touch(out: str, name: str) -> None:
    with open(os.path.join(out, name), "w"):
        pass


def job(out: str, run: str) -> None:
    import daisy_nb

    client = daisy_nb.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            time.sleep(0.02)
            i = block.spatial_id
            _touch(out, f"fin{run}_{i}")
        _touch(out, f"sent{run}_{i}")


def worker_function() -> None:
    argv = [sys.executable, os.path.abspath(__file__), "job", os.environ["DRAIN_OUT"], os.environ["DRAIN_RUN"]]
    subprocess.run(["sbatch", "--parsable", "--wait", "--wrap", shlex.join(argv)], check=True, stdin=subprocess.DEVNULL)


def driver(out: str, tracking: str, run: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import drainprog  # the worker function by reference, importable in the workers

    import daisy_nb
    from daisy_nb import Roi

    os.environ["DRAIN_OUT"], os.environ["DRAIN_RUN"] = out, run
    task = daisy_nb.Task(
        "drain",
        Roi((0,), (10 * N_BLOCKS,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=drainprog.worker_function,
        read_write_conflict=False,
        max_workers=JOBS,
        max_retries=0,
        tracking_path=tracking,
    )
    try:
        daisy_nb.run_blockwise([task], progress=False, summary=False, host="127.0.0.1")
    except KeyboardInterrupt:
        print("KI", flush=True)
        sys.exit(42)
    print("DONE", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "job":
        job(sys.argv[2], sys.argv[3])
    else:
        driver(sys.argv[2], sys.argv[3], sys.argv[4])
