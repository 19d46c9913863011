"""Block and worker functions for the retry-backoff tests (imported by worker processes: keep light).

Each attempt of a block appends ``start <monotonic secs>`` to ``$DAISY_NB_TEST_OUT/t_<spatial id>``;
a failing attempt then appends ``fail <monotonic secs>``. ``time.monotonic`` is the machine's one
clock (CLOCK_MONOTONIC on Linux), so the Scheduler's and every worker's readings compare.
"""

import os
import time


def _log(block, what):
    path = os.path.join(os.environ["DAISY_NB_TEST_OUT"], f"t_{block.spatial_id}")
    with open(path, "a") as f:
        f.write(f"{what} {time.monotonic()!r}\n")
    with open(path) as f:
        return sum(line.startswith("start") for line in f)


def fail_first_attempt(block):
    """Blocks 0 and 2 fail their first attempt (``status = FAILED``: the serial runner retries it too)."""
    n = _log(block, "start")
    if n == 1 and block.spatial_id in (0, 2):
        _log(block, "fail")
        block.status = 3  # BlockStatus.FAILED


def client_loop():
    """A Client loop over ``fail_first_attempt`` (a 0-argument worker function: the TCP hand-out)."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            fail_first_attempt(block)
