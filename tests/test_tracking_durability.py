"""Block tracking keeps what finished (issue #12): SIGKILL, I/O per flush, the serial heartbeat.

A SIGKILL of the scheduler process loses at most the last ~1 s of finished blocks
and never leaves a block recorded that did not succeed; a flush writes what
changed, not the grid; a serial run shows progress. Real subprocesses, real files,
the store read back with zarr.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from funlib.geometry import Roi

import daisy_nb as daisy
from daisy_nb.tracking import TrackingStore, _store, read_tracking

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KILLRUN = HERE / "workers" / "killrun.py"


def _env(**extra) -> dict:
    pp = os.pathsep.join([str(ROOT), str(HERE / "workers"), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=pp, **extra)


def _done_by_zarr(track: Path) -> set[int]:
    zarr = pytest.importorskip("zarr")
    done = np.asarray(zarr.open_group(str(track), mode="r")["done"][...]).reshape(-1)
    return set(np.flatnonzero(done).tolist())


def _wait_group_gone(pgid: int, wait: float) -> None:
    """Poll until no live process of process group ``pgid`` is left, or ``wait`` seconds passed."""
    import psutil

    def left():
        out = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.info["pid"]) == pgid:
                    out.append(p.info["pid"])
            except (ProcessLookupError, psutil.Error):
                pass
        return out

    deadline = time.monotonic() + wait
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)


def _read_log(log: Path) -> dict[int, float]:
    out = {}
    if log.exists():
        for line in log.read_text().splitlines():
            i, t = line.split()
            out[int(i)] = float(t)
    return out


@pytest.mark.parametrize("mode", ["serial", "pool", "dask"])
def test_sigkill_keeps_every_finished_block_but_the_last_second(mode, tmp_path):
    if mode == "dask":
        pytest.importorskip("distributed")
    track, log = tmp_path / "track", tmp_path / "finished.log"
    n = 20_000  # far more than can finish before the kill
    proc = subprocess.Popen(
        [sys.executable, str(KILLRUN), mode, str(n), str(track), str(log)],
        env=_env(),
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 90
        while len(_read_log(log)) < 30:  # the run is well under way (workers up)
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.02)
        time.sleep(1.5)  # past the first tracking flush, so a flush is not what saves the blocks
        t_kill = time.time()
        os.kill(proc.pid, signal.SIGKILL)  # the scheduler process only
        proc.wait(timeout=10)
        _wait_group_gone(proc.pid, 3.0)  # pool workers notice and stop (what is left is killed below)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait()
        proc.stderr.close()
    finished = _read_log(log)
    recorded = _done_by_zarr(track)
    assert len(finished) >= 30 and len(finished) < n
    # nothing recorded that did not finish (and no failing block: i % 7 == 3)
    assert recorded <= set(finished), sorted(recorded - set(finished))[:10]
    assert not any(i % 7 == 3 for i in recorded)
    # lost: only blocks that finished in the last ~second before the kill (or after it);
    # 1.5 s leaves room for a loaded machine (bench_tracking.py reports the exact ages)
    lost = {i: t for i, t in finished.items() if i not in recorded}
    old = sorted(t_kill - t for t in lost.values() if t < t_kill - 1.5)
    assert not old, f"{len(lost)} of {len(finished)} finished blocks lost, {len(old)} older than 1.5 s: {old[:5]}"
    # daisy_nb reads what it kept as done: a rerun would skip exactly these
    info = read_tracking(track)
    assert set(np.flatnonzero(np.asarray(info["done"]).reshape(-1)).tolist()) == recorded


def test_marks_are_in_the_file_before_any_flush(tmp_path):
    """A mark goes straight into the shared file map: a SIGKILL right after it keeps it."""
    p = tmp_path / "s"
    code = (
        "import os, signal\n"
        "from funlib.geometry import Roi\n"
        "from daisy_nb.tracking import TrackingStore\n"
        f"s = TrackingStore.open({str(p)!r}, Roi((0,), (100000,)), Roi((0,), (1,)), Roi((0,), (1,)))\n"
        "s.flush()\n"
        "s.mark_done([3, 5, 99999])\n"
        "s.add_failures([7, 7, 60000])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), cwd=tmp_path, check=False)
    assert r.returncode == -signal.SIGKILL
    zarr = pytest.importorskip("zarr")
    g = zarr.open_group(str(p), mode="r")
    assert np.flatnonzero(g["done"][...]).tolist() == [3, 5, 99999]
    f = g["failures"][...]
    assert np.flatnonzero(f).tolist() == [7, 60000] and f[7] == 2 and f[60000] == 1


def _write_bytes() -> int | None:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _io_accounted(d: Path) -> bool:
    """Whether this file system's page writes show in /proc/self/io (not tmpfs)."""
    b0 = _write_bytes()
    if b0 is None:
        return False
    with open(d / "probe", "wb") as f:
        f.write(b"x" * (1 << 20))
    ok = (_write_bytes() or 0) - b0 >= (1 << 20)
    (d / "probe").unlink()
    return ok


def test_bytes_written_per_flush_follow_the_changes_not_the_grid(tmp_path):
    if not _io_accounted(tmp_path):
        pytest.skip("/proc/self/io write_bytes does not count writes on this file system")
    n = 10**7  # done: 10 MB, failures: 40 MB
    one = Roi((0,), (1,))
    s = TrackingStore.open(tmp_path / "big", Roi((0,), (n,)), one, one)  # durable: msync
    rng = np.random.default_rng(0)
    s.done.reshape(-1)[: n // 2] = 1  # half way through a run
    s.add_failures(rng.integers(0, n, 1000))  # failure counts all over the grid
    s.mark_dirty()
    s.flush()
    for rep in range(3):
        start = n // 2 + rep * 2000
        b0 = _write_bytes()
        s.mark_done(np.arange(start, start + 2000, dtype=np.int64))
        s.add_failures(rng.integers(0, n, 5))
        assert s.flush()
        wrote = _write_bytes() - b0
        # 2000 consecutive done bytes: at most 2 pages; 5 failure counts: at most 5 pages
        assert wrote <= 16 * 4096, wrote
    assert not s.flush()  # nothing changed: nothing written
    s.close()
    info = read_tracking(tmp_path / "big")
    assert int(np.asarray(info["done"]).sum()) == n // 2 + 6000
    assert (tmp_path / "big" / "failures" / "c" / "0").stat().st_blocks * 512 < 4 * n // 4  # stays sparse


def test_private_fallback_rewrites_whole_chunks_and_reopens_shared(tmp_path, monkeypatch):
    """Where a chunk cannot be mapped shared the store holds it privately and rewrites it aside."""
    one = Roi((0,), (1,))
    total = Roi((0,), (5000,))
    p = tmp_path / "s"
    monkeypatch.setattr(_store, "SHARED_MAPS", False)
    s = TrackingStore.open(p, total, one, one)
    chunk = p / "done" / "c" / "0"
    ino = chunk.stat().st_ino
    s.mark_done([1, 4999])
    s.add_failures([2])
    assert read_tracking(p)["done"].reshape(-1)[1] == 0  # private until flushed
    s.close()
    assert chunk.stat().st_ino != ino  # aside + rename
    monkeypatch.setattr(_store, "SHARED_MAPS", True)
    with TrackingStore.open(p, total, one, one) as s2:
        assert np.flatnonzero(s2.done).tolist() == [1, 4999]
        assert np.flatnonzero(s2.failures).tolist() == [2]
        s2.mark_done([7])
        assert read_tracking(p)["done"].reshape(-1)[7] == 1  # shared: in the file at once


# ---------------------------------------------------------------------------
# the serial runner's heartbeat
# ---------------------------------------------------------------------------


class _Observer:
    def __init__(self):
        self.events = []

    def on_start(self, states):
        self.events.append(("start", states["s"].completed_count))

    def on_progress(self, states):
        self.events.append(("progress", states["s"].completed_count))

    def on_finish(self, states):
        self.events.append(("finish", states["s"].completed_count))


def _sleepy(block):
    time.sleep(0.01)


def _serial_task(tid="s", n=60, **kw):
    one = Roi((0,), (1,))
    return daisy.Task(tid, Roi((0,), (n,)), one, one, process_function=_sleepy, read_write_conflict=False, **kw)


def test_serial_run_calls_observers_during_the_run():
    obs = _Observer()
    assert daisy.run_blockwise(_serial_task(), multiprocessing=False, progress=obs, summary=False)
    kinds = [k for k, _ in obs.events]
    assert kinds[0] == "start" and kinds[-1] == "finish" and kinds.count("finish") == 1
    mid = [c for k, c in obs.events if k == "progress" and 0 < c < 60]
    assert mid, obs.events  # on_progress while blocks were still left (every ~0.2 s of a 0.6 s run)
    assert obs.events[-1] == ("finish", 60)


def test_serial_run_shows_tqdm_bars_and_json_progress(capsys):
    assert daisy.run_blockwise(_serial_task("bar", 30), multiprocessing=False, summary=True)
    out, err = capsys.readouterr()
    assert "bar ✔" in err and "30/30" in err  # the tqdm bar (stderr)
    assert "Execution Summary" in out
    sink = io.StringIO()
    daisy.run_blockwise(
        _serial_task("j", 40), multiprocessing=False, summary=False, progress=daisy.JsonProgressObserver(stream=sink)
    )
    events = [line.split('"event": "')[1].split('"')[0] for line in sink.getvalue().splitlines()]
    assert events[0] == "start" and events[-1] == "finish" and "progress" in events


def test_serial_run_flushes_tracking_while_it_runs(tmp_path, monkeypatch):
    """The heartbeat msyncs the store about once a second during a serial run."""
    flushes = []
    real = TrackingStore.flush

    def counting(self):
        flushes.append(time.monotonic())
        return real(self)

    monkeypatch.setattr(TrackingStore, "flush", counting)
    t0 = time.monotonic()
    daisy.run_blockwise(
        _serial_task("f", 250, tracking_path=tmp_path / "f"), multiprocessing=False, progress=False, summary=False
    )
    t1 = time.monotonic()
    during = [t for t in flushes if t < t1 - 0.05]
    assert t1 - t0 > 2.0 and len(during) >= 1, (t1 - t0, flushes)
    assert len(_done_by_zarr(tmp_path / "f")) == 250


def test_serial_ctrl_c_prints_partial_summary_and_keeps_the_blocks(tmp_path, capsys):
    seen = []

    def interrupting(block):
        seen.append(block)
        if len(seen) == 6:
            raise KeyboardInterrupt

    one = Roi((0,), (1,))
    t = daisy.Task(
        "c",
        Roi((0,), (20,)),
        one,
        one,
        process_function=interrupting,
        read_write_conflict=False,
        tracking_path=tmp_path / "c",
    )
    with pytest.raises(KeyboardInterrupt) as ei:
        daisy.run_blockwise(t, multiprocessing=False, progress=False)
    assert ei.value.daisy_states["c"].completed_count == 5
    assert "Run interrupted" in capsys.readouterr().out
    assert len(_done_by_zarr(tmp_path / "c")) == 5


def test_chunk_that_cannot_be_opened_for_writing_falls_back_to_private_copies(tmp_path, monkeypatch):
    """A read-only chunk file (EACCES/EROFS on O_RDWR) is read privately; flush rewrites it aside."""
    one = Roi((0,), (1,))
    total = Roi((0,), (3000,))
    p = tmp_path / "ro"
    with TrackingStore.open(p, total, one, one) as s:
        s.mark_done([10])
    real_open = os.open

    def no_write_open(path, flags, *a, **kw):
        if flags & os.O_RDWR and str(path).endswith(os.path.join("c", "0")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", no_write_open)
    s = TrackingStore.open(p, total, one, one)
    assert s.done.reshape(-1)[10] == 1
    s.mark_done([11])
    s.add_failures([12])
    assert read_tracking(p)["done"].reshape(-1)[11] == 0  # not in the file until the flush
    assert s.flush()
    s.close()
    monkeypatch.setattr(os, "open", real_open)
    info = read_tracking(p)
    assert np.flatnonzero(info["done"]).tolist() == [10, 11]
    assert np.flatnonzero(info["failures"]).tolist() == [12]
