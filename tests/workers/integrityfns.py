"""Worker functions and block functions of tests/test_frame_integrity.py.

``proxied_loop`` is a 0-argument worker function whose ``Client`` connects through the
test's bit-flipping proxy (``INTEGRITY_PROXY_PORT``) instead of the scheduler's port.
Its blocks (1-D, 10 wide, grid index = ``write_roi.begin // 10``):

* ``ALWAYS_STATUS`` ends every attempt with ``block.status = FAILED`` (an ``R`` frame
  with status 3), ``ALWAYS_RAISES`` raises in every attempt (an ``F`` frame; ``E`` for a
  task with ``resource_tracking=True``): neither may ever be recorded done;
* ``SLOW`` sleeps long enough for heartbeats to flow both ways;
* with ``INTEGRITY_PAUSE=1`` in the environment, the worker pauses for longer than
  ``GIVE_BACK_SECS`` after ``PAUSE_AFTER`` (outside ``acquire_block``): the blocks the
  scheduler sent ahead meanwhile are given back (``G`` frames, from the heartbeat thread);
* every other block succeeds and first writes ``ok_<index>_<pid>_<n>``: what really
  succeeded, to compare with the tracking store's done marks.
"""

import os
import time
from pathlib import Path

ALWAYS_STATUS = 3
ALWAYS_RAISES = 7
SLOW = 5
SLOW_SECS = 1.2
PAUSE_AFTER = 1  # early: the task's ready blocks still cover two per client, so blocks go ahead


def _out() -> Path:
    return Path(os.environ["DAISY_NB_TEST_OUT"])


def proxied_loop():
    import daisy_nb
    from daisy_nb.runtime.client import GIVE_BACK_SECS

    ctx = daisy_nb.Context.from_env()
    ctx["port"] = os.environ["INTEGRITY_PROXY_PORT"]
    pause = os.environ.get("INTEGRITY_PAUSE") == "1"
    client = daisy_nb.Client(ctx)
    n = 0
    while True:
        i = None
        try:
            with client.acquire_block() as b:
                if b is None:
                    break
                i = b.write_roi.begin[0] // 10
                if i == SLOW:
                    time.sleep(SLOW_SECS)
                if i == ALWAYS_STATUS:
                    b.status = daisy_nb.BlockStatus.FAILED
                elif i == ALWAYS_RAISES:
                    raise RuntimeError(f"block {i} always fails")
                else:
                    n += 1
                    (_out() / f"ok_{i}_{os.getpid()}_{n}").touch()
        except RuntimeError:
            pass  # reported (an F frame, E with resource_tracking); go on with the next block
        if pause and i == PAUSE_AFTER:  # the scenario, not a wait: not asking for a block, holding some
            time.sleep(GIVE_BACK_SECS + 0.5)


def double_hello():
    """Speaks the protocol itself: hello, acquire, a block, a second hello (the scheduler must drop
    the connection and hand the block out again); then a normal Client loop finishes the task."""
    import daisy_nb
    from daisy_nb.runtime.client import pack_hello, unpack_block
    from daisy_nb.runtime.net import liveness as net_liveness
    from daisy_nb.runtime.net import transport as net_transport

    ctx = daisy_nb.Context.from_env()
    timeouts = net_liveness.liveness(ctx)
    sess = net_transport.connect(ctx["hostname"], int(ctx["port"]), bytes.fromhex(ctx["authkey"]), timeouts)
    sess.send(pack_hello(ctx["task_id"], int(ctx["worker_id"])))
    sess.send(b"A")
    msg = sess.recv()
    block = unpack_block(msg, ctx["task_id"])
    sess.send(pack_hello(ctx["task_id"], int(ctx["worker_id"])))
    t0 = time.monotonic()
    try:
        while True:
            kind = sess.recv()[:1]  # heartbeats, or a block sent ahead, until the close
            if kind not in (b"P", b"B"):
                end = f"frame {kind!r}"
                break
    except (EOFError, ConnectionResetError):
        end = "closed"
    except TimeoutError:
        end = "timeout"
    secs = time.monotonic() - t0
    sess.close()
    (_out() / "double_hello").write_text(f"{block.index} {end} {secs:.3f}")
    client = daisy_nb.Client(ctx)
    while True:
        with client.acquire_block() as b:
            if b is None:
                break
            (_out() / f"ok_{b.write_roi.begin[0] // 10}_{os.getpid()}").touch()


def record_env(block):
    """A block function: what its worker process has in DAISY_CONTEXT."""
    (_out() / f"env_{os.getpid()}").write_text(os.environ.get("DAISY_CONTEXT", "<unset>"))


def client_loop():
    import daisy_nb

    client = daisy_nb.Client()
    while True:
        with client.acquire_block() as b:
            if b is None:
                break
            (_out() / f"ok_{b.write_roi.begin[0] // 10}_{os.getpid()}").touch()
