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

from daisy_nb.runtime.client import _RELEASE, _STATS, pack_block, unpack_hello
from daisy_nb.runtime.policy import record_error
from daisy_nb.runtime.processes import job_text

__all__ = ["ClientConn", "ClientsMixin"]

logger = logging.getLogger("daisy")

# daisy 2.0.0's diagnoses of a worker function that does not wait for its worker (its wording, plus
# the launchers); the fix is the same for all of them
_MUST_BLOCK = (
    "0-argument worker functions must block until their worker exits (e.g. `sbatch --wait`, `srun`, `bsub -K`, "
    "`subprocess.run`, or a launcher of `daisy_nb.launch`): daisy tracks worker liveness by that call, so a "
    "fire-and-forget submit (plain `sbatch`, `subprocess.Popen` without waiting) makes daisy respawn "
    "workers it believes dead, burning the worker restarts, and can abandon the task while real workers "
    "still run"
)

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
        self.tl_key = None  # its row in the dashboard's timeline


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
    timeline: Any  # a dashboard.timeline.Timeline, or None
    _died_with_template: Any  # processes.ProcessesMixin

    where: str  # where the scheduler listens and what it advertises (pool._start_listener)
    returned_wids: set[int]
    connected_tids: set[str]
    warned: set[tuple[str, str]]

    if TYPE_CHECKING:

        def _abandon(self, tid: str, reason: str) -> None: ...
        def _nothing_left(self, tr) -> bool: ...
        def _client_lost(self, cc: ClientConn) -> None: ...
        def _client_timed_out(self, cc: ClientConn) -> None: ...

    def _on_client_msg(self, cc: ClientConn, msg: bytes) -> None:
        kind = msg[:1]
        if kind == b"P":  # heartbeat (last_seen is updated on every read)
            return
        if kind == b"H":
            if cc.tr is not None:  # one hello per connection
                self._drop_client(cc)
                return
            tid, cc.wid = unpack_hello(msg)
            cc.tr = self.trs.get(tid)
            if cc.tr is None:
                self._drop_client(cc)
                return
            self.n_clients[tid] = self.n_clients.get(tid, 0) + 1
            self.connected_tids.add(tid)
            w = self.workers.get(cc.wid)
            if w is not None and w.tr is cc.tr:
                w.connected = True
            elif cc.wid in self.returned_wids and not (cc.tr.abandoned or self.s.is_task_done(tid)):
                self._connected_too_late(cc)
            tl = self.timeline
            if tl is not None:  # the row of its worker function (its job), or its own if that has one
                taken = any(c.tl_key == ("w", cc.wid) for c in self.clients.values() if c is not cc)
                if cc.wid in self.workers and not taken:
                    cc.tl_key = ("w", cc.wid)
                else:
                    cc.tl_key = ("c", cc.wid, time.monotonic_ns())  # unique (an id() could be reused)
                    w = self.workers.get(cc.wid)
                    tl.worker(
                        cc.tl_key,
                        tid,
                        "client",
                        f"client of worker {cc.wid}",
                        None,
                        None if w is None else job_text(w.job),
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
            w = self.workers.get(cc.wid)  # the worker function whose job this client is
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
                record_error(
                    self.s.counters[tr.tid], msg[t0:].decode("utf-8", "replace"), log=None if w is None else w.err_path
                )
            if w is not None and w.tr is tr:  # what its worker function's jobs finished (policy.is_job_end)
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
                tr.block_secs.append(secs)
                old = self.client_block_secs.get(tr.tid)
                self.client_block_secs[tr.tid] = secs if old is None else old + AHEAD_EMA * (secs - old)
                if self.timeline is not None and cc.tl_key is not None:
                    self.timeline.bar(cc.tl_key, tr.tid, now / 1e9 - secs, now / 1e9, 1, int(status != 2))
            if status == 2:
                self._send_ahead(cc)

    # ----------------------------------------------- worker functions that do not wait
    def _unreachable_hint(self) -> str:
        return (
            f"the scheduler {self.where}; jobs on other machines need an address of this machine that "
            "they can reach: run_blockwise(host=...) or DAISY_HOST"
        )

    def _function_returned(self, w) -> tuple[bool, str | None]:
        """A worker function returned on its own (exit 0): ``(dirty, reason)`` (see processes._on_exit).

        Its worker still connected: it goes on (daisy 2.0.0 too), with a warning. Returned
        before any block while blocks are ready: a failure (else it would be respawned
        without end); never connected: daisy 2.0.0's diagnosis, and where its job
        should have connected (the job may not reach the address)."""
        tr = w.tr
        self.returned_wids.add(w.wid)
        if any(cc.wid == w.wid and cc.tr is tr for cc in self.clients.values()):
            if (tr.tid, "running") not in self.warned:
                self.warned.add((tr.tid, "running"))
                logger.warning(
                    "task %r: the worker function of worker %d returned while its worker is still connected; %s",
                    tr.tid,
                    w.wid,
                    _MUST_BLOCK,
                )
            return False, None
        if w.acquired or self.s.ready_count(tr.tid) == 0:
            return False, None
        if w.connected:
            return True, (
                f"worker function of worker {w.wid} returned without acquiring any block while blocks were "
                "ready (its worker connected and left without asking for one)"
            )
        return True, (
            f"worker function of worker {w.wid} returned without its worker ever connecting, while the task "
            f"still has work. {_MUST_BLOCK}. If it did wait, its worker could not connect: " + self._unreachable_hint()
        )

    def _unconnected_note(self, w) -> str:
        """For a worker function that failed before any worker of its task connected: where to."""
        if w.connected or w.tr.tid in self.connected_tids:
            return ""
        return f" (no worker of this task has connected yet: {self._unreachable_hint()})"

    def _connected_too_late(self, cc: ClientConn) -> None:
        """A Client said hello for a worker function that had returned: daisy 2.0.0 stops the run
        here (a RuntimeError); daisy_nb abandons the task, which ``run_blockwise`` raises."""
        tr = cc.tr
        msg = (
            f'worker {cc.wid} for task "{tr.tid}" connected after its worker function had already returned. '
            + _MUST_BLOCK
        )
        logger.error("task %r: %s", tr.tid, msg)
        record_error(self.s.counters[tr.tid], msg)
        from daisy_nb.progress import ABANDON_NOT_WAITING

        self._abandon(tr.tid, ABANDON_NOT_WAITING)

    def _check_unconnected(self, now: float) -> None:
        """Warn once per task when its worker functions run but no worker has connected for a while
        (twice the peer timeout: 60 s by default). Jobs still queued are fine; jobs that cannot
        reach the address are what this is about."""
        limit = 2 * self.net["peer_timeout"]
        for tid, tr in self.trs.items():
            if (
                tr.arity != 0
                or tid in self.connected_tids
                or not tr.workers
                or tr.t_spawned is None
                or now - tr.t_spawned < limit
                or (tid, "unconnected") in self.warned
            ):
                continue
            self.warned.add((tid, "unconnected"))
            logger.warning(
                "task %r: no worker has connected in %.0f s since its first worker function started. If the jobs "
                "are still queued, this is expected; if they run, they cannot reach the scheduler: %s",
                tid,
                now - tr.t_spawned,
                self._unreachable_hint(),
            )

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
        if cc.conn.broken is not None and cc.conn in self.clients:  # never interpreted: dropped at once
            logger.warning(
                "task %r: a frame from worker %s at %s failed its integrity check (%s); connection dropped, "
                "%d block(s) it held are handed out again",
                "?" if cc.tr is None else cc.tr.tid,
                cc.wid,
                cc.conn.peer,
                cc.conn.broken,
                len(cc.held),
            )
            self._drop_client(cc)

    def _check_clients(self) -> None:
        """Heartbeats: ping every client (also while it runs a block, so that it can tell a live
        scheduler from a vanished one and end its program); drop the ones that went silent."""
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
            elif now - cc.last_sent > beat:
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

    def _running_client_blocks(self) -> list:
        """The block each client runs (the first it holds), for the hang alarm."""
        out = []
        for cc in list(self.clients.values()):
            if cc.held and cc.tr is not None:
                row, sent = next(iter(cc.held.items()))
                w = self.workers.get(cc.wid)
                pid = w.proc.pid if w is not None and w.proc is not None else None
                out.append((cc.tr.tid, [row], f"Client of worker {cc.wid} at {cc.conn.peer}", pid,
                            max(sent, cc.t_free_ns) / 1e9))  # fmt: skip
        return out

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
            if self.timeline is not None and cc.tl_key is not None and cc.tl_key[0] == "c":
                self.timeline.ended(cc.tl_key)
        self.by_obj.pop(cc.conn, None)
        try:
            cc.conn.close()
        except OSError:
            pass
        if cc.held and cc.tr is not None:
            self._release_held(cc)
