"""Block functions of the dry-run and hang-alarm tests (imported by worker processes: keep light)."""

import os
import time

from blockfns import done


def fail_some(block):
    """An earlier run that finished part of a pipeline: in task a the blocks of even rows and
    columns fail (the last level of a 2-D task with conflicts: nothing in a depends on them),
    elsewhere the blocks of odd columns (axis 0)."""
    x, y = (v // 10 % 2 for v in block.write_roi.offset)
    if (block.task_id == "a" and not x and not y) or (block.task_id != "a" and x):
        block.status = 3
        return
    done(block)


def hold_first(block):
    """Block 0 runs while ``$DAISY_NB_TEST_OUT/hold`` exists (at most 120 s); the others take
    ``$DAISY_NB_TEST_BLOCK_SECS`` (default 0)."""
    out = os.environ["DAISY_NB_TEST_OUT"]
    if block.spatial_id == 0:
        deadline = time.monotonic() + 120
        while os.path.exists(os.path.join(out, "hold")) and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        time.sleep(float(os.environ.get("DAISY_NB_TEST_BLOCK_SECS", "0")))
    done(block)


def client_hold():
    """A 0-argument worker function: a ``Client`` loop running :func:`hold_first`."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            hold_first(block)
