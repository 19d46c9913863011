"""The hand-out of blocks to ``daisy_nb.Client`` connections, as decisions without I/O.

:class:`HandOut` is the scheduler's side of every connection (requests, releases,
failures, give-backs, blocks sent ahead, parking, quiet time, heartbeats and block
timeouts) as a plain object: events in, actions out. No socket, clock or process
inside: the shell (:mod:`daisy_nb.runtime.net.server`) owns the sockets, reads the
frames, decodes them (:mod:`.wire`), passes the clock in, and executes what
:meth:`HandOut.take` returns (:class:`Send` a frame, :class:`Close` a connection).

Events: :meth:`HandOut.opened` (an authenticated connection), :meth:`HandOut.on_frames`
(the decoded messages of every readable connection, one pass), :meth:`HandOut.lost`
(end of stream, a send that failed, a malformed frame), :meth:`HandOut.broken` (a frame
failed its integrity check), :meth:`HandOut.serve_parked`, :meth:`HandOut.heartbeats`
and :meth:`HandOut.check_timeouts` (the clock moved), :meth:`HandOut.drop_task`
(abandonment), :meth:`HandOut.stop` (Ctrl-C: no more blocks handed out),
:meth:`HandOut.close_all` (the run's end). The scheduler is the real one, called through
its list API (:class:`daisy_nb.scheduling.listed.ListedCalls`: ``acquire``, ``release``)
once per task and pass. What the core asks or tells about a connection's worker function
goes to the pool's :class:`Jobs` (its worker-function part); a task to abandon to the
``abandon`` callback.

**One pass per wake-up, batched.** The frames of every readable connection are taken in
order, but what they ask of the scheduler is collected: the pass ends with one list
``release`` per task for every block released, failed or given back, then one list
``acquire`` per task for every connection that waits for a block. A release is
also a request ("done, and the next one"), so a worker's loop costs one frame each way
per block; ``ACQUIRE`` asks only where no release did.

**Blocks sent ahead.** After a connection's first block, the next block goes ahead (one
at most: a client holds at most the block it runs and one behind it) while the ready
blocks of its task cover two per connected client. A request that crosses a block
already on its way is answered by that block. A block waiting behind is given back
uncounted (``GIVE_BACK``, ``GOODBYE``); when a connection drops, the block it was running
fails (an attempt) and the one behind it goes back (status 0).

**Parking and the tail.** A connection that asks while its task has no ready block waits
(parked) while a block can still come for it: at most as many wait as the task has pending
blocks (waiting for upstream blocks). The others are told to end (``NO_MORE``); so is every
one once every block the task has left is in flight (its tail), except one kept parked
while a block in flight could still need a retry (:class:`daisy_nb.runtime.net.tail.TailKeep`,
which says why one).

**Walltime.** A job that knows when it ends (its hello carries the seconds it has left:
``Client(end_time=...)``, ``SLURM_JOB_END_TIME``) is handed no block it is unlikely to
finish; it is told to end (``NO_MORE``) exactly as at the tail, and a parked one once its
time runs short (:class:`daisy_nb.runtime.net.walltime.WalltimeRule`, which says why).

**Quiet time.** After a pass that ends with every connection holding two blocks and none
parked, the connections may stay unread for a quarter of the (shortest) mean block time of
their tasks, at most ``QUIET_MAX_SECS`` (:attr:`HandOut.quiet_secs`): the frames that arrive
meanwhile are taken in one pass (the shell waits on that deadline), and no client runs dry
meanwhile, as each has a block behind the one it runs.

Invariants (:meth:`HandOut.validate`): every block handed out is held by exactly one
connection (or released); per task, the blocks held equal the scheduler's processing
count; a parked connection holds nothing and is registered as parked exactly once; at
most two blocks per connection; the client counts match the connections. Once the parked
connections were served, a task with no ready block has at most its pending blocks plus one
parked, the one more only while a retry can come (:func:`daisy_nb.runtime.net.tail.check_tail`).
A job with a known end had, when its newest block was sent, at least the time the walltime
rule asked for; after the parked connections were served, none whose time ran short is parked
(:func:`check_walltime`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from daisy_nb.errors import WorkerError
from daisy_nb.runtime.common.failures import record_error, record_worker_error
from daisy_nb.runtime.net import wire
from daisy_nb.runtime.net.backups import ClientBackups
from daisy_nb.runtime.net.tail import OUTLAST_MEDIANS, TailKeep
from daisy_nb.runtime.net.walltime import WALLTIME_FACTOR, WalltimeRule, check_walltime, median_block_secs
from daisy_nb.scheduling.listed import ListedCalls

__all__ = [
    "AHEAD_EMA",
    "QUIET_FRACTION",
    "QUIET_MAX_SECS",
    "WALLTIME_FACTOR",
    "Close",
    "Conn",
    "HandOut",
    "Jobs",
    "Send",
    "check_walltime",
]  # fmt: skip  (WALLTIME_FACTOR, check_walltime: net/walltime.py's, for the core's users)

logger = logging.getLogger("daisy")

AHEAD_EMA = 0.2  # weight of the newest block in the per-task mean block time
QUIET_FRACTION = 0.25  # of the mean block time, the longest the connections may go unread (quiet time)
QUIET_MAX_SECS = 0.02
HEARTBEAT_CHECKS = 5  # scans of every connection per heartbeat interval (pings, silent peers)

_new = tuple.__new__
_PING = wire.encode_ping()
_NO_MORE = wire.encode_no_more()


class Send(NamedTuple):
    """Send ``payload`` (one frame) on connection ``cid``; if that fails, the shell reports :meth:`HandOut.lost`."""

    cid: Hashable
    payload: bytes


class Close(NamedTuple):
    """Close connection ``cid`` (the core has forgotten it already)."""

    cid: Hashable


class Jobs(Protocol):
    """What the Client side asks and tells about the worker function whose job a connection is
    (:class:`daisy_nb.runtime.local.functions.Functions`): a client's hello carries its worker id."""

    def is_worker(self, wid: int) -> bool: ...
    def job_connected(self, wid: int, tr: Any) -> bool: ...
    def job_ready(self, wid: int, tr: Any) -> None: ...
    def returned(self, wid: int) -> bool: ...
    def job_acquired(self, wid: int) -> None: ...
    def job_released(self, wid: int) -> None: ...
    def job_result(self, wid: int, tr: Any, *, raised: bool, finished: bool) -> None: ...
    def job_log(self, wid: int) -> str | None: ...
    def job_label(self, wid: int) -> str | None: ...
    def job_pid(self, wid: int) -> int | None: ...
    def job_lost(self, wid: int, tr: Any) -> None: ...
    def job_timed_out(self, wid: int, tr: Any) -> bool: ...
    def died_with_template(self, wid: int) -> bool: ...
    def has_workers(self, tr: Any) -> bool: ...
    def job_start_secs(self, tid: str) -> float | None: ...


def _waited(ccs: Iterable[Conn], now_ns: int) -> float:
    """Seconds the longest waiting of ``ccs`` has been without a block."""
    return (now_ns - min(c.t_free_ns for c in ccs)) / 1e9


class Conn:
    """One connection as the core sees it (the dashboard reads ``wid`` and ``held``)."""

    __slots__ = (
        "asked", "cid", "end_ns", "ended", "held", "last_seen", "last_sent", "n_sent", "need_ns", "parked", "peer",
        "t_free_ns", "tl_key", "tr", "wid",
    )  # fmt: skip

    def __init__(self, cid: Hashable, peer: Any, now_ns: int):
        self.cid = cid
        self.peer = peer
        self.tr: Any = None  # the task's run record, once the client said hello
        self.wid = -1
        self.held: dict[int, int] = {}  # block index -> when sent (ns), in the order sent
        self.parked = False
        self.ended = False  # told that no block is left (NO_MORE): it leaves
        self.last_seen = self.last_sent = now_ns  # heartbeats
        self.t_free_ns = now_ns  # when its previous block ended, or it first asked (block times, waits)
        self.asked = False  # it asked for a block (its job's set-up is done)
        self.n_sent = 0  # blocks sent to it
        self.tl_key: Any = None  # its row in the dashboard's timeline
        self.end_ns: int | None = None  # when its job ends, on the core's clock (its hello); None: not known
        self.need_ns: int | None = None  # the time left the walltime rule asked for its newest block (None: none)


class _Pass:
    """What one pass over the readable connections asks of the scheduler."""

    __slots__ = ("ahead", "releases", "want")

    def __init__(self):
        self.releases: dict[Any, tuple[list[int], list[int]]] = {}  # task run -> (indices, statuses)
        self.want: dict[Conn, None] = {}  # connections waiting for a block, in arrival order
        self.ahead: dict[Conn, None] = {}  # connections that may get the next block ahead

    def release(self, tr, index: int, status: int) -> None:
        rel = self.releases.get(tr)
        if rel is None:
            rel = self.releases[tr] = ([], [])
        rel[0].append(index)
        rel[1].append(status)


class _Connections:
    """The connection table (part of :class:`HandOut`): opened, who each is (its hello), lost,
    dropped, and what they held."""

    conns: dict[Hashable, Conn]
    trs: Mapping[str, Any]
    jobs: Jobs
    s: Any
    listed: ListedCalls
    n_clients: dict[str, int]
    timeline: Any
    aborting: bool
    tail: TailKeep
    parked: dict[Any, dict[Conn, None]]
    bk: ClientBackups
    _batch: _Pass | None
    _out: list[Send | Close]
    connected_tids: set[str]
    timed: int
    _too_late: Callable[[Conn], str | None] | None
    _abandon: Callable[[str, str], None]

    def _park(self, cc: Conn, on: bool) -> None:
        """``cc`` waits for a block (``on``), or no longer does."""
        cc.parked = on
        if on:
            self.parked.setdefault(cc.tr, {})[cc] = None
            return
        ccs = self.parked.get(cc.tr)
        if ccs is not None:
            ccs.pop(cc, None)
            if not ccs:
                del self.parked[cc.tr]

    def _release_pass(self, batch: _Pass) -> None:
        raise NotImplementedError  # HandOut's

    def opened(self, cid: Hashable, peer: Any, now_ns: int) -> None:
        """A new authenticated connection."""
        if cid in self.conns:
            raise ValueError(f"connection {cid!r} is open already")
        self.conns[cid] = Conn(cid, peer, now_ns)

    def holding(self) -> bool:
        """Some client holds a block."""
        return any(cc.held for cc in self.conns.values())

    def idle_clients(self, tr) -> int:
        """Connections of ``tr`` that would take a ready block now: they said hello, hold none and were
        not told to end (parked, or not asked yet). One pass over the connections."""
        return sum(1 for cc in self.conns.values() if cc.tr is tr and not cc.held and not cc.ended)

    def other_jobs(self, cc: Conn) -> int:
        """The connections of ``cc``'s task but ``cc`` that were not told to end."""
        return sum(1 for c in self.conns.values() if c.tr is cc.tr and c is not cc and not c.ended)

    def soon_free(self, tr, now_ns: int) -> int:
        """Blocks the busy connections of ``tr`` will take within a job's start, for the pool's spawn
        plan, while ``tr`` is paced by its upstream tasks (net/tail.py: "Downstream jobs at the
        upstream's pace"); 0 otherwise. A connection whose block has run ``OUTLAST_MEDIANS``
        median block times (a straggler) counts for none."""
        tid = tr.tid
        if tid not in self.tail.paced or self.tail.upstream_drained(tid):
            return 0
        start, med = self.jobs.job_start_secs(tid), median_block_secs(tr)
        if not start or not med:
            return 0
        old_ns = now_ns - OUTLAST_MEDIANS * med * 1e9  # a block started before this is a straggler
        young = sum(
            1
            for cc in self.conns.values()
            if cc.tr is tr and cc.held and not cc.ended and max(next(iter(cc.held.values())), cc.t_free_ns) > old_ns
        )
        return math.floor(start / med + 1e-9) * young

    def lost(self, cid: Hashable) -> None:
        """The connection ended (end of stream, a failed send, a malformed frame): dropped."""
        cc = self.conns.get(cid)
        if cc is not None:
            self._drop(cc)

    def broken(self, cid: Hashable, why: str) -> None:
        """A frame failed its integrity check: never interpreted, the connection dropped at once."""
        cc = self.conns.get(cid)
        if cc is None:
            return
        logger.warning(
            "task %r: a frame from worker %s at %s failed its integrity check (%s); connection dropped, "
            "%d block(s) it held are handed out again",
            "?" if cc.tr is None else cc.tr.tid,
            cc.wid,
            cc.peer,
            why,
            len(cc.held),
        )
        self._drop(cc)

    def drop_task(self, tid: str) -> None:
        """``tid`` was abandoned: its connections are closed (what they held goes back)."""
        for cc in list(self.conns.values()):
            if cc.tr is not None and cc.tr.tid == tid:
                self._drop(cc)

    def close_all(self) -> None:
        """The run's end: every connection closed at once."""
        for cc in list(self.conns.values()):
            self._drop(cc)

    # ------------------------------------------------------------------ who it is
    def _hello(self, cc: Conn, msg: wire.Hello, now_ns: int) -> None:
        if cc.tr is not None:  # one hello per connection
            self._drop(cc)
            return
        tr = self.trs.get(msg.task_id)
        if tr is None:
            self._drop(cc)
            return
        cc.tr, cc.wid = tr, msg.worker_id
        left = msg.secs_left
        if left is not None and math.isfinite(left):  # the job's end on our clock: no clock need agree
            cc.end_ns = now_ns + int(left * 1e9)
            self.timed += 1
        tid = tr.tid
        self.n_clients[tid] = self.n_clients.get(tid, 0) + 1
        self.connected_tids.add(tid)
        if not self.jobs.job_connected(cc.wid, tr):  # not the job of a running worker function
            late = None if self._too_late is None else self._too_late(cc)
            if late is not None and not (self.s.is_abandoned(tid) or self.s.is_task_done(tid)):
                self._connected_too_late(cc, late)
        tl = self.timeline
        if tl is not None:  # the row of its worker function (its job), or its own if that has one
            taken = any(c.tl_key == ("w", cc.wid) for c in self.conns.values() if c is not cc)
            if self.jobs.is_worker(cc.wid) and not taken:
                cc.tl_key = ("w", cc.wid)
            else:
                cc.tl_key = ("c", cc.wid, now_ns)  # unique (an id() could be reused)
                tl.worker(cc.tl_key, tid, "client", f"client of worker {cc.wid}", None, self.jobs.job_label(cc.wid))

    def _connected_too_late(self, cc: Conn, msg: str) -> None:
        """A Client said hello for a worker function that had returned (``msg``: the diagnosis):
        daisy 2.0.0 stops the run here (a RuntimeError); daisy_nb abandons the task, which
        ``run_blockwise`` raises."""
        tr = cc.tr
        logger.error("task %r: %s", tr.tid, msg)
        record_error(self.s.counters[tr.tid], msg)
        if self._batch is not None:  # blocks released earlier in this pass were done before it ended
            self._release_pass(self._batch)
        from daisy_nb.progress import ABANDON_NOT_WAITING

        self._abandon(tr.tid, ABANDON_NOT_WAITING)

    # ------------------------------------------------------------------ drops
    def _release_held(self, cc: Conn, fail_running: bool = True) -> None:
        """The block ``cc`` runs fails (an attempt); blocks behind it were never started: given back.

        Given back too on Ctrl-C (``abort``), and when the connection's worker died with the
        worker template (not the block's fault). ``fail_running=False`` (a goodbye, sent between
        blocks): every block it holds is given back."""
        idx = list(cc.held)
        st = [0] * len(idx)
        if fail_running and not (self.aborting or self.jobs.died_with_template(cc.wid)):
            st[0] = 3
        if self.bk.spec is not None and not self.bk.lost(cc):  # a copy whose twin runs on: the twin decides
            idx, st = idx[1:], st[1:]
        cc.held.clear()
        if idx:
            self.listed.release(cc.tr.tid, idx, st)
        self.tail.touch(cc.tr.tid)

    def _drop(self, cc: Conn) -> None:
        if cc.parked:
            self._park(cc, False)
        if self.conns.pop(cc.cid, None) is None:
            return
        if cc.end_ns is not None:
            self.timed -= 1
        if cc.tr is not None:
            self.n_clients[cc.tr.tid] -= 1
            if self.timeline is not None and cc.tl_key is not None and cc.tl_key[0] == "c":
                self.timeline.ended(cc.tl_key)
        self._out.append(Close(cc.cid))
        if self._batch is not None:  # its releases in this pass are dropped from want/ahead
            self._batch.want.pop(cc, None)
            self._batch.ahead.pop(cc, None)
        if cc.held and cc.tr is not None:
            self._release_held(cc)


class _Timers(_Connections):
    """What the clock decides (part of :class:`HandOut`): heartbeats, silent peers, block timeouts."""

    net: Mapping[str, float]
    _next_beat_check: int

    def heartbeats(self, now_ns: int) -> None:
        """Ping every client (also while it runs a block, so that it can tell a live scheduler from a
        vanished one); drop the ones silent for ``peer_timeout``. A scan a few times per heartbeat."""
        if not self.conns or now_ns < self._next_beat_check:
            return
        beat, dead = int(self.net["heartbeat"] * 1e9), int(self.net["peer_timeout"] * 1e9)
        self._next_beat_check = now_ns + beat // HEARTBEAT_CHECKS
        for cc in list(self.conns.values()):
            if now_ns - cc.last_seen > dead:
                logger.warning(
                    "task %r: worker %s at %s sent nothing for %.0f s; dropped, %d block(s) it held are handed "
                    "out again",
                    "?" if cc.tr is None else cc.tr.tid,
                    cc.wid,
                    cc.peer,
                    (now_ns - cc.last_seen) / 1e9,
                    len(cc.held),
                )
                self._drop(cc)
                if cc.tr is not None:  # the worker function waiting for it is ended (and replaced)
                    self.jobs.job_lost(cc.wid, cc.tr)
            elif now_ns - cc.last_sent > beat:
                cc.last_sent = now_ns
                self._out.append(Send(cc.cid, _PING))

    def check_timeouts(self, now_ns: int) -> None:
        """A client's running block (the first it holds) past the task's timeout fails; one behind goes back."""
        if not self.conns or all(tr.timeout_ns is None for tr in self.trs.values()):
            return
        for cc in list(self.conns.values()):
            tr = cc.tr
            if tr is None or tr.timeout_ns is None or not cc.held or cc.cid not in self.conns:
                continue
            sent = next(iter(cc.held.values()))
            if now_ns - max(sent, cc.t_free_ns) <= tr.timeout_ns:  # it started when the previous one ended
                continue
            self.s.counters[tr.tid].timeout_reclaim_count += 1
            self._release_held(cc)
            if not self.jobs.job_timed_out(cc.wid, tr):  # its worker function is ended, else it is dropped
                self._drop(cc)

    def running_blocks(self) -> list[tuple]:
        """``(task id, [index], label, pid, since)`` of the block each client runs (the hang alarm)."""
        out: list[tuple] = []
        for cc in list(self.conns.values()):
            if cc.held and cc.tr is not None:
                index, sent = next(iter(cc.held.items()))
                label = f"Client of worker {cc.wid} at {cc.peer}"
                out.append((cc.tr.tid, [index], label, self.jobs.job_pid(cc.wid), max(sent, cc.t_free_ns) / 1e9))
        return out


class _Copies(_Timers):
    """Backup copies of stragglers (part of :class:`HandOut`; the rule: :mod:`.backups`)."""

    stopped: bool
    counts: dict[str, int]

    def _send_block(self, cc: Conn, row: list[int], now_ns: int) -> None:
        raise NotImplementedError  # HandOut's

    def _copy_ended(self, cc: Conn, index: int, ok: bool, now_ns: int) -> bool:
        """``cc`` ended block ``index`` (its first): whether that end counts. A twin that lost is
        told to drop it; the block behind either, if any, starts now."""
        counts, twin = self.bk.ended(cc, index, ok, now_ns)
        if twin is not None:
            self._tell_drop(twin, index, now_ns)
        self.bk.next_started(cc, now_ns)
        return counts

    def _tell_drop(self, cc: Conn, index: int, now_ns: int) -> None:
        """``cc``'s copy of block ``index`` was told to stop: it is told to drop it (``D``); the block
        behind it, if any, is its copy now."""
        cc.held.pop(index, None)
        self._out.append(Send(cc.cid, wire.encode_drop(index)))
        self.bk.next_started(cc, now_ns)

    def copies_due(self) -> bool:
        """Jobs wait parked for a straggler's copy (:meth:`.backups.ClientBackups.copies_due`)."""
        return not self.stopped and not self.aborting and self.bk.copies_due(self.parked)

    def _launch_backups(self, now_ns: int) -> None:
        """Send the backups the rule asks for now, each to a parked job of its task."""
        if self.bk.spec is None or self.stopped or self.aborting:
            return
        for cc, row in self.bk.launch(self.parked, now_ns):
            self._send_block(cc, row, now_ns)
            self.counts["backups"] += 1
        self._drop_slow(now_ns)

    def _due_backups(self, tid: str, group: list[Conn], now_ns: int) -> int:
        """Backups due in the bulk of ``tid`` to the first of ``group`` (jobs asking for a block,
        holding none), before fresh blocks: how many were sent."""
        if self.bk.spec is None or self.stopped or self.aborting:
            return 0
        rows = self.bk.take_due(tid, len(group), now_ns)
        for cc, row in zip(group, rows):
            self._send_block(cc, row, now_ns)
            self.counts["backups"] += 1
        return len(rows)

    def check_timeouts(self, now_ns: int) -> None:
        """Blocks past their task's timeout (``_Timers``), and backups slow themselves dropped."""
        self._drop_slow(now_ns)
        super().check_timeouts(now_ns)

    def _drop_slow(self, now_ns: int) -> None:
        """Backups slow themselves are dropped (:meth:`.backups.ClientBackups.slow`); their twins run on."""
        if self.bk.spec is None or self.aborting:
            return
        for cc, index in self.bk.slow(now_ns):
            self._tell_drop(cc, index, now_ns)
            self.counts["slow backups"] = self.counts.get("slow backups", 0) + 1


class HandOut(_Copies):
    """Requests, releases, blocks sent ahead, parking, quiet time, heartbeats (module docstring)."""

    def __init__(
        self,
        scheduler,
        tasks: Mapping[str, Any],
        jobs: Jobs,
        abandon: Callable[[str, str], None],
        *,
        net: Mapping[str, float],
        connected_too_late: Callable[[Conn], str | None] | None = None,
    ):
        self.s = scheduler
        self.listed = ListedCalls(scheduler)  # its hand-out and release as lists (scheduling/listed.py)
        self.trs = tasks  # the run records by task id (a hello names its task)
        self.jobs = jobs
        self._abandon = abandon
        self.net = net
        # the worker-function diagnoses: the error if a connection's worker function had returned already
        self._too_late = connected_too_late
        self.conns: dict[Hashable, Conn] = {}
        self.n_clients: dict[str, int] = {}  # task id -> connected clients
        self.client_block_secs: dict[str, float] = {}  # task id -> mean block time of its clients
        self.connected_tids: set[str] = set()  # tasks a Client has said hello for
        self.timed = 0  # connections whose job's end is known (the walltime rule asks about them only)
        self.parked: dict[Any, dict[Conn, None]] = {}  # task run -> connections waiting, oldest first
        # which connections stay parked when no block is ready, and for how long (net/tail.py)
        self.tail = TailKeep(scheduler, jobs.job_start_secs, lambda t: median_block_secs(tasks[t]), self.conns.values)
        self.walltime = WalltimeRule()  # which jobs end before their walltime (net/walltime.py)
        # backups of stragglers, Task(speculative=...) (net/backups.py)
        self.bk = ClientBackups(scheduler, self.listed.describe)
        self.quiet_secs = 0.0  # how long the connections may go unread after the last pass
        self.aborting = False  # blocks cut short are given back, not failed
        self.stopped = False  # no more blocks handed out (Ctrl-C)
        self.timeline: Any = None  # a dashboard.timeline.Timeline, or None
        # what happened, for tests and benchmarks: passes, messages by kind, blocks sent (and ahead),
        # jobs told to end for their walltime
        self.counts: dict[str, int] = {"passes": 0, "sent": 0, "ahead": 0, "walltime": 0, "backups": 0}
        self._next_beat_check = 0
        self._batch: _Pass | None = None
        self._out: list[Send | Close] = []

    # ------------------------------------------------------------------ actions
    def take(self) -> list[Send | Close]:
        """The actions decided since the last call, in order (the shell executes them)."""
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------------ events
    def abort(self) -> None:
        """The run is being aborted (Ctrl-C, an error): blocks cut short are given back, not failed."""
        self.aborting = True

    def stop(self) -> None:
        """No more blocks are handed out (Ctrl-C): releases are still taken; requests get nothing."""
        self.stopped = True
        for ccs in self.parked.values():
            for cc in ccs:
                cc.parked = False
        self.parked.clear()

    def on_frames(self, frames: list[tuple[Hashable, list]], now_ns: int) -> None:
        """One pass: the decoded messages of each readable connection (see the module docstring)."""
        batch = self._batch = _Pass()
        counts = self.counts
        counts["passes"] += 1
        try:
            for cid, msgs in frames:
                cc = self.conns.get(cid)
                if cc is None:
                    continue
                cc.last_seen = now_ns
                for msg in msgs:
                    if cc.cid not in self.conns:
                        break  # dropped by an earlier frame
                    kind = wire.kind_name(msg)
                    counts[kind] = counts.get(kind, 0) + 1
                    self._on_msg(cc, msg, batch, now_ns)
        finally:
            self._batch = None
        self._serve(batch, now_ns)

    def serve_parked(self, now_ns: int) -> None:
        """Answer the clients waiting for a block (a block, or ``NO_MORE`` when none is left). A
        second pass judges them again after a first that served some: handing out an upstream
        task's last blocks drains it, which a downstream task's waiting jobs are judged by."""
        if not self.parked:
            return
        self._launch_backups(now_ns)
        for _ in range(2):
            batch = _to_answer(self, now_ns)
            if not batch.want:
                return
            self._serve(batch, now_ns)

    # ------------------------------------------------------------------ messages
    def _on_msg(self, cc: Conn, msg, batch: _Pass, now_ns: int) -> None:
        if msg is wire.PING:  # heartbeat (last_seen is updated on every read)
            return
        if isinstance(msg, wire.Hello):
            self._hello(cc, msg, now_ns)
            return
        tr = cc.tr
        if tr is None:  # anything before the hello
            self._drop(cc)
            return
        if msg is wire.ACQUIRE:
            if not cc.asked:  # its job is set up: what a job takes to start; its wait starts now
                cc.asked, cc.t_free_ns = True, now_ns
                self.jobs.job_ready(cc.wid, tr)
            self._request(cc, batch)
        elif isinstance(msg, wire.Release):
            self._finished(cc, tr, msg.block, msg.status, msg.stats, batch, now_ns)
            self._request(cc, batch, ahead=msg.status == 2)  # "done, and the next one"
        elif isinstance(msg, wire.Failure):
            err = WorkerError(msg.type, msg.message, msg.traceback, msg.spatial_id, tr.tid)
            record_worker_error(self.s.counters[tr.tid], err, log=self.jobs.job_log(cc.wid))
            self._finished(cc, tr, msg.block, 3, msg.stats, batch, now_ns, raised=True)
        elif isinstance(msg, wire.GiveBack):  # a block sent ahead, never started: back to the front
            if cc.held.pop(msg.block, None) is not None and (
                self.bk.spec is None or self.bk.given_back(cc, msg.block, now_ns)
            ):
                batch.release(tr, msg.block, 0)
        elif msg is wire.GOODBYE:  # a client leaves between blocks: what it holds was never started
            if cc.held:
                self._release_held(cc, fail_running=False)
            self._drop(cc)  # it reads until we close
        else:
            raise TypeError(f"not a client message: {msg!r}")

    def _finished(self, cc: Conn, tr, index: int, status: int, stats, batch: _Pass, now_ns: int, raised=False):
        sent = cc.held.pop(index, None)
        # what its worker function's jobs finished (policy.is_job_end)
        self.jobs.job_result(cc.wid, tr, raised=raised, finished=sent is not None and status == 2)
        if sent is None:  # reclaimed after a timeout, dropped (its copy won), or never ours
            return
        if stats is not None and tr.res is not None:
            tr.res.add_one(stats, status != 2)
        if self.bk.spec is None or self._copy_ended(cc, index, status == 2, now_ns):
            batch.release(tr, index, status)
        secs = (now_ns - max(sent, cc.t_free_ns)) / 1e9
        cc.t_free_ns = now_ns
        tr.block_secs.append(secs)
        self.s.counters[tr.tid].job_seconds.ran(secs)
        old = self.client_block_secs.get(tr.tid)
        self.client_block_secs[tr.tid] = secs if old is None else old + AHEAD_EMA * (secs - old)
        if self.timeline is not None and cc.tl_key is not None:
            self.timeline.bar(cc.tl_key, tr.tid, now_ns / 1e9 - secs, now_ns / 1e9, 1, int(status != 2))

    def _request(self, cc: Conn, batch: _Pass, ahead: bool = True) -> None:
        """``cc`` asks for a block: one it holds already (sent ahead, on its way) answers it; else it
        waits for the pass's acquisition. Fast blocks: maybe one more ahead (see ``_serve``)."""
        if cc.held:
            self._park(cc, False)
        else:
            batch.want[cc] = None
        if ahead:
            batch.ahead[cc] = None

    # ------------------------------------------------------------------ the pass's end
    def _serve(self, batch: _Pass, now_ns: int) -> None:
        """End a pass: its releases (one scheduler call per task), then a block for every connection
        that waits for one (one acquisition per task), ``NO_MORE`` where none is left, parked where
        blocks are still to come; then the blocks sent ahead."""
        self._release_pass(batch)
        if batch.want:
            self._hand_out(batch.want, False, now_ns)
        if batch.ahead and not self.stopped:
            ahead: dict[Conn, None] = {}
            gone: dict[str, bool] = {}  # task id -> abandoned (asked once per task)
            for cc in batch.ahead:
                tr = cc.tr
                if len(cc.held) != 1 or cc.cid not in self.conns:
                    continue
                a = gone.get(tr.tid)
                if a is None:
                    a = gone[tr.tid] = self.s.is_abandoned(tr.tid)
                if a or (self.bk.spec is not None and self.bk.has_due(tr.tid, now_ns)):
                    continue  # (a straggler's backup waits for a job that asks holding nothing)
                if tr.tid in self.client_block_secs:  # after its first block
                    ahead[cc] = None
            if ahead:
                self._hand_out(ahead, True, now_ns)
        self.quiet_secs = self._quiet(batch)

    def _release_pass(self, batch: _Pass) -> None:
        for tr, (idx, st) in batch.releases.items():
            self.listed.release(tr.tid, idx, st)
            self.tail.touch(tr.tid)
        batch.releases.clear()

    def _quiet(self, batch: _Pass) -> float:
        """0 unless nobody is parked and every connection holds two blocks (one with one could ask
        meanwhile and idle: a downstream job fed block by block). Holding at most two, a task's
        connections all hold two when its blocks in flight are twice them (a copy: no quiet)."""
        if self.parked or self.stopped or not (batch.want or batch.ahead):
            return 0.0
        secs = QUIET_MAX_SECS / QUIET_FRACTION
        for tid, n in self.n_clients.items():
            if not n:
                continue
            if self.s.processing_count(tid) < 2 * n:
                return 0.0
            secs = min(secs, self.client_block_secs.get(tid, 0.0))
        return secs * QUIET_FRACTION

    def _hand_out(self, ccs: dict[Conn, None], ahead: bool, now_ns: int) -> None:
        """One acquisition per task for ``ccs`` (each gets one block, in order); the rest get
        ``NO_MORE`` if their task has nothing left, else wait (parked). ``ahead``: only while the
        ready blocks cover two per connected client of the task."""
        by_task: dict[Any, list[Conn]] = {}
        for cc in ccs:
            if cc.cid in self.conns and cc.tr is not None:
                by_task.setdefault(cc.tr, []).append(cc)
        s = self.s
        for tr, group in by_task.items():
            if self.timed and not self.stopped:
                group = self._walltime(tr, group, ahead, now_ns)
            if not ahead and self.bk.spec is not None:  # a straggler's backup before fresh blocks
                group = group[self._due_backups(tr.tid, group, now_ns) :]
            k = 0
            if not (self.stopped or s.is_abandoned(tr.tid)):
                ready = s.ready_count(tr.tid)
                if ahead:  # each one ahead while the ready blocks still cover two per client
                    ready = max(0, ready - 2 * self.n_clients.get(tr.tid, 1) + 1)
                k = min(len(group), ready)
            if k > 0:
                rows = self.listed.acquire(tr.tid, k)
                k = len(rows)
                if k and tr.t_first is None:
                    tr.t_first = now_ns / 1e9
                for cc, row in zip(group, rows):
                    self._send_block(cc, row, now_ns)
                self.tail.touch(tr.tid)
                self.tail.handed_out(tr.tid)
                self.counts["sent"] += k
                if ahead:
                    self.counts["ahead"] += k
            if ahead or k == len(group):
                continue
            if self.stopped:  # Ctrl-C: they get nothing; the run's end closes them
                continue
            for cc in group[k:]:
                if not self._stays(cc, tr, now_ns):  # no block can come for it: told to end (net/tail.py)
                    self._end(cc)
                else:
                    self._park(cc, True)

    # ------------------------------------------------------------------ walltime
    def _walltime(self, tr, group: list[Conn], ahead: bool, now_ns: int) -> list[Conn]:
        """``group`` without the connections whose job ends too soon for a block (net/walltime.py):
        those asking for one are told to end; ``ahead``: they just get none ahead."""
        keep, short = self.walltime.split(tr, group, now_ns, ending=not ahead)
        if not ahead:
            for cc in short:
                self._end(cc)
                self.counts["walltime"] += 1
        return keep

    def _end(self, cc: Conn) -> None:
        """``cc`` is told that no block is left for it (``NO_MORE``): it leaves, and its worker
        function's return is a clean end."""
        self._park(cc, False)
        self._out.append(Send(cc.cid, _NO_MORE))
        cc.ended = True
        self.jobs.job_released(cc.wid)

    def _stays(self, cc: Conn, tr, now_ns: int) -> bool:
        """No block of ``tr`` is ready: ``cc`` stays parked, for a pending block or a retry (else it
        is told to end)."""
        kept = self.parked.get(tr, {})
        if self.bk.spec is not None and self.bk.keep_at_tail(tr.tid, len(kept) - (cc in kept)):
            return True  # for a backup copy (net/backups.py)
        others = functools.partial(self.other_jobs, cc)  # (asked only when it matters)
        return self.tail.stays(tr.tid, len(kept) - (cc in kept), (now_ns - cc.t_free_ns) / 1e9, now_ns, others)

    def _send_block(self, cc: Conn, row: list[int], now_ns: int) -> None:
        first = not cc.held
        cc.held[row[0]] = now_ns
        cc.last_sent = now_ns
        if cc.parked:
            self._park(cc, False)
            if cc.n_sent:  # a wait between two blocks (not a job's first): the upstream's pace (net/tail.py)
                self.tail.waited(cc.tr.tid, (now_ns - cc.t_free_ns) / 1e9, now_ns)
        cc.n_sent += 1
        self.jobs.job_acquired(cc.wid)
        self._out.append(_new(Send, (cc.cid, wire.encode_block(row))))  # Send(...) without its Python __new__
        if first and self.bk.spec is not None:
            self.bk.started(cc, row[0], now_ns)

    # ------------------------------------------------------------------ invariants
    def validate(self) -> None:
        """Raise ``AssertionError`` if an invariant does not hold (see the module docstring)."""
        check_invariants(self)


def _to_answer(core: HandOut, now_ns: int) -> _Pass:
    """The parked clients :meth:`HandOut.serve_parked` answers now: those of a task with a block
    ready or whose waiting jobs its tail policy judges again (:meth:`.tail.TailKeep.rejudge`), and
    jobs whose time ran short while they waited (told to end)."""
    batch = _Pass()
    for tr, ccs in core.parked.items():
        if ccs and (
            core.s.ready_count(tr.tid) > 0
            or core.tail.rejudge(tr.tid, len(ccs), functools.partial(_waited, ccs, now_ns), now_ns)
        ):
            batch.want.update(ccs)
        elif ccs and core.timed:
            batch.want.update((cc, None) for cc in core.walltime.short_parked(tr, ccs, now_ns))
    return batch


def check_invariants(core: HandOut) -> None:
    """:meth:`HandOut.validate`: every block in one place, held equal to in flight, parking consistent."""
    s = core.s
    held_by_task: dict[str, set[int]] = {}
    holders: dict[tuple[str, int], list[Conn]] = {}
    counts: dict[str, int] = {}
    for cid, cc in core.conns.items():
        assert cc.cid == cid, (cid, cc.cid)
        assert len(cc.held) <= 2, f"connection {cid!r} holds {len(cc.held)} blocks"
        if cc.tr is None:
            assert not cc.held and not cc.parked, f"connection {cid!r} holds or waits before its hello"
            continue
        tid = cc.tr.tid
        counts[tid] = counts.get(tid, 0) + 1
        held_by_task.setdefault(tid, set()).update(cc.held)
        for i in cc.held:
            holders.setdefault((tid, i), []).append(cc)
        if cc.parked:
            assert not cc.held, f"connection {cid!r} is parked and holds {list(cc.held)}"
            assert cc in core.parked.get(cc.tr, {}), f"connection {cid!r} parked but not registered"
        if cc.end_ns is not None and cc.held and cc.need_ns is not None:  # the walltime rule
            left = cc.end_ns - max(cc.held.values())  # when its newest block (or a later one given back) went out
            assert left >= cc.need_ns, (
                f"connection {cid!r} was sent a block with {left / 1e9:.3f} s left, under the {cc.need_ns / 1e9:.3f} s "
                "the walltime rule asks"
            )
    for (tid, i), holding in holders.items():  # only a copied block is in two places (net/backups.py)
        assert len(holding) == 1 or core.bk.copied(tid, i, holding), (
            f"block {i} of task {tid!r} held by {len(holding)} connections"
        )
    core.bk.validate(core.conns)
    assert core.timed == sum(1 for cc in core.conns.values() if cc.end_ns is not None), "timed connections miscounted"
    for tr, ccs in core.parked.items():
        for cc in ccs:
            assert cc.parked and core.conns.get(cc.cid) is cc, f"stale parked connection {cc.cid!r}"
            assert cc.tr is tr
    assert not (core.stopped and core.parked), "parked connections after stop"
    for tid in core.trs:
        n = core.n_clients.get(tid, 0)
        assert n == counts.get(tid, 0), f"task {tid!r}: {n} clients counted, {counts.get(tid, 0)} connected"
        held = len(held_by_task.get(tid, ()))
        assert held == s.processing_count(tid), (
            f"task {tid!r}: connections hold {held} blocks, the scheduler has {s.processing_count(tid)} in flight"
        )
