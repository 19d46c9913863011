"""TCP transport of ``daisy_nb.Client`` connections: the handshake, the listener, both ends' sockets.

Used by 0-argument worker functions and the programs they start (cluster jobs), never
by block-function workers (those use shared memory, see ``_shm``). Standard library
only: worker programs import this.

Protocol (version 3) on one TCP connection, all integers little-endian:

1. server -> client: ``MAGIC`` (8 bytes) + server nonce ``Ns`` (16 random bytes).
2. client -> server: ``HMAC-SHA256(secret, b"daisy_nb client" + Ns)`` (32 bytes) +
   client nonce ``Nc`` (16 bytes). The server reads exactly these 48 bytes within
   ``auth`` seconds and compares the MAC with :func:`hmac.compare_digest`; anything
   else (a wrong MAC, silence, an early close, junk, an HTTP request) closes the
   connection. Nothing a peer sends is interpreted before this check passes.
   Handshakes run in the listener's own thread on non-blocking sockets with a
   deadline each, so a silent stranger delays neither other connections nor the run.
   At most ``MAX_PENDING_PER_PEER`` handshakes per peer address (an IPv6 /64) are in
   progress (beyond it that address's oldest is dropped) and ``MAX_PENDING`` in all
   (beyond it the oldest of the address with the most is dropped): a flood from one
   address never evicts another address's handshake. A client whose handshake is
   closed or times out tries once more before it concludes "another run".
3. server -> client: ``HMAC-SHA256(secret, b"daisy_nb server" + Ns + Nc)`` (32 bytes).
   The client checks it, so a worker never talks to another run that reuses the port
   (or to any other program): it treats that as "the run has ended".
4. Frames, both ways, each with a MAC and an implicit sequence number under a key per
   direction derived from the secret and both nonces (:mod:`.frames`: layout, keys,
   why BLAKE2b). A frame that fails is never interpreted: the connection is closed at
   once (the scheduler hands out the blocks it held again, as for a lost client; the
   client treats it as a lost connection). The payload's first byte is its kind (see
   ``client.py``); ``P`` is a heartbeat.

   Why not TLS: Python's :mod:`ssl` has no pre-shared-key ciphersuites before 3.13
   (this package supports 3.10), so TLS would need certificates per run
   (generated with a third-party package, or ``openssl`` on ``PATH``) on a path that
   carries ~100-byte frames; the per-frame MAC costs ~1 µs (benchmarks/bench_frame_mac.py)
   and only the standard library. Frames are authenticated, not encrypted: block
   coordinates and tracebacks are not secret, the run's secret never travels.

Using the frames (a client, a benchmark): :func:`connect` returns a :class:`Session`
(the socket and its :class:`FrameCodec`); ``send_frame(session, payload)``,
``recv_frame(session)`` (blocking) and ``session.feed(data)`` (bytes read by the
caller: the complete frames, verified, in one pass) work on it. The scheduler's end
is a :class:`ServerConn` (``send_bytes``, ``recv_frames``), made by :class:`Listener`.

The secret (32 random bytes per run) travels hex-encoded in the ``DAISY_CONTEXT`` of
worker functions (``authkey``), like the address; block-function workers never connect
and never get it, and ``Context``'s repr hides it. So does liveness: the client sends ``P`` every
``heartbeat`` seconds from a background thread (also while a block runs) and the
server pings clients that wait for work; each side treats ``peer_timeout`` seconds
of silence as the end of the other (the server drops the client and hands its blocks
out again; the client's ``acquire_block`` yields ``None``). TCP keepalive (and
``TCP_USER_TIMEOUT``) on both ends notices a vanished host on the same time scale.
Defaults: ``DAISY_NB_HEARTBEAT_SECS=5``, ``DAISY_NB_PEER_TIMEOUT_SECS=30``,
``DAISY_NB_AUTH_TIMEOUT_SECS=5`` (read by the scheduler and put in the context).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import random
import secrets
import selectors
import socket
import threading
import time

from daisy_nb.runtime.net import wire
from daisy_nb.runtime.net.frames import HEADER, HTAG, MAX_FRAME, TAG, FrameCodec, FrameError, Session

__all__ = [
    "BACKLOG",
    "HEADER",
    "HTAG",
    "MAC",
    "MAGIC",
    "MAX_FRAME",
    "MAX_PENDING",
    "MAX_PENDING_PER_PEER",
    "NONCE",
    "TAG",
    "FrameError",
    "Listener",
    "NotOurRun",
    "ServerConn",
    "connect",
    "keepalive",
    "peer_key",
]

logger = logging.getLogger("daisy")

MAGIC = wire.MAGIC  # "DAISYNB" + the protocol version (see runtime/net/wire.py)
NONCE = 16
MAC = 32
_CLIENT_LABEL = b"daisy_nb client"
_SERVER_LABEL = b"daisy_nb server"
MAX_PENDING = 2048  # handshakes in progress at once (the oldest of the busiest address goes beyond this)
MAX_PENDING_PER_PEER = 128  # per peer address (an IPv6 /64); that address's oldest goes beyond this
# connections the kernel queues before accept (capped by net.core.somaxconn): a job storm overflowing a
# short queue loses SYNs, and each retransmission costs 1 s, 2 s, 4 s (2,000 jobs at once: 6.5 s with 128)
BACKLOG = 4096


class NotOurRun(ConnectionError):
    """The listener at the address is not this worker's run (another run, another program)."""


class _Dropped(NotOurRun):
    """The handshake was closed or timed out: another run, or ours dropped it (a flood); retried once."""


def keepalive(sock: socket.socket, peer_timeout: float) -> None:
    """TCP keepalive and user timeout so that a vanished host is noticed in about ``peer_timeout``."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle, intvl = max(1, int(peer_timeout / 3)), max(1, int(peer_timeout / 6))
        for name, v in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", intvl), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), v)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # unacknowledged data (a heartbeat) bounds it too
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(peer_timeout * 1000))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # pragma: no cover - exotic platforms; the heartbeat still works
        logger.debug("could not enable TCP keepalive", exc_info=True)


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


# -------------------------------------------------------------------------- client
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def connect(host: str, port: int, secret: bytes, timeouts: dict, source: str | None = None) -> Session:
    """Connect and authenticate both ways; returns a :class:`Session` (blocking, ``peer_timeout`` set).

    ``OSError`` if nothing answers (refused, unreachable, timeout); :class:`NotOurRun`
    if something answers that is not this run. A handshake that the listener closes or
    lets time out is tried once more (after 0.05-0.5 s) before concluding "another run":
    a listener under a handshake flood may have dropped ours. ``source``: the local address
    to connect from (a load generator standing in for many machines), else the system's choice.
    """
    try:
        return _connect_once(host, port, secret, timeouts, source)
    except _Dropped as e:
        logger.info("daisy_nb handshake with %s:%s failed (%s); trying once more", host, port, e)
    time.sleep(random.uniform(0.05, 0.5))
    return _connect_once(host, port, secret, timeouts, source)


def _connect_once(host: str, port: int, secret: bytes, timeouts: dict, source: str | None = None) -> Session:
    src = None if source is None else (source, 0)
    sock = socket.create_connection((host, port), timeout=timeouts["auth"], source_address=src)
    try:
        try:
            hello = _recv_exact(sock, len(MAGIC) + NONCE)
            if hello[: len(MAGIC)] != MAGIC:
                theirs = wire.version_of(hello)
                if theirs is None:
                    raise NotOurRun("the listener is not a daisy_nb scheduler")
                # another daisy_nb release: never "the run has ended" (the job would exit 0 having done nothing)
                raise wire.ProtocolVersionError(theirs, where=f"{host}:{port}")
            if not secret:  # a context built by hand: the scheduler is there, but not this worker's
                raise NotOurRun("the context has no authkey")
            ns = hello[len(MAGIC) :]
            nc = secrets.token_bytes(NONCE)
            sock.sendall(_mac(secret, _CLIENT_LABEL, ns) + nc)
            proof = _recv_exact(sock, MAC)
        except (EOFError, ConnectionResetError):
            raise _Dropped("the scheduler closed the connection during authentication (another run)") from None
        except TimeoutError:
            raise _Dropped("no daisy_nb handshake from the listener") from None
        if not hmac.compare_digest(proof, _mac(secret, _SERVER_LABEL, ns, nc)):
            raise NotOurRun("the scheduler could not prove it knows this run's secret (another run)")
        keepalive(sock, timeouts["peer_timeout"])
        sock.settimeout(timeouts["peer_timeout"])
        return Session(sock, FrameCodec.client(secret, ns, nc))
    except BaseException:
        sock.close()
        raise


# -------------------------------------------------------------------------- server
class ServerConn:
    """The scheduler's end of an authenticated connection (non-blocking; never blocks the loop).

    ``broken``: why a frame failed its check (``recv_frames`` returned the frames verified
    before it; the caller closes the connection), else None.
    """

    def __init__(self, sock: socket.socket, peer, codec: FrameCodec):
        self.sock = sock
        self.peer = peer
        self.codec = codec
        self._fd = sock.fileno()
        self._buf = bytearray()
        self.closed = False
        self.broken: str | None = None
        sock.setblocking(False)

    def fileno(self) -> int:
        return self._fd

    def send_bytes(self, payload: bytes) -> None:
        """Send one frame; ``OSError`` if it does not fit at once (the peer has stopped reading)."""
        data = self.codec.seal(payload)
        if self.sock.send(data) != len(data):
            raise OSError("peer is not reading (send buffer full)")

    def recv_frames(self) -> list[bytes]:
        """The complete frames that have arrived, verified (``EOFError`` at end of stream).

        A frame that fails its check sets ``broken`` and ends the list (the frames before
        it are authentic); after that, ``FrameError``."""
        if self.broken is not None:
            raise FrameError(self.broken)
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        if not data:
            raise EOFError("connection closed")
        self._buf += data
        try:
            return self.codec.open(self._buf)
        except FrameError as e:
            self.broken = str(e)
            return e.frames

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()


def peer_key(peer) -> str:
    """Whose handshake slots a connection uses: its IPv4 address, or its IPv6 /64 (one host's usual share)."""
    try:
        a = ipaddress.ip_address(str(peer[0]).split("%")[0])
    except (ValueError, TypeError, IndexError):
        return str(peer)
    if isinstance(a, ipaddress.IPv6Address):
        if a.ipv4_mapped is not None:
            return str(a.ipv4_mapped)
        return str(ipaddress.ip_network(f"{a}/64", strict=False))
    return str(a)


class _Handshake:
    __slots__ = ("buf", "deadline", "key", "nonce", "peer", "sock")

    def __init__(self, sock, peer, deadline):
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.key = peer_key(peer)
        self.nonce = secrets.token_bytes(NONCE)
        self.buf = b""


class _Pending:
    """The handshakes in progress, oldest first, in all and per peer address (see :func:`peer_key`)."""

    def __init__(self):
        self.all: dict[socket.socket, _Handshake] = {}
        self.peers: dict[str, dict[socket.socket, _Handshake]] = {}

    def __contains__(self, sock) -> bool:
        return sock in self.all

    def __len__(self) -> int:
        return len(self.all)

    def values(self):
        return self.all.values()

    def add(self, hs: _Handshake) -> None:
        self.all[hs.sock] = hs
        self.peers.setdefault(hs.key, {})[hs.sock] = hs

    def remove(self, hs: _Handshake) -> None:
        self.all.pop(hs.sock, None)
        group = self.peers.get(hs.key)
        if group is not None:
            group.pop(hs.sock, None)
            if not group:
                del self.peers[hs.key]

    def victim(self, key: str) -> _Handshake | None:
        """The handshake to drop before one from ``key`` joins: ``key``'s oldest at its cap, else
        at the global cap the oldest of the address with the most (a flooder's), else None."""
        group = self.peers.get(key)
        if group is not None and len(group) >= MAX_PENDING_PER_PEER:
            return next(iter(group.values()))
        if len(self.all) >= MAX_PENDING:
            return next(iter(max(self.peers.values(), key=len).values()))
        return None


class Listener:
    """Listens on ``bind_host``; hands each connection that authenticates to ``on_conn(ServerConn)``.

    Accepting and every handshake run in one thread over non-blocking sockets, so a
    stranger (silent, slow, junk) costs at most ``auth`` seconds of its own socket.
    """

    def __init__(self, bind_host: str, secret: bytes, on_conn, timeouts: dict, *, version: int = wire.VERSION):
        self.secret = secret
        self.magic = wire.magic(version)  # another version only in tests (a scheduler of another release)
        self.on_conn = on_conn
        self.timeouts = dict(timeouts)
        self.rejected = 0
        self._probe_ports: set[int] = set()  # local ports of this process's own checks (see reaches)
        self._sock = self._bind(bind_host)
        self.family = self._sock.family
        self.address = self._sock.getsockname()[:2]
        self.port = self.address[1]
        self._stop_r, w = os.pipe()
        self._stop_w: int | None = w
        self._thread = threading.Thread(target=self._loop, name="daisy_nb-listener", daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(host: str) -> socket.socket:
        try:
            infos = socket.getaddrinfo(host, 0, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise ValueError(f"host={host!r}: cannot resolve it ({e})") from None
        err = None
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.bind(addr)
                sock.listen(BACKLOG)
                sock.setblocking(False)
                return sock
            except OSError as e:
                sock.close()
                err = e
        raise ValueError(
            f"host={host!r}: cannot listen on it ({err}); pass an address or name of this machine, "
            "or host='0.0.0.0' to listen on every interface"
        )

    @classmethod
    def check_bindable(cls, host: str) -> None:
        """``ValueError`` naming ``host`` unless this machine can listen on it."""
        cls._bind(host).close()

    def reaches(self, ip: str, timeout: float = 2.0) -> bool:
        """True if a TCP connection from this machine to ``ip`` at our port is greeted by this
        listener's handshake (daisy 2.0.0's connectivity check before advertising an address).
        The check closes at once; the listener drops it without counting or logging it."""
        try:
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            s = socket.socket(fam, socket.SOCK_STREAM)
        except OSError:
            return False
        try:
            s.settimeout(timeout)
            s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", 0))  # our port is known before connecting
            port = s.getsockname()[1]
            self._probe_ports.add(port)
            try:
                s.connect((ip, self.port))
            except OSError:
                self._probe_ports.discard(port)  # nothing reached the listener
                return False
            return _recv_exact(s, len(MAGIC) + NONCE)[: len(MAGIC)] == self.magic
        except (OSError, EOFError):
            return False
        finally:
            s.close()

    def close(self) -> None:
        """Stop accepting, close the socket and any handshake in progress; waits for the thread."""
        w = self._stop_w
        if w is None:
            return
        try:
            os.write(w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        os.close(w)
        os.close(self._stop_r)
        self._stop_w = None

    # ---------------------------------------------------------------- thread
    def _reject(self, hs: _Handshake, why: str) -> None:
        if isinstance(hs.peer, tuple) and len(hs.peer) > 1 and hs.peer[1] in self._probe_ports:
            self._probe_ports.discard(hs.peer[1])  # our own connectivity check (reaches)
            hs.sock.close()
            return
        self.rejected += 1
        log = logger.warning if self.rejected == 1 else logger.debug
        log("closed a connection from %s that did not authenticate (%s); the run goes on", hs.peer, why)
        hs.sock.close()

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ, None)
        sel.register(self._stop_r, selectors.EVENT_READ, "stop")
        pending = _Pending()
        try:
            while True:
                now = time.monotonic()
                timeout = min((h.deadline for h in pending.values()), default=now + 1.0) - now
                for key, _ in sel.select(max(0.0, timeout)):
                    if key.data == "stop":
                        return
                    try:
                        if key.data is None:
                            self._accept(sel, pending)
                        else:
                            self._advance(sel, pending, key.data)
                    except Exception:  # a bug must not stop the listener: drop that one connection
                        logger.exception("daisy_nb listener: unexpected error")
                        hs = key.data
                        if hs is not None and hs.sock in pending:
                            self._drop(sel, pending, hs, "internal error")
                now = time.monotonic()
                for hs in [h for h in pending.values() if h.deadline <= now]:
                    self._drop(sel, pending, hs, f"no answer within {self.timeouts['auth']:g} s")
        finally:
            for hs in list(pending.values()):
                hs.sock.close()
            sel.close()
            self._sock.close()

    def _drop(self, sel, pending: _Pending, hs: _Handshake, why: str) -> None:
        pending.remove(hs)
        sel.unregister(hs.sock)
        self._reject(hs, why)

    def _accept(self, sel, pending) -> None:
        while True:
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: leave it in the backlog, try again on the next wake-up
                logger.debug("accept failed", exc_info=True)
                return
            sock.setblocking(False)
            hs = _Handshake(sock, peer, time.monotonic() + self.timeouts["auth"])
            try:
                sock.send(self.magic + hs.nonce)  # 24 bytes into an empty buffer
            except OSError:
                self._reject(hs, "closed at once")
                continue
            while (victim := pending.victim(hs.key)) is not None:
                self._drop(sel, pending, victim, f"too many handshakes at once (from {victim.key})")
            pending.add(hs)
            sel.register(sock, selectors.EVENT_READ, hs)

    def _advance(self, sel, pending, hs: _Handshake) -> None:
        if hs.sock not in pending:  # dropped earlier in this wake-up
            return
        try:
            chunk = hs.sock.recv(MAC + NONCE - len(hs.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(sel, pending, hs, str(e))
            return
        if not chunk:
            self._drop(sel, pending, hs, "closed before answering")
            return
        hs.buf += chunk
        if len(hs.buf) < MAC + NONCE:
            return
        pending.remove(hs)
        sel.unregister(hs.sock)
        if not hmac.compare_digest(hs.buf[:MAC], _mac(self.secret, _CLIENT_LABEL, hs.nonce)):
            self._reject(hs, "wrong answer")
            return
        proof = _mac(self.secret, _SERVER_LABEL, hs.nonce, hs.buf[MAC:])
        try:
            if hs.sock.send(proof) != len(proof):
                raise OSError("short send")
        except OSError as e:
            self._reject(hs, str(e))
            return
        keepalive(hs.sock, self.timeouts["peer_timeout"])
        nc = hs.buf[MAC:]
        self.on_conn(ServerConn(hs.sock, hs.peer, FrameCodec.server(self.secret, hs.nonce, nc)))
