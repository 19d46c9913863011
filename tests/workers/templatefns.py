"""Block functions for tests/test_runtime_template.py: each records which process started it.

A ``done`` line is ``<pid> <offset> <shape> <parent pid>[,<heavy modules>]``: the parent of a
worker forked by the run's template is the template; of an exec'd worker, the pool.
"""

import os
import random
import resource
import signal
import sys
import time

from blockfns import attempt, done


def record_parent(block):
    attempt(block)
    time.sleep(0.002)
    done(block, str(os.getppid()))


def record_parent_and_imports(block):
    heavy = [m for m in ("numba", "numpy", "zarr") if m in sys.modules]
    done(block, f"{os.getppid()},{'+'.join(heavy) or 'none'}")


_template_modules: set = set()  # the template's modules at this worker's fork (read at its first block)


def record_worker_side_imports(block):
    """The ``done`` line's extra: the modules of the worker side (daisy_nb's, and ``mmap``) this
    worker imported after its fork, before this block ended (``+``-joined, ``none``). The
    template's modules at the fork are what its import reporter starts from (``_zygote_imports``),
    read in the worker's first batch (the reporter's hook is gone after it)."""
    from daisy_nb.runtime.local import worker

    if not _template_modules:
        _template_modules.update(worker.after_first_batch.__self__.before)
    mine = {__name__, "blockfns"}
    new = sorted(
        m
        for m in sys.modules
        if m not in _template_modules and m not in mine and (m.startswith("daisy_nb") or m == "mmap")
    )
    done(block, f"{os.getppid()},{'+'.join(new) or 'none'}")


def record_template_extras(block):
    """The ``done`` line's extra: which of the modules only the pool's side or the main process
    uses the template held at this worker's fork (``+``-joined, ``none``)."""
    from daisy_nb.runtime.local import worker

    if not _template_modules:
        _template_modules.update(worker.after_first_batch.__self__.before)
    held = [m for m in ("subprocess", "shutil", "datetime", "bz2", "lzma") if m in _template_modules]
    done(block, f"{os.getppid()},{'+'.join(held) or 'none'}")


def record_cloudpickle_source(block):
    """The ``done`` line's extra: where this worker's cloudpickle came from, ``template`` (held
    by the template at the fork), ``worker`` (imported after the fork) or ``none``."""
    from daisy_nb.runtime.local import worker

    if not _template_modules:
        _template_modules.update(worker.after_first_batch.__self__.before)
    where = "template" if "cloudpickle" in _template_modules else "worker" if "cloudpickle" in sys.modules else "none"
    done(block, f"{os.getppid()},{where}")


class RecordParentWith:
    """``record_parent`` carrying ``nbytes`` of data: a task whose serialized function is that large."""

    def __init__(self, nbytes: int):
        self.data = os.urandom(nbytes)

    def __call__(self, block):
        assert len(self.data) > 0
        record_parent(block)


def churn_buffers(block):
    """Allocate and free buffers of varied sizes (zarr chunks, a block's arrays) 20 times; the
    ``done`` line's extra is the minor page faults per round in this worker."""
    attempt(block)
    rng = random.Random(block.block_id[1])
    bufs = [bytearray(rng.randrange(256 << 10, 4 << 20)) for _ in range(6)]  # the first round: faults either way
    del bufs
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        bufs = [bytearray(rng.randrange(256 << 10, 4 << 20)) for _ in range(6)]
        del bufs
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 20
    done(block, f"{os.getppid()},{faults:.0f}")


def sigkill_once_on_5(block):
    n = attempt(block)
    if block.spatial_id == 5 and n == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    done(block, str(os.getppid()))


def hang_on_2(block):
    attempt(block)
    if block.spatial_id == 2:
        time.sleep(1000)
    done(block, str(os.getppid()))


def kill_template_once_on_40(block):
    """The first attempt at block 40 kills the worker's parent, the template (and so itself)."""
    n = attempt(block)
    if block.spatial_id == 40 and n == 1 and os.getppid() != int(os.environ["DAISY_NB_TEST_POOL_PID"]):
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(30)  # the template's death signal ends this worker first
    time.sleep(0.002)
    done(block, str(os.getppid()))


def exit_3(block):
    attempt(block)
    os._exit(3)


def write_fds_and_fail_on_1(block):
    """Writes below Python's streams (fd 1 and 2), then block 1 raises: all of it lands in the slot's logs."""
    os.write(1, f"fd1 from block {block.spatial_id} pid {os.getpid()}\n".encode())
    os.write(2, f"fd2 from block {block.spatial_id}\n".encode())
    if block.spatial_id == 1:
        raise ValueError("block 1 fails")
    done(block, str(os.getppid()))


def client_loop_reporting_nodelay():
    """A Client loop that records whether its connection sends small writes at once (TCP_NODELAY)."""
    import socket

    import daisy_nb

    client = daisy_nb.Client()
    s = socket.socket(fileno=os.dup(client._conn.sock.fileno()))
    nodelay = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    s.close()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            attempt(block)
            done(block, f"{os.getppid()},nodelay={nodelay}")


def client_loop_killing_template_once_on_12():
    """A Client loop whose first attempt at block 12 kills its parent, the template (and so itself)."""
    import daisy_nb

    client = daisy_nb.Client()
    pool_pid = int(os.environ["DAISY_NB_TEST_POOL_PID"])
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            n = attempt(block)
            if block.spatial_id == 12 and n == 1 and os.getppid() != pool_pid:
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(30)  # the template's death signal ends this worker first
            time.sleep(0.002)
            done(block, str(os.getppid()))
