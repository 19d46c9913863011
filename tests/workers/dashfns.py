"""Block functions for the dashboard tests (imported by worker processes: keep light).

``DASH_FAIL``: comma-separated block ids that raise. ``DASH_SLOW``: a file; while it
exists every block sleeps ``DASH_SLEEP`` seconds (default 0.005), so a test decides
when the run may finish. ``DASH_GATE`` (``"<task>:<first id>:<file>"``): blocks of that task
from that id on wait until the file exists; ``DASH_HOLD`` (``"<task>:<id>"``): that block
waits while the ``DASH_SLOW`` file exists (so the run cannot end before the test lets it).
Waits give up after two minutes.
"""

import os
import time


def _fail_ids():
    return {int(v) for v in os.environ.get("DASH_FAIL", "").split(",") if v}


def work(block):
    die = os.environ.get("DASH_DIE")  # "<block id>:<marker file>": the worker dies there, once
    if die:
        bid, marker = die.split(":", 1)
        if block.block_id[1] == int(bid) and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
    if block.block_id[1] in _fail_ids():
        raise ValueError(f"dashboard test failure in block {block.block_id[1]}")
    flag = os.environ.get("DASH_SLOW")
    gate = os.environ.get("DASH_GATE")
    if gate:
        tid, first, path = gate.split(":", 2)
        if block.task_id == tid and block.block_id[1] >= int(first):
            _wait(lambda: os.path.exists(path))
    hold = os.environ.get("DASH_HOLD")
    if hold and flag:
        tid, bid = hold.split(":")
        if block.task_id == tid and block.block_id[1] == int(bid):
            _wait(lambda: not os.path.exists(flag))
    if flag and os.path.exists(flag):
        time.sleep(float(os.environ.get("DASH_SLEEP", "0.005")))


def _wait(cond, secs=120.0):
    deadline = time.monotonic() + secs
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
