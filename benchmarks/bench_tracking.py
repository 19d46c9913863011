"""Block tracking: bytes written per flush, and what a SIGKILL loses, side by side with daisy 2.0.0.

    python benchmarks/bench_tracking.py [--daisy-python /work/venv-daisy2/bin/python] [--quick]
        [--cases flush,kill] [--blocks N] [--kill-after S] [--modes serial,pool,dask]

flush   A tracking store of ``--blocks`` blocks (default 10^8; 10^6 with --quick), half
        of it done and 1000 blocks with a failure count, then a few thousand blocks
        change (3000 consecutive done marks + 5 failures) and the store is flushed
        (durable: msync/fsync). Reported: bytes this process wrote for it
        (``/proc/self/io`` ``write_bytes``, which the kernel counts when a page
        becomes dirty, through ``write()`` or through a shared map) and the time.
        Strategies of daisy_nb, in one run: ``shared`` (the chunk files mapped
        MAP_SHARED, a flush is an msync of the changed pages: the default; a
        store made in this run faults its pages in one by one, 4 KiB each),
        ``shared-resumed`` (the same on a store reopened with data in it, which is
        read ahead: its page cache can hold large folios, up to 2 MiB, written
        whole) and ``rewrite`` (each flush writes the changed arrays whole, aside
        + rename: the previous strategy, still the fallback for read-only chunk
        files).
kill    A 1-D task of 5 ms blocks whose block function appends ``<grid index> <time>``
        to a log and fsyncs it after its work; the run (serial, pool with 2
        workers, dask LocalCluster with 2 worker processes) is SIGKILLed (the whole process group, scheduler and workers at
        once) ``--kill-after`` s (default 5) after its first block. Then the
        tracking store is read with zarr: ``recorded`` (done bytes), ``finished``
        (logged), ``bad`` = recorded but never finished (must be 0), ``lost`` =
        finished but not recorded, and ``lost > 1s`` = of those, the ones that
        finished more than 1 s before the kill (the target is 0).

Each measurement runs in a fresh interpreter (the same script with ``--worker``).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _util import child_env, emit, spawn

BLOCK_SECS = 0.005
STRATEGIES = ("shared", "shared-resumed", "rewrite")


# -- flush: bytes per flush ------------------------------------------------------------
def _write_bytes() -> int | None:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def flush_case(strategy: str, n: int, workdir: str) -> dict:
    import numpy as np

    sys.path.insert(0, ROOT)
    from funlib.geometry import Roi

    from daisy_nb.tracking import TrackingStore, _store

    _store.SHARED_MAPS = strategy != "rewrite"
    path = os.path.join(workdir, f"flush-{strategy}")
    shutil.rmtree(path, ignore_errors=True)
    one = Roi((0,), (1,))
    total = Roi((0,), (n,))
    t0 = time.perf_counter()
    s = TrackingStore.open(path, total, one, one)
    t_open = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    s.done.reshape(-1)[: n // 2] = 1  # a run half way through
    s.add_failures(rng.integers(0, n, 1000))
    s.mark_dirty()
    s.flush()
    if strategy == "shared-resumed":  # a rerun: the chunk has data, the scheduler scans it
        s.close()
        del s
        gc.collect()  # unmapped, so the page cache can be dropped: a cold rerun
        for name in ("done", "failures"):
            fd = os.open(os.path.join(path, name, "c", "0"), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        s = TrackingStore.open(path, total, one, one)
        int(s.done.sum())
    rows = []
    k = 3000
    for rep in range(3):
        start = n // 2 + rep * k
        b0 = _write_bytes()
        t0 = time.perf_counter()
        s.mark_done(np.arange(start, start + k, dtype=np.int64))
        s.add_failures(rng.integers(0, n, 5))
        s.flush()
        secs = time.perf_counter() - t0
        b1 = _write_bytes()
        rows.append({"bytes": None if b0 is None else b1 - b0, "secs": secs})
    s.close()
    du = sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(path) for f in fs)
    shutil.rmtree(path, ignore_errors=True)
    return {"strategy": strategy, "n": n, "changed": k + 5, "open_secs": t_open, "flushes": rows, "disk_bytes": du}


# -- kill: what a SIGKILL loses ----------------------------------------------------------
def _log_block(block) -> None:
    time.sleep(BLOCK_SECS)
    i = int(block.write_roi.begin[0])
    fd = os.open(os.environ["BENCH_TRACK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i} {time.time():.6f}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def kill_child(lib: str, mode: str, n: int, track: str) -> None:
    """The run that gets killed (never returns normally within the benchmark)."""
    if lib == "daisy":
        import daisy
    else:
        sys.path.insert(0, ROOT)
        import daisy_nb as daisy
    from funlib.geometry import Roi

    one = Roi((0,), (1,))
    task = daisy.Task(
        "k",
        total_roi=Roi((0,), (n,)),
        read_roi=one,
        write_roi=one,
        process_function=_log_block,
        read_write_conflict=False,
        max_workers=2,
        max_retries=0,
        tracking_path=track,
    )
    if mode == "dask":  # daisy_nb only: daisy 2.0.0 has no dask executor
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
        )
        client = Client(cluster)
        client.wait_for_workers(2, timeout=60)
        daisy.run_blockwise([task], executor=client, progress=False, summary=False)
        return
    daisy.run_blockwise([task], multiprocessing=(mode == "pool"), progress=False, summary=False)


def read_done(track: str):
    """Grid indices recorded done, read with zarr (as any tool would)."""
    import numpy as np
    import zarr

    return set(np.flatnonzero(np.asarray(zarr.open_group(track, mode="r")["done"][...]).reshape(-1)).tolist())


def read_log(log: str) -> dict[int, float]:
    out: dict[int, float] = {}
    with open(log) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:
                out[int(parts[0])] = float(parts[1])
    return out


def _sems() -> set:
    """Python multiprocessing's named semaphores in /dev/shm (Linux)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("sem.mp-")}
    except OSError:
        return set()


def kill_run(python: str, lib: str, mode: str, n: int, kill_after: float, workdir: str, timeout: float = 120) -> dict:
    """Start a run, SIGKILL its process group ``kill_after`` s after the first block, compare."""
    tag = f"{lib}-{mode}"
    track = os.path.join(workdir, f"track-{tag}")
    log = os.path.join(workdir, f"log-{tag}.txt")
    shutil.rmtree(track, ignore_errors=True)
    if os.path.exists(log):
        os.unlink(log)
    env = child_env({"BENCH_TRACK_LOG": log})
    shm_before = _sems()
    proc = subprocess.Popen(
        [python, os.path.abspath(__file__), "--kill-child", lib, mode, str(n), track],
        env=env,
        cwd=workdir,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + timeout
        while not (os.path.exists(log) and os.path.getsize(log) > 0):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{tag}: the run ended before its first block:\n{proc.stderr.read().decode()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: no block finished within {timeout} s")
            time.sleep(0.01)
        time.sleep(kill_after)
        t_kill = time.time()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
        # the kill took multiprocessing's resource tracker with it (dask's LocalCluster makes
        # named semaphores): remove what the killed run left in /dev/shm
        for name in _sems() - shm_before:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
    finished = read_log(log)
    recorded = read_done(track)
    lost = [i for i in finished if i not in recorded]
    return {
        "lib": lib,
        "mode": mode,
        "finished": len(finished),
        "recorded": len(recorded),
        "bad": len(recorded - set(finished)),
        "lost": len(lost),
        "lost_older_1s": sum(1 for i in lost if finished[i] < t_kill - 1.0),
        "lost_max_age": max((max(0.0, t_kill - finished[i]) for i in lost), default=0.0),
    }


# -- tables ------------------------------------------------------------------------------
def _mb(b):
    return "n/a" if b is None else f"{b / 1e6:,.2f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daisy-python", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="flush,kill")
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--kill-after", type=float, default=None)
    ap.add_argument("--modes", default="serial,pool,dask", help="kill: runtimes to kill (dask: daisy_nb only)")
    ap.add_argument("--worker", nargs="+")
    ap.add_argument("--kill-child", nargs=4)
    a = ap.parse_args()
    if a.kill_child:
        lib, mode, n, track = a.kill_child
        kill_child(lib, mode, int(n), track)
        return
    if a.worker:
        what, *rest = a.worker
        if what == "flush":
            emit(flush_case(rest[0], int(rest[1]), rest[2]))
        return
    cases = a.cases.split(",")
    n = a.blocks or (10**6 if a.quick else 10**8)
    kill_after = a.kill_after if a.kill_after is not None else (1.0 if a.quick else 5.0)
    load = os.getloadavg()
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}  (uptime)")
    workdir = tempfile.mkdtemp(prefix="bench_tracking_", dir=os.environ.get("BENCH_TRACKING_DIR"))
    try:
        if "flush" in cases:
            print(f"\n### bytes written per flush: {n:,} blocks, 3005 changed (3 flushes each)\n")
            print("| strategy | bytes per flush | secs per flush | open secs | store on disk |")
            print("|---|---|---|---|---|")
            res = {s: spawn(sys.executable, __file__, ["flush", s, n, workdir]) for s in STRATEGIES}
            for s, r in res.items():
                bs = [f["bytes"] for f in r["flushes"]]
                secs = [f["secs"] for f in r["flushes"]]
                shown = " / ".join(_mb(b) for b in bs)
                print(
                    f"| {s} | {shown} | {' / '.join(f'{t:.3f}' for t in secs)} | {r['open_secs']:.3f} "
                    f"| {_mb(r['disk_bytes'])} |"
                )
            rw = [f["bytes"] for f in res["rewrite"]["flushes"]]
            for s in ("shared", "shared-resumed"):
                sh = [f["bytes"] for f in res[s]["flushes"]]
                if None not in sh and None not in rw and sum(sh):
                    print(f"\nrewrite / {s}: {sum(rw) / sum(sh):,.0f}x the bytes per flush")
        if "kill" in cases:
            kn = 2000 if a.quick else 100_000
            print(
                f"\n### SIGKILL {kill_after:g} s after the first block ({BLOCK_SECS * 1e3:g} ms blocks, "
                "log fsync'd per block)\n"
            )
            print(
                "| library | mode | finished | recorded | recorded, not finished | lost | lost > 1 s before kill "
                "| oldest lost (s) |"
            )
            print("|---|---|---|---|---|---|---|---|")
            libs = [("daisy_nb", sys.executable)] + ([("daisy", a.daisy_python)] if a.daisy_python else [])
            for mode in a.modes.split(","):
                for lib, py in libs:
                    if mode == "dask" and (lib != "daisy_nb" or importlib.util.find_spec("distributed") is None):
                        continue
                    r = kill_run(py, lib, mode, kn, kill_after, workdir)
                    print(
                        f"| {lib} | {mode} | {r['finished']} | {r['recorded']} | {r['bad']} | {r['lost']} "
                        f"| {r['lost_older_1s']} | {r['lost_max_age']:.2f} |"
                    )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
