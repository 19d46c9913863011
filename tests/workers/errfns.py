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


class DiskGone(Exception):  # noqa: N818 - named as no convention expects: the text path cannot find it
    pass


def gone(block):
    """``ERR_GONE`` block ids raise a :class:`DiskGone` with a message of two lines."""
    bid = block.block_id[1]
    if bid in _ids("ERR_GONE"):
        raise DiskGone(f"disk {bid} is gone\nsecond line: ask the admin")
    work(block)


def client_loop():
    """A 0-argument worker function: a ``Client`` loop over :func:`gone` that carries on after a
    block raised (its worker lives on: the failures are the blocks', no worker's)."""
    import daisy_nb

    client = daisy_nb.Client()
    while True:
        try:
            with client.acquire_block() as block:
                if block is None:
                    break
                gone(block)
        except (DiskGone, IndexError):
            continue
