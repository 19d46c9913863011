"""A fire-and-forget job's program (:func:`localfns.fire_and_forget`): ``python late_prog.py SECS``.

Sleeps ``SECS`` (a job waiting in a queue), connects, records its pid (``prog_<pid>``),
then runs blocks of 10 ms until there are none or the run ends.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import blockfns  # noqa: E402

import daisy_nb  # noqa: E402

time.sleep(float(sys.argv[1]))
blockfns._touch(f"prog_{os.getpid()}")
client = daisy_nb.Client()
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        time.sleep(0.01)
        blockfns.done(block)
