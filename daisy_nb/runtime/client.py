"""``Client``: the worker side of a 0-argument worker function (daisy 2.0 semantics).

``Client()`` reads ``DAISY_CONTEXT`` (put in the environment of every worker
process by the pool, inherited by programs the worker launches), connects to the
pool's authenticated listener (``multiprocessing.connection`` with the authkey
carried in the context) and hands out one block per ``acquire_block()``.

Messages are tiny ``struct``-packed frames, never pickles: ``H`` hello, ``A``
acquire, ``R`` release, ``F`` failure + traceback; the pool answers ``B`` + block
or ``N`` (no more work). For a ``Task(resource_tracking=True)`` (``resource_tracking=1``
in the context) the body of ``with client.acquire_block()`` is measured with
``profile_block`` and the stats ride on the block's own release frame (``R`` with
five float64 appended; ``E`` instead of ``F``): still one message per block. Blocks held by a connection that drops are failed (and
retried) by the pool.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from contextlib import contextmanager

from daisy_nb.block import Block, BlockStatus
from daisy_nb.runtime.context import Context

__all__ = ["Client"]

logger = logging.getLogger("daisy")

_BLOCK_HDR = struct.Struct("<qqq")  # index, spatial_id, ndim
_RELEASE = struct.Struct("<qq")  # index, status
_STATS = struct.Struct("<5d")  # wall s, cpu s, peak RSS, IO read, IO write (resource_tracking)


def pack_block(index: int, spatial_id: int, ro, rs, wo, ws) -> bytes:
    nd = len(ro)
    return b"B" + _BLOCK_HDR.pack(index, spatial_id, nd) + struct.pack(f"<{4 * nd}q", *ro, *rs, *wo, *ws)


def unpack_block(msg: bytes, task_id: str) -> Block:
    index, spatial, nd = _BLOCK_HDR.unpack_from(msg, 1)
    v = struct.unpack_from(f"<{4 * nd}q", msg, 1 + _BLOCK_HDR.size)
    read = (tuple(v[0:nd]), tuple(v[nd : 2 * nd]))
    write = (tuple(v[2 * nd : 3 * nd]), tuple(v[3 * nd :]))
    b = Block._make(task_id, spatial, read, write, index)
    b._status = BlockStatus.PROCESSING
    return b


def _no_delay(conn) -> None:
    """TCP_NODELAY: a release and the next acquire are two small writes in a row, and with Nagle's
    algorithm the second waits for the pool's delayed ACK (~40 ms per block on Linux)."""
    import socket

    try:
        s = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        finally:
            s.close()
    except OSError:
        pass


class Client:
    """Worker-side client; ``with client.acquire_block() as block:`` yields a ``Block`` or ``None``."""

    def __init__(self, context=None):
        if context is None:
            context = Context.from_env()
        from daisy_nb.logging import get_log_basedir, set_log_basedir

        if "logdir" not in context:
            base = get_log_basedir()
            context["logdir"] = "" if base is None else str(base)
        set_log_basedir(context["logdir"] or None)
        self.context = context
        self.host = context["hostname"]
        self.port = int(context["port"])
        self.worker_id = int(context["worker_id"])
        self.task_id = context["task_id"]
        self._track = context.get("resource_tracking", "0") == "1"
        authkey = bytes.fromhex(context.get("authkey", ""))
        from multiprocessing.connection import Client as _MPClient

        try:
            self._conn = _MPClient((self.host, self.port), authkey=authkey or None)
        except (ConnectionRefusedError, FileNotFoundError):
            self._conn = None
            logger.warning(
                "daisy server at %s:%s is not reachable; assuming the run has ended — "
                "this worker will exit without processing blocks",
                self.host,
                self.port,
            )
            return
        _no_delay(self._conn)
        self._conn.send_bytes(b"H" + f"{self.task_id}\n{self.worker_id}".encode())

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def _request(self):
        if self._conn is None:
            return None
        self._conn.send_bytes(b"A")
        msg = self._conn.recv_bytes()
        if msg[:1] == b"N":
            return None
        return unpack_block(msg, self.task_id)

    @contextmanager
    def acquire_block(self):
        if self._conn is None:
            yield None
            return
        block = self._request()
        if block is None:
            self._disconnect()
            yield None
            return
        reported = False
        prof = None
        if self._track:
            from daisy_nb.profiling import profile_block

            prof = profile_block(block).start()
        try:
            yield block
            if block.status == BlockStatus.PROCESSING:
                block.status = BlockStatus.SUCCESS
        except BaseException as e:
            block.status = BlockStatus.FAILED
            try:
                from daisy_nb import logging as dlog

                tb = dlog.format_traceback(type(e), e, e.__traceback__)
                logger.warning("block %s failed: %s", block.block_id, e)
                sys.stderr.write(f"block {block.block_id} failed:\n{tb}")
                sys.stderr.flush()
                from daisy_nb.runtime.worker import _cap

                text = f"block {block.block_id} failed:\n" + _cap(tb)
                head = b"F" + struct.pack("<q", block.index)
                if prof is not None:
                    head = b"E" + struct.pack("<q", block.index) + self._stats_bytes(prof, block)
                self._conn.send_bytes(head + text.encode("utf-8", "replace"))
                reported = True
            except Exception:
                pass
            raise
        finally:
            if block.status != BlockStatus.SUCCESS:
                block.status = BlockStatus.FAILED
            if not reported:
                tail = b"" if prof is None else self._stats_bytes(prof, block)
                self._conn.send_bytes(b"R" + _RELEASE.pack(block.index, block.status) + tail)

    @staticmethod
    def _stats_bytes(prof, block) -> bytes:
        from daisy_nb.profiling import measured_stats

        return _STATS.pack(*(float(v) for v in measured_stats(prof, block)[:5]))

    def _disconnect(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def __del__(self):
        try:
            self._disconnect()
        except Exception:
            pass
