"""A live dashboard in the browser: progress, rates, workers, errors and where blocks are.

``run_blockwise(..., dashboard=True)`` serves a page on ``http://127.0.0.1:<free
port>/`` for the length of the run (``dashboard=8787`` picks the port; a watching
page gets up to :data:`LINGER_SECS` more to fetch the final state) and prints its
URL once. For a page that outlives the run, or another bind address, make a
:class:`Dashboard` yourself and pass it::

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
import secrets
import sys
import time
from typing import Any

from .live import LiveSource, Tee

__all__ = ["Dashboard", "check_dashboard", "start_for_run", "with_dashboard"]

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


class Dashboard:
    """A dashboard server; shows the run it is passed to (``run_blockwise(..., dashboard=dash)``).

    Parameters
    ----------
    port : int
        0 (default) for a free port.
    host : str
        The bind address, 127.0.0.1 by default. Any other address (another
        loopback address, a LAN address, ``0.0.0.0``) needs this explicit choice,
        and then every request must carry a random token: open :attr:`url`.
    token : str, optional
        The token to require (default: a random one when ``host`` is not
        127.0.0.1/localhost, none otherwise).
    quiet : bool
        Do not print the URL when the server starts.

    The server starts on :meth:`start` (or the first run) and stops on
    :meth:`close`; a context manager does both.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", *, token: str | None = None, quiet: bool = False):
        self.port = _check_port(port)
        self.host = _check_host(host)
        if token is not None and (not isinstance(token, str) or not token):
            raise TypeError("token must be a non-empty str")
        from .server import LOOPBACK_HOSTS

        self.token = token if token is not None else (None if host in LOOPBACK_HOSTS else secrets.token_urlsafe(24))
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
                raise OSError(f"dashboard: cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
            self.port = self._server.port
            if not self.quiet:
                try:
                    print(f"daisy_nb dashboard: {self.url}", file=sys.stdout or sys.__stdout__, flush=True)
                except (AttributeError, OSError, ValueError):  # no usable stdout (pythonw, closed)
                    pass
        return self

    @property
    def url(self) -> str | None:
        """The page's address (with the token, if one is needed); None before :meth:`start`."""
        return None if self._server is None else self._server.url

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

    def __repr__(self) -> str:
        return f"Dashboard({self.url or f'{self.host}:{self.port}, not started'})"


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
