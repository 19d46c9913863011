"""The scheduler's side of ``daisy_nb.Client`` connections (0-argument worker functions).

A part of the pool (:mod:`.pool`): every method runs in the pool's main loop.
Connections arrive authenticated from :class:`daisy_nb.runtime._net.Listener` (the
pool's; the pool hands each over with :meth:`Clients.add`); frames are those of
:mod:`daisy_nb.runtime.client`. :class:`Clients` owns every connection
(:class:`ClientConn`: the blocks it holds, heartbeats, its timeline row) and the
per-task client counts and block times.

Called by the pool: ``add``, ``on_readable`` (its waitables), ``serve_parked``,
``holding``, ``check_heartbeats``, ``check_timeouts``, ``running_blocks``,
``drop_task`` (abandonment), ``close_all`` (the run's end), ``listening``, ``abort``,
``attach_timeline``; by the worker functions' side (:mod:`daisy_nb.runtime.local.functions`,
which owns daisy 2.0.0's diagnoses of worker functions that do not wait): ``has_client``.
What it asks and tells about a connection's worker function goes to :class:`Jobs` (that
side); a task to abandon (a worker that connected too late) goes to the pool's
``abandon`` callback.

**One pass per wake-up, batched.** The pool hands over every connection that is
readable at once (:meth:`Clients.on_readable`); their frames are read and taken in
order, but what they ask of the scheduler is collected: the pass ends with one
``release_blocks`` per task for every block released, failed or given back, then one
``acquire_blocks`` per task for every connection that waits for a block (the batch
API: ~2-4 µs per block instead of ~20 µs one at a time, ``bench_server_cpu.py
--micro``). A release is also a request (``R``: "done, and the next one"), so a
worker's loop costs one frame each way per block; ``A`` asks for a block only where
no release did (a connection's first block, after a failure, after a give-back).

**Blocks sent ahead.** The scheduler sends a client the *next* block along (one at
most, so a client holds at most the block it runs and one waiting behind it): after
the client's first block, while the ready blocks of its task cover two per connected
client. The guard keeps the end of a task (or of a level) free of blocks queued
behind others: once the ready blocks are fewer, nothing more goes ahead, and the
blocks sent ahead before are run within a block's time, while every client still
gets work from the ready ones. The client takes a waiting block without asking; a
request (an ``R`` or ``A``) that crosses a block already on its way is answered by
that block. A block waiting behind is given back uncounted: ``G`` after a failure or
a second of not asking, ``Q`` (goodbye: everything it holds) when the client closes.
When a connection drops, the block it was running fails (an attempt) and the one
behind it is given back (status 0), as in the pool's batches.

**Quiet time.** A client that holds a block behind the one it runs does not wait for
the scheduler for at least a block's time. After a pass in which every connection
that asked ends up holding two blocks and none is parked, the pool may leave the
connections unread for a quarter of the task's (shortest) mean block time, at most
``QUIET_MAX_SECS`` (:attr:`Clients.quiet_secs`; only in runs without block-function
workers): the frames that arrive meanwhile are taken in one pass, so that the
scheduler wakes up once per several blocks instead of once per block
(``bench_server_cpu.py``).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from daisy_nb.runtime.client import _RELEASE, _STATS, pack_row, unpack_hello
from daisy_nb.runtime.local.pool_parts import PoolTaskRun, Waitables, nothing_left
from daisy_nb.runtime.policy import record_error

__all__ = ["ClientConn", "Clients", "Jobs"]

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
QUIET_FRACTION = 0.25  # of the mean block time, the longest the connections may go unread (quiet time)
QUIET_MAX_SECS = 0.02
HEARTBEAT_CHECKS = 5  # scans of every connection per heartbeat interval (pings, silent peers)


class _Pass:
    """What one pass over the readable connections asks of the scheduler (see the module docstring)."""

    __slots__ = ("ahead", "releases", "want")

    def __init__(self):
        self.releases: dict[Any, tuple[list[int], list[int]]] = {}  # task run -> (indices, statuses)
        self.want: dict[ClientConn, None] = {}  # connections waiting for a block, in arrival order
        self.ahead: dict[ClientConn, None] = {}  # connections that may get the next block ahead

    def release(self, tr, index: int, status: int) -> None:
        rel = self.releases.get(tr)
        if rel is None:
            rel = self.releases[tr] = ([], [])
        rel[0].append(index)
        rel[1].append(status)


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


class Jobs(Protocol):
    """What the Client side asks and tells about the worker function whose job a connection is
    (:class:`daisy_nb.runtime.local.functions.Functions`): a client's hello carries its worker id."""

    def is_worker(self, wid: int) -> bool: ...
    def job_connected(self, wid: int, tr: PoolTaskRun) -> bool: ...
    def returned(self, wid: int) -> bool: ...
    def job_acquired(self, wid: int) -> None: ...
    def job_result(self, wid: int, tr: PoolTaskRun, *, raised: bool, finished: bool) -> None: ...
    def job_log(self, wid: int) -> str | None: ...
    def job_label(self, wid: int) -> str | None: ...
    def job_pid(self, wid: int) -> int | None: ...
    def job_lost(self, wid: int, tr: PoolTaskRun) -> None: ...
    def job_timed_out(self, wid: int, tr: PoolTaskRun) -> bool: ...
    def died_with_template(self, wid: int) -> bool: ...
    def has_workers(self, tr: PoolTaskRun) -> bool: ...


class Clients:
    """Client messages, block hand-out, heartbeats and drops (see the module docstring)."""

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
        self._abandon = abandon  # the pool's: abandon a task and its downstream tasks
        self.net = net
        self.clients: dict = {}  # connection -> ClientConn
        self.n_clients: dict[str, int] = {}  # task id -> connected clients
        self.client_block_secs: dict[str, float] = {}  # task id -> mean block time of its clients
        self.where = ""  # where the scheduler listens and what it advertises (see listening)
        self.aborting = False
        self.timeline: Any = None  # a dashboard.timeline.Timeline, or None
        self._next_beat_check = 0.0  # check_heartbeats scans every connection from then on
        self.quiet_secs = 0.0  # how long the connections may go unread after the last pass (quiet time)
        self.parked: dict[Any, dict[ClientConn, None]] = {}  # task run -> connections waiting, oldest first
        self._batch: _Pass | None = None  # the pass under way (on_readable, serve_parked)

    # ------------------------------------------------------------- coordination
    def attach_timeline(self, timeline) -> None:
        self.timeline = timeline

    def abort(self) -> None:
        """The run is being aborted (Ctrl-C, an error): blocks cut short are given back, not failed."""
        self.aborting = True

    def listening(self, where: str) -> None:
        """The listener is up: ``where`` Client connections go (for the diagnoses)."""
        self.where = where

    def add(self, conn) -> None:
        """A new authenticated connection (from the listener's thread, through the pool)."""
        cc = ClientConn(conn)
        self.clients[conn] = cc
        self.waitables.add(conn, "c", cc)

    def serve_parked(self) -> None:
        """Answer the clients waiting for a block (a block, or ``N`` when none is left)."""
        if not self.parked:
            return
        batch = _Pass()
        for tr, ccs in self.parked.items():
            if ccs and (self.s.ready_count(tr.tid) > 0 or nothing_left(self.s, tr)):
                batch.want.update(ccs)
        if batch.want:
            self._serve(batch)

    def _park(self, cc: ClientConn, on: bool) -> None:
        cc.parked = on
        if on:
            self.parked.setdefault(cc.tr, {})[cc] = None
            return
        ccs = self.parked.get(cc.tr)
        if ccs is not None:
            ccs.pop(cc, None)
            if not ccs:
                del self.parked[cc.tr]

    def has_client(self, wid: int, tr: PoolTaskRun) -> bool:
        """A connection of worker ``wid`` of ``tr`` is open (asked by the worker functions' diagnoses)."""
        return any(cc.wid == wid and cc.tr is tr for cc in self.clients.values())

    def holding(self) -> bool:
        """Some client holds a block."""
        return any(cc.held for cc in self.clients.values())

    def drop_task(self, tr: PoolTaskRun) -> None:
        """``tr`` was abandoned: its connections are closed (what they held goes back)."""
        for cc in list(self.clients.values()):
            if cc.tr is tr:
                self._drop_client(cc)

    def close_all(self) -> None:
        """The run's end: every connection closed at once (their programs end, see ``runtime.client``)."""
        for cc in list(self.clients.values()):
            self._drop_client(cc)

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
            if not self.jobs.job_connected(cc.wid, cc.tr):  # not the job of a running worker function
                if self.jobs.returned(cc.wid) and not (cc.tr.abandoned or self.s.is_task_done(tid)):
                    self._connected_too_late(cc)
            tl = self.timeline
            if tl is not None:  # the row of its worker function (its job), or its own if that has one
                taken = any(c.tl_key == ("w", cc.wid) for c in self.clients.values() if c is not cc)
                if self.jobs.is_worker(cc.wid) and not taken:
                    cc.tl_key = ("w", cc.wid)
                else:
                    cc.tl_key = ("c", cc.wid, time.monotonic_ns())  # unique (an id() could be reused)
                    tl.worker(
                        cc.tl_key,
                        tid,
                        "client",
                        f"client of worker {cc.wid}",
                        None,
                        self.jobs.job_label(cc.wid),
                    )
            return
        tr = cc.tr
        if tr is None:
            self._drop_client(cc)
            return
        batch = self._batch
        assert batch is not None  # frames are taken inside a pass (on_readable)
        if kind == b"A":
            self._request(cc, batch)
        elif kind == b"Q":  # goodbye: a client leaves between blocks, so what it holds was never started
            if cc.held:
                self._release_held(cc, fail_running=False)
            self._drop_client(cc)  # it reads until we close
        elif kind == b"G":  # a block sent ahead, never started: back to the front of the queue
            (index,) = _INDEX.unpack_from(msg, 1)
            if cc.held.pop(index, None) is not None:
                batch.release(tr, index, 0)
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
                record_error(
                    self.s.counters[tr.tid], msg[t0:].decode("utf-8", "replace"), log=self.jobs.job_log(cc.wid)
                )
            sent = cc.held.pop(index, None)
            # what its worker function's jobs finished (policy.is_job_end)
            self.jobs.job_result(cc.wid, tr, raised=kind != b"R", finished=sent is not None and status == 2)
            if sent is not None:  # else: reclaimed after a timeout
                if stats is not None and tr.res is not None:
                    tr.res.add_one(stats, status != 2)
                batch.release(tr, index, 2 if status == 2 else 3)
                tr.inflight -= 1
                now = time.monotonic_ns()
                secs = (now - max(sent, cc.t_free_ns)) / 1e9
                cc.t_free_ns = now
                tr.block_secs.append(secs)
                old = self.client_block_secs.get(tr.tid)
                self.client_block_secs[tr.tid] = secs if old is None else old + AHEAD_EMA * (secs - old)
                if self.timeline is not None and cc.tl_key is not None:
                    self.timeline.bar(cc.tl_key, tr.tid, now / 1e9 - secs, now / 1e9, 1, int(status != 2))
            if kind == b"R":  # "done, and the next one" (the client sends no A after it)
                self._request(cc, batch, ahead=status == 2)

    def _request(self, cc: ClientConn, batch: _Pass, ahead: bool = True) -> None:
        """``cc`` asks for a block: one it holds already (sent ahead, on its way) answers it; else it
        waits for the pass's acquisition. Fast blocks: maybe one more ahead (see ``_serve``)."""
        if cc.held:
            self._park(cc, False)
        else:
            batch.want[cc] = None
        if ahead:
            batch.ahead[cc] = None

    # ----------------------------------------------- worker functions that do not wait
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
        if self._batch is not None:  # blocks released earlier in this pass were done before it ended
            self._release_pass(self._batch)
        from daisy_nb.progress import ABANDON_NOT_WAITING

        self._abandon(tr.tid, ABANDON_NOT_WAITING)

    def _serve(self, batch: _Pass) -> None:
        """End a pass: its releases (one scheduler call per task), then a block for every connection
        that waits for one (one acquisition per task), ``N`` where none is left, parked where blocks
        are still to come; then the blocks sent ahead to fast-block connections."""
        self._release_pass(batch)
        if batch.want:
            self._hand_out(batch.want, ahead=False)
        if batch.ahead:
            ahead: dict[ClientConn, None] = {}
            for cc in batch.ahead:
                tr = cc.tr
                if len(cc.held) != 1 or cc.conn not in self.clients or tr.abandoned:
                    continue
                if tr.tid in self.client_block_secs:  # after its first block
                    ahead[cc] = None
            if ahead:
                self._hand_out(ahead, ahead=True)
        self.quiet_secs = self._quiet(batch)

    def _release_pass(self, batch: _Pass) -> None:
        """The pass's releases so far, one scheduler call per task."""
        for tr, (idx, st) in batch.releases.items():
            self.s.release_indices(tr.tid, idx, st)
        batch.releases.clear()

    def _quiet(self, batch: _Pass) -> float:
        """The quiet time after ``batch`` (see the module docstring): 0 unless every connection that
        asked holds two blocks and nobody is parked."""
        if self.parked:
            return 0.0
        secs = QUIET_MAX_SECS / QUIET_FRACTION
        for group in (batch.want, batch.ahead):
            for cc in group:
                if cc.conn not in self.clients:
                    continue
                if len(cc.held) < 2:
                    return 0.0
                secs = min(secs, self.client_block_secs.get(cc.tr.tid, 0.0))
        return secs * QUIET_FRACTION if batch.want or batch.ahead else 0.0

    def _hand_out(self, ccs: dict[ClientConn, None], ahead: bool) -> None:
        """One ``acquire_blocks`` per task for ``ccs`` (each gets one block, in order); the rest get
        ``N`` if their task has nothing left, else wait (parked). ``ahead``: only while the ready
        blocks cover two per connected client of the task, and nobody waits for what is left."""
        by_task: dict[Any, list[ClientConn]] = {}
        for cc in ccs:
            if cc.conn in self.clients and cc.tr is not None:
                by_task.setdefault(cc.tr, []).append(cc)
        s = self.s
        for tr, group in by_task.items():
            k = 0
            if not tr.abandoned:
                ready = s.ready_count(tr.tid)
                if ahead:  # each one ahead while the ready blocks still cover two per client
                    ready = max(0, ready - 2 * self.n_clients.get(tr.tid, 1) + 1)
                k = min(len(group), ready)
            if k > 0:
                rows = s.acquire_described(tr.tid, k)
                k = len(rows)
                if k and tr.t_first is None:
                    tr.t_first = time.monotonic()
                for cc, row in zip(group, rows):
                    self._send_block(cc, row, ahead)
            if ahead or k == len(group):
                continue
            done = nothing_left(s, tr)
            for cc in group[k:]:
                if done:
                    self._park(cc, False)
                    try:
                        cc.conn.send_bytes(b"N")
                    except OSError:
                        self._drop_client(cc)
                else:
                    self._park(cc, True)

    def _send_block(self, cc: ClientConn, row: list[int], ahead: bool) -> None:
        """Send ``cc`` one block (``row``: index, spatial id, read offset and shape, write offset and
        shape, flat: ``Scheduler.acquire_described``)."""
        i = row[0]
        tr = cc.tr
        now = time.monotonic_ns()
        cc.held[i] = now
        cc.last_sent = now / 1e9
        tr.inflight += 1
        if cc.parked:
            self._park(cc, False)
        self.jobs.job_acquired(cc.wid)
        try:
            cc.conn.send_bytes(pack_row(row))
        except OSError:
            self._drop_client(cc)

    def on_readable(self, ccs: list[ClientConn]) -> None:
        """The connections that are readable in this wake-up: their frames, in one pass (see the
        module docstring)."""
        batch = self._batch = _Pass()
        try:
            now = time.monotonic()
            for cc in ccs:
                if cc.conn in self.clients:
                    self._read(cc, now)
        finally:
            self._batch = None
        self._serve(batch)

    def _read(self, cc: ClientConn, now: float) -> None:
        try:
            msgs = cc.conn.recv_frames()
        except (EOFError, OSError):
            self._drop_client(cc)
            return
        cc.last_seen = now
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

    def check_heartbeats(self) -> None:
        """Heartbeats: ping every client (also while it runs a block, so that it can tell a live
        scheduler from a vanished one and end its program); drop the ones that went silent."""
        if not self.clients:
            return
        now = time.monotonic()
        beat, dead = self.net["heartbeat"], self.net["peer_timeout"]
        if now < self._next_beat_check:  # a scan of every connection: a few times per heartbeat
            return
        self._next_beat_check = now + beat / HEARTBEAT_CHECKS
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
                if cc.tr is not None:  # the worker function waiting for it is ended (and replaced)
                    self.jobs.job_lost(cc.wid, cc.tr)
            elif now - cc.last_sent > beat:
                try:
                    cc.conn.send_bytes(b"P")
                    cc.last_sent = now
                except OSError:
                    self._drop_client(cc)

    def check_timeouts(self, now: int) -> None:
        """A client's running block (the first it holds) past the task's timeout fails; one behind goes back."""
        if not self.clients or all(tr.timeout_ns is None for tr in self.trs.values()):
            return
        for cc in list(self.clients.values()):
            tr = cc.tr
            if tr is None or tr.timeout_ns is None or not cc.held:
                continue
            sent = next(iter(cc.held.values()))
            if now - max(sent, cc.t_free_ns) <= tr.timeout_ns:  # it started when the previous one ended
                continue
            self.s.counters[tr.tid].timeout_reclaim_count += 1
            self._release_held(cc)
            if not self.jobs.job_timed_out(cc.wid, tr):  # its worker function is ended, else it is dropped
                self._drop_client(cc)

    def running_blocks(self) -> list:
        """The block each client runs (the first it holds), for the hang alarm."""
        out: list[tuple] = []
        for cc in list(self.clients.values()):
            if cc.held and cc.tr is not None:
                row, sent = next(iter(cc.held.items()))
                pid = self.jobs.job_pid(cc.wid)
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
        if fail_running and not (self.aborting or self.jobs.died_with_template(cc.wid)):
            st[0] = 3
        cc.held.clear()
        self.s.release_blocks(cc.tr.tid, idx, st)
        cc.tr.inflight -= len(idx)

    def _drop_client(self, cc: ClientConn) -> None:
        if cc.parked:
            self._park(cc, False)
        if self.clients.pop(cc.conn, None) is not None and cc.tr is not None:
            self.n_clients[cc.tr.tid] -= 1
            if self.timeline is not None and cc.tl_key is not None and cc.tl_key[0] == "c":
                self.timeline.ended(cc.tl_key)
        self.waitables.discard(cc.conn)
        try:
            cc.conn.close()
        except OSError:
            pass
        if cc.held and cc.tr is not None:
            self._release_held(cc)
