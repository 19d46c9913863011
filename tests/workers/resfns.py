"""Block and worker functions for tests/test_resource_tracking.py (run in worker processes)."""

import os
import time

CPU_SECS = 0.02  # CPU burnt per block by ``burn``
WRITE_BYTES = 256 * 1024  # bytes written per block by ``write_file``


def _burn(secs):
    t = time.process_time()
    x = 0
    while time.process_time() - t < secs:
        x += 1
    return x


def burn(block):
    _burn(CPU_SECS)


def write_file(block):
    path = os.path.join(os.environ["DAISY_NB_TEST_OUT"], f"w_{block.spatial_id}.bin")
    with open(path, "wb") as f:
        f.write(b"x" * WRITE_BYTES)


def fail_odd(block):
    """Odd blocks raise; even ones succeed (both burn a little CPU)."""
    _burn(0.002)
    if block.spatial_id % 2:
        raise ValueError(f"odd block {block.spatial_id}")


def own_profile(block):
    """Profiles only a short sleep itself, then burns CPU outside it: the worker's own
    (outer) measurement must not replace the block function's."""
    import daisy_nb

    with daisy_nb.profile_block(block):
        time.sleep(0.001)
    assert block.stats is not None and block.stats.cpu_seconds < CPU_SECS
    first = block.stats
    _burn(CPU_SECS)
    with daisy_nb.profile_block(block):  # a second profile does not replace the first either
        _burn(0.001)
    assert block.stats is first


def client_burn():
    import daisy_nb

    client = daisy_nb.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            _burn(CPU_SECS)
            if block.spatial_id == 1:
                raise ValueError("client block 1 failed")


def sigkill_once_on_7(block):
    """The worker dies on block 7's first attempt (mid-batch once batches grow)."""
    import signal

    name = os.path.join(os.environ["DAISY_NB_TEST_OUT"], f"attempt_{block.spatial_id}")
    with open(name, "a") as f:
        f.write("x")
    if block.spatial_id == 7 and os.path.getsize(name) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
