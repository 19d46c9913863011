"""The dashboard's HTTP server: the standard library's ``ThreadingHTTPServer``.

Read-only: GET only (``http.server`` answers other methods with 501). Routes:

* ``/`` and ``/static/<file>``: the page (shipped in the package, no network);
* ``/api/state``: counts, rates, workers, errors (JSON);
* ``/api/pictures``: one block-state picture per task (JSON, see :mod:`.picture`);
* ``/api/timeline``: the worker timeline (JSON, see :mod:`.timeline`);
* ``/api/block?task=T&panel=P&r=R&c=C`` or ``?task=T&block_id=ID``: the blocks
  under a pixel, their ROIs and tracebacks;
* ``/metrics``: the state in the Prometheus text format (:mod:`.metrics`).

Access: bound to 127.0.0.1 unless another address (IPv4 or IPv6) is asked for
explicitly, and every request, on loopback too, must carry the token of the
printed URL, as Jupyter does (other users of a login node can reach 127.0.0.1):
``?token=...`` (the page passes it on to its own files and API calls), an
``Authorization: token ...`` or ``Bearer ...`` header (a Prometheus scrape
config's ``authorization``), or the cookie a request with a good token gets
(``HttpOnly; SameSite=Strict``, per port; it holds a hash of the token), so
that a reload of the bare address still works. Compared in constant time.
Without a token (turned off explicitly, see :func:`daisy_nb.dashboard.resolve_token`)
the ``Host`` header must name a loopback host or the bind address, so that a web
page the user visits cannot read the dashboard through a DNS name that points to
127.0.0.1.

Each connection gets :data:`REQUEST_TIMEOUT` seconds to send a request's head
(the request line and headers; one deadline for all of it, so a client that
sends a byte at a time cannot hold a thread either), and as long for each write
of the answer; an idle keep-alive connection is closed after as long.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import secrets
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, quote, urlsplit

__all__ = ["LOOPBACK_HOSTS", "REQUEST_TIMEOUT", "DashboardServer"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
REQUEST_TIMEOUT = 10.0  # s a connection gets to send a request's head (and for each write); read at accept
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


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each with the time left to the handler's deadline as its timeout."""

    def __init__(self, handler: _Handler):
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        h = self.handler
        left = h.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request head not received in time")
        h.connection.settimeout(left)
        return h.connection.recv_into(buf)


def _cookie_value(token: str) -> str:
    return hashlib.sha256(b"daisy_nb-dashboard-cookie\0" + token.encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    server_version = "daisy_nb-dashboard"
    protocol_version = "HTTP/1.1"
    # the head and the body go out in two writes: with Nagle's algorithm the body waits for the
    # client's delayed ACK of the head, ~40 ms per request on a keep-alive connection
    disable_nagle_algorithm = True
    deadline = 0.0
    _set_cookie = False

    def log_message(self, format, *args):
        pass

    def setup(self) -> None:
        self.timeout = self.server.owner.timeout
        super().setup()
        self.rfile.close()  # the socket's own file: reads go through the deadline instead
        self.rfile = io.BufferedReader(_DeadlineReader(self))

    def handle_one_request(self) -> None:
        # one deadline for the whole head of the next request (keep-alive: also the idle time before it)
        # (http.server takes a TimeoutError of any read or write for the end of the connection)
        self.deadline = time.monotonic() + self.timeout
        super().handle_one_request()

    def _send(self, code: int, body: bytes, ctype: str, cache: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=300" if cache else "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        if self._set_cookie:
            srv: DashboardServer = self.server.owner
            self.send_header("Set-Cookie", f"{srv.cookie_name}={srv.cookie}; Path=/; HttpOnly; SameSite=Strict")
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
            want = srv.token.encode()
            got = (query.get("token") or [None])[0]
            if got is not None:
                ok = secrets.compare_digest(got.encode(), want)
                self._set_cookie = ok  # a reload of the bare address works from now on
                return ok
            scheme, _, cred = (self.headers.get("Authorization") or "").strip().partition(" ")
            if scheme.lower() in ("token", "bearer"):
                return secrets.compare_digest(cred.strip().encode(), want)
            for part in (self.headers.get("Cookie") or "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == srv.cookie_name:
                    return secrets.compare_digest(value.encode(), srv.cookie.encode())
            return False
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if ":" in host else host
        return name in LOOPBACK_HOSTS or name == srv.host

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self.connection.settimeout(self.timeout)  # the head is in: the whole timeout for each write
        self._set_cookie = False
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if not self._allowed(query):
            self._error(HTTPStatus.FORBIDDEN, "forbidden: open the URL with its token (printed at start)")
            return
        srv: DashboardServer = self.server.owner
        path = parts.path
        if path not in ("/", "/index.html"):
            self._set_cookie = False  # the page sets it; its own files and API calls need not
        try:
            if path in ("/", "/index.html"):
                body, ctype = srv.static["index.html"]
                if srv.token is not None:  # the page's own files need the token too (without cookies)
                    t = f"?token={quote(srv.token, safe='')}".encode()
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
        except Exception as e:  # a bug here must not take the run down; the page shows it, the log has it
            logging.getLogger("daisy").warning(
                "daisy_nb dashboard: %s %s failed", self.command, self.path, exc_info=True
            )
            try:
                self._error(500, f"{type(e).__name__}: {e}")
            except OSError:
                pass


def address_family(host: str) -> socket.AddressFamily:
    """The family to bind ``host`` with: IPv4 for ``localhost`` where it has an IPv4 address."""
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"cannot resolve {host!r}: {e.strerror or e}") from None
    families = [info[0] for info in infos]
    return socket.AF_INET if socket.AF_INET in families else families[0]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False  # a second dashboard on a busy port fails instead of sharing it
    timeout = None  # handle_request() waits for the next connection

    def __init__(self, address, handler):
        self.address_family = address_family(address[0])
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            with contextlib.suppress(OSError):  # "::" means every address: IPv4 too (as http.server's CLI)
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


_STATIC: dict | None = None


class DashboardServer:
    """Serves a source (``state()``, ``pictures()``, ``block(query)``) in a daemon thread.

    ``source`` is a callable returning the current source, so a long-lived server
    can show the next run. ``token``: required on every request (None: no token,
    then the ``Host`` header must be a loopback name or ``host``). ``timeout``: see
    :data:`REQUEST_TIMEOUT` (its default).

    The thread loops on ``handle_request()`` (each request then gets its own
    thread) instead of ``serve_forever()``, whose shutdown waits for its polling
    interval: :meth:`close` wakes the loop with a connection of its own, so a
    run with ``dashboard=True`` ends without delay.
    """

    def __init__(
        self, source, host: str = "127.0.0.1", port: int = 0, token: str | None = None, timeout: float | None = None
    ):
        global _STATIC
        if _STATIC is None:
            _STATIC = _static_files()
        self.source = source
        self.host = host
        self.token = token
        self.timeout = float(REQUEST_TIMEOUT if timeout is None else timeout)
        self.static = _STATIC
        self.httpd = _Server((host, int(port)), _Handler)
        self.httpd.owner = self
        self.port = int(self.httpd.server_address[1])
        self.cookie_name = f"daisy_nb_dashboard_{self.port}"  # cookies ignore ports: one per dashboard
        self.cookie = _cookie_value(token) if token is not None else ""
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

    def url_for(self, path: str = "", query: str = "") -> str:
        """``http://host:port/<path>?<query>&token=...`` (IPv6 hosts in brackets)."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        q = "&".join(x for x in (query, f"token={quote(self.token, safe='')}" if self.token else "") if x)
        return f"http://{h}:{self.port}/{path.lstrip('/')}" + (f"?{q}" if q else "")

    @property
    def url(self) -> str:
        return self.url_for()

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
