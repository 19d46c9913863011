"""The dashboard's HTTP server: the standard library's ``ThreadingHTTPServer``.

Read-only: GET only (``http.server`` answers other methods with 501). Routes:

* ``/`` and ``/static/<file>``: the page (shipped in the package, no network);
* ``/api/state``: counts, rates, workers, errors (JSON);
* ``/api/pictures``: one block-state picture per task (JSON, see :mod:`.picture`);
* ``/api/timeline``: the worker timeline (JSON, see :mod:`.timeline`);
* ``/api/block?task=T&panel=P&r=R&c=C`` or ``?task=T&block_id=ID``: the blocks
  under a pixel, their ROIs and tracebacks;
* ``/metrics``: the state in the Prometheus text format (:mod:`.metrics`).

Access: bound to 127.0.0.1 unless another address is asked for explicitly.
Then every request must carry the random token of the printed URL
(``?token=...``; the page passes it on), as Jupyter does. Without a token, the
``Host`` header must name a loopback host, so that a web page the user visits
cannot read the dashboard through a DNS name that points to 127.0.0.1.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

__all__ = ["LOOPBACK_HOSTS", "DashboardServer"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _static_files() -> dict[str, tuple[bytes, str]]:
    out = {}
    root = resources.files(__package__) / "static"
    for entry in root.iterdir():
        name = entry.name
        ext = name[name.rfind(".") :]
        if ext in _TYPES:
            out[name] = (entry.read_bytes(), _TYPES[ext])
    return out


class _Handler(BaseHTTPRequestHandler):
    server_version = "daisy_nb-dashboard"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def _send(self, code: int, body: bytes, ctype: str, cache: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=300" if cache else "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj, code: int = 200) -> None:
        self._send(code, json.dumps(obj, separators=(",", ":"), allow_nan=False).encode(), "application/json")

    def _error(self, code: int, msg: str) -> None:
        self._json({"error": msg}, code)

    def _allowed(self, query: dict) -> bool:
        srv: DashboardServer = self.server.owner
        if srv.token is not None:
            got = (query.get("token") or [""])[0]
            return secrets.compare_digest(got.encode(), srv.token.encode())
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if ":" in host else host
        return name in LOOPBACK_HOSTS or name == srv.host

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if not self._allowed(query):
            self._error(HTTPStatus.FORBIDDEN, "forbidden: open the URL with its token (printed at start)")
            return
        srv: DashboardServer = self.server.owner
        path = parts.path
        try:
            if path in ("/", "/index.html"):
                body, ctype = srv.static["index.html"]
                if srv.token is not None:  # the page's own files need the token too
                    t = f"?token={srv.token}".encode()
                    body = body.replace(b'static/style.css"', b"static/style.css" + t + b'"')
                    body = body.replace(b'static/app.js"', b"static/app.js" + t + b'"')
                self._send(200, body, ctype)
            elif path.startswith("/static/"):
                item = srv.static.get(path[len("/static/") :])
                if item is None:
                    self._error(404, "not found")
                else:
                    self._send(200, item[0], item[1], cache=True)
            elif path == "/api/state":
                self._json(srv.source().state())
            elif path == "/metrics":
                from .metrics import CONTENT_TYPE, render

                self._send(200, render(srv.source().state()).encode(), CONTENT_TYPE)
            elif path == "/api/pictures":
                self._json(srv.source().pictures())
            elif path == "/api/timeline":
                src = srv.source()
                self._json(src.timeline_json() if hasattr(src, "timeline_json") else {"rows": [], "tasks": []})
            elif path == "/api/block":
                q = {k: v[0] for k, v in query.items()}
                try:
                    self._json(srv.source().block(q))
                except (KeyError, ValueError, IndexError) as e:
                    self._error(404, f"no such block or pixel: {e}")
            else:
                self._error(404, "not found")
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # a bug here must not take the run down; the page shows it
            try:
                self._error(500, f"{type(e).__name__}: {e}")
            except OSError:
                pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False  # a second dashboard on a busy port fails instead of sharing it
    timeout = None  # handle_request() waits for the next connection


_STATIC: dict | None = None


class DashboardServer:
    """Serves a source (``state()``, ``pictures()``, ``block(query)``) in a daemon thread.

    ``source`` is a callable returning the current source, so a long-lived server
    can show the next run. ``token``: None on loopback, else required.

    The thread loops on ``handle_request()`` (each request then gets its own
    thread) instead of ``serve_forever()``, whose shutdown waits for its polling
    interval: :meth:`close` wakes the loop with a connection of its own, so a
    run with ``dashboard=True`` ends without delay.
    """

    def __init__(self, source, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        global _STATIC
        if _STATIC is None:
            _STATIC = _static_files()
        self.source = source
        self.host = host
        self.token = token
        self.static = _STATIC
        self.httpd = _Server((host, int(port)), _Handler)
        self.httpd.owner = self
        self.port = int(self.httpd.server_address[1])
        self._stop = False
        self.thread = threading.Thread(target=self._loop, name="daisy_nb-dashboard", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                self.httpd.handle_request()
            except OSError:
                if self._stop:
                    return

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def close(self) -> None:
        self._stop = True
        poke = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        try:
            with socket.create_connection((poke, self.port), timeout=1):
                pass
        except OSError:
            pass
        # the poke is queued in the listen backlog: the loop wakes, finds the socket closed (or
        # accepts the poke) and ends on its own; nothing to wait for here
        self.httpd.server_close()
        self.thread.join(timeout=0.05)
