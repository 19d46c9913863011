"""One :class:`~daisy_nb.runtime.net.client.Client`'s connection to its scheduler: :class:`Connection`.

The worker side of the TCP wire below the block protocol: the socket and its frame
session (:mod:`.frames`, set up by :func:`.transport.connect`), frames out one sender at
a time (the client's thread and its heartbeat thread both send), frames in decoded into
an inbox (:mod:`.wire`), when the scheduler was last heard and last told anything, the
heartbeat it is owed, whether the connection is over (closed, broken, silent), and its
close: after a goodbye, read to the scheduler's own close, so that a reset cannot discard
the last frames sent.

It decides nothing about blocks (what a frame means, which block to ask for, give back or
release is the :class:`Client`'s) and nothing about the run's end (the client's
``_ExitWithRun``). Standard library only: a worker program imports it.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import deque

from daisy_nb.runtime.net import frames, wire

__all__ = ["Connection"]

_PING = wire.encode_ping()
_CLOSE_DRAIN_SECS = 5.0  # at most this long reading to the scheduler's close after a goodbye


class Connection:
    """An authenticated connection to the scheduler (see the module docstring).

    Parameters
    ----------
    sess : frames.Session
        The connected socket and its frame codec, from :func:`.transport.connect`.
    peer_timeout : float
        Seconds of silence from the scheduler after which the connection is over.
    since : float
        ``time.monotonic()`` when the connection was begun: the silence counts from there.

    Notes
    -----
    Two locks: ``send_lock``, one sender at a time; ``reading``, one reader of the socket and
    the inbox at a time (reentrant: the client holds it across a request, the heartbeat
    thread tries it without waiting). After :meth:`close`, ``sock`` and ``sess`` are None,
    :meth:`send` returns False and :meth:`read` raises ``EOFError``.
    """

    def __init__(self, sess: frames.Session, peer_timeout: float, since: float) -> None:
        self.sess: frames.Session | None = sess
        self.sock: socket.socket | None = sess.sock
        self.peer_timeout = peer_timeout
        self.send_lock = threading.Lock()
        self.reading = threading.RLock()
        self.inbox: deque = deque()  # messages read and not used yet (a block sent ahead, no more work)
        self.last_send = self.last_recv = since
        self._poll = select.poll()
        self._poll.register(sess.sock, select.POLLIN)

    @property
    def is_open(self) -> bool:
        """Not closed yet (by :meth:`close`)."""
        return self.sock is not None

    def send(self, payload: bytes) -> bool:
        """Send one frame: True, or False when the connection is closed already.

        Raises
        ------
        OSError
            Sending failed (the caller decides what a lost connection means).
        """
        with self.send_lock:
            if self.sess is None:
                return False
            self.sess.send(payload)
            self.last_send = time.monotonic()
            return True

    def ping_if_due(self, now: float, heartbeat: float) -> None:
        """A heartbeat when nothing was sent for ``heartbeat`` seconds (also while a block runs).

        A failed send is left to the client's thread: it finds out on its next send or receive.
        """
        if now - self.last_send < heartbeat:
            return
        with self.send_lock:
            if self.sess is not None:
                try:
                    self.sess.send(_PING)
                    self.last_send = time.monotonic()
                except OSError:
                    pass

    def read(self, wait: bool) -> None:
        """Move the frames that arrived into :attr:`inbox` (heartbeats dropped); ``wait``: block
        (up to the socket's timeout, ``peer_timeout``) for bytes. The caller holds ``reading``.

        Raises
        ------
        EOFError
            The connection is closed (by us or by the scheduler).
        OSError
            It broke: a frame failed its check (``FrameError``, a ``ConnectionError``), an
            authentic frame that is not the scheduler's (``ConnectionError``), a timeout
            (``TimeoutError``) or a socket error.
        """
        sock, sess = self.sock, self.sess
        if sock is None or sess is None:
            raise EOFError("disconnected")
        if sess.broken is not None:  # a frame failed its check: never read past it
            raise frames.FrameError(sess.broken)
        if not wait and not self._poll.poll(0):
            return
        data = sock.recv(65536)
        if not data:
            raise EOFError("the scheduler closed the connection")
        self.last_recv = time.monotonic()
        # a frame that fails its check raises FrameError (a ConnectionError): a lost connection
        try:
            msgs = [wire.decode_server(m) for m in sess.feed(data)]
        except wire.WireError as e:  # authentic but not ours: as a lost connection
            raise ConnectionError(f"unexpected frame from the scheduler ({e})") from None
        self.inbox.extend(m for m in msgs if m is not wire.PING)

    def watch(self, now: float) -> str | None:
        """Why the connection is over (closed by the scheduler, broken, silent for ``peer_timeout``
        seconds), or None; what arrived meanwhile goes to the inbox. The caller holds ``reading``."""
        if self.sock is None:
            return None
        try:
            self.read(False)
        except (EOFError, OSError) as e:
            return str(e) or type(e).__name__
        if now - self.last_recv > self.peer_timeout:
            return f"no word from it for {self.peer_timeout:g} s"
        return None

    def close(self, goodbye: bytes | None = None) -> OSError | None:
        """Close the connection (later calls do nothing).

        ``goodbye``: a last frame to send first; once it is sent, read to the scheduler's close
        (closing with unread bytes would reset the connection, and a reset can discard the last
        frames sent). Returns why the goodbye could not be sent (then the socket is just closed).
        """
        err: OSError | None = None
        sent = False
        with self.reading:
            if goodbye is not None:
                try:
                    sent = self.send(goodbye)
                except OSError as e:
                    err = e
            with self.send_lock:
                sock, self.sock, self.sess = self.sock, None, None
        if sock is None:
            return err
        try:
            if sent:
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(min(self.peer_timeout, _CLOSE_DRAIN_SECS))
                while sock.recv(65536):
                    pass
        except OSError:
            pass
        finally:
            sock.close()
        return err
