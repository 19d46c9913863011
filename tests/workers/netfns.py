"""0-argument worker functions and block functions of tests/test_cluster_net.py.

Each ``submit_*`` starts ``netprog.py`` in its own session (a job handed to a batch
system) with nothing but PATH and DAISY_CONTEXT, records ``job_<pid>`` for the tests'
clean-up and, except ``fire_and_forget``, waits for it (``sbatch --wait``).
"""

import os
import subprocess
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
PROG = os.path.join(HERE, "netprog.py")


def _out():
    return os.environ["DAISY_NB_TEST_OUT"]


def _start(mode):
    env = {"PATH": os.environ.get("PATH", ""), "DAISY_CONTEXT": os.environ["DAISY_CONTEXT"]}
    with open(os.path.join(_out(), f"prog_{os.getpid()}.err"), "ab") as err:
        p = subprocess.Popen(
            [sys.executable, PROG, _out(), mode],
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    with open(os.path.join(_out(), f"job_{p.pid}"), "w"):
        pass
    return p


def _submit(mode):
    rc = _start(mode).wait()
    if rc:
        raise SystemExit(f"job exited with {rc}")


def submit_remote():
    _submit("remote")


def submit_local_only():
    _submit("local_only")


def submit_unreachable():
    _submit("unreachable")


def submit_unreachable_fails():
    _submit("unreachable_fails")


def fire_and_forget():
    """Plain ``sbatch``: submits and returns. Only the first one submits (so that the test
    does not start a job per restart); the others return after a moment, as ``sbatch`` does."""
    import daisy_nb

    if daisy_nb.Context.from_env()["worker_id"] == "0":
        _start("late")
    else:
        time.sleep(0.3)


def returns_once_connected():
    """Submits, waits until its job has been given a block (so the scheduler has seen it
    connect), and returns while the job goes on."""
    import glob

    p = _start("late")
    mine = f"{p.pid}\n"

    def served():
        for path in glob.glob(os.path.join(_out(), "blk_*")):
            with open(path) as f:
                if mine in f.read():
                    return True
        return False

    deadline = time.monotonic() + 30
    while not served() and time.monotonic() < deadline:
        time.sleep(0.02)


def never_connects():
    """A job that runs for a while and never connects (it cannot reach the address), then ends."""
    time.sleep(float(os.environ.get("NETFNS_NEVER_SECS", "4")))


def mark(block):
    """Block function: one file per block, named by the quoted task id."""
    tag = urllib.parse.quote(block.task_id, safe="")
    with open(os.path.join(_out(), f"blk_{tag}_{block.spatial_id}"), "a") as f:
        f.write(f"{os.getpid()}\n")
    print(f"ran block {block.block_id}", flush=True)


def client_loop():
    """A worker function that runs the Client loop itself (the job is the worker process)."""
    import daisy_nb

    client = daisy_nb.Client()
    print(f"task_id={client.task_id!r}", flush=True)
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            mark(block)


def via_loopback():
    """A worker function whose Client records the advertised address, then connects through
    127.0.0.1 (the scheduler listens on every interface) and runs the loop: for a host= that
    only other machines could reach."""
    import daisy_nb

    ctx = daisy_nb.Context.from_env()
    with open(os.path.join(_out(), f"advertised_{os.getpid()}"), "w") as f:
        f.write(ctx["hostname"])
    ctx["hostname"] = "127.0.0.1"
    client = daisy_nb.Client(ctx)
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
