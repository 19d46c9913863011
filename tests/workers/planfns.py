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


def sleep_once(block):
    """Block 0 sleeps until ``$DAISY_NB_TEST_OUT/release`` exists (the first time), the others are fast."""
    if block.spatial_id == 0 and not os.path.exists(os.path.join(os.environ["DAISY_NB_TEST_OUT"], "slept")):
        deadline = time.monotonic() + float(os.environ.get("DAISY_NB_TEST_SLEEP", "3"))
        while time.monotonic() < deadline:
            time.sleep(0.02)
        open(os.path.join(os.environ["DAISY_NB_TEST_OUT"], "slept"), "w").close()
    done(block)
