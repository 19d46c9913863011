"""The worker timeline (bounded memory, what the pool and Client jobs report) and the run
report (written at the end, also after Ctrl-C and abandonment; self-contained)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb.dashboard import Dashboard
from daisy_nb.dashboard.timeline import MAX_BARS, MAX_BUCKETS, MAX_ROWS, Timeline

HERE = Path(__file__).parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "workers"))
import dashfns  # noqa: E402


# ------------------------------------------------------------------ the timeline itself
def test_memory_stays_bounded_over_a_long_run_and_busy_time_is_kept():
    tl = Timeline(window_s=60.0, max_bars=500, max_buckets=50)
    tl.t0 = 0.0
    busy = 0.0
    t = 0.0
    sizes = []
    # 4 workers, 250,000 batches each over ~14 simulated hours, a 0.1 s batch then a 0.1 s idle gap
    for i in range(250_000):
        for w in range(4):
            tl.bar(("w", w), "task", t, t + 0.1, n=5)
        busy += 4 * 0.1
        t += 0.2
        if i % 50_000 == 0:
            sizes.append(tl.size())
    sizes.append(tl.size())
    bound = 4 * (1 + 500 + 50)
    assert max(sizes) <= bound, sizes
    for r in tl.rows.values():
        assert len(r.bars) <= 500 and len(r.buckets) <= 50
        # the window is at full resolution: gaps longer than the merge gap stay gaps
        assert all(b[1] - b[0] < 0.2 for b in r.bars)
    assert tl.bucket_s > 60.0  # coarsened: 14 h in at most 50 buckets
    kept = sum(b[5] for r in tl.rows.values() for b in r.bars)
    kept += sum(v for r in tl.rows.values() for bk in r.buckets.values() for v in bk.values())
    assert kept == pytest.approx(busy, rel=1e-6)
    js = tl.to_json(t, 0.0)
    assert sum(r["blocks"] for r in js["rows"]) == 4 * 250_000 * 5
    assert len(json.dumps(js)) < 400_000


def test_fast_back_to_back_batches_merge_and_rows_are_bounded():
    tl = Timeline()
    tl.t0 = 0.0
    for i in range(10_000):  # 10 ms batches back to back for 100 s: one bar (below a pixel's resolution)
        tl.bar("a", "t", 100 + i * 0.01, 100 + (i + 1) * 0.01, n=10)
    assert len(tl.rows["a"].bars) == 1 and tl.rows["a"].bars[0][3] == 100_000
    for k in range(MAX_ROWS + 40):  # worker churn: old finished rows are dropped, their counts kept
        tl.worker(("w", k), "t", t=float(k))
        tl.bar(("w", k), "t", k, k + 0.5)
        tl.ended(("w", k), lost=k % 2 == 1)
    assert len(tl.rows) <= MAX_ROWS
    assert tl.retired["rows"] >= 41 and tl.retired["blocks"] >= 41
    states = {r["key"]: r["state"] for r in tl.to_json(1e4, 0.0)["rows"]}
    assert states[f"w-{MAX_ROWS + 39}"] == "lost" and states[f"w-{MAX_ROWS + 38}"] == "exited"
    assert MAX_BARS > 0 and MAX_BUCKETS > 0


def test_row_states():
    tl = Timeline()
    tl.worker("s", "t", t=0.0)
    tl.worker("r", "t", t=0.0)
    tl.bar("r", "t", 9.5, 9.9)
    tl.worker("i", "t", t=0.0)
    tl.bar("i", "t", 1.0, 2.0)
    tl.worker("j", "t", job="4711", t=0.0)
    st = {r["key"]: r for r in tl.to_json(10.0, 0.0, live={"j": ("running", 8.0)})["rows"]}
    assert [st[k]["state"] for k in "sri"] == ["starting", "running", "idle"]
    assert st["j"]["state"] == "running" and st["j"]["job"] == "4711" and st["j"]["running_since"] == 8.0


# ------------------------------------------------------------------ the pool reports to it
def _task(n=200, fn=dashfns.work, name="tl", **kw):
    return daisy_nb.Task(
        name,
        total_roi=Roi((0,), (n * 10,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        **kw,
    )


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_a_pool_run_fills_the_timeline(tmp_path, monkeypatch, no_leaks):
    monkeypatch.setenv("DASH_DIE", f"50:{tmp_path / 'died'}")  # the worker running block 50 dies, once
    monkeypatch.setenv("DASH_FAIL", "7")
    with Dashboard(quiet=True) as dash:
        states = daisy_nb.run_blockwise(
            [_task(300, max_workers=2, max_retries=1)],
            dashboard=dash,
            return_states=True,
            progress=False,
            summary=False,
            log_dir=str(tmp_path / "logs"),
        )
        tl = dash.source.timeline_json()
    st = states["tl"]
    rows = tl["rows"]
    assert tl["tasks"] == ["tl"]
    assert len(rows) == st.worker_start_count >= 3  # two, plus the replacements of the dead/raising ones
    # every block that ran is in a bar: 300 blocks, minus the one running in the dead worker, plus retries
    ran = sum(r["blocks"] for r in rows)
    assert 300 <= ran <= 302
    assert sum(b[3] for r in rows for b in r["bars"]) == ran
    assert {r["state"] for r in rows} <= {"lost", "exited"}
    assert sum(r["state"] == "lost" for r in rows) == st.worker_failure_count >= 2
    assert any(b[4] for r in rows for b in r["bars"])  # block 7's bar is marked failed
    for r in rows:
        assert r["kind"] == "worker" and r["pid"] and r["end"] >= r["start"]
        for b in r["bars"]:
            assert r["start"] - 0.5 <= b[0] <= b[1] <= r["end"] + 0.5


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_client_jobs_have_rows_with_their_job_id(tmp_path, out, no_leaks):
    """Worker functions that launch a job (``daisy_nb.launch``): each job's row carries its job id."""
    from daisy_nb import launch

    job_out = tmp_path / "jobs"
    job_out.mkdir()
    prog = Path(__file__).parent / "workers" / "launch_job.py"
    submit = launch.local([sys.executable, str(prog), str(job_out), "0.01", "normal"])
    states = daisy_nb.run_blockwise(
        [_task(40, submit, "cl", max_workers=2)],
        return_states=True,
        progress=False,
        summary=False,
        host="127.0.0.1",
        report=str(tmp_path / "r.html"),
    )
    assert states["cl"].completed_count == 40
    pids = {p.name.split("_")[1] for p in job_out.glob("pid_*")}
    data = _report_data(tmp_path / "r.html")
    rows = data["/api/timeline"]["rows"]
    jobs = [r for r in rows if r["kind"] == "job"]
    assert jobs and all(r["job"] and r["job"].startswith("local ") for r in jobs)
    assert {r["job"].split()[1] for r in jobs} <= pids  # the job ids the launcher reported: its children
    assert sum(r["blocks"] for r in rows) == 40  # one bar per block a client released


# ------------------------------------------------------------------ the run report
def _report_data(path: Path) -> dict:
    html = path.read_text()
    m = re.search(r"<script>window.DAISY_NB_REPORT = (.*?);</script>", html, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def external_refs(html: str) -> list[str]:
    """URLs in the page that would leave the file: http(s)://, protocol-relative, src=/href= to anything
    but a fragment or a data: URI."""
    bad = re.findall(r"https?://[^\s\"'<>)]*", html)
    bad += re.findall(r"""(?:src|href)\s*=\s*["']?(?!#|data:)([^"'\s>]+)""", html)
    bad += re.findall(r"""url\(\s*["']?(?!data:|#)([^)"']+)""", html)
    bad += re.findall(r"@import", html)
    return bad


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_report_is_self_contained_and_holds_the_run(tmp_path, monkeypatch, no_leaks):
    monkeypatch.setenv("DASH_FAIL", "4,8")
    path = tmp_path / "run.html"
    states = daisy_nb.run_blockwise(
        [_task(500, max_workers=2, max_retries=0)], report=str(path), return_states=True, progress=False, summary=False
    )
    html = path.read_text()
    assert external_refs(html) == []
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    data = _report_data(path)
    s = data["/api/state"]
    t = s["tasks"][0]
    assert s["finished"] and t["completed"] == states["tl"].completed_count == 498 and t["failed"] == 2
    assert [g["count"] for g in s["error_groups"] if g["type"] == "ValueError"] == [2]
    assert data["/api/pictures"]["tasks"]["tl"]["shape"] == [500]
    assert sum(r["blocks"] for r in data["/api/timeline"]["rows"]) == 500
    assert s["report"]["version"] == daisy_nb.__version__
    with pytest.raises(TypeError, match="report"):
        daisy_nb.run_blockwise([_task(5)], report=3, progress=False, summary=False)
    with pytest.raises(ValueError, match="report"):
        daisy_nb.run_blockwise([_task(5)], report=str(tmp_path / "no" / "dir.html"), progress=False, summary=False)


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_report_after_abandonment(tmp_path, monkeypatch, no_leaks):
    monkeypatch.setenv("DASH_FAIL", "2")
    path = tmp_path / "abandoned.html"
    with pytest.raises(RuntimeError, match="abandoned"):
        daisy_nb.run_blockwise(
            [_task(50, max_workers=1, max_worker_restarts=0)], report=str(path), progress=False, summary=False
        )
    s = _report_data(path)["/api/state"]
    assert s["tasks"][0]["abandoned"] and s["tasks"][0]["orphaned"] > 0
    assert any(g["type"] == "ValueError" and g["first_block"] == 2 for g in s["error_groups"])


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_report_after_ctrl_c_of_daisy_nb_run(tmp_path):
    flag = tmp_path / "slow"
    flag.write_text("")
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE / 'workers')!r})\n"
        "import daisy, dashfns\n"
        "from funlib.geometry import Roi\n"
        "t = daisy.Task('c', total_roi=Roi((0,), (100000,)), read_roi=Roi((0,), (10,)), write_roi=Roi((0,), (10,)),\n"
        "               process_function=dashfns.work, read_write_conflict=False, max_workers=2)\n"
        "print('running', flush=True)\n"
        "daisy.run_blockwise([t], progress=False)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DAISY_NB_LOG_DIR"}  # the program's logs: ./daisy_logs
    env.update(PYTHONPATH=str(ROOT), DASH_SLOW=str(flag), DASH_SLEEP="0.01")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daisy_nb", "run", "--report", "out.html", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "running"
        logs = tmp_path / "daisy_logs" / "c"
        deadline = time.monotonic() + 60
        while not (logs.is_dir() and any(logs.glob("worker_*.out"))):  # workers run blocks
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert f"daisy_nb report: {tmp_path / 'out.html'}" in err
    s = _report_data(tmp_path / "out.html")["/api/state"]
    t = s["tasks"][0]
    assert s["finished"] and t["total"] == 10000 and t["remaining"] > 0  # the counts at the interrupt


def test_daisy_nb_run_report_option_errors():
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "run", "--report"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--report needs a file name" in r.stderr
