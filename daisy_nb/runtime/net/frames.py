"""Authenticated frames of ``daisy_nb.Client`` connections (after :mod:`.transport`'s handshake).

One key per direction, derived from the run's secret and both handshake nonces
(:func:`session_keys`: an HMAC-based KDF; the secret is already 32 random bytes), and an
implicit sequence number per direction (0, 1, 2, ...; never sent). A frame is::

    u32 n | htag (8) | payload (n bytes, at most MAX_FRAME) | tag (16)
    htag = BLAKE2b-64(key, person "daisy_nb hdr",   seq u64 | n u32)
    tag  = BLAKE2b-128(key, person "daisy_nb frame", seq u64 | n u32 | payload)

The length is checked (``htag``) before the receiver waits for the body, so a changed
length is caught at once instead of after ``peer_timeout`` seconds of waiting; a frame
that is changed, dropped, replayed, reordered, or taken from the other direction or
another connection fails its tag. Keyed BLAKE2b (:mod:`hashlib`) rather than
HMAC-SHA256: the cheaper of the two in the standard library, ~2x here per frame
(``benchmarks/bench_frame_mac.py``). Standard library only: worker programs import this.

Use: :class:`FrameCodec` (``seal`` a payload, ``open`` a receive buffer: every complete
frame in one pass, verified); :class:`Session` (a client's blocking socket and its codec,
what ``transport.connect`` returns), with ``send_frame(session, payload)`` and
``recv_frame(session)``.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct

__all__ = ["FrameCodec", "FrameError", "Session", "recv_frame", "send_frame", "session_keys", "split_frames"]

MAX_FRAME = 1 << 20  # tracebacks are capped at 8 KiB; a block frame is < 1 KiB
_LEN = struct.Struct("<I")
_SEQ_LEN = struct.Struct("<QI")  # what a frame's tags cover besides the payload
HTAG = 8  # header tag bytes (the length's)
TAG = 16  # frame tag bytes
HEADER = _LEN.size + HTAG  # bytes before the payload
_KEY_LABELS = (b"daisy_nb frames client->server", b"daisy_nb frames server->client")


class FrameError(ConnectionError):
    """A frame failed its integrity check (or broke the protocol): the connection is over.

    ``frames``: the frames verified before it in the same read (authentic, in order)."""

    def __init__(self, why: str, frames: list[bytes] | None = None):
        super().__init__(why)
        self.frames = frames or []


def session_keys(secret: bytes, ns: bytes, nc: bytes) -> tuple[bytes, bytes]:
    """``(client->server key, server->client key)`` of one connection (both nonces: fresh per connection)."""
    return tuple(hmac.digest(secret, label + ns + nc, "sha256") for label in _KEY_LABELS)  # type: ignore[return-value]


class FrameCodec:
    """One connection's frame authentication, both directions (see the module docstring).

    :meth:`seal` makes the next outgoing frame (callers that send from several threads
    seal and send under one lock, so frames leave in sequence order); :meth:`open`
    takes the complete frames off the front of a receive buffer, verified, in one pass.
    """

    __slots__ = ("_rh", "_rseq", "_rt", "_sh", "_sseq", "_st")

    def __init__(self, send_key: bytes, recv_key: bytes):
        # keyed states, copied per frame (cheaper than keying each time)
        self._sh = hashlib.blake2b(key=send_key, digest_size=HTAG, person=b"daisy_nb hdr")
        self._st = hashlib.blake2b(key=send_key, digest_size=TAG, person=b"daisy_nb frame")
        self._rh = hashlib.blake2b(key=recv_key, digest_size=HTAG, person=b"daisy_nb hdr")
        self._rt = hashlib.blake2b(key=recv_key, digest_size=TAG, person=b"daisy_nb frame")
        self._sseq = self._rseq = 0

    @classmethod
    def client(cls, secret: bytes, ns: bytes, nc: bytes) -> FrameCodec:
        c2s, s2c = session_keys(secret, ns, nc)
        return cls(c2s, s2c)

    @classmethod
    def server(cls, secret: bytes, ns: bytes, nc: bytes) -> FrameCodec:
        c2s, s2c = session_keys(secret, ns, nc)
        return cls(s2c, c2s)

    def seal(self, payload: bytes) -> bytes:
        """The frame carrying ``payload`` (the next in this direction's sequence)."""
        n = len(payload)
        if n > MAX_FRAME:
            raise ValueError(f"payload of {n} bytes exceeds MAX_FRAME ({MAX_FRAME})")
        sl = _SEQ_LEN.pack(self._sseq, n)
        self._sseq += 1
        h = self._sh.copy()
        h.update(sl)
        t = self._st.copy()
        t.update(sl)
        t.update(payload)
        return sl[8:] + h.digest() + payload + t.digest()

    def open(self, buf: bytearray) -> list[bytes]:
        """Remove the complete frames at the front of ``buf`` and return their payloads, verified.

        :class:`FrameError` (with the frames verified before it) at the first that fails;
        a header is checked as soon as it is in, before waiting for its body."""
        out: list[bytes] = []
        pos, end = 0, len(buf)
        mv = memoryview(buf)
        try:
            while end - pos >= HEADER:
                (n,) = _LEN.unpack_from(buf, pos)
                sl = _SEQ_LEN.pack(self._rseq, n)
                h = self._rh.copy()
                h.update(sl)
                if not hmac.compare_digest(mv[pos + _LEN.size : pos + HEADER], h.digest()):
                    raise FrameError(f"frame {self._rseq} failed its integrity check (header)", out)
                if n > MAX_FRAME:
                    raise FrameError(f"frame of {n} bytes (protocol error)", out)
                stop = pos + HEADER + n + TAG
                if end < stop:
                    break
                t = self._rt.copy()
                t.update(sl)
                t.update(mv[pos + HEADER : stop - TAG])
                if not hmac.compare_digest(mv[stop - TAG : stop], t.digest()):
                    raise FrameError(f"frame {self._rseq} failed its integrity check", out)
                out.append(bytes(mv[pos + HEADER : stop - TAG]))
                self._rseq += 1
                pos = stop
        finally:
            mv.release()
            del buf[:pos]
        return out


class Session:
    """The client's end of an authenticated connection: a blocking socket and its :class:`FrameCodec`.

    ``broken``: why a frame failed its check (every later ``feed``/``recv`` raises
    :class:`FrameError` again), else None."""

    __slots__ = ("_buf", "_ready", "broken", "codec", "sock")

    def __init__(self, sock: socket.socket, codec: FrameCodec):
        self.sock = sock
        self.codec = codec
        self.broken: str | None = None
        self._buf = bytearray()
        self._ready: list[bytes] = []  # frames read by recv and not returned yet

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, payload: bytes) -> None:
        self.sock.sendall(self.codec.seal(payload))

    def feed(self, data: bytes) -> list[bytes]:
        """The frames completed by ``data`` (read from ``sock`` by the caller), verified."""
        if self.broken is not None:
            raise FrameError(self.broken)
        self._buf += data
        try:
            return self.codec.open(self._buf)
        except FrameError as e:
            self.broken = str(e)
            raise

    def recv(self) -> bytes:
        """The next frame (blocking, within the socket's timeout)."""
        while not self._ready:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("connection closed")
            self._ready.extend(self.feed(data))
        return self._ready.pop(0)

    def close(self) -> None:
        self.sock.close()


def send_frame(session: Session, payload: bytes) -> None:
    """Send one frame on a client :class:`Session`."""
    session.send(payload)


def recv_frame(session: Session) -> bytes:
    """The next frame of a client :class:`Session` (blocking); :class:`FrameError` if it fails."""
    return session.recv()


def split_frames(buf: bytearray, codec: FrameCodec) -> list[bytes]:
    """Remove the complete frames at the front of ``buf`` and return their payloads, verified."""
    return codec.open(buf)
