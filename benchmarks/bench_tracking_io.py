"""Block tracking's two write paths: bytes written and time per flush, mmap against pwrite.

    python benchmarks/bench_tracking_io.py [--blocks N] [--batch B] [--reps R] [--dir D] [--quick]

A store of ``--blocks`` blocks (default 10^8: ``done`` 100 MB, ``failures`` 400 MB
sparse) half done, then ``--reps`` times: a batch of ``--batch`` (default 1,000)
blocks is marked done and the store flushed (durable: ``msync`` on the mmap path,
``fdatasync`` on the pwrite path), the batch either contiguous (the next 1,000
blocks: a run going through the grid in order) or scattered (1,000 blocks drawn
from the undone half: blocks finishing out of order in a big grid). Each path in a
fresh interpreter, forced with ``DAISY_NB_TRACKING_IO``; ``fresh`` is the store the
process made, ``resumed`` a store reopened by a new process with the chunks dropped
from the page cache (``POSIX_FADV_DONTNEED``: a rerun on another day; its pages are
read in, the mmap path's read ahead, not faulted one by one).

Reported per flush (median over the reps; from ``/proc/self/io`` around mark + flush):
``written`` = ``write_bytes``, what the kernel sends to storage (counted when a page
becomes dirty, whether by a ``write()`` or a store into a shared map, so it is
page-granular on both paths); ``syscall bytes`` = ``wchar``, the bytes handed to
``write()``/``pwrite()`` (0 for a store into a map); ``syscalls`` = ``syscw``; the
time of the ``mark_done`` call and of the flush. Also the open time of the store.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _util import emit, spawn

PATHS = ("mmap", "pwrite")
ORDERS = ("contiguous", "scattered")


def _io() -> dict[str, int]:
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v)
    return out


def worker(path: str, state: str, n: int, batch: int, reps: int, store_dir: str) -> dict:
    import numpy as np

    sys.path.insert(0, ROOT)
    from funlib.geometry import Roi

    from daisy_nb.tracking import TrackingStore
    from daisy_nb.tracking import _io as tio

    one = Roi((0,), (1,))
    total = Roi((0,), (n,))
    if state == "resumed":  # a rerun on another day: the chunks are not in the page cache
        for name in ("done", "failures"):
            fd = os.open(os.path.join(store_dir, name, "c", "0"), os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    t0 = time.perf_counter()
    s = TrackingStore.open(store_dir, total, one, one)
    t_open = time.perf_counter() - t0
    assert s.io == path, (s.io, path)
    if state == "fresh":  # half done
        s.done.reshape(-1)[: n // 2] = 1
        s.mark_dirty(failures=False)
        s.flush()
    rng = np.random.default_rng(0 if state == "fresh" else 1)
    out: dict = {"open_secs": t_open, "fs": tio.fs_name(tio.fs_type(store_dir))}
    nxt = n // 2 + (0 if state == "fresh" else batch * reps)  # past what the fresh store marked
    for order in ORDERS:
        rows = []
        for _ in range(reps):
            if order == "contiguous":
                idx = np.arange(nxt, nxt + batch, dtype=np.int64)
                nxt += batch
            else:
                idx = np.unique(rng.integers(n // 2 + n // 4, n, batch * 2))[:batch]
            a = _io()
            t1 = time.perf_counter()
            s.mark_done(idx)
            t2 = time.perf_counter()
            assert s.flush()
            t3 = time.perf_counter()
            b = _io()
            rows.append(
                {
                    "written": b["write_bytes"] - a["write_bytes"],
                    "wchar": b["wchar"] - a["wchar"],
                    "syscw": b["syscw"] - a["syscw"],
                    "mark_secs": t2 - t1,
                    "flush_secs": t3 - t2,
                }
            )
        out[order] = {k: statistics.median(r[k] for r in rows) for k in rows[0]} | {
            "all_written": [r["written"] for r in rows],
            "all_mark_ms": [round(r["mark_secs"] * 1e3, 2) for r in rows],
        }
    s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=10**8)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir; its file system matters)")
    ap.add_argument("--quick", action="store_true", help="10^6 blocks, 2 reps (smoke test)")
    ap.add_argument("--worker", nargs=6, metavar=("PATH", "STATE", "N", "BATCH", "REPS", "DIR"))
    args = ap.parse_args()
    if args.worker:
        path, state, n, batch, reps, d = args.worker
        emit(worker(path, state, int(n), int(batch), int(reps), d))
        return
    if args.quick:
        args.blocks, args.reps = 10**6, 2
    base = tempfile.mkdtemp(prefix="bench_tracking_io-", dir=args.dir)
    script = os.path.abspath(__file__)
    results = {}
    try:
        for path in PATHS:
            d = os.path.join(base, path)
            env = {"DAISY_NB_TRACKING_IO": path}
            for state in ("fresh", "resumed"):
                a = [path, state, args.blocks, args.batch, args.reps, d]
                results[path, state] = spawn(sys.executable, script, a, env_extra=env)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    fs = results["mmap", "fresh"]["fs"]
    print(
        f"\n{args.blocks:,} blocks, batches of {args.batch:,} done marks, {args.reps} flushes each (median), on {fs}\n"
    )
    print("| path | store | batch | written per flush | syscall bytes | syscalls | mark_done | flush | open |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for (path, state), r in results.items():
        for order in ORDERS:
            x = r[order]
            print(
                f"| {path} | {state} | {order} | {x['written'] / 1024:,.0f} KiB | {x['wchar'] / 1024:,.1f} KiB "
                f"| {x['syscw']:,.0f} | {x['mark_secs'] * 1e3:.2f} ms | {x['flush_secs'] * 1e3:.1f} ms "
                f"| {r['open_secs']:.2f} s |"
            )
    print("\nwritten per flush, every rep (bytes):")
    for (path, state), r in results.items():
        print(f"  {path:6} {state:7}", {o: r[o]["all_written"] for o in ORDERS})
    print("mark_done, every rep (ms):")
    for (path, state), r in results.items():
        print(f"  {path:6} {state:7}", {o: r[o]["all_mark_ms"] for o in ORDERS})


if __name__ == "__main__":
    main()
