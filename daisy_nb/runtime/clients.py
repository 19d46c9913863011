"""The scheduler's side of ``daisy_nb.Client`` connections (0-argument worker functions).

A mixin of the pool (``pool._Pool``): every method runs in the pool's main loop.
Connections arrive authenticated from :class:`daisy_nb.runtime._net.Listener`;
frames are those of :mod:`daisy_nb.runtime.client`.

**Blocks sent ahead.** A client asks (``A``) and waits a round trip for every block
(~0.3 ms on a loaded 2-core VM, as long as a fast block itself). For fast blocks the
scheduler therefore sends the *next* block along (one at most, so a client holds at
most the block it runs and one waiting behind it): after a client's first blocks,
while the task's blocks take less than ``batch_target_secs`` (as the pool's batches)
and the ready blocks cover two per client of the task. The client takes a waiting
block without asking; an ``A`` that crosses a block already on its way is answered
by that block. A block waiting behind is given back uncounted: ``G`` after a
failure or a second of not asking, ``Q`` (goodbye: everything it holds) when the
client closes. When a connection drops, the block it was running fails (an attempt)
and the one behind it is given back (status 0), as in the pool's batches.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from daisy_nb.runtime.client import _RELEASE, _STATS, pack_block
from daisy_nb.runtime.policy import record_error

__all__ = ["ClientConn", "ClientsMixin"]

logger = logging.getLogger("daisy")

_INDEX = struct.Struct("<q")
AHEAD_EMA = 0.2  # weight of the newest block in the per-task mean block time


class ClientConn:
    def __init__(self, conn):
        self.conn = conn
        self.tr = None  # the pool's _TaskRun, once the client said hello
        self.wid = -1
        self.held: dict[int, int] = {}  # block index -> monotonic_ns when sent, in the order sent
        self.parked = False
        self.last_seen = self.last_sent = time.monotonic()  # heartbeats
        self.t_free_ns = time.monotonic_ns()  # when its previous block ended (block time estimates)


class ClientsMixin:
    """Client messages, block hand-out, heartbeats and drops (see the module docstring)."""

    # set by the pool (pool._Pool)
    s: Any  # the Scheduler
    trs: dict
    workers: dict
    clients: dict
    by_obj: dict
    n_clients: dict[str, int]
    client_block_secs: dict[str, float]
    next_wid: int
    target: float
    net: dict[str, float]
    aborting: bool
    _died_with_template: Any  # processes.ProcessesMixin

    if TYPE_CHECKING:

        def _nothing_left(self, tr) -> bool: ...
        def _client_lost(self, cc: ClientConn) -> None: ...
        def _client_timed_out(self, cc: ClientConn) -> None: ...

    def _on_client_msg(self, cc: ClientConn, msg: bytes) -> None:
        kind = msg[:1]
        if kind == b"P":  # heartbeat (last_seen is updated on every read)
            return
        if kind == b"H":
            tid, wid = msg[1:].decode().split("\n")
            cc.wid = int(wid)
            cc.tr = self.trs.get(tid)
            if cc.tr is None:
                self._drop_client(cc)
                return
            self.n_clients[tid] = self.n_clients.get(tid, 0) + 1
            if 0 <= cc.wid < self.next_wid and cc.wid not in self.workers and not self.s.is_done():
                logger.warning(
                    "task %r: worker %d connected after its worker function had already returned; 0-argument "
                    "worker functions must block until the worker they start exits (subprocess.run, "
                    "`bsub -K`, `sbatch --wait`, `srun`): a returned one is replaced, so a fire-and-forget "
                    "submit starts workers without end",
                    tid,
                    cc.wid,
                )
            return
        tr = cc.tr
        if tr is None:
            self._drop_client(cc)
            return
        if kind == b"A":
            if cc.held:  # the client asked before a block sent ahead arrived: that block answers it
                cc.parked = False
            else:
                cc.parked = True
                self._serve_client(cc)
            self._send_ahead(cc)
        elif kind == b"Q":  # goodbye: a client leaves between blocks, so what it holds was never started
            if cc.held:
                self._release_held(cc, fail_running=False)
            self._drop_client(cc)  # it reads until we close
        elif kind == b"G":  # a block sent ahead, never started: back to the front of the queue
            (index,) = _INDEX.unpack_from(msg, 1)
            if cc.held.pop(index, None) is not None:
                self.s.release_blocks(tr.tid, np.array([index], np.int64), np.zeros(1, np.uint8))
                tr.inflight -= 1
        elif kind in (b"R", b"F", b"E"):
            stats = None
            if kind == b"R":
                index, status = _RELEASE.unpack_from(msg, 1)
                if len(msg) >= 1 + _RELEASE.size + _STATS.size:  # a tracked release carries its stats
                    stats = _STATS.unpack_from(msg, 1 + _RELEASE.size)
            else:
                (index,) = _INDEX.unpack_from(msg, 1)
                status = 3
                t0 = 9
                if kind == b"E":  # a failure with stats (resource_tracking)
                    stats = _STATS.unpack_from(msg, 9)
                    t0 += _STATS.size
                record_error(self.s.counters[tr.tid], msg[t0:].decode("utf-8", "replace"))
            w = self.workers.get(cc.wid)  # what its worker function's jobs finished (policy.is_job_end)
            if w is not None and w.tr is tr:
                w.client_raised = kind != b"R"
            else:
                w = None
            sent = cc.held.pop(index, None)
            if sent is not None:  # else: reclaimed after a timeout
                if w is not None and status == 2:
                    w.finished += 1
                if stats is not None and tr.res is not None:
                    tr.res.add_one(stats, status != 2)
                self.s.release_blocks(
                    tr.tid, np.array([index], np.int64), np.array([2 if status == 2 else 3], np.uint8)
                )
                tr.inflight -= 1
                now = time.monotonic_ns()
                secs = (now - max(sent, cc.t_free_ns)) / 1e9
                cc.t_free_ns = now
                old = self.client_block_secs.get(tr.tid)
                self.client_block_secs[tr.tid] = secs if old is None else old + AHEAD_EMA * (secs - old)
            if status == 2:
                self._send_ahead(cc)

    def _send_ahead(self, cc: ClientConn) -> None:
        """Send a fast-block client its next block while it runs this one (see the module docstring)."""
        tr = cc.tr
        if len(cc.held) != 1 or tr.abandoned:
            return
        secs = self.client_block_secs.get(tr.tid)
        if secs is None or secs >= self.target:
            return
        if self.s.ready_count(tr.tid) >= 2 * self.n_clients.get(tr.tid, 1):
            self._serve_client(cc, ahead=True)

    def _serve_client(self, cc: ClientConn, ahead: bool = False) -> None:
        tr = cc.tr
        if not tr.abandoned and self.s.ready_count(tr.tid) > 0:
            b = self.s.acquire_blocks(tr.tid, 1)
            if len(b.index):
                i = int(b.index[0])
                msg = pack_block(
                    i,
                    int(b.spatial_id[0]),
                    b.read_offset[0].tolist(),
                    b.read_shape[0].tolist(),
                    b.write_offset[0].tolist(),
                    b.write_shape[0].tolist(),
                )
                cc.held[i] = time.monotonic_ns()
                cc.last_sent = time.monotonic()
                tr.inflight += 1
                cc.parked = False
                w = self.workers.get(cc.wid)
                if w is not None:
                    w.acquired += 1
                if tr.t_first is None:
                    tr.t_first = time.monotonic()
                try:
                    cc.conn.send_bytes(msg)
                except OSError:
                    self._drop_client(cc)
                return
        if not ahead and self._nothing_left(tr):
            cc.parked = False
            try:
                cc.conn.send_bytes(b"N")
            except OSError:
                self._drop_client(cc)

    def _on_client_readable(self, cc: ClientConn) -> None:
        try:
            msgs = cc.conn.recv_frames()
        except (EOFError, OSError):
            self._drop_client(cc)
            return
        cc.last_seen = time.monotonic()
        for msg in msgs:
            if cc.conn not in self.clients:
                return  # dropped by an earlier frame
            try:
                self._on_client_msg(cc, msg)
            except (struct.error, ValueError):  # a malformed frame (from an authenticated peer)
                self._drop_client(cc)

    def _check_clients(self) -> None:
        """Heartbeats: ping clients that wait for work; drop the ones that went silent."""
        now = time.monotonic()
        beat, dead = self.net["heartbeat"], self.net["peer_timeout"]
        for cc in list(self.clients.values()):
            if now - cc.last_seen > dead:
                tid = cc.tr.tid if cc.tr is not None else "?"
                logger.warning(
                    "task %r: worker %s at %s sent nothing for %.0f s; dropped, %d block(s) it held are handed "
                    "out again",
                    tid,
                    cc.wid,
                    cc.conn.peer,
                    now - cc.last_seen,
                    len(cc.held),
                )
                self._drop_client(cc)
                self._client_lost(cc)
            elif cc.parked and now - cc.last_sent > beat:
                try:
                    cc.conn.send_bytes(b"P")
                    cc.last_sent = now
                except OSError:
                    self._drop_client(cc)

    def _client_timeouts(self, now: int) -> None:
        """A client's running block (the first it holds) past the task's timeout fails; one behind goes back."""
        for cc in list(self.clients.values()):
            tr = cc.tr
            if tr is None or tr.timeout_ns is None or not cc.held:
                continue
            sent = next(iter(cc.held.values()))
            if now - max(sent, cc.t_free_ns) <= tr.timeout_ns:  # it started when the previous one ended
                continue
            self.s.counters[tr.tid].timeout_reclaim_count += 1
            self._release_held(cc)
            self._client_timed_out(cc)

    def _release_held(self, cc: ClientConn, fail_running: bool = True) -> None:
        """The block ``cc`` runs fails (an attempt); blocks behind it were never started: given back.

        Given back too on Ctrl-C, as in the pool's batches, and when the connection's worker
        died with the worker template (its death signal: not the block's fault, as for block
        workers in ``processes._on_exit``). A program that worker started connects with the
        same worker id; the pool ends those along with the worker. ``fail_running=False``
        (a goodbye, sent between blocks): every block it holds is given back.
        """
        idx = np.array(list(cc.held), np.int64)
        st = np.zeros(len(idx), np.uint8)
        if fail_running and not (self.aborting or self._died_with_template(cc.wid)):
            st[0] = 3
        cc.held.clear()
        self.s.release_blocks(cc.tr.tid, idx, st)
        cc.tr.inflight -= len(idx)

    def _drop_client(self, cc: ClientConn) -> None:
        if self.clients.pop(cc.conn, None) is not None and cc.tr is not None:
            self.n_clients[cc.tr.tid] -= 1
        self.by_obj.pop(cc.conn, None)
        try:
            cc.conn.close()
        except OSError:
            pass
        if cc.held and cc.tr is not None:
            self._release_held(cc)
