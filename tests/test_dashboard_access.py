"""Who can read the dashboard: a token on every host (loopback too), IPv6, handler timeouts."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from daisy_nb.dashboard import TOKEN_ENV, Dashboard, resolve_token
from daisy_nb.dashboard import server as dserver

try:
    from . import served
except ImportError:
    import served

ROOT = Path(__file__).parent.parent
PATHS = ("", "api/state", "api/pictures", "api/timeline", "api/block?task=x&block_id=1", "static/app.js", "metrics")


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def status(url, headers=None, timeout=10):
    """(status, headers, body); an HTTP error status is returned, not raised."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def bare(dash, path=""):
    """``path`` on ``dash`` without any token."""
    h = f"[{dash.host}]" if ":" in dash.host else dash.host
    return f"http://{h}:{dash.port}/{path}"


def _refused(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
        except OSError:
            return True
    return False


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")


def _check_token_required(dash):
    """Without the token, with a wrong one: 403 everywhere; with it: 200."""
    assert dash.token and len(dash.token) >= 24
    for path in PATHS:
        code, _, body = status(bare(dash, path))
        assert code == 403, path
        assert b"task" not in body and b"daisy_nb_" not in body  # nothing of the run in the refusal
        sep = "&" if "?" in path else "?"
        assert status(bare(dash, f"{path}{sep}token=wrong"))[0] == 403, path
        assert status(bare(dash, f"{path}{sep}token="))[0] == 403, path
        assert status(bare(dash, path), {"Authorization": "token wrong"})[0] == 403, path
    code, _, page = status(dash.url)
    assert code == 200 and b"static/app.js?token=" in page  # the page passes it on to its own files
    assert json.loads(status(dash.url_for("api/state"))[2])["mode"] == "live"
    code, headers, text = status(dash.url_for("metrics"))
    assert code == 200 and headers["Content-Type"].startswith("text/plain") and b"# TYPE" in text
    assert status(dash.url_for("static/app.js"))[0] == 200


def test_a_token_is_required_on_127_0_0_1_too():
    with Dashboard(quiet=True) as dash:
        assert dash.url == f"http://127.0.0.1:{dash.port}/?token={dash.token}"
        _check_token_required(dash)
        # a scrape config's `authorization` (Bearer) or Jupyter's `Authorization: token ...`
        for scheme in ("Bearer", "token", "bearer"):
            assert status(bare(dash, "metrics"), {"Authorization": f"{scheme} {dash.token}"})[0] == 200
        assert status(bare(dash, "metrics"), {"Authorization": f"Basic {dash.token}"})[0] == 403
    with Dashboard(quiet=True) as other:
        assert other.token != dash.token  # random per dashboard
        assert other.token not in repr(other) and f":{other.port}/" in repr(other)  # a repr goes to logs
    assert repr(Dashboard(token=False)).endswith("not started, no token)")


def test_the_page_sets_a_strict_cookie_so_a_reload_without_the_query_works():
    with Dashboard(quiet=True) as dash:
        code, headers, _ = status(dash.url)
        assert code == 200
        cookie = headers["Set-Cookie"]
        attrs = [a.strip() for a in cookie.split(";")]
        assert "HttpOnly" in attrs and "SameSite=Strict" in attrs and "Path=/" in attrs
        pair = attrs[0]
        assert pair.startswith(f"daisy_nb_dashboard_{dash.port}=")
        assert dash.token not in cookie  # it holds a hash of the token, not the token
        for path in PATHS:
            want = 404 if path.startswith("api/block") else 200  # in, but no run yet: no such block
            assert status(bare(dash, path), {"Cookie": f"other=1; {pair}"})[0] == want, path
        name, _, value = pair.partition("=")
        wrong = value[:-1] + ("1" if value.endswith("0") else "0")  # one character off
        assert status(bare(dash), {"Cookie": f"{name}={wrong}"})[0] == 403
        assert status(bare(dash), {"Cookie": f"daisy_nb_dashboard_1={value}"})[0] == 403  # another port's
        assert "Set-Cookie" not in status(dash.url_for("api/state"))[1]  # the page sets it, not every call
        assert "Set-Cookie" not in status(bare(dash, "?token=wrong"))[1]


def test_explicit_bind_address_needs_the_token():
    with Dashboard(host="127.0.0.2", quiet=True) as dash:
        assert dash.url.startswith(f"http://127.0.0.2:{dash.port}/?token=")
        _check_token_required(dash)
        assert _refused("127.0.0.1", dash.port)
    assert _refused("127.0.0.2", dash.port)  # closed with the Dashboard


@needs_ipv6
def test_ipv6_loopback():
    with Dashboard(host="::1", quiet=True) as dash:
        assert dash.url == f"http://[::1]:{dash.port}/?token={dash.token}"
        _check_token_required(dash)
        assert _refused("127.0.0.1", dash.port)  # ::1 only
    assert _refused("::1", dash.port)


@needs_ipv6
def test_ipv6_any_address_serves_ipv4_too():
    with Dashboard(host="::", quiet=True) as dash:
        assert dash.url == f"http://[::]:{dash.port}/?token={dash.token}"
        for url in (f"http://[::1]:{dash.port}/", f"http://127.0.0.1:{dash.port}/"):
            assert status(url + "api/state")[0] == 403
            assert json.loads(status(f"{url}api/state?token={dash.token}")[2])["mode"] == "live"
    assert _refused("::1", dash.port)


def test_token_from_the_environment(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "my-Token_1.2~x")
    with Dashboard(quiet=True) as dash:
        assert dash.token == "my-Token_1.2~x" and dash.url.endswith("/?token=my-Token_1.2~x")
        assert status(bare(dash, "api/state"))[0] == 403
        assert status(dash.url_for("api/state"))[0] == 200
    with Dashboard(token="given", quiet=True) as dash:  # the argument wins
        assert dash.token == "given" and status(dash.url_for("api/state"))[0] == 200
    monkeypatch.setenv(TOKEN_ENV, "")  # empty: as unset, a random one
    assert len(resolve_token()) >= 24


def test_a_token_with_url_characters_is_quoted():
    with Dashboard(token="a&b=c+d%/", quiet=True) as dash:
        assert "token=a%26b%3Dc%2Bd%25%2F" in dash.url
        assert status(dash.url_for("api/block", "task=x&block_id=1"))[0] == 404  # in: no such task
        code, _, page = status(dash.url)
        assert code == 200 and b"static/app.js?token=a%26b%3Dc%2Bd%25%2F" in page
        assert status(dash.url_for("static/app.js"))[0] == 200
        assert status(bare(dash, "api/state?token=a&b=c+d%/"))[0] == 403  # unquoted: another token


@pytest.mark.parametrize("how", ["false", "empty", "env"])
def test_token_off_serves_without_and_warns(how, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="daisy")
    if how == "env":
        monkeypatch.setenv(TOKEN_ENV, "off")
    token = {"false": False, "empty": "", "env": None}[how]
    with Dashboard(token=token, quiet=True) as dash:
        assert dash.token is None and dash.url == f"http://127.0.0.1:{dash.port}/"
        assert "no token" in caplog.text and dash.url in caplog.text
        for path in PATHS[:3] + ("metrics",):
            assert status(bare(dash, path))[0] == 200, path
        # still: a page elsewhere cannot read it through a DNS name pointing to 127.0.0.1
        assert status(bare(dash, "api/state"), {"Host": f"evil.example:{dash.port}"})[0] == 403
        assert status(bare(dash, "api/state"), {"Host": f"localhost:{dash.port}"})[0] == 200


def test_bad_tokens_are_clear_errors(monkeypatch):
    with pytest.raises(TypeError, match="token"):
        Dashboard(token=123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token"):
        Dashboard(token="two words")
    with pytest.raises(ValueError, match="token"):
        Dashboard(token="caf\u00e9")
    monkeypatch.setenv(TOKEN_ENV, "tab\there")
    with pytest.raises(ValueError, match=TOKEN_ENV):
        Dashboard()


# ------------------------------------------------------------------ handler timeouts


def _closed_within(sock, secs):
    """Seconds until the server closes ``sock`` (reads until EOF), or None after ``secs``."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - t0 < secs:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - t0
    return None


def test_a_connection_that_sends_nothing_is_closed(monkeypatch):
    monkeypatch.setattr(dserver, "REQUEST_TIMEOUT", 0.5)
    with Dashboard(quiet=True) as dash:
        with socket.create_connection(("127.0.0.1", dash.port)) as s:
            took = _closed_within(s, 8)  # at 0.5 s, on a busy machine a bit later; never, before (or 10 s)
        assert took is not None
        # the server is still there for a real request
        assert status(dash.url_for("api/state"))[0] == 200


def test_a_connection_that_sends_slowly_is_closed(monkeypatch):
    monkeypatch.setattr(dserver, "REQUEST_TIMEOUT", 0.5)
    with Dashboard(quiet=True) as dash:
        head = f"GET /api/state?token={dash.token} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: {'x' * 400}\r\n"
        with socket.create_connection(("127.0.0.1", dash.port)) as s:
            closed = False
            for ch in head.encode():  # one byte every 50 ms (>= 23 s): each read is quick, the head is not
                try:
                    s.sendall(bytes([ch]))
                except OSError:  # the server closed it
                    closed = True
                    break
                s.settimeout(0.05)
                try:
                    if s.recv(4096) == b"":
                        closed = True
                        break
                except TimeoutError:
                    pass
            assert closed, "the slow request stayed open until its head was all sent"
        # and a keep-alive connection that goes idle after a request is closed too
        with socket.create_connection(("127.0.0.1", dash.port)) as s:
            s.sendall(f"GET /api/state?token={dash.token} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            s.settimeout(10)
            first = s.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            assert _closed_within(s, 10) is not None


def test_keep_alive_requests_do_not_wait_for_delayed_acks():
    """The head and the body are two writes: with Nagle's algorithm each answer waited ~40 ms."""
    import http.client
    import statistics

    with Dashboard(quiet=True) as dash:
        conn = http.client.HTTPConnection("127.0.0.1", dash.port, timeout=10)
        took = []
        for _ in range(41):  # one connection: Linux acks the first segments at once, later ones 40 ms late
            t0 = time.perf_counter()
            conn.request("GET", f"/api/state?token={dash.token}")
            r = conn.getresponse()
            assert r.status == 200 and r.read()
            took.append(time.perf_counter() - t0)
        conn.close()
    assert statistics.median(took) < 0.02, took


def test_the_default_request_timeout():
    assert dserver.REQUEST_TIMEOUT == 10.0
    with Dashboard(quiet=True) as dash:
        assert dash._server.timeout == 10.0


# ------------------------------------------------------------------ the offline `daisy-nb dashboard`


def _tracking(tmp_path):
    from funlib.geometry import Roi

    import daisy_nb

    t = daisy_nb.Task(
        "vol",
        total_roi=Roi((0,), (40,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=lambda b: None,
        read_write_conflict=False,
        tracking_path=str(tmp_path / "trk" / "vol"),
    )
    assert daisy_nb.run_blockwise([t], multiprocessing=False, progress=False, summary=False)


def _serve(tmp_path, *args, env=None, sigint_ignored=False):
    """Start `daisy-nb dashboard trk ARGS`; returns (proc, url)."""
    cmd = [sys.executable, "-m", "daisy_nb", "dashboard", "trk", "--port", "0", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    proc, err = served.start(cmd, cwd=tmp_path, env=env, sigint_ignored=sigint_ignored)
    line = proc.stdout.readline()
    if "daisy_nb dashboard (read-only" not in line:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise AssertionError(line + err.read_text())
    proc.err_path = err
    return proc, line.split(": ", 1)[1].strip()


def _stop(proc):
    return served.stop(proc, proc.err_path)  # ~0.3 s; a deadline of 60 s for a machine loaded 15-fold


@pytest.mark.timeout(120)
def test_offline_dashboard_token_options(tmp_path):
    _tracking(tmp_path)
    proc, url = _serve(tmp_path)  # default: a random token, on 127.0.0.1 too
    try:
        p = urllib.parse.urlsplit(url)
        assert p.hostname == "127.0.0.1" and p.query.startswith("token=") and len(p.query) > 30
        base = f"http://127.0.0.1:{p.port}/"
        assert status(base + "api/state")[0] == 403
        assert json.loads(status(f"{base}api/state?{p.query}")[2])["mode"] == "tracking"
    finally:
        _stop(proc)
    proc, url = _serve(tmp_path, "--token", "cli-tok", env={TOKEN_ENV: "env-tok"})  # the option wins
    try:
        assert url.endswith("/?token=cli-tok")
        assert status(url.replace("cli-tok", "env-tok"))[0] == 403 and status(url)[0] == 200
    finally:
        _stop(proc)
    proc, url = _serve(tmp_path, "--no-token")
    try:
        assert "?" not in url and status(url + "api/state")[0] == 200
    finally:
        err = _stop(proc)
    assert "no token" in err  # the warning


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_offline_dashboard_ends_on_a_signal_when_started_in_the_background(tmp_path, sig):
    """Started as `daisy-nb dashboard trk &` from a script (SIGINT ignored, so Python raises no
    KeyboardInterrupt), `kill -INT` and `kill -TERM` still end it cleanly with exit code 0."""
    _tracking(tmp_path)
    proc, url = _serve(tmp_path, sigint_ignored=True)
    assert status(url)[0] == 200
    if sig == signal.SIGINT:
        _stop(proc)
    else:
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()


@needs_ipv6
@pytest.mark.timeout(120)
def test_offline_dashboard_on_ipv6(tmp_path):
    _tracking(tmp_path)
    proc, url = _serve(tmp_path, "--bind", "::1", env={TOKEN_ENV: "six"})
    try:
        assert url.startswith("http://[::1]:") and url.endswith("/?token=six")
        port = urllib.parse.urlsplit(url).port
        assert status(f"http://[::1]:{port}/api/state")[0] == 403
        assert json.loads(status(f"http://[::1]:{port}/api/state?token=six")[2])["tasks"][0]["completed"] == 4
    finally:
        _stop(proc)
