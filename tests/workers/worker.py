"""An external worker program, launched by a 0-argument worker function (daisy 1.x tutorial style)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import blockfns  # noqa: E402

import daisy_nb.runtime.client as c  # noqa: E402

client = c.Client()
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        blockfns.attempt(block)
        blockfns.done(block, extra="external")
