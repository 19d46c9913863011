"""The scheduler's side of ``daisy_nb.Client`` connections (0-argument worker functions): the shell.

A part of the pool (:mod:`daisy_nb.runtime.pool`): every method runs in the pool's main loop. The
decisions (requests, releases, blocks sent ahead, parking, quiet time, heartbeats,
block timeouts) are :class:`daisy_nb.runtime.net.handout.HandOut`'s, a core without
I/O; :class:`Clients` owns the sockets, reads and decodes the frames
(:mod:`daisy_nb.runtime.net.wire`), passes the clock in and executes the core's
actions (send a frame, close a connection). Connections arrive authenticated from
:class:`daisy_nb.runtime.net.transport.Listener` (the pool's; the pool hands each over with
:meth:`Clients.add`).

**Waiting.** The connections are registered in a selector of their own, whose
descriptor the pool's :class:`daisy_nb.runtime.pool_parts.Waitables` watches (one entry for every
connection): a wake-up on it is one pass over every readable connection. **Quiet
time** (the core's ``quiet_secs``: every connection holds two blocks) takes
that entry out of the pool's waitables until a deadline; :meth:`Clients.wait_timeout`
bounds the pool's wait by it and puts the entry back once it has passed, so the frames
that arrive meanwhile are taken in one pass, and nothing else (a worker's exit, a new
connection, Ctrl-C) waits for it.

**Ctrl-C** (:meth:`Clients.drain`): nothing more is handed out, the frames already
readable are taken (releases recorded) for at most ``DRAIN_SECS`` or until no
connection is readable, then the run ends as before.

Called by the pool: ``add``, ``on_readable`` (its waitables), ``wait_timeout``,
``serve_parked``, ``holding``, ``check_heartbeats``, ``check_timeouts``,
``running_blocks``, ``drop_task`` (abandonment), ``drain`` (Ctrl-C), ``close_all``
(the run's end), ``listening``, ``abort``, ``attach_timeline``; by the worker
functions' side (:mod:`daisy_nb.runtime.local.functions`, which owns daisy 2.0.0's
diagnoses of worker functions that do not wait, and their spawn count): ``has_client``,
``idle_clients``, ``soon_free``. What it asks and
tells about a connection's worker function goes to :class:`Jobs` (that side); a task
to abandon (a worker that connected too late) goes to the pool's ``abandon`` callback.
"""

from __future__ import annotations

import logging
import selectors
import time
from collections.abc import Callable, Mapping
from typing import Any

from daisy_nb.runtime.local.functions import MUST_BLOCK
from daisy_nb.runtime.local.pool_parts import PoolTaskRun, Waitables
from daisy_nb.runtime.net import wire
from daisy_nb.runtime.net.backups import COPY_LOOK_SECS
from daisy_nb.runtime.net.handout import QUIET_FRACTION, QUIET_MAX_SECS, Close, Conn, HandOut, Jobs

__all__ = ["QUIET_FRACTION", "QUIET_MAX_SECS", "ClientConn", "Clients", "Jobs"]

logger = logging.getLogger("daisy")


DRAIN_SECS = 0.5  # Ctrl-C: the longest the releases already readable are taken for

ClientConn = Conn  # a connection's record (the dashboard reads ``wid`` and ``held``)


class Clients:
    """The sockets of Client connections around the hand-out core (see the module docstring)."""

    def __init__(
        self,
        scheduler,
        tasks: Mapping[str, PoolTaskRun],
        waitables: Waitables,
        jobs: Jobs,
        abandon: Callable[[str, str], None],
        *,
        net: dict[str, float],
    ):
        self.s = scheduler
        self.trs = tasks  # the pool's run records (a hello names its task)
        self.waitables = waitables
        self.jobs = jobs
        self.net = net
        self.core = HandOut(scheduler, tasks, jobs, abandon, net=net, connected_too_late=self._too_late)
        self.where = ""  # where the scheduler listens and what it advertises (see listening)
        self._sel = selectors.DefaultSelector()  # every connection (see the module docstring)
        self._sel_fd = self._sel.fileno()
        self._watched = False  # the selector is in the pool's waitables
        self.quiet_until: float | None = None  # monotonic deadline of the quiet time, or None

    @property
    def clients(self) -> dict:
        """The connections: ``ServerConn -> ClientConn`` (read by the dashboard, the diagnoses)."""
        return self.core.conns

    @property
    def quiet_secs(self) -> float:
        return self.core.quiet_secs

    # ------------------------------------------------------------- coordination
    def attach_timeline(self, timeline) -> None:
        self.core.timeline = timeline

    def abort(self) -> None:
        """The run is being aborted (Ctrl-C, an error): blocks cut short are given back, not failed."""
        self.core.abort()

    def listening(self, where: str) -> None:
        """The listener is up: ``where`` Client connections go (for the diagnoses)."""
        self.where = where

    def add(self, conn) -> None:
        """A new authenticated connection (from the listener's thread, through the pool)."""
        self.core.opened(conn, conn.peer, time.monotonic_ns())
        self._sel.register(conn, selectors.EVENT_READ, conn)
        if not self._watched and self.quiet_until is None:
            self.waitables.add(self._sel_fd, "c", self)
            self._watched = True

    def has_client(self, wid: int, tr: PoolTaskRun) -> bool:
        """A connection of worker ``wid`` of ``tr`` is open (asked by the worker functions' diagnoses)."""
        return any(cc.wid == wid and cc.tr is tr for cc in self.core.conns.values())

    def idle_clients(self, tr: PoolTaskRun) -> int:
        """Connections of ``tr`` that would take a ready block now (asked by the worker functions' spawn count)."""
        return self.core.idle_clients(tr)

    def soon_free(self, tr: PoolTaskRun) -> int:
        """Blocks the busy connections of a paced ``tr`` take within a job's start (the spawn count's too)."""
        return self.core.soon_free(tr, time.monotonic_ns())

    def holding(self) -> bool:
        """Some client holds a block."""
        return self.core.holding()

    def serve_parked(self) -> None:
        """Answer the clients waiting for a block (a block, or ``N`` when none is left)."""
        if self.core.parked:
            self.core.serve_parked(time.monotonic_ns())
            self._execute()

    def drop_task(self, tr: PoolTaskRun) -> None:
        """``tr`` was abandoned: its connections are closed (what they held goes back)."""
        self.core.drop_task(tr.tid)
        self._execute()

    def close_all(self) -> None:
        """The run's end: every connection closed at once (their programs end, see ``runtime.client``)."""
        self.core.close_all()
        self._execute()
        self._unwatch()
        self._sel.close()

    def check_heartbeats(self) -> None:
        """Ping every client (also while it runs a block); drop the ones that went silent."""
        if self.core.conns:
            self.core.heartbeats(time.monotonic_ns())
            self._execute()

    def check_timeouts(self, now: int) -> None:
        """A client's running block past the task's timeout fails; one behind goes back."""
        self.core.check_timeouts(now)
        self._execute()

    def running_blocks(self) -> list:
        """The block each client runs (the first it holds), for the hang alarm."""
        return self.core.running_blocks()

    # ------------------------------------------------------------- reading
    def on_readable(self, _ready: list | None = None, quiet: bool = True) -> None:
        """The pool saw the connections' selector readable: every readable connection in one pass.
        ``quiet``: the quiet time may follow (the pool has no block-function workers)."""
        self._pass(self._sel.select(0))
        if quiet and self.core.quiet_secs > 0 and self.core.conns:
            self._unwatch()
            self.quiet_until = time.monotonic() + self.core.quiet_secs

    def quiet_over(self) -> bool:
        """The quiet time has just ended: the connections are watched again, and the caller takes
        what arrived meanwhile now (``on_readable``), in the same turn of its loop."""
        until = self.quiet_until
        if until is None or time.monotonic() < until:
            return False
        self.quiet_until = None
        if not self.core.conns:
            return False
        self._watch()
        return True

    def wait_timeout(self, limit: float) -> float:
        """How long the pool may wait (at most ``limit``): the quiet time's deadline; once it has
        passed, the connections are watched again."""
        if self.core.copies_due():  # a straggler's copy may be due: launched at the next turn
            limit = min(limit, COPY_LOOK_SECS)
        until = self.quiet_until
        if until is None:
            return limit
        left = until - time.monotonic()
        if left > 0:
            return min(limit, left)
        self.quiet_until = None
        if self.core.conns:
            self._watch()
        return 0.0

    def drain(self, grace: float = DRAIN_SECS) -> int:
        """Ctrl-C: hand out nothing more and take the frames already readable (releases are recorded),
        for at most ``grace`` seconds or until no connection is readable; returns the passes made."""
        self.core.stop()
        self._execute()
        self.quiet_until = None
        deadline = time.monotonic() + grace
        passes = 0
        while self.core.conns and time.monotonic() < deadline:
            ready = self._sel.select(0)
            if not ready:
                break
            self._pass(ready)
            passes += 1
        return passes

    def _pass(self, ready) -> None:
        now = time.monotonic_ns()
        frames: list[tuple] = []
        broken = []
        for key, _ in ready:
            conn = key.data
            try:
                msgs = conn.recv_frames()
            except (EOFError, OSError):
                self.core.lost(conn)
                continue
            try:
                frames.append((conn, [wire.decode_client(m) for m in msgs]))
            except wire.WireError as e:  # from an authenticated peer: a bug, or another release
                logger.warning("closing a connection from %s that sent a malformed frame (%s)", conn.peer, e)
                self.core.lost(conn)
                continue
            if conn.broken is not None:  # the frames before the one that failed are authentic
                broken.append(conn)
        self.core.on_frames(frames, now)
        for conn in broken:  # never interpreted: dropped at once
            self.core.broken(conn, conn.broken)
        self._execute()

    def _execute(self) -> None:
        core = self.core
        while acts := core.take():
            for a in acts:
                conn: Any = a.cid  # a ServerConn
                if isinstance(a, Close):
                    self._close(conn)
                    continue
                try:
                    conn.send_bytes(a.payload)
                except OSError:
                    core.lost(conn)

    def _close(self, conn) -> None:
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            conn.close()
        except OSError as e:
            logger.debug("closing a connection from %s: %s", conn.peer, e)
        if not self.core.conns:
            self._unwatch()

    def _watch(self) -> None:
        if not self._watched:
            self.waitables.add(self._sel_fd, "c", self)
            self._watched = True

    def _unwatch(self) -> None:
        if self._watched:
            self.waitables.discard(self._sel_fd)
            self._watched = False

    def _too_late(self, cc: Conn) -> str | None:
        """The error if ``cc``'s worker function had returned before it said hello (see the core)."""
        if not self.jobs.returned(cc.wid):
            return None
        return (
            f'worker {cc.wid} for task "{cc.tr.tid}" connected after its worker function had already returned. '
            + MUST_BLOCK
        )
