"""Block functions for the error-grouping tests (imported by worker processes: keep light).

``ERR_INDEX``: block ids that raise an IndexError whose message carries a number of the
block's own; ``ERR_KEY``: block ids that raise a KeyError. ``ERR_SLEEP``: seconds every
block sleeps (default 0).
"""

import os
import time


def _ids(name):
    return {int(v) for v in os.environ.get(name, "").split(",") if v}


def work(block):
    bid = block.block_id[1]
    s = float(os.environ.get("ERR_SLEEP", "0") or 0)
    if s:
        time.sleep(s)
    if bid in _ids("ERR_INDEX"):
        raise IndexError(f"index {bid * 1000 + 7} is out of bounds for axis 0 with size 1000")
    if bid in _ids("ERR_KEY"):
        raise KeyError(f"chunk/{bid}")
