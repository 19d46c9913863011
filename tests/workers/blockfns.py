"""Block and worker functions for the runtime tests (imported by worker processes: keep light).

Outputs go to files under ``$DAISY_NB_TEST_OUT`` (workers are separate processes).
"""

import os
import signal
import sys
import time


def out_dir():
    return os.environ["DAISY_NB_TEST_OUT"]


def _touch(name, text=""):
    with open(os.path.join(out_dir(), name), "a") as f:
        f.write(text)


def attempt(block):
    """Record one attempt; return how many attempts this block has had (1-based)."""
    name = f"attempt_{block.task_id}_{block.spatial_id}"
    _touch(name, "x")
    return os.path.getsize(os.path.join(out_dir(), name))


def done(block, extra=""):
    r, w = block.read_roi, block.write_roi
    _touch(f"done_{block.task_id}_{block.spatial_id}", f"{os.getpid()} {r.offset[0]} {w.shape[0]} {extra}\n")


def noop(block):
    pass


def mark(block):
    attempt(block)
    done(block)


def mark_and_print(block):
    print(f"hello from block {block.spatial_id}")
    mark(block)


def check_numba(block):
    done(block, "numba" if "numba" in sys.modules else "clean")


def raise_first_attempt_and_block3(block):
    n = attempt(block)
    if block.spatial_id == 3:
        raise ValueError(f"block 3 always fails (attempt {n})")
    if n == 1 and block.spatial_id % 2 == 1:
        raise RuntimeError("odd blocks fail on their first attempt")
    done(block)


def status_failed(block):
    attempt(block)
    if block.spatial_id == 0:
        block.status = 3
        return
    done(block)


def exit_once_on_5(block):
    n = attempt(block)
    if block.spatial_id == 5 and n == 1:
        os._exit(1)
    done(block)


def sigkill_once_on_5(block):
    n = attempt(block)
    if block.spatial_id == 5 and n == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    done(block)


def hang_on_2(block):
    attempt(block)
    if block.spatial_id == 2:
        time.sleep(1000)
    done(block)


def always_exit(block):
    attempt(block)
    os._exit(3)


def slow_mark(block):
    """~50 ms block; records start/end timestamps to measure concurrency."""
    t0 = time.time()
    time.sleep(0.05)
    _touch(f"span_{block.task_id}_{block.spatial_id}", f"{t0} {time.time()} {os.getpid()}\n")
    done(block)


def sleepy(block):
    attempt(block)
    time.sleep(0.2)
    done(block)


# ---- 0-argument worker functions -------------------------------------------------


def _client_loop(run):
    """A Client loop running ``run(block)`` on every block it acquires."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            run(block)


def client_loop():
    _client_loop(mark)


def client_loop_slow():
    """A Client loop over ``slow_mark`` blocks (~50 ms each)."""
    _client_loop(slow_mark)


def client_loop_with_context(*, context):
    import daisy_nb.runtime.client as c

    _touch(f"context_{context['worker_id']}", context.to_env())
    client = c.Client(context)
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            mark(block)


def client_loop_raising():
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            n = attempt(block)
            if block.spatial_id == 1 and n == 1:
                raise ValueError("client block failed")
            done(block)


def launch_external():
    import subprocess

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
    subprocess.run([sys.executable, script], check=True)


def segfault_once_on_5(block):
    n = attempt(block)
    if block.spatial_id == 5 and n == 1:
        import ctypes

        ctypes.string_at(0)
    done(block)


def client_loop_hang_on_2():
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            attempt(block)
            if block.spatial_id == 2:
                time.sleep(1000)
            done(block)


# ---- fast blocks: the pool prefetches a second batch for each worker --------------


def quick_mark(block):
    """~2 ms block: fast enough for batches of several blocks, and so for prefetching."""
    attempt(block)
    time.sleep(0.002)
    done(block)


def sigkill_once_on_300(block):
    """Fast blocks; the worker running block 300 dies (first attempt) with a prefetched batch queued."""
    n = attempt(block)
    if block.spatial_id == 300 and n == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    done(block)


def hang_on_300(block):
    attempt(block)
    if block.spatial_id == 300:
        time.sleep(1000)
    done(block)


def light_imports(block):
    """Which heavy modules the worker process has loaded."""
    heavy = [m for m in ("numba", "numpy", "multiprocessing") if m in sys.modules]
    done(block, ",".join(heavy) or "none")


def always_raise(block):
    attempt(block)
    raise RuntimeError(f"block {block.block_id[1]} always raises")


# ---- 0-argument worker functions and blocks sent ahead (runtime/clients.py) -------


def client_takes_three():
    """Leaves its loop after three blocks, with the next one (sent ahead) still unread."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    for _ in range(3):
        with client.acquire_block() as block:
            if block is None:
                return
            mark(block)


def client_loop_killed_on_5():
    """SIGKILLs itself inside block 5 (first attempt): no goodbye, a block sent ahead unread."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            if attempt(block) == 1 and block.spatial_id == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            done(block)


def client_pauses_after_two():
    """After two blocks, stays away from acquire_block for 2.5 s (the heartbeat gives the next back)."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    k = 0
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            mark(block)
        k += 1
        if k == 2:
            time.sleep(2.5)


def client_loop_slow_killed_on_5():
    """30 ms blocks (blocks go ahead whatever their time); SIGKILLs itself inside block 5's first
    attempt, with the block sent ahead of it unread: that block must go back uncounted."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            if attempt(block) == 1 and block.spatial_id == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.03)
            done(block)


def client_loop_sleep_20ms():
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            time.sleep(0.02)
            mark(block)


def client_loop_catching():
    """Block 7 raises in every attempt; the loop catches it (an ``F`` frame) and goes on."""
    import daisy_nb.runtime.client as c

    client = c.Client()
    while True:
        try:
            with client.acquire_block() as block:
                if block is None:
                    break
                if block.spatial_id == 7:
                    raise RuntimeError("block 7 always fails")
                mark(block)
        except RuntimeError:
            pass
