"""Resume after the whole run (parent and workers) was killed with SIGKILL."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import harness  # noqa: E402

pytest.importorskip("daisy_nb.scheduler")

pytestmark = [pytest.mark.mp, pytest.mark.timeout(90)]

SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {workers!r}); sys.path.insert(0, {root!r})
    if {named!r} and hasattr(os, "memfd_create"):
        del os.memfd_create  # the named-segment path of platforms without memfd
    import blockfns
    import daisy_nb
    from funlib.geometry import Roi
    task = daisy_nb.Task("r", total_roi=Roi((0,), (3000,)), read_roi=Roi((0,), (10,)), write_roi=Roi((0,), (10,)),
                         process_function=blockfns.{fn}, read_write_conflict=False, max_workers=2,
                         tracking_path={tracking!r})
    states = daisy_nb.run_blockwise(task, progress=False, summary=False, return_states=True)
    st = states["r"]
    print("STATES", st.completed_count, st.skipped_count, st.total_block_count, flush=True)
    """
)


def _recorded(track):
    """Blocks the tracking store on disk holds as done (0 before it exists)."""
    from daisy_nb.tracking import read_tracking

    try:
        done = read_tracking(track)["done"]
    except FileNotFoundError:
        return 0
    return 0 if done is None else int(done.sum())


@pytest.mark.parametrize("named", [False, True], ids=["memfd", "named_shm"])
def test_resume_after_sigkill(tmp_path, monkeypatch, named):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("DAISY_NB_TEST_OUT", str(out))
    script = tmp_path / "run.py"
    kw = dict(workers=str(HERE / "workers"), root=str(HERE.parent), tracking=str(tmp_path / "track"), named=named)
    script.write_text(SCRIPT.format(fn="slow_mark", **kw))
    shm_before = harness.shm_segments()
    p = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while len(list(out.glob("done_r_*"))) < 40:  # ~1 s of work, so at least one flush happened
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
        time.sleep(0.05)
    while _recorded(tmp_path / "track") < 40:  # marks reached the tracking file (a flush, on the pwrite path)
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    first = {f.name for f in out.glob("done_r_*")}
    worker_pids = {int(f.read_text().split()[0]) for f in out.glob("done_r_*")}
    deadline = time.monotonic() + 5
    while any(harness.pid_alive(pid) for pid in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(harness.pid_alive(pid) for pid in worker_pids), "workers outlived a SIGKILLed parent"
    assert 0 < len(first) < 300

    for f in out.glob("done_r_*"):
        f.unlink()
    script.write_text(SCRIPT.format(fn="slow_mark", **kw))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("STATES"))
    completed, skipped, total = map(int, line.split()[1:])
    assert completed == total == 300
    # tracking is flushed about once a second: only blocks done in the last ~second (40 blocks/s) rerun
    assert 0 < skipped <= len(first) and len(first) - skipped <= 60
    assert len(list(out.glob("done_r_*"))) == total - skipped
    deadline = time.monotonic() + 5
    while harness.shm_segments() - shm_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (harness.shm_segments() - shm_before)
