"""A live dashboard in the browser: progress, rates, workers, errors and where blocks are.

``run_blockwise(..., dashboard=True)`` serves a page on ``http://127.0.0.1:<free
port>/`` for the length of the run (``dashboard=8787`` picks the port; a watching
page gets up to :data:`LINGER_SECS` more to fetch the final state) and prints its
URL once, with the random token every request needs (on loopback too: other
users of the machine can reach 127.0.0.1; :func:`resolve_token` for choosing one
or turning it off). For a page that outlives the run, or another bind address
(IPv4 or IPv6), make a :class:`Dashboard` yourself and pass it::

    with daisy_nb.dashboard.Dashboard(port=8787) as dash:
        daisy.run_blockwise(pipeline, dashboard=dash)
        input("press enter to stop the dashboard")

``daisy-nb dashboard PATH...`` serves the same page from block-tracking
directories (:mod:`.offline`).

Parts: :mod:`.live` (the run's state: a progress observer plus read-only views
of the scheduler and the pool), :mod:`.timeline` (the worker timeline the
runtimes report batches to), :mod:`.offline` (the same from tracking stores),
:mod:`.picture` (block-state pictures), :mod:`.server` (HTTP), :mod:`.report`
(the page and its data in one HTML file, ``run_blockwise(..., report=...)``)
and ``static/`` (the page: HTML, CSS and JavaScript, no network access).
Errors are grouped in :mod:`daisy_nb.errors`.

The runtime plumbing is one call: :func:`start_for_run`, which ``run_blockwise``
(and so a ``Server``) makes around its runtime, or :func:`with_dashboard`, the
same around a ``run(progress)`` callable for other front-ends.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import sys
import time
from typing import Any

from daisy_nb import config

from .live import LiveSource, Tee

__all__ = ["TOKEN_ENV", "Dashboard", "check_dashboard", "resolve_token", "start_for_run", "with_dashboard"]

logger = logging.getLogger("daisy")
TOKEN_ENV = config.DASHBOARD_TOKEN.name  # the token of dashboards that are given none; "off": no token

LINGER_SECS = 1.5  # dashboard=True: after the run, how long to wait for a watching page to fetch the end state


def _check_port(port, name: str = "port") -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{name} must be an int (0 for a free port), got {type(port).__name__}")
    if not 0 <= port <= 65535:
        raise ValueError(f"{name} must be in 0..65535, got {port}")
    return port


def _check_host(host) -> str:
    if not isinstance(host, str) or not host:
        raise TypeError(f"host must be a non-empty str (an IP address or 'localhost'), got {host!r}")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"host must be an IP address or 'localhost', got {host!r}") from None
    return host


def _check_token(token: str, name: str) -> str:
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise ValueError(f"{name} must be printable ASCII without spaces, got {token!r}")
    return token


def resolve_token(token: str | bool | None = None) -> str | None:
    """The token a dashboard requires (None: none): the rule of ``Dashboard(token=...)``.

    * ``None`` (default): ``$DAISY_NB_DASHBOARD_TOKEN`` if it is set and not
      empty (``off``: no token), else a random one (``secrets.token_urlsafe(24)``);
    * ``True``: a random one; a str: that one (printable ASCII, no spaces);
    * ``""`` or ``False``: no token. Anyone who can reach the address can then
      read the dashboard (on a shared login node: every user, on 127.0.0.1 too);
      starting it logs a warning.
    """
    if token is None:
        env = config.DASHBOARD_TOKEN.get() or ""
        if env == "off":
            return None
        if env:
            return _check_token(env, f"${TOKEN_ENV}")
        return secrets.token_urlsafe(24)
    if token is True:
        return secrets.token_urlsafe(24)
    if token is False or token == "":
        return None
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, True, False or None, got {type(token).__name__}")
    return _check_token(token, "token")


class Dashboard:
    """A dashboard server; shows the run it is passed to (``run_blockwise(..., dashboard=dash)``).

    The server starts on :meth:`start` (or the first run) and stops on
    :meth:`close`; a context manager does both.

    Parameters
    ----------
    port : int
        0 (default) for a free port.
    host : str
        The bind address, 127.0.0.1 by default: an IPv4 or IPv6 address
        (``"::1"``; ``"::"`` is every address, IPv4 too) or ``localhost``. Any
        other than loopback (a LAN address, ``0.0.0.0``) needs this explicit choice.
    token : str or bool, optional
        Every request must carry it (``?token=`` as in :attr:`url`, an
        ``Authorization: token ...``/``Bearer ...`` header, or the cookie the
        page gets). Default: ``$DAISY_NB_DASHBOARD_TOKEN``, else a random one;
        ``""``/``False`` turns it off (a warning): see :func:`resolve_token`.
    quiet : bool
        Do not print the URL when the server starts.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", *, token: str | bool | None = None, quiet: bool = False):
        self.port = _check_port(port)
        self.host = _check_host(host)
        self.token = resolve_token(token)
        self.quiet = bool(quiet)
        self.source: Any = LiveSource()  # or another source with state/pictures/block (offline.py)
        self._server: Any = None

    def start(self) -> Dashboard:
        """Bind and serve (in a daemon thread); prints the URL once. Idempotent."""
        if self._server is None:
            from .server import DashboardServer

            try:
                self._server = DashboardServer(lambda: self.source, self.host, self.port, self.token)
            except OSError as e:
                h = f"[{self.host}]" if ":" in self.host else self.host
                raise OSError(f"dashboard: cannot listen on {h}:{self.port}: {e.strerror or e}") from None
            self.port = self._server.port
            if self.token is None:
                logger.warning(
                    "daisy_nb dashboard: no token (turned off): anyone who can reach %s can read the run's "
                    "task names, tracebacks, paths and PIDs",
                    self._server.url,
                )
            if not self.quiet:
                try:
                    print(f"daisy_nb dashboard: {self.url}", file=sys.stdout or sys.__stdout__, flush=True)
                except (AttributeError, OSError, ValueError):  # no usable stdout (pythonw, closed)
                    pass
        return self

    @property
    def url(self) -> str | None:
        """The page's address with its token (``http://127.0.0.1:PORT/?token=...``); None before :meth:`start`."""
        return None if self._server is None else self._server.url

    def url_for(self, path: str = "", query: str = "") -> str:
        """The address of ``path`` (``"api/state"``, ``"metrics"``) with ``query`` and the token."""
        if self._server is None:
            raise RuntimeError("the dashboard is not started")
        return self._server.url_for(path, query)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        srv, self._server = self._server, None
        if srv is not None:
            srv.close()
        if isinstance(self.source, LiveSource):
            self.source.scheduler = None  # let the scheduler's arrays go

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:  # without the token: a repr ends up in logs (print dash.url to share it)
        where = self.url.split("?", 1)[0] if self.url else f"{self.host}:{self.port}, not started"
        return f"Dashboard({where}, {'no token' if self.token is None else 'token required'})"


def check_dashboard(dashboard) -> None:
    """Validate ``run_blockwise``'s ``dashboard=`` before any work starts (ValueError/TypeError)."""
    if dashboard is None or dashboard is False or dashboard is True or isinstance(dashboard, Dashboard):
        return
    if isinstance(dashboard, int):
        _check_port(dashboard, "dashboard (a port number)")
        return
    raise TypeError(
        "dashboard must be True (a free port), a port number, a daisy_nb.dashboard.Dashboard or None, "
        f"got {type(dashboard).__name__}"
    )


def start_for_run(dashboard, scheduler, progress, runtime: str = "pool", report=None):
    """Start the dashboard (and/or the run report) of one run: returns ``(observer, finish)``.

    ``observer`` replaces the run's ``progress=`` (it calls the dashboard and the
    user's observer); call ``finish()`` when the run is over, also on errors (it
    records the final states, writes ``report`` (a path, see :mod:`.report`) and
    stops a server made here). With ``dashboard`` None or False and no report:
    ``(progress, no-op)``; with a report only, the same source runs without a server.
    """
    check_dashboard(dashboard)
    no_dash = dashboard is None or dashboard is False
    if no_dash and report is None:
        return progress, lambda: None
    from daisy_nb.progress import resolve_observer

    owned = not no_dash and not isinstance(dashboard, Dashboard)
    dash = None
    if no_dash:
        src = LiveSource()
    else:
        dash = Dashboard(0 if dashboard is True else int(dashboard)) if owned else dashboard
        dash.start()
        src = dash.source
    src.begin(scheduler, runtime)
    observer = Tee(src, resolve_observer(progress, list(scheduler.task_ids)))

    def finish():
        try:
            src.end(scheduler.task_states)
            if report is not None:
                from .report import write_for_run

                write_for_run(report, src)
            # a page is watching: let it see the end (not on Ctrl-C or errors: called from a finally)
            if owned and time.monotonic() < src.wanted_until and sys.exc_info()[0] is None:
                src.final_served.wait(LINGER_SECS)
        finally:
            if owned and dash is not None:
                dash.close()
            if no_dash:
                src.scheduler = None

    return observer, finish


def with_dashboard(dashboard, scheduler, progress, run, runtime: str = "pool"):
    """Run ``run(progress)`` (returns the states) with a live dashboard on ``scheduler``.

    The front-ends' one hook: ``dashboard`` is ``run_blockwise``'s argument (None
    or False: just ``run(progress)``); ``progress`` the user's ``progress=``. The
    dashboard's observer is put next to the user's, the pool hands itself over
    through ``attach_runtime`` (for the workers view), and the final states are
    recorded when ``run`` returns or raises. A server made here for ``True`` or a
    port stops when the run ends; a :class:`Dashboard` passed in stays up.
    """
    observer, finish = start_for_run(dashboard, scheduler, progress, runtime)
    try:
        return run(observer)
    finally:
        finish()
