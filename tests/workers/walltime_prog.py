"""A worker program (a "cluster job") for :mod:`walltime`: ``python walltime_prog.py MODE``.

A ``daisy_nb.Client`` loop whose blocks run :func:`walltime.step` (which may end this
program as a walltime kill would); a block that raises ends the loop and the program
with it, as daisy 2.0 re-raises it.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import walltime  # noqa: E402

import daisy_nb  # noqa: E402

mode = sys.argv[1]
client = daisy_nb.Client()
finished = 0
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        walltime.step(block, mode, finished)
        finished += 1
