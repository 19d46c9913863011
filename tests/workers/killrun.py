"""A run that the tracking tests SIGKILL: ``python killrun.py MODE N TRACK LOG`` (serial, pool, dask).

Each block sleeps ~5 ms, then, if it succeeds, appends ``<grid index> <time>`` to LOG
and fsyncs it: LOG lists exactly the blocks that finished. Every 7th block fails
(an exception in the pool, ``block.status = FAILED`` in serial mode, where an
exception would end the run) and must never be recorded done.
"""

import os
import sys
import time


def block_fn(block):
    time.sleep(0.005)
    i = int(block.write_roi.begin[0])
    if i % 7 == 3:
        if os.environ.get("KILLRUN_MODE") == "serial":
            from daisy_nb import BlockStatus

            block.status = BlockStatus.FAILED
            return
        raise RuntimeError(f"block {i} fails on purpose")
    fd = os.open(os.environ["KILLRUN_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i} {time.time():.6f}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    mode, n, track, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ["KILLRUN_MODE"] = mode
    os.environ["KILLRUN_LOG"] = log
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from killrun import (
        block_fn as fn,  # by reference, so pool workers import this module
    )

    import daisy_nb as daisy
    from daisy_nb import Roi

    one = Roi((0,), (1,))
    task = daisy.Task(
        "k",
        Roi((0,), (n,)),
        one,
        one,
        process_function=fn,
        read_write_conflict=False,
        max_workers=2,
        max_retries=0,
        tracking_path=track,
    )
    if mode == "dask":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
        )
        client = Client(cluster)
        client.wait_for_workers(2, timeout=60)
        daisy.run_blockwise(task, executor=client, progress=False, summary=False)
        return
    daisy.run_blockwise(task, multiprocessing=(mode == "pool"), progress=False, summary=False)


if __name__ == "__main__":
    main()
