"""A tracking store migrated to a grown volume: time and peak memory of the remap.

    python benchmarks/bench_tracking_grow.py [--blocks N] [--dir D] [--quick]

A 2-D store of ``--blocks`` blocks (default 10^8: a 10,000 x 10,000 grid, ``shrink``
with ragged far edges; ``done`` 100 MB with 90% of the blocks done, ``failures``
400 MB sparse with 10,000 counts) is opened, in a fresh interpreter, for a volume
grown by 2 blocks towards negative coordinates on axis 0 and by ~5% at the far end
of both axes. Reported: the migration itself (``_grow.migrate``: the remap of
``done`` and ``failures`` in pieces plus the build-beside-and-swap) and the whole
``TrackingStore.open``, wall time and the call's own peak RSS (``VmHWM`` reset
before it, see ``benchmarks/_util.py``), plus the bytes of the files written. The
store's pages are in the page cache (it was just written): a cold store adds the
time to read ``done`` (100 MB) and the pages of ``failures`` that hold counts (its
holes are not read). Removing the old store costs what freeing its ``failures``
chunk costs: that chunk's pages are allocated one by one as counts arrive, so 10,000
scattered counts are ~10,000 extents for the file system to free.
``--quick``: 10^6 blocks (the smoke test).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _util import emit, machine_note, peak_rss, reset_peak, rss, spawn, table

WS = 10


def geometry(blocks: int):
    n0 = int(math.isqrt(blocks))
    n1 = blocks // n0
    # ragged far edges (shrink): the last block of each axis is 5 wide
    old = ((0, 0), (n0 * WS - 5, n1 * WS - 5))
    g0, g1 = max(1, n0 // 20), max(1, n1 // 20)
    new = ((-2 * WS, 0), (old[1][0] + 2 * WS + g0 * WS, old[1][1] + g1 * WS))
    return (n0, n1), old, new


def rois(total):
    return total, ((0, 0), (WS, WS)), ((0, 0), (WS, WS)), "shrink"


def worker_make(path: str, blocks: int) -> None:
    import numpy as np

    from daisy_nb.tracking import TrackingStore

    (n0, n1), old, _ = geometry(blocks)
    t0 = time.perf_counter()
    with TrackingStore.open(path, *rois(old), read_write_conflict=False) as s:
        assert s.grid_shape == (n0, n1), s.grid_shape
        d = s.done.reshape(-1)
        d[:] = 1
        d[::10] = 0  # 90% done
        rng = np.random.default_rng(0)
        s.add_failures(rng.integers(0, d.size, 10_000), 1)
        s.mark_dirty(failures=False)
        done = int(np.count_nonzero(d))
    emit({"make_secs": time.perf_counter() - t0, "done": done})


def worker_migrate(path: str, blocks: int) -> None:
    from daisy_nb.tracking import TrackingStore, _grow

    _, _, new = geometry(blocks)
    rec: dict = {}
    real = _grow.migrate

    def timed(p, growth, durable=True):
        flagged = reset_peak()
        base = rss()
        t0 = time.perf_counter()
        info = real(p, growth, durable)
        rec["build_secs"] = marks["built"] - t0
        rec["swap_secs"] = marks.get("swapped", marks.get("moved-new", marks["built"])) - marks["built"]
        rec["cleanup_secs"] = marks["cleaned"] - marks.get("swapped", marks.get("moved-new", marks["built"]))
        rec.update(
            migrate_secs=time.perf_counter() - t0,
            migrate_peak=peak_rss() - base,
            peak_exact=flagged,
            new_blocks=growth.new_blocks,
        )
        return info

    _grow.migrate = timed
    from daisy_nb.tracking import _io

    marks: dict = {}
    _io.STEP_HOOK = lambda name: marks.setdefault(name, time.perf_counter())
    reset_peak()
    base = rss()
    t0 = time.perf_counter()
    s = TrackingStore.open(path, *rois(new), read_write_conflict=False)
    rec["open_secs"] = time.perf_counter() - t0
    rec["open_peak"] = peak_rss() - base
    info = s.grown_from
    rec.update(kept=info["kept"], had=info["had"], failures=info["failures"], grid=list(s.grid_shape))
    s.close()
    du = 0
    for root, _, files in os.walk(path):
        for f in files:
            du += os.stat(os.path.join(root, f)).st_blocks * 512
    rec["disk_bytes"] = du
    emit(rec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=10**8)
    ap.add_argument("--dir", default=None, help="where the store is made (default: a temp dir)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        kind, path, blocks = a.worker[0], a.worker[1], int(a.worker[2])
        {"make": worker_make, "migrate": worker_migrate}[kind](path, blocks)
        return 0
    blocks = 10**6 if a.quick else a.blocks
    base = tempfile.mkdtemp(prefix="bench_grow_", dir=a.dir)
    try:
        path = os.path.join(base, "store")
        made = spawn(sys.executable, __file__, ["make", path, blocks])
        r = spawn(sys.executable, __file__, ["migrate", path, blocks])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    (n0, n1), old, new = geometry(blocks)
    # every done block kept except the clipped last row and column of the old grid
    mb = 1 << 20
    print(f"# tracking store of {n0:,} x {n1:,} = {n0 * n1:,} blocks, grown to {r['grid'][0]:,} x {r['grid'][1]:,}")
    print(f"# {machine_note()}")
    rows = [
        ["migration (remap + swap)", f"{r['migrate_secs']:.2f} s", f"{r['migrate_peak'] / mb:.1f} MB"],
        ["... of which: build the remapped store beside (read, remap, write, fsync)", f"{r['build_secs']:.2f} s", ""],
        ["... swap it in", f"{r['swap_secs']:.3f} s", ""],
        ["... remove the old store", f"{r['cleanup_secs']:.2f} s", ""],
        ["TrackingStore.open (incl. migration)", f"{r['open_secs']:.2f} s", f"{r['open_peak'] / mb:.1f} MB"],
    ]
    print(table(["step", "wall time", "peak RSS of the call"], rows))
    print()
    print(
        f"done marks kept {r['kept']:,} of {r['had']:,} (new volume: {r['new_blocks']:,} blocks); "
        f"failure cells kept {r['failures']:,}; store on disk {r['disk_bytes'] / mb:.0f} MB"
        + ("" if r["peak_exact"] else " (peak RSS: upper bound, VmHWM could not be reset)")
    )
    # the clipped far edge (last row and column) is dropped, every other done mark kept
    exp_drop = made["done"] - r["kept"]
    assert 0 < exp_drop <= n0 + n1, exp_drop
    return 0


if __name__ == "__main__":
    sys.exit(main())
