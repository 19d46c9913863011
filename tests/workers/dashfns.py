"""Block functions for the dashboard tests (imported by worker processes: keep light).

``DASH_FAIL``: comma-separated block ids that raise. ``DASH_SLOW``: a file; while it
exists every block sleeps ``DASH_SLEEP`` seconds (default 0.005), so a test decides
when the run may finish.
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
    if flag and os.path.exists(flag):
        time.sleep(float(os.environ.get("DASH_SLEEP", "0.005")))
