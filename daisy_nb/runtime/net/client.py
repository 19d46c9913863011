"""``Client``: the worker side of a 0-argument worker function (daisy 2.0 semantics).

``Client()`` reads ``DAISY_CONTEXT`` (put in the environment of every worker
process by the pool, inherited by programs the worker launches, also on other
machines: ``run_blockwise(host=...)``), connects to the scheduler over TCP and
hands out one block per ``acquire_block()``. This module is the block protocol and the
run's end as a worker program sees them; the connection under it (frames in and out,
heartbeats, silence, the close) is a :class:`~daisy_nb.runtime.net.connection.Connection`.

Protocol (details in :mod:`daisy_nb.runtime.net.transport` and :mod:`daisy_nb.runtime.net.wire`):

1. Handshake, before anything else is read: the scheduler sends ``DAISYNB6`` and a
   16-byte nonce; the client answers ``HMAC-SHA256(secret, "daisy_nb client" +
   nonce)`` and its own nonce; the scheduler proves the secret the same way. The
   secret (``authkey``) comes with the address in ``DAISY_CONTEXT``.
2. Frames, each with a MAC and an implicit sequence number under keys derived from
   the secret and both nonces (``net.frames.FrameCodec``; a frame that fails ends the
   connection, as a lost one), tiny ``struct``-packed payloads, never pickles.
   Client: ``H`` hello (worker id, the seconds its job has left, then the task id: the
   rest of the frame, so an id may hold any character; one per connection), ``A`` acquire, ``R`` release
   (index, status) *and* acquire the next (the scheduler answers it as an ``A``, so
   a loop sends one frame per block; ``A`` only where no release asked: the first
   block, after a failure or a give-back), ``F`` failure (index, spatial id, the
   exception's type, message and capped traceback; no request), ``G`` give back a block sent ahead (index), ``Q`` goodbye, ``P``
   heartbeat (every ``heartbeat`` seconds, from a background thread, also while a
   block runs). Scheduler: ``B`` block (index, spatial id, ROIs), ``N`` no more
   work, ``P`` heartbeat (while a request waits). A block the client holds (sent
   ahead, or on its way) answers a request; one it does not use is given back (``G``,
   ``Q``), uncounted.
3. Silence for ``peer_timeout`` seconds ends the connection, on either side.

For a ``Task(resource_tracking=True)`` (``resource_tracking=1`` in the context) the
body of ``with client.acquire_block()`` is measured with ``profile_block`` and the
stats ride on the block's own release frame (``R`` with five float64 appended;
``E`` instead of ``F``): still one message per block. While its task has ready
blocks to spare, the scheduler sends the next block ahead, so that the worker does
not wait a round trip per block (see :mod:`daisy_nb.runtime.net.handout`); ``G`` gives
such a block back unstarted (after a failure, or when the worker stops asking for a
second) and ``Q`` gives back everything still held. The block that a connection which drops (or stays
silent) was running is failed (and retried) by the scheduler.

The run being over is never an error here: a scheduler that refuses the
connection, is another run (its secret differs), or vanishes (silent for
``peer_timeout`` seconds, or the connection breaks) makes ``acquire_block`` yield
``None`` after a warning, so the canonical loop ends and a straggler cluster job
exits with 0.

**A job never outlives its run** (by more than a few seconds). The heartbeat thread
also watches the connection, between blocks and while one runs: the scheduler
closes every connection when the run ends (Ctrl-C, abandonment, an exception; the
kernel does it when the driver is killed) and heartbeats every client, so a closed
connection is seen within half a second and a vanished machine after
``peer_timeout`` seconds. Then, if the client's blocks run in the main thread:

* a block that is running is interrupted: the thread sends ``SIGINT`` to the main
  thread (``signal.pthread_kill``), so the block body gets ``KeyboardInterrupt``
  (also inside ``time.sleep`` or a blocking read); ``acquire_block`` marks the block
  failed and re-raises (the scheduler, gone or ending, never counts it done: it runs
  again in the next run); uncaught, the program exits non-zero (as an interrupted
  program: 130 in a shell), as a daisy 2.0.0 worker whose run vanished mid-block
  exits with the error its release raises;
* whether or not a block was running, a program still alive ``grace`` seconds
  (``DAISY_NB_EXIT_GRACE_SECS``, default 3) after the run ended ends itself with
  ``os._exit(130)``: a block stuck in C code, a handler that swallowed the interrupt,
  or post-processing after the loop do not keep a cluster node.

**A block dropped** (``Task(speculative=...)``: ``speculative=1`` in the context): a backup
copy of a straggling block ran in another job and succeeded first, and the scheduler says
``D`` (drop). A block not started yet is never started (the client asks for another); a
block running in the main thread is interrupted within ``DROP_TICK_SECS`` (its body gets
:class:`BlockDropped`, from the client's handler of a signal of its own, not ``SIGINT``, which
stays the program's: :mod:`.drops`). ``acquire_block`` takes it: no failure
is reported, the loop goes on (a ``BlockDropped`` is a ``BaseException``: ``except
Exception`` in a block body lets it through). A body in another thread is not interrupted;
its end counts for nothing. The block function of a speculative task must be idempotent
(chunk-aligned zarr writes are): both copies may have written.

A normal end is unchanged: ``N`` (no more work) between blocks makes
``acquire_block`` yield ``None``, the loop ends and the program exits 0; nothing is
interrupted and no deadline is armed. Opt out with ``Client(exit_with_run=False)``
or ``DAISY_NB_EXIT_WITH_RUN=0``: then the connection is still watched, but the
program is only told at its next ``acquire_block`` (``None``). A client whose
blocks run in another thread (a thread pool, a dask task) never interrupts or ends
its process.
"""

from __future__ import annotations

import atexit
import logging
import math
import numbers
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from daisy_nb import config
from daisy_nb.block import Block, BlockStatus
from daisy_nb.runtime.common.run_block import cap_traceback, format_exception
from daisy_nb.runtime.net import liveness, transport, wire
from daisy_nb.runtime.net.connection import Connection
from daisy_nb.runtime.net.context import Context
from daisy_nb.runtime.net.drops import DROP_TICK_SECS, BlockDropped, Drops

__all__ = ["BlockDropped", "Client"]

logger = logging.getLogger("daisy")

_BLOCK_HDR = wire._BLOCK_HDR  # index, spatial_id, ndim (benchmarks read frames with it)
_RELEASE = wire._RELEASE  # index, status
_STATS = wire._STATS  # wall s, cpu s, peak RSS, IO read, IO write (resource_tracking)

GIVE_BACK_SECS = 1.0  # a block sent ahead goes back if the worker has not asked for one for this long
_LIVE: weakref.WeakSet = weakref.WeakSet()  # connected clients (closed at exit)

_ENDED = "assuming the run has ended — this worker will exit without processing blocks"
EXIT_CODE = 130  # a program ended by its run's end (128 + SIGINT: "interrupted")
EXIT_GRACE_SECS = config.EXIT_GRACE_SECS.default
_ACQUIRE, _GOODBYE = wire.encode_acquire(), wire.encode_goodbye()
_YEAR_2000 = 946_684_800.0  # an end_time before it is a duration passed by mistake


def _exit_settings(exit_with_run) -> tuple[bool, float]:
    """``(end the program with the run, grace seconds)`` from the argument and the environment."""
    if exit_with_run is None:
        exit_with_run = config.EXIT_WITH_RUN.get()
    elif not isinstance(exit_with_run, bool):
        raise TypeError(f"exit_with_run must be a bool, got {type(exit_with_run).__name__}")
    return exit_with_run, config.EXIT_GRACE_SECS.get()


def _end_time(end_time) -> float | None:
    """When this job ends (UNIX epoch seconds): ``end_time``, else ``SLURM_JOB_END_TIME``, else None."""
    if end_time is None:
        return config.SLURM_JOB_END_TIME.get()
    if isinstance(end_time, bool) or not isinstance(end_time, numbers.Real):
        raise TypeError(
            "end_time must be a time in UNIX epoch seconds (a number, e.g. time.time() + 3600 or "
            f"datetime.timestamp()), got {type(end_time).__name__}"
        )
    try:
        v = float(end_time)
    except OverflowError:
        v = math.inf
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"end_time must be a time in UNIX epoch seconds (a finite number > 0), got {end_time!r}")
    if v < _YEAR_2000:
        raise ValueError(
            f"end_time must be a time in UNIX epoch seconds, got {end_time!r} (before the year 2000: a "
            "duration? pass time.time() + seconds)"
        )
    return v


class _ExitWithRun:
    """Whether, and how, the run's end ends this worker program (see the module docstring).

    Owns the policy only: the client tells it who runs its blocks (:meth:`block_user`), that the
    run ended normally (:meth:`normal_end`: nothing to do) or was lost (:meth:`run_lost`); it
    decides whether to interrupt the main thread's block and arms the deadline (``grace``
    seconds, then ``os._exit(EXIT_CODE)``).
    """

    def __init__(self, exit_with_run: bool | None) -> None:
        self.enabled, self.grace = _exit_settings(exit_with_run)
        self.main_user = False  # its blocks ran in the main thread: the run's end may end the program
        self.ended = False  # the program's end is under way (or a normal end: nothing to do)

    def block_user(self) -> None:
        """Called by the thread that asks for a block: the main thread's blocks may be interrupted."""
        if not self.main_user and threading.current_thread() is threading.main_thread():
            self.main_user = True

    def normal_end(self) -> None:
        """No more work (or the client closed by its program): the run's end ends nothing."""
        self.ended = True

    def run_lost(self, in_block: bool) -> None:
        """The run is over, not normally: interrupt a running block (``in_block``: seen while
        the block body runs) and end a program still alive ``grace`` seconds later."""
        if self.ended or not (self.enabled and self.main_user):
            return
        self.ended = True
        if in_block:
            handler = signal.getsignal(signal.SIGINT)
            if callable(handler):  # Python's default handler raises KeyboardInterrupt in the main thread
                logger.warning("the run ended while a block was running: interrupting it (KeyboardInterrupt)")
                # to the main thread itself: a signal sent to the process may be taken by this thread,
                # and the main thread's time.sleep / blocking read would run on to its end
                main = threading.main_thread().ident
                if main is not None:
                    signal.pthread_kill(main, signal.SIGINT)
        threading.Thread(target=_exit_after, args=(self.grace,), name="daisy_nb-exit", daemon=True).start()


def pack_block(index: int, spatial_id: int, ro, rs, wo, ws) -> bytes:
    """A ``BLOCK`` frame (see :func:`daisy_nb.runtime.net.wire.encode_block`)."""
    return wire.encode_block([index, spatial_id, *ro, *rs, *wo, *ws])


pack_row = wire.encode_block


def pack_hello(task_id: str, worker_id: int, secs_left: float | None = None) -> bytes:
    """``HELLO`` + worker id (``int64``) + seconds left (``float64``, NaN: not known) + the task id in
    UTF-8, the rest of the frame: any id works."""
    return wire.encode_hello(task_id, worker_id, secs_left)


def unpack_hello(msg: bytes) -> tuple[str, int]:
    """``(task_id, worker_id)`` of a ``HELLO`` frame (``ValueError`` if malformed)."""
    m = wire.decode_client(msg)
    if not isinstance(m, wire.Hello):
        raise wire.WireError(f"not a hello: {msg[:1]!r}")
    return m.task_id, m.worker_id


def block_of(row: wire.BlockRow, task_id: str) -> Block:
    """The :class:`~daisy_nb.Block` of a decoded ``BLOCK`` message, being processed."""
    b = Block._make(task_id, row.spatial_id, row.read, row.write, row.block)
    b._status = BlockStatus.PROCESSING
    return b


def unpack_block(msg: bytes, task_id: str) -> Block:
    """The :class:`~daisy_nb.Block` of a ``BLOCK`` frame (``ValueError`` if it is not one)."""
    row = wire.decode_server(msg)
    if not isinstance(row, wire.BlockRow):
        raise wire.WireError(f"not a block: {msg[:1]!r}")
    return block_of(row, task_id)


class Client:
    """The worker side of a 0-argument worker function: blocks from the scheduler, over TCP.

    Parameters
    ----------
    context : Context, optional
        Where the scheduler is and who this worker is (``hostname``, ``port``,
        ``task_id``, ``worker_id``, the run's ``authkey``...). Default: the
        ``DAISY_CONTEXT`` environment variable that the scheduler gives every
        worker function (inherited by the programs it starts).
    exit_with_run : bool, optional
        When the run ends while this program runs (Ctrl-C, abandonment, an
        exception, the driver killed: the connection closes or stays silent), a
        block running in the main thread gets ``KeyboardInterrupt`` and a program
        still alive a few seconds later exits with 130 (see the module docstring).
        ``False`` (or ``DAISY_NB_EXIT_WITH_RUN=0``) opts out: ``acquire_block`` then
        just yields ``None`` at its next call. Default: the environment, else True.
    end_time : float, optional
        When this job ends, in UNIX epoch seconds (``time.time()``'s clock), e.g. its
        batch system's time limit: once the time left is under twice the task's median
        block time, :meth:`acquire_block` yields ``None`` as when no block is left (a
        clean end, not a crash; a new job starts if blocks remain). Default:
        ``SLURM_JOB_END_TIME``, else none. daisy's ``Client`` has no such keyword.

    Raises
    ------
    TypeError
        ``end_time`` is not a number (a ``bool`` is not one either).
    ValueError
        A malformed ``DAISY_CONTEXT`` ("invalid context token") or setting (``SLURM_JOB_END_TIME``
        too); an ``end_time`` not finite or before 2000 (a duration: pass ``time.time() + secs``).
    KeyError
        No context given and ``DAISY_CONTEXT`` unset.
    daisy_nb.runtime.net.wire.ProtocolVersionError
        The scheduler speaks another version of the protocol (another daisy_nb
        release): install the driver's daisy_nb version where this worker runs.

    Notes
    -----
    A scheduler that is not there (refused, unreachable, silent) or is another run
    is not an error, as in daisy 2.0.0: a warning ("not reachable", "not this
    worker's run"), :attr:`connected` is False and :meth:`acquire_block` yields
    ``None``, so the canonical loop ends and the program exits 0.

    Examples
    --------
    >>> client = daisy_nb.Client()  # doctest: +SKIP
    >>> while True:  # doctest: +SKIP
    ...     with client.acquire_block() as block:
    ...         if block is None:
    ...             break
    ...         process(block)
    """

    def __init__(
        self, context: Context | None = None, *, exit_with_run: bool | None = None, end_time: float | None = None
    ) -> None:
        self._exit = _ExitWithRun(exit_with_run)
        #: When this job ends (UNIX epoch seconds), or None: not known (see ``end_time``).
        self.end_time = _end_time(end_time)
        if context is None:
            context = Context.from_env()
        _use_logdir(context)
        self.context = context
        self.host = context["hostname"]
        self.port = int(context["port"])
        self.worker_id = int(context["worker_id"])
        self.task_id = context["task_id"]
        self._track = context.get("resource_tracking", "0") == "1"
        self._drops = Drops() if context.get("speculative", "0") == "1" else None  # blocks to drop (net/drops.py)
        try:
            secret = bytes.fromhex(context.get("authkey", ""))
        except ValueError:
            raise ValueError(f"malformed authkey in {Context.ENV_VARIABLE}") from None
        timeouts = liveness.liveness(context)
        self._beat = timeouts["heartbeat"]
        self._peer = timeouts["peer_timeout"]
        self._conn: Connection | None = None  # None: the scheduler was not reached
        self._stop = threading.Event()
        self._in_block = False
        self._owed = False  # a request (A, or an R: "done, and the next one") is not answered yet
        self._t_idle = t0 = time.monotonic()
        self._conn = _connect(self.host, self.port, secret, timeouts, t0)
        if self._conn is None:
            return
        # the seconds left, not the end time: the scheduler's clock need not agree with this machine's
        left = None if self.end_time is None else self.end_time - time.time()
        if self._send(pack_hello(self.task_id, self.worker_id, left)):
            _LIVE.add(self)
            ref = weakref.ref(self)  # the thread must not keep the client alive
            threading.Thread(target=_heartbeat_loop, args=(ref,), name="daisy_nb-heartbeat", daemon=True).start()

    @property
    def connected(self) -> bool:
        """Whether this client is connected to its scheduler (False if it was not reachable, or
        after the last block, or once the run ended)."""
        return self._conn is not None and self._conn.is_open

    # ------------------------------------------------------------- the connection, watched
    def _send(self, payload: bytes) -> bool:
        """One frame to the scheduler; False when closed, or when sending failed (the run is lost)."""
        if self._conn is None:
            return False
        try:
            return self._conn.send(payload)
        except OSError as e:
            self._lost(f"sending failed: {e}")
            return False

    def _tick(self) -> None:
        """Heartbeat thread, a few times a second: watch the connection (the run's end is seen
        while a block runs too), give back a block sent ahead if this worker stopped asking for
        blocks, and tell the scheduler it lives (also while a block runs)."""
        conn, now = self._conn, time.monotonic()
        if conn is None:
            return
        if conn.reading.acquire(blocking=False):  # holding it: the client's thread is not inside _request
            try:
                if not self._in_block and now - self._t_idle > GIVE_BACK_SECS:
                    self._give_back()
                why = conn.watch(now)
                if self._drops is not None:
                    self._drops.take(conn.inbox)
            finally:
                conn.reading.release()
            if why is not None:
                self._lost(why, interrupt=self._in_block)
                return
        conn.ping_if_due(now, self._beat)

    def _lost(self, why: str, interrupt: bool = False) -> None:
        """The run is over for this client (not a normal end): close; the policy may end the program.

        ``interrupt``: seen by the heartbeat thread while the block body runs.
        """
        if self.connected:
            logger.warning("lost the daisy server at %s:%s (%s); " + _ENDED, self.host, self.port, why)
        self._disconnect(give_back=False)
        self._exit.run_lost(interrupt and self._in_block)

    def _request(self) -> Block | None:
        """The next block: one sent ahead, or the answer to a request (one is sent unless owed)."""
        conn = self._conn
        if conn is None:
            return None
        with conn.reading:
            if not conn.is_open:
                return None
            try:
                conn.read(False)  # a block sent ahead is used without asking
                if not self._owed and not any(isinstance(m, wire.BlockRow) for m in conn.inbox):
                    if not self._send(_ACQUIRE):
                        return None
                    self._owed = True
                while True:
                    while conn.inbox:
                        msg = conn.inbox.popleft()
                        if self._drops is not None and self._drops.skip(msg):  # a drop; a dropped block
                            if isinstance(msg, wire.BlockRow):  # it answered the request: ask again
                                self._owed = False
                                if not any(isinstance(m, wire.BlockRow) for m in conn.inbox):
                                    if not self._send(_ACQUIRE):
                                        return None
                                    self._owed = True
                            continue
                        if isinstance(msg, wire.BlockRow):  # the answer, or a block sent ahead (it answers)
                            self._owed = False
                            return block_of(msg, self.task_id)
                        if msg is wire.NO_MORE:
                            self._owed = False
                            return None
                        raise ConnectionError(f"unexpected message {msg!r}")
                    conn.read(True)
            except TimeoutError:
                self._lost(f"no word from it for {self._peer:g} s")
            except (EOFError, OSError) as e:
                self._lost(str(e) or type(e).__name__)
            return None

    def _give_back(self) -> None:
        """Return the blocks sent ahead that this worker will not start (the scheduler does not count them)."""
        conn = self._conn
        if conn is None:
            return
        with conn.reading:
            if not conn.is_open:
                return
            try:
                conn.read(False)
            except (EOFError, OSError):
                return
            for msg in [m for m in conn.inbox if isinstance(m, wire.BlockRow)]:
                conn.inbox.remove(msg)
                self._owed = False  # that block answered the request: asking again takes an ACQUIRE
                self._send(wire.encode_give_back(msg.block))

    @contextmanager
    def acquire_block(self) -> Iterator[Block | None]:
        """The next block to process, as a context manager; ``None`` when there is no more work.

        Yields
        ------
        Block or None
            A block of this worker's task (status ``PROCESSING``), or ``None``: no block
            is left, or the scheduler is gone (the run ended, or was never reachable).

        Notes
        -----
        Leaving the ``with`` body normally releases the block as done (unless the body
        set ``block.status = BlockStatus.FAILED``); an exception in the body marks it
        failed, sends the traceback to the scheduler and propagates. The release also
        asks for the next block, and while its task has blocks to spare the scheduler
        sends the next one ahead, so a loop costs one message each way per block.
        With ``Task(resource_tracking=True)`` the body is measured and the stats ride
        on the release.

        Examples
        --------
        >>> with client.acquire_block() as block:  # doctest: +SKIP
        ...     if block is not None:
        ...         process(block)
        """
        if not self.connected:
            yield None
            return
        self._exit.block_user()
        block = self._request()
        if block is None:
            self._disconnect()
            yield None
            return
        reported = False
        self._in_block = True
        if self._drops is not None and threading.current_thread() is threading.main_thread():
            self._drops.begin(block.index)
        prof = None
        if self._track:
            from daisy_nb.profiling import profile_block

            prof = profile_block(block).start()
        try:
            yield block
            if block.status == BlockStatus.PROCESSING:
                block.status = BlockStatus.SUCCESS
        except BlockDropped:  # a copy in another job won: nothing to report, the loop goes on
            logger.info("block %s dropped: a backup copy of it finished first", block.block_id)
            block.status = BlockStatus.FAILED  # its release counts for nothing at the scheduler
        except BaseException as e:
            block.status = BlockStatus.FAILED
            try:
                tb = format_exception(e)
                logger.warning("block %s failed: %s", block.block_id, e)
                sys.stderr.write(f"block {block.block_id} failed:\n{tb}")
                sys.stderr.flush()
                stats = None if prof is None else _stats(prof, block)
                fail = wire.encode_failure(
                    block.index, block.spatial_id, type(e).__name__, str(e), cap_traceback(tb), stats
                )
                self._send(fail)
                reported = True
                self._give_back()  # the exception most likely ends this worker's loop
            except Exception:  # reporting must not hide the block's own exception, raised below
                logger.warning("could not report the failure of block %s", block.block_id, exc_info=True)
            raise
        finally:
            if self._drops is not None:
                self._drops.end()
            if block.status != BlockStatus.SUCCESS:
                block.status = BlockStatus.FAILED
            if not reported:  # a release asks for the next block too: the loop goes on
                stats = None if prof is None else _stats(prof, block)
                if self._send(wire.encode_release(block.index, block.status, stats)):
                    self._owed = True
            self._t_idle = time.monotonic()
            self._in_block = False

    def _disconnect(self, give_back: bool = True):
        stop = getattr(self, "_stop", None)
        if stop is None:  # __init__ did not get that far
            return
        stop.set()
        if give_back:  # a normal end: a goodbye that fails now is no reason to end the program
            self._exit.normal_end()
        conn = self._conn
        if conn is None:
            return
        was_open = conn.is_open
        # goodbye: the scheduler gives back what it sent ahead (never started) and closes
        err = conn.close(_GOODBYE if give_back else None)
        if err is not None and was_open:
            logger.warning(
                "lost the daisy server at %s:%s (%s); " + _ENDED, self.host, self.port, f"sending failed: {err}"
            )

    def __del__(self) -> None:
        try:
            self._disconnect()
        except Exception:  # noqa: S110 - at interpreter shutdown module globals may be gone: nothing to tell
            pass


def _use_logdir(context: Context) -> None:
    """This worker's log folder: the context's ``logdir`` (set from this process's when missing)."""
    from daisy_nb.logging import get_log_basedir, set_log_basedir

    if "logdir" not in context:
        base = get_log_basedir()
        context["logdir"] = "" if base is None else str(base)
    set_log_basedir(context["logdir"] or None)


def _connect(host: str, port: int, secret: bytes, timeouts: dict, t0: float) -> Connection | None:
    """The connection to the scheduler, or None (after a warning) if it is not there or is another run."""
    try:
        return Connection(transport.connect(host, port, secret, timeouts), timeouts["peer_timeout"], t0)
    except wire.ProtocolVersionError as e:  # another daisy_nb release: loud, never "the run has ended"
        logger.error("%s", e)
        raise
    except transport.NotOurRun as e:
        logger.warning("daisy server at %s:%s is not this worker's run (%s); " + _ENDED, host, port, e)
    except OSError as e:
        logger.warning("daisy server at %s:%s is not reachable (%s); " + _ENDED, host, port, e)
    return None


def _stats(prof, block) -> tuple[float, ...]:
    """A tracked block's five stats, as its release frame carries them."""
    from daisy_nb.profiling import measured_stats

    return tuple(float(v) for v in measured_stats(prof, block)[:5])


def _exit_after(grace: float) -> None:
    """The run ended ``grace`` seconds ago and this program is still alive: end it (not a normal end)."""
    time.sleep(grace)
    try:
        logger.warning(
            "the daisy run ended %g s ago and this worker program is still running: exiting with %d "
            "(DAISY_NB_EXIT_WITH_RUN=0 keeps it)",
            grace,
            EXIT_CODE,
        )
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stream: exit all the same
        pass
    os._exit(EXIT_CODE)


def _heartbeat_loop(ref) -> None:
    """The heartbeat thread of one client (holds it only weakly)."""
    while True:
        c = ref()
        if c is None:
            return
        stop, tick = c._stop, DROP_TICK_SECS if c._drops is not None else min(c._beat / 2, 0.5)
        del c
        if stop.wait(tick):
            return
        c = ref()
        if c is None:
            return
        c._tick()
        del c


@atexit.register
def _close_all() -> None:
    """At exit, give back blocks sent ahead and close (a worker that left its loop early)."""
    for c in list(_LIVE):
        try:
            c._disconnect()
        except Exception:  # one client's goodbye must not stop the others'
            logger.debug("closing a daisy_nb client at exit failed", exc_info=True)
