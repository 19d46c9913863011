"""Block tracking on a full disk and on file systems where a mapped write can fail late (issue 19, item 6).

The write path follows the file system (``statfs``): a shared map where reserved
blocks are overwritten in place (ext4, XFS, tmpfs), ``pwrite`` elsewhere;
``DAISY_NB_TRACKING_IO`` forces one. A full disk, at the start or in the middle of
a run, on either path, ends the run with an error naming the tracking path, keeps
the marks written so far, and a rerun after freeing space resumes. Converting a
caller-provided store survives a SIGKILL at every step. Real mounts (a size-limited
tmpfs, an overlay: root only, skipped elsewhere), real worker processes, real kills.
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from funlib.geometry import Roi

import daisy_nb as daisy
from daisy_nb.tracking import ENV_IO, TrackingStore, TrackingWriteError, _io, read_tracking

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKERS = HERE / "workers"
sys.path.insert(0, str(WORKERS))

import diskfns  # noqa: E402

pytestmark = pytest.mark.timeout(180)

ONE = Roi((0,), (1,))
PATHS = ["mmap", "pwrite"]


def _mount(target: Path, *args: str) -> None:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a file system for the test needs root on Linux")
    target.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount ({' '.join(args)}): {r.stderr.strip()}")


@pytest.fixture
def mounts(tmp_path):
    """``mount(name, *mount_args) -> Path``: a mount under ``tmp_path``, unmounted at the end."""
    made: list[Path] = []

    def mount(name: str, *args: str) -> Path:
        d = tmp_path / name
        _mount(d, *args)
        made.append(d)
        return d

    yield mount
    gc.collect()  # maps held by the frames of a caught exception's traceback
    for d in reversed(made):
        r = subprocess.run(["umount", str(d)], capture_output=True, text=True, check=False)
        if r.returncode != 0:  # something still holds it: detach it anyway
            subprocess.run(["umount", "-l", str(d)], check=False)
        assert r.returncode == 0, f"umount {d}: {r.stderr.strip()}"


def _tmpfs(mounts, name: str, size: str) -> Path:
    return mounts(name, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")


# ---------------------------------------------------------------------------
# which path, and the switch
# ---------------------------------------------------------------------------


def test_bad_io_switch_is_a_value_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_IO, "fast")
    with pytest.raises(ValueError, match=ENV_IO):
        TrackingStore.open(tmp_path / "s", Roi((0,), (10,)), ONE, ONE)
    task = daisy.Task("t", Roi((0,), (10,)), ONE, ONE, process_function=lambda b: None, tracking_path=tmp_path / "t")
    with pytest.raises(ValueError, match=ENV_IO):
        daisy.run_blockwise([task], multiprocessing=False, progress=False, summary=False)


def test_file_system_type_picks_the_path(tmp_path, monkeypatch, mounts):
    monkeypatch.delenv(ENV_IO, raising=False)
    ftype = _io.fs_type(tmp_path)
    if shutil.which("stat"):  # coreutils reads the same statfs field
        out = subprocess.run(["stat", "-f", "-c", "%t", str(tmp_path)], capture_output=True, text=True, check=True)
        assert ftype == int(out.stdout.strip(), 16)
    expected = "mmap" if _io.fs_name(ftype) in ("ext4", "xfs", "tmpfs") else "pwrite"
    with TrackingStore.open(tmp_path / "here", Roi((0,), (100,)), ONE, ONE) as s:
        assert s.io == expected, _io.fs_name(ftype)
    for forced in PATHS:
        monkeypatch.setenv(ENV_IO, forced)
        with TrackingStore.open(tmp_path / f"forced_{forced}", Roi((0,), (100,)), ONE, ONE) as s:
            assert s.io == forced
    monkeypatch.setenv(ENV_IO, "auto")

    # ext4 and tmpfs have no reflinks: the unshare call is refused (XFS takes it)
    fd = os.open(tmp_path / "here" / "done" / "c" / "0", os.O_RDWR)
    try:
        assert _io.unshare(fd, 100) is (_io.fs_name(ftype) == "xfs")
    finally:
        os.close(fd)

    t = _tmpfs(mounts, "tmpfs", "4m")
    assert _io.fs_name(_io.fs_type(t)) == "tmpfs"
    with TrackingStore.open(t / "s", Roi((0,), (100,)), ONE, ONE) as s:
        assert s.io == "mmap"

    # overlayfs: a file of the lower layer is copied up on its first write (copy-on-write)
    lower, upper, work = (tmp_path / n for n in ("lower", "upper", "work"))
    for d in (lower, upper, work):
        d.mkdir()
    with TrackingStore.open(lower / "s", Roi((0,), (100,)), ONE, ONE) as s:
        s.mark_done([1, 2])
    merged = mounts("merged", "-t", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", "overlay")
    assert _io.fs_name(_io.fs_type(merged)) == "overlayfs"
    with TrackingStore.open(merged / "s", Roi((0,), (100,)), ONE, ONE) as s:
        assert s.io == "pwrite"
        assert np.flatnonzero(s.done).tolist() == [1, 2]
        s.mark_done([7])
    assert np.flatnonzero(read_tracking(merged / "s")["done"]).tolist() == [1, 2, 7]
    assert np.flatnonzero(read_tracking(lower / "s")["done"]).tolist() == [1, 2]  # the lower file untouched


# ---------------------------------------------------------------------------
# a full disk
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", ["full", "too_small"])
def test_no_disk_space_at_the_start_refuses_the_run(case, path, mounts, monkeypatch, no_leaks):
    monkeypatch.setenv(ENV_IO, path)
    if case == "full":  # not a page left: the metadata cannot be written
        disk, n = _tmpfs(mounts, "disk", "256k"), 100
        diskfns.fill(str(disk / "filler"))
    else:  # room for the metadata, not for done's 100 KB
        disk, n = _tmpfs(mounts, "disk", "64k"), 100_000
    track = disk / "track"
    task = daisy.Task("t", Roi((0,), (n,)), ONE, ONE, process_function=lambda b: None, tracking_path=track)
    with pytest.raises(RuntimeError, match="no disk space for block tracking") as info:
        daisy.run_blockwise([task], progress=False, summary=False)
    assert str(track) in str(info.value)


def _run_filling(track: Path, out: Path, filler: Path, runtime, n: int, at: int):
    task = daisy.Task(
        "t",
        Roi((0,), (10 * n,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=functools.partial(diskfns.fill_then_fail_some, out=str(out), filler=str(filler), at=at),
        read_write_conflict=False,
        max_retries=0,
        max_workers=2,
        tracking_path=track,
    )
    how = {"executor": runtime} if not isinstance(runtime, str) else {"multiprocessing": runtime == "pool"}
    return daisy.run_blockwise([task], progress=False, summary=False, return_states=True, **how)


def _finished(out: Path) -> set[int]:
    return {int(p.name[3:]) for p in out.iterdir() if p.name.startswith("ok_")}


@pytest.fixture
def runner(request, monkeypatch):
    """``"serial"``, ``"pool"`` or a dask ``Client`` of a LocalCluster with 2 worker processes."""
    if request.param != "dask":
        yield request.param
        return
    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(WORKERS), os.environ.get("PYTHONPATH", "")]))
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


RUNS = [("serial", "mmap"), ("serial", "pwrite"), ("pool", "mmap"), ("pool", "pwrite"), ("dask", "pwrite")]


@pytest.mark.parametrize(("runner", "path"), RUNS, indirect=["runner"])
def test_disk_full_mid_run_ends_it_cleanly_and_a_rerun_resumes(runner, path, tmp_path, mounts, monkeypatch, no_leaks):
    """Another program fills the disk during the run: the next failure count cannot be
    written (``done`` is reserved at the start, ``failures`` page by page), the run
    ends with an error naming the chunk, the done marks so far are kept, and a rerun
    after freeing the space skips them and finishes."""
    monkeypatch.setenv(ENV_IO, path)
    disk = _tmpfs(mounts, "disk", "1m")
    track, filler = disk / "track", disk / "filler"
    n, at = 3000, 40
    out1 = tmp_path / "out1"
    out1.mkdir()
    with pytest.raises(TrackingWriteError) as info:
        _run_filling(track, out1, filler, runner, n, at)
    err = info.value
    assert err.errno == 28 and str(track) in str(err.filename), err  # ENOSPC, the chunk named
    assert f"block tracking at {err.filename}" in str(err) and "rerun" in str(err)
    assert filler.exists()
    finished = _finished(out1)
    assert len(finished) < n - n // 5, "the run was not stopped"
    recorded = set(np.flatnonzero(np.asarray(read_tracking(track)["done"])).tolist())
    assert recorded <= finished  # never a block that did not succeed
    # every block that finished before the disk was full is kept (they all got their
    # success released well before the run stopped: at most the in-flight ones are not)
    early = {i for i in finished if i < at // 2}
    assert early <= recorded, sorted(early - recorded)
    assert len(recorded) >= len(finished) // 2

    filler.unlink()  # free the space, run again
    out2 = tmp_path / "out2"
    out2.mkdir()
    states = _run_filling(track, out2, filler, runner, n, -1)
    again = _finished(out2)
    assert not again & recorded  # the blocks marked done were skipped
    ok = {i for i in range(n) if i % 5 != 3}
    assert again == ok - recorded
    assert states["t"].skipped_count >= len(recorded)
    assert set(np.flatnonzero(np.asarray(read_tracking(track)["done"])).tolist()) == ok
    fails = np.asarray(read_tracking(track)["failures"]).reshape(-1)
    assert all(fails[i] >= 1 for i in range(3, n, 5))


@pytest.mark.parametrize("path", PATHS)
def test_a_failed_flush_is_raised_once_then_retried(path, mounts, monkeypatch):
    """The error is raised by the flush that meets it; the runtimes' last flush (while the
    error ends the run) stays quiet; once space is back, the next flush writes everything."""
    monkeypatch.setenv(ENV_IO, path)
    disk = _tmpfs(mounts, "disk", "256k")
    s = TrackingStore.open(disk / "s", Roi((0,), (50_000,)), ONE, ONE)
    try:
        s.mark_done([1, 2])
        s.flush()
        diskfns.fill(str(disk / "filler"))
        s.mark_done([3])  # reserved at the start: still written
        s.add_failures([40_000])  # a page never written before: no space
        with pytest.raises(TrackingWriteError, match="block tracking at .*failures"):
            s.flush()
        s.add_failures([40_000])
        assert s.flush() is False  # raised once: the run is ending
        os.unlink(disk / "filler")
        assert s.flush()  # the space is back: the counts held back are written
    finally:
        s.close()
    info = read_tracking(disk / "s")
    assert np.flatnonzero(info["done"]).tolist() == [1, 2, 3]
    assert int(info["failures"][40_000]) == 2
    del info
    s = TrackingStore.open(disk / "s", Roi((0,), (50_000,)), ONE, ONE)
    assert int(s.failures[40_000]) == 2 and s.done[3] == 1
    s.close()


# ---------------------------------------------------------------------------
# converting a caller-provided store, killed at every step
# ---------------------------------------------------------------------------

CONVERT = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from funlib.geometry import Roi
    from daisy_nb.tracking import TrackingStore, _io
    step, exchange, path = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    _io.USE_EXCHANGE = exchange
    def hook(name):
        print("STEP", name, flush=True)
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)
    _io.STEP_HOOK = hook
    one = Roi((0,), (1,))
    s = TrackingStore.open(path, Roi((0,), ({n},)), one, one)
    s.mark_done({new})
    s.flush()
    print("FLUSHED", flush=True)
    s.close()
    """
)
N_CONV = 70_000  # a done chunk bigger than a page, written sparsely
OLD_MARKS = [0, 5, 4096, 69_999]
NEW_MARKS = [6, 50_000]
STEPS = [("chunk", True), ("built", True), ("swapped", True), ("cleaned", True)]
STEPS += [("built", False), ("moved-old", False), ("moved-new", False)]


@pytest.mark.parametrize(("step", "exchange"), STEPS)
def test_sigkill_while_converting_a_foreign_store_loses_no_mark(step, exchange, tmp_path):
    zarr = pytest.importorskip("zarr")
    p = tmp_path / "foreign"
    g = zarr.open_group(str(p), mode="w")  # a caller-provided group: compressed, no hash
    d = g.create_array("done", shape=(N_CONV,), dtype="uint8", chunks=(10_000,))
    old = np.zeros(N_CONV, np.uint8)
    old[OLD_MARKS] = 1
    d[...] = old
    script = tmp_path / "convert.py"
    script.write_text(CONVERT.format(root=str(ROOT), n=N_CONV, new=NEW_MARKS))
    r = subprocess.run([sys.executable, str(script), step, "1" if exchange else "0", str(p)],
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert f"STEP {step}" in r.stdout, r.stdout + r.stderr[-2000:]  # (no "swapped" without the exchange)
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr[-2000:]

    # zarr-python (what a caller uses) never sees the array missing or torn
    seen = np.asarray(zarr.open_array(str(p / "done"), mode="r")[...]) if (p / "done" / "zarr.json").exists() else None
    converted = step in ("swapped", "cleaned", "moved-new")
    if step != "moved-old":  # only between two renames is done/ briefly elsewhere
        assert seen is not None
        assert set(OLD_MARKS) <= set(np.flatnonzero(seen).tolist())
    with TrackingStore.open(p, Roi((0,), (N_CONV,)), ONE, ONE) as s:
        done = np.array(s.done)
    marks = set(np.flatnonzero(done).tolist())
    assert set(OLD_MARKS) <= marks <= set(OLD_MARKS + NEW_MARKS)
    if converted or step == "moved-old":  # the new array was complete: finished, not lost
        assert marks == set(OLD_MARKS + NEW_MARKS)
    assert sorted(x.name for x in p.iterdir()) == ["done", "failures", "zarr.json"]  # no leftover
    assert sorted(os.listdir(p / "done")) == ["c", "zarr.json"]
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(p / "done"), mode="r")[...]), done)
