"""Block functions for the full-disk tracking tests (imported by worker processes: keep light).

A block fills the (small) tracking file system with a file, as another program
writing to the same disk would.
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


def fill_then_fail_some(block, out, filler, at):
    """Fill ``filler``'s disk at block ``at``; every fifth block fails (a failure count to
    record); the others leave ``out/ok_<i>``. (Bound with functools.partial.)"""
    i = block.write_roi.offset[0] // 10  # the block's tracking cell (10-wide blocks from 0)
    if i == at:
        fill(filler)
    time.sleep(0.001)
    if i % 5 == 3:  # failed without raising: the serial runner would re-raise it
        from daisy_nb.block import BlockStatus

        block.status = BlockStatus.FAILED
        return
    with open(os.path.join(out, f"ok_{i}"), "w"):
        pass
