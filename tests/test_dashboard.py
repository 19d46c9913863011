"""The live dashboard: pictures against a naive twin, the HTTP API of a real run, binding, CLI.

Browser tests (headless chromium rendering the page) are in test_dashboard_browser.py.
"""

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb.block import cantor_number
from daisy_nb.dashboard import Dashboard, check_dashboard
from daisy_nb.dashboard import picture as pic
from daisy_nb.dashboard.live import inverse_cantor
from daisy_nb.kernels import graph as kg

try:
    from . import served
except ImportError:
    import served

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))
import dashfns  # noqa: E402

ROOT = HERE.parent


def get(url, host=None, timeout=10):
    req = urllib.request.Request(url)
    if host is not None:
        req.add_header("Host", host)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def get_json(url):
    return json.loads(get(url)[1])


def at(url, path, query=""):
    """``path`` (and ``query``) on the dashboard of a printed URL, keeping its ``?token=...``."""
    p = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((p.scheme, p.netloc, "/" + path, "&".join(x for x in (query, p.query) if x), ""))


def unpack(b64, shape):
    return np.frombuffer(zlib.decompress(base64.b64decode(b64)), np.uint8).reshape(shape)


# ------------------------------------------------------------------ pictures: naive twin

LAYOUTS = [
    # (total, read, write, conflict, fit)
    (((0,), (100,)), ((0,), (7,)), ((0,), (7,)), False, "valid"),
    (((0,), (1_000_000,)), ((0,), (1,)), ((0,), (1,)), False, "valid"),
    (((0, 0), (57, 83)), ((0, 0), (5, 7)), ((1, 1), (3, 5)), True, "overhang"),
    (((-4, 2), (2000, 3300)), ((0, 0), (3, 3)), ((1, 1), (1, 1)), True, "shrink"),
    (((0, 0, 0), (30, 41, 29)), ((0, 0, 0), (6, 6, 6)), ((1, 1, 1), (4, 4, 4)), True, "valid"),
    (((0, 0, 0), (200, 60, 70)), ((0, 0, 0), (2, 3, 3)), ((0, 1, 1), (2, 1, 1)), True, "shrink"),
    (((0, 0, 0, 0), (5, 6, 20, 20)), ((0, 0, 0, 0), (2, 2, 4, 4)), ((0, 0, 1, 1), (2, 2, 2, 2)), True, "overhang"),
]


def _task(geom, name="t"):
    (to, ts), (ro, rs), (wo, ws), conflict, fit = geom
    return daisy_nb.Task(
        name,
        total_roi=Roi(to, ts),
        read_roi=Roi(ro, rs),
        write_roi=Roi(wo, ws),
        process_function=dashfns.work,
        read_write_conflict=conflict,
        fit=fit,
    )


def _grid_of_rows(sched, t):
    lay = sched.tasks[sched.task_ids[t]].layout
    tt = sched.geometry.tt
    rows = np.arange(lay.num_blocks, dtype=np.int64)
    g = np.empty((len(rows), lay.ndim), np.int64)
    kg.rows_to_grid(tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.geo, t, rows, g)
    return g


@pytest.mark.parametrize("geom", LAYOUTS, ids=lambda g: f"{len(g[0][0])}d-{g[4]}-{'c' if g[3] else 'n'}")
def test_live_codes_and_picture_match_a_naive_twin(geom):
    """Every block lands on its grid cell with its state; pixels are the worst state and the done share."""
    rng = np.random.default_rng(len(str(geom)))
    sched = daisy_nb.Scheduler([_task(geom)], block_tracking=False)
    try:
        lay = sched.tasks["t"].layout
        n = lay.num_blocks
        status = rng.integers(0, 6, n).astype(np.uint8)
        preskip = (rng.random(n) < 0.2).astype(np.uint8)
        grid = tuple(int(v) for v in lay.grid_shape)
        # naive: per row, its grid cell (the geometry kernel) and its display code
        want = np.zeros(grid, np.uint8)
        g = _grid_of_rows(sched, 0)
        lut = [pic.WAITING, pic.WAITING, pic.PROCESSING, pic.DONE, pic.FAILED, pic.ORPHANED]
        codes = np.array([lut[s] for s in status], np.uint8)
        codes[(status == 3) & (preskip != 0)] = pic.SKIPPED
        want[tuple(g.T)] = codes
        got = pic.live_codes(lay, status, preskip, 0, grid[0])
        np.testing.assert_array_equal(got, want)
        # a slab in the middle equals the same rows of the whole
        a0, a1 = grid[0] // 3, max(grid[0] // 3 + 1, 2 * grid[0] // 3)
        np.testing.assert_array_equal(pic.live_codes(lay, status, preskip, a0, a1), want[a0:a1])
        # the picture, pixel by pixel from pixel_box
        p = pic.picture(grid, pic.live_slabs(lay, status, preskip))
        pl = pic.PictureLayout(grid)
        worst = unpack(p["codes"], (pl.panels, pl.h, pl.w))
        done = unpack(p["done"], (pl.panels, pl.h, pl.w))
        assert p["counts"]["failed"] == int((codes == pic.FAILED).sum())
        assert sum(p["counts"].values()) == n
        assert pl.panels * pl.h * pl.w <= 200_000  # never block by block for big grids
        picks = [(k, r, c) for k in range(pl.panels) for r in range(pl.h) for c in range(pl.w)]
        if len(picks) > 400:
            picks = [picks[i] for i in rng.choice(len(picks), 400, replace=False)]
        for k, r, c in picks:
            cells = [want[tuple(slice(a, b) for a, b in zip(lo, hi))].reshape(-1) for lo, hi in pl.pixel_box(k, r, c)]
            cells = np.concatenate(cells) if cells else np.zeros(0, np.uint8)
            assert worst[k, r, c] == (cells.max() if cells.size else pic.NONE), (k, r, c)
            share = ((cells == pic.DONE) | (cells == pic.SKIPPED)).sum() * 255 // max(1, cells.size)
            assert done[k, r, c] == share
    finally:
        sched.close()


def test_a_million_block_picture_is_small():
    geom = (((0, 0, 0), (100, 100, 100)), ((0, 0, 0), (1, 1, 1)), ((0, 0, 0), (1, 1, 1)), False, "valid")
    sched = daisy_nb.Scheduler([_task(geom)], block_tracking=False)
    try:
        lay = sched.tasks["t"].layout
        st = np.full(lay.num_blocks, 3, np.uint8)
        st[123_456] = 4  # one failed block
        p = pic.picture(lay.grid_shape, pic.live_slabs(lay, st, np.zeros_like(st)))
        assert len(json.dumps(p)) < 20_000
        pl = pic.PictureLayout(lay.grid_shape)
        worst = unpack(p["codes"], (pl.panels, pl.h, pl.w))
        assert (worst == pic.FAILED).sum() == 1  # the lone failure stays visible
        assert p["counts"]["failed"] == 1 and p["counts"]["done"] == 10**6 - 1
    finally:
        sched.close()


@pytest.mark.parametrize("nd", [1, 2, 3, 4])
def test_inverse_cantor(nd):
    rng = np.random.default_rng(nd)
    for _ in range(300):
        x = tuple(int(v) for v in rng.integers(0, 50 if nd > 2 else 10**6, nd))
        assert inverse_cantor(cantor_number(x), nd) == x
    assert inverse_cantor(cantor_number((10**12, 3, 7)), 3) == (10**12, 3, 7)


# ------------------------------------------------------------------ argument checks


@pytest.mark.parametrize("bad, exc", [("yes", TypeError), (-1, ValueError), (70000, ValueError), (1.5, TypeError)])
def test_bad_dashboard_argument_fails_before_work(tmp_path, bad, exc):
    t = daisy_nb.Task(
        "t",
        total_roi=Roi((0,), (20,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=dashfns.work,
        tracking_path=str(tmp_path / "trk"),
    )
    with pytest.raises(exc, match="dashboard"):
        daisy_nb.run_blockwise([t], dashboard=bad, progress=False)
    assert not (tmp_path / "trk").exists()  # nothing ran, no tracking store made
    check_dashboard(True)
    check_dashboard(8787)
    check_dashboard(None)


def test_dashboard_constructor_checks():
    with pytest.raises(ValueError, match="host"):
        Dashboard(host="not-an-address")
    with pytest.raises(TypeError, match="port"):
        Dashboard(port="80")
    with pytest.raises(ValueError, match="port"):
        Dashboard(port=-3)


def test_busy_port_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"dashboard: cannot listen on 127.0.0.1:{port}"):
            Dashboard(port=port, quiet=True).start()


# ------------------------------------------------------------------ binding and token


def _refused(host, port):
    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
        except (ConnectionRefusedError, OSError):
            return True
    return False


def test_default_binding_is_127_0_0_1_only():
    with Dashboard(quiet=True) as dash:
        port = dash.port
        assert dash.url == f"http://127.0.0.1:{port}/?token={dash.token}"
        assert get(dash.url)[0] == 200
        assert _refused("127.0.0.2", port)  # another loopback address: nobody listens there
        assert get(dash.url_for("api/state"), host=f"localhost:{port}")[0] == 200


def test_read_only_methods():
    with Dashboard(quiet=True) as dash:
        req = urllib.request.Request(dash.url_for("api/state"), data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 501
        body = get(dash.url)[1].decode()
        assert "static/app.js" in body and "http" not in body.replace("http-equiv", "")  # nothing from the network


# ------------------------------------------------------------------ a real run


def _tasks(n_a=300, n_b=200, **kw):
    a = daisy_nb.Task(
        "alpha",
        total_roi=Roi((0, 0), (10 * 20, 10 * (n_a // 20))),
        read_roi=Roi((0, 0), (10, 10)),
        write_roi=Roi((0, 0), (10, 10)),
        process_function=dashfns.work,
        read_write_conflict=False,
        max_workers=2,
        max_retries=1,
        **kw,
    )
    b = daisy_nb.Task(
        "beta",
        total_roi=Roi((0,), (10 * n_b,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=dashfns.work,
        read_write_conflict=False,
        max_workers=1,
        max_retries=0,
        **kw,
    )
    return [a, b]


def _agree(api_task, st):
    assert api_task["total"] == st.total_block_count
    assert api_task["completed"] == st.completed_count
    assert api_task["skipped"] == st.skipped_count
    assert api_task["failed"] == st.failed_count
    assert api_task["orphaned"] == st.orphaned_count
    assert api_task["processing"] == st.processing_count
    assert api_task["remaining"] == st.total_block_count - st.completed_count - st.failed_count - st.orphaned_count


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_state_agrees_with_final_task_states_and_shows_failures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DASH_FAIL", "4,17")
    with Dashboard(quiet=True) as dash:
        states = daisy_nb.run_blockwise(_tasks(), dashboard=dash, return_states=True, progress=False, summary=True)
        summary = {
            ln.split()[0]: ln.split()
            for ln in capsys.readouterr().out.splitlines()
            if ln.strip().startswith(("alpha ", "beta "))
        }
        s = get_json(dash.url_for("api/state"))
        assert s["finished"] is True
        assert [t["task_id"] for t in s["tasks"]] == list(states)
        for t in s["tasks"]:
            _agree(t, states[t["task_id"]])
            assert t["blocks_per_s"] > 0 and t["eta_s"] == 0.0 and t["elapsed_s"] > 0
            # the execution summary's row: task sym blocks completed skipped failed orphaned time blocks/s
            row = summary[t["task_id"]]
            assert [int(v) for v in row[2:7]] == [t["total"], t["completed"], t["skipped"], t["failed"], t["orphaned"]]
            assert abs(float(row[7].rstrip("s")) - t["elapsed_s"]) <= 0.006
            assert abs(float(row[8].replace(",", "")) - t["blocks_per_s"]) <= 1
        assert states["alpha"].failed_count == 2 and states["beta"].failed_count == 2
        # the errors list names the failed blocks, with their tracebacks
        failed = {(e["task"], e["block_id"]) for e in s["errors"]}
        assert ("alpha", 4) in failed or ("alpha", 17) in failed
        assert all("dashboard test failure in block" in e["text"] for e in s["errors"])
        # click: block id, ROIs, traceback (from the states or the worker logs)
        for tid in ("alpha", "beta"):
            for bid in (4, 17):
                b = get_json(dash.url_for("api/block", f"task={tid}&block_id={bid}"))
                assert b["blocks_in_pixel"] == 1
                (blk,) = b["blocks"]
                assert blk["block_id"] == bid and blk["status"] == "failed"
                assert blk["failed_attempts"] == (2 if tid == "alpha" else 1)
                assert f"dashboard test failure in block {bid}" in blk["traceback"]
        blk = get_json(dash.url_for("api/block", "task=beta&block_id=17"))["blocks"][0]
        assert blk["write_roi"] == {"offset": [170], "shape": [10]} and blk["read_roi"] == blk["write_roi"]
        # alpha is 2-D: block id 4 is grid cell inverse_cantor(4)
        g = inverse_cantor(4, 2)
        blk = get_json(dash.url_for("api/block", "task=alpha&block_id=4"))["blocks"][0]
        assert blk["write_roi"]["offset"] == [10 * g[0], 10 * g[1]]
        # the pictures: one per task, counts as in the states; the failed pixel is clickable
        p = get_json(dash.url_for("api/pictures"))["tasks"]
        for tid, st in states.items():
            assert p[tid]["counts"]["failed"] == st.failed_count
            assert p[tid]["counts"]["done"] + p[tid]["counts"]["skipped"] == st.completed_count
        pa = p["alpha"]
        worst = unpack(pa["codes"], (len(pa["panels"]), pa["h"], pa["w"]))
        r, c = map(int, np.argwhere(worst[0] == pic.FAILED)[0])
        clicked = get_json(dash.url_for("api/block", f"task=alpha&panel=0&r={r}&c={c}"))
        assert clicked["blocks"][0]["status"] == "failed"
        with pytest.raises(urllib.error.HTTPError) as e:
            get(dash.url_for("api/block", "task=nope&block_id=1"))
        assert e.value.code == 404


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_counts_grow_while_running_and_workers_are_listed(tmp_path, monkeypatch):
    flag = tmp_path / "slow"
    flag.write_text("")
    monkeypatch.setenv("DASH_SLOW", str(flag))
    monkeypatch.setenv("DASH_SLEEP", "0.01")
    monkeypatch.delenv("DASH_FAIL", raising=False)
    seen = {}
    with Dashboard(quiet=True) as dash:

        def watch():
            try:
                deadline = time.monotonic() + 60
                first = None
                while time.monotonic() < deadline:
                    s = get_json(dash.url_for("api/state"))
                    done = sum(t["completed"] for t in s["tasks"])
                    busy = [w for w in s["workers"] if w["alive"] and w.get("block_id") is not None]
                    if first is None and done > 0:
                        first = done
                    elif first is not None and done > first and busy:
                        seen.update(first=first, later=done, workers=s["workers"], rate=s["tasks"][0]["blocks_per_s"])
                        break
                    time.sleep(0.3)
            finally:
                flag.unlink()

        th = threading.Thread(target=watch)
        th.start()
        states = daisy_nb.run_blockwise(
            _tasks(400, 100), dashboard=dash, return_states=True, progress=False, summary=False
        )
        th.join()
        assert seen, "the counts did not grow while the run was going on"
        assert seen["later"] > seen["first"]
        ws = seen["workers"]
        assert {w["task"] for w in ws} <= {"alpha", "beta"} and all(w["pid"] for w in ws)
        assert any(w["state"] == "busy" for w in ws)
        s = get_json(dash.url_for("api/state"))
        for t in s["tasks"]:
            _agree(t, states[t["task_id"]])
        assert not any(w["alive"] for w in s["workers"])  # all gone at the end


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_dead_worker_shows_as_restart_and_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DASH_DIE", f"6:{tmp_path / 'died'}")
    monkeypatch.delenv("DASH_FAIL", raising=False)
    with Dashboard(quiet=True) as dash:
        states = daisy_nb.run_blockwise(
            _tasks(40, 30), dashboard=dash, return_states=True, progress=False, summary=False
        )
        s = get_json(dash.url_for("api/state"))
    assert (tmp_path / "died").exists()
    died = [t for t in s["tasks"] if t["worker_failures"]]
    assert len(died) == 1  # block 6 of whichever task reaches it first: its worker dies once
    for t in s["tasks"]:
        _agree(t, states[t["task_id"]])
        st = states[t["task_id"]]
        assert t["worker_restarts"] == st.worker_restart_count and t["worker_failures"] == st.worker_failure_count
    errs = [e for e in s["errors"] if e["block_id"] is None]
    assert errs and "exited with code 3" in errs[0]["text"]


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_ctrl_c_with_a_watched_dashboard_stops_promptly(tmp_path):
    flag = tmp_path / "slow"
    flag.write_text("")
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(HERE / 'workers')!r})\n"
        "import dashfns, daisy_nb\n"
        "from funlib.geometry import Roi\n"
        "t = daisy_nb.Task('c', total_roi=Roi((0,), (100000,)), read_roi=Roi((0,), (10,)), write_roi=Roi((0,), (10,)),\n"
        "                  process_function=dashfns.work, read_write_conflict=False, max_workers=2)\n"
        "daisy_nb.run_blockwise(t, dashboard=True, progress=False)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), DASH_SLOW=str(flag), DASH_SLEEP="0.01")
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("daisy_nb dashboard: http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split(": ", 1)[1].strip()
        deadline = time.monotonic() + 60
        # running, and watched (the URL is printed before the run's tasks are known: poll until they are)
        while not [t for t in get_json(at(url, "api/state"))["tasks"] if t["completed"]]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 5  # the pool's 2 s plus start-up noise; no linger on Ctrl-C
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        assert _refused("127.0.0.1", urllib.parse.urlsplit(url).port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serial_runner_and_server_owned_by_the_run(capsys):
    t = _tasks(40, 20)
    states = daisy_nb.run_blockwise(
        t, multiprocessing=False, dashboard=True, return_states=True, progress=False, summary=False
    )
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("daisy_nb dashboard: http://127.0.0.1:")]
    assert len(lines) == 1  # printed once
    url = lines[0].split(": ", 1)[1]
    assert urllib.parse.urlsplit(url).query.startswith("token=")
    port = urllib.parse.urlsplit(url).port
    assert states["alpha"].completed_count == 40
    assert _refused("127.0.0.1", port)  # dashboard=True: the server ends with the run


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_a_watching_page_sees_the_end_of_a_dashboard_true_run(tmp_path, monkeypatch):
    flag = tmp_path / "slow"
    flag.write_text("")
    monkeypatch.setenv("DAISY_NB_DASHBOARD_TOKEN", "page-knows-it")  # the run's own server takes it
    monkeypatch.setenv("DASH_SLOW", str(flag))
    monkeypatch.delenv("DASH_FAIL", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api/state?token=page-knows-it"
    seen = []

    def page():  # polls like the page, once a second
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                s = get_json(url)
            except OSError:
                if seen:
                    return  # the server is gone
                time.sleep(0.05)
                continue
            seen.append(s["finished"])
            if flag.exists():
                flag.unlink()  # let the run finish now
            time.sleep(1.0)

    th = threading.Thread(target=page)
    th.start()
    t0 = time.monotonic()
    daisy_nb.run_blockwise(_tasks(40, 20), dashboard=port, progress=False, summary=False)
    th.join()
    assert seen and seen[-1] is True, seen
    assert time.monotonic() - t0 < 60
    assert _refused("127.0.0.1", port)


def test_a_dashboard_shows_the_next_run():
    with Dashboard(quiet=True) as dash:
        daisy_nb.run_blockwise(_tasks(40, 20), multiprocessing=False, dashboard=dash, progress=False, summary=False)
        t2 = daisy_nb.Task(
            "gamma",
            total_roi=Roi((0,), (50,)),
            read_roi=Roi((0,), (10,)),
            write_roi=Roi((0,), (10,)),
            process_function=dashfns.work,
        )
        daisy_nb.run_blockwise([t2], multiprocessing=False, dashboard=dash, progress=False, summary=False)
        s = get_json(dash.url_for("api/state"))
        assert [t["task_id"] for t in s["tasks"]] == ["gamma"] and s["tasks"][0]["completed"] == 5
        assert list(get_json(dash.url_for("api/pictures"))["tasks"]) == ["gamma"]


@pytest.mark.timeout(180)
def test_dask_executor_run_agrees(monkeypatch):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    monkeypatch.setenv("DASH_FAIL", "5")
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
        Dashboard(quiet=True) as dash,
    ):
        states = daisy_nb.run_blockwise(
            _tasks(100, 50), executor=client, dashboard=dash, return_states=True, progress=False, summary=False
        )
        s = get_json(dash.url_for("api/state"))
        assert s["runtime"] == "dask" and s["finished"]
        for t in s["tasks"]:
            _agree(t, states[t["task_id"]])
        assert states["beta"].failed_count == 1
        b = get_json(dash.url_for("api/block", "task=beta&block_id=5"))["blocks"][0]
        assert b["status"] == "failed" and b["write_roi"] == {"offset": [50], "shape": [10]}


# ------------------------------------------------------------------ CLI


def _tracked_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DASH_FAIL", "3,9")
    monkeypatch.chdir(tmp_path)
    from daisy_nb import logging as dlog

    old = dlog.get_log_basedir()
    dlog.set_log_basedir(tmp_path / "daisy_logs")
    try:
        t = daisy_nb.Task(
            "vol",
            total_roi=Roi((0, 0, 0), (40, 40, 40)),
            read_roi=Roi((0, 0, 0), (10, 10, 10)),
            write_roi=Roi((0, 0, 0), (10, 10, 10)),
            process_function=dashfns.work,
            max_retries=0,
            read_write_conflict=False,
            tracking_path=str(tmp_path / "trk" / "vol"),
            max_workers=2,
        )
        return daisy_nb.run_blockwise([t], return_states=True, progress=False, summary=False)["vol"]
    finally:
        dlog.set_log_basedir(old)


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_cli_serves_tracking_read_only(tmp_path, monkeypatch):
    st = _tracked_run(tmp_path, monkeypatch)
    cmd = [sys.executable, "-m", "daisy_nb", "dashboard", "trk", "--port", "0"]
    env = {k: v for k, v in os.environ.items() if k != "DAISY_NB_LOG_DIR"}  # its default: ./daisy_logs
    proc, err = served.start(cmd, cwd=tmp_path, env=dict(env, PYTHONPATH=str(ROOT)))
    try:
        line = proc.stdout.readline()
        assert "daisy_nb dashboard (read-only" in line, line + err.read_text()
        url = line.split(": ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and "?token=" in url
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url.split("?")[0])
        assert e.value.code == 403
        s = get_json(at(url, "api/state"))
        assert s["mode"] == "tracking"
        (t,) = s["tasks"]
        assert (t["task_id"], t["total"], t["completed"], t["failed"]) == ("vol", 64, st.completed_count, 2)
        b = get_json(at(url, "api/block", "task=vol&block_id=9"))["blocks"][0]
        assert b["status"] == "failed" and b["failed_attempts"] == 1
        assert "dashboard test failure in block 9" in b["traceback"]  # from ./daisy_logs
        p = get_json(at(url, "api/pictures"))["tasks"]["vol"]
        assert p["counts"]["failed"] == 2 and p["shape"] == [4, 4, 4]
        deadline = time.monotonic() + 20  # the state is re-read at most once a second: poll for the pass
        while len(errs := get_json(at(url, "api/state"))["errors"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(e["block_id"] for e in errs) == [3, 9]  # the failed blocks the picture pass found
        assert all(f"dashboard test failure in block {e['block_id']}" in e["text"] for e in errs)
        groups = get_json(at(url, "api/state"))["error_groups"]  # the worker logs' failures, by kind
        assert [(g["type"], g["count"], g["task"]) for g in groups] == [("ValueError", 2, "vol")]
        assert "static/app.js" in get(url)[1].decode()
    finally:
        served.stop(proc, err)  # ~0.3 s; a deadline of 60 s for a heavily loaded machine


def test_cli_bad_path_exit_code(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "dashboard", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 2 and "no such file" in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_benchmark_quick():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_dashboard.py"), "--quick"],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| dashboard=True, nobody looks |" in r.stdout and "| dashboard, poller every" in r.stdout


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_tracking_source_with_the_task_layout_gives_rois(tmp_path, monkeypatch):
    import argparse

    from daisy_nb.dashboard.offline import add_arguments, make_source

    _tracked_run(tmp_path, monkeypatch)
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(
        [
            "trk",
            "--total-roi",
            "0,0,0:40,40,40",
            "--read-roi",
            "0,0,0:10,10,10",
            "--write-roi",
            "0,0,0:10,10,10",
            "--logs",
            str(tmp_path / "daisy_logs"),
        ]
    )
    src = make_source(args)
    (t,) = src.state()["tasks"]
    assert t["counted"] == "blocks" and t["total"] == 64 and t["failed"] == 2
    b = src.block({"task": "vol", "block_id": "9"})["blocks"][0]
    g = inverse_cantor(9, 3)
    assert b["write_roi"] == {"offset": [10 * v for v in g], "shape": [10, 10, 10]}
    assert b["read_roi"] == b["write_roi"] and b["status"] == "failed"
    assert "dashboard test failure in block 9" in b["traceback"]
    with pytest.raises(KeyError):
        src.block({"task": "vol", "block_id": str(cantor_number((7, 0, 0)))})  # outside the 4x4x4 grid
