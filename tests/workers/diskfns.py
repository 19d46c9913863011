"""Block functions for the full-disk tracking tests (imported by worker processes: keep light).

``$DAISY_NB_TEST_OUT``: where each finished block leaves a file; ``$DAISY_NB_TEST_FILL``:
a file on the (small) tracking file system that block ``$DAISY_NB_TEST_FILL_AT`` fills
it with, as another program writing to the same disk would.
"""

import errno
import os
import time


def fill(path):
    """Write ``path`` until the file system is full (no page left)."""
    chunk = b"\xff" * 4096
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # the other worker filled it
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    break
                raise
    finally:
        os.close(fd)


def fill_then_fail_some(block):
    """Fill the disk at one block; every fifth block fails (a failure count to record)."""
    i = block.write_roi.offset[0] // 10  # the block's tracking cell (10-wide blocks from 0)
    at = int(os.environ.get("DAISY_NB_TEST_FILL_AT", "-1"))
    if i == at:
        fill(os.environ["DAISY_NB_TEST_FILL"])
    time.sleep(0.001)
    if i % 5 == 3:  # failed without raising: the serial runner would re-raise it
        from daisy_nb.block import BlockStatus

        block.status = BlockStatus.FAILED
        return
    with open(os.path.join(os.environ["DAISY_NB_TEST_OUT"], f"ok_{i}"), "w"):
        pass
