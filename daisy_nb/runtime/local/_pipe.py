"""The socket pair between the pool and a worker: both ends, framed like ``multiprocessing.connection``.

A frame is a 4-byte big-endian signed length, then the bytes; a payload longer than
``2**31 - 1`` bytes has the length -1 followed by an 8-byte unsigned length, as
:class:`multiprocessing.connection.Connection` writes them (a test checks the two against
each other). Both ends use :class:`Pipe` rather than ``multiprocessing``: the worker side
imports nothing it does not need (its start is on every run's critical path), and the
scheduler's process does not keep ``multiprocessing.connection`` and what it imports (~0.2 MB)
for the rest of the program, where the main job's peak comes after the run
(``docs/explanation/pool.md``).

Reads and writes block, as ``Connection``'s do; :meth:`Pipe.poll` says whether a frame
has started to arrive. ``os.read``/``os.write`` retry on ``EINTR`` themselves (PEP 475); a
peer that closed its end makes :meth:`Pipe.recv_bytes` raise ``EOFError`` and
:meth:`Pipe.send_bytes` ``BrokenPipeError``.
"""

from __future__ import annotations

import os
import select
import struct

__all__ = ["Pipe", "pipe_pair"]

_LEN = struct.Struct("!i")
_LEN64 = struct.Struct("!Q")


class Pipe:
    """One end of the socket pair (its descriptor ``fd``, owned: :meth:`close` closes it)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def fileno(self) -> int:
        if self.fd < 0:
            raise OSError("pipe is closed")
        return self.fd

    def send_bytes(self, data: bytes) -> None:
        n = len(data)
        head = _LEN.pack(n) if n <= 0x7FFFFFFF else _LEN.pack(-1) + _LEN64.pack(n)
        view = memoryview(head + data)
        while view:
            view = view[os.write(self.fd, view) :]

    def _read(self, n: int) -> bytes:
        data = os.read(self.fd, n)
        if len(data) == n:
            return data
        if not data:
            raise EOFError
        parts = [data]
        n -= len(data)
        while n:
            data = os.read(self.fd, n)
            if not data:
                raise EOFError
            parts.append(data)
            n -= len(data)
        return b"".join(parts)

    def recv_bytes(self) -> bytes:
        (n,) = _LEN.unpack(self._read(4))
        if n == -1:
            (n,) = _LEN64.unpack(self._read(8))
        return self._read(n) if n else b""

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether something can be read (a frame, or the peer's close) within ``timeout`` seconds
        (None: wait for it)."""
        p = select.poll()
        p.register(self.fileno(), select.POLLIN)
        ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        return bool(p.poll(ms))

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:  # an end dropped unclosed does not keep its descriptor (as Connection's)
        try:
            self.close()
        except OSError:
            pass


def pipe_pair() -> tuple[Pipe, Pipe]:
    """A connected pair of blocking ends (``multiprocessing.Pipe(duplex=True)``'s socket pair)."""
    import socket  # the pool's side only: a worker gets its end as a descriptor

    a, b = socket.socketpair()
    return Pipe(a.detach()), Pipe(b.detach())
