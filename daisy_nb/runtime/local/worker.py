"""Worker process main: ``python -m daisy_nb.runtime.local.worker <fd> <parent_pid>``.

Started by :mod:`daisy_nb.runtime.local.pool`: forked by the run's worker template
(:mod:`._zygote`, which then calls :func:`serve`) or exec'd, never forked from the
scheduler process, which runs numba and zarr threads. ``fd`` is this worker's end of a
socket pair to the parent, used only for small signals; blocks and their results
travel through a shared-memory segment (layout in :mod:`._shm`).

Protocol: :mod:`daisy_nb.runtime.local.wire` (both ends, the version): one pickled
setup dict, the function bytes (cloudpickle, loadable with plain pickle), then "run the
batch in slot k", "quit", or "serve another task" (a new setup and function follow; its
``init_fn`` runs, ``DAISY_CONTEXT`` and the log files change: ``runtime/local/reuse.py``);
this worker answers "ready", "slot k done" (statuses in
shared memory) or "a block of slot k raised" (and exits); a 0-argument worker
function's process keeps its end only for its launcher's job reports
(:mod:`daisy_nb.launch`). The parent may send the next batch while one runs (two
slots): the worker finds it waiting in the socket and starts it at once. Frames are
``multiprocessing.connection``'s (4-byte big-endian length, then the bytes), written
with plain ``os.read``/``os.write`` (:mod:`._pipe`, both ends). A setup of another wire version (another
daisy_nb installed since the driver started) is a loud exit
(:data:`~daisy_nb.runtime.local.wire.VERSION_MISMATCH_EXIT`).

With ``resource_tracking`` in the setup, each call is wrapped in
:func:`daisy_nb.profiling.profile_block` and the block's stats are written to the
slot's stats region (``_shm``) before its status: no message per block.

A 1-argument ``process_function(block)`` is called once per block; an exception
fails that block (traceback to stderr, i.e. the ``.err`` log, and its type, message and
traceback in a :data:`~daisy_nb.runtime.local.wire.Kind.RAISED` frame) and ends the worker with exit code 1 (daisy 2.0's dirty exit; the blocks
after it in the batch were never started). A 0-argument worker function is called once, with ``context=`` when it asks
for it, and runs its own ``daisy_nb.Client()`` loop; raising is a dirty exit.

Deliberately imports nothing heavy: no numpy, numba, scheduler or kernels, and on
Linux not even ``multiprocessing`` (start-up time is on every run's critical path).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

_LIBC: list = []  # the C library, loaded once (a template process loads it for all the workers it forks)


def _die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send us ``sig`` when the parent dies (best effort elsewhere)."""
    try:
        if not _LIBC:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        _LIBC[0].prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no C library or no prctl (not Linux): the parent ends us
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _apply_setup(setup: dict) -> None:
    for p in reversed(setup.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    from daisy_nb import logging as dlog

    dlog.set_log_basedir(setup.get("log_basedir"))
    if setup.get("log_mode"):
        dlog.set_log_mode(setup["log_mode"])
    if setup.get("log_level") is not None:
        dlog.set_log_level(setup["log_level"])
    if setup.get("tee_files"):  # log mode "both": console and file
        out_path, err_path = setup["tee_files"]
        sys.stdout = _Tee(sys.stdout, open(out_path, "a", buffering=1))
        sys.stderr = _Tee(sys.stderr, open(err_path, "a", buffering=1))
        dlog._bind_worker_files(sys.stdout._file, sys.stderr._file)
    elif dlog.get_log_mode() == "file":  # fds 1 and 2 are this slot's log files
        dlog._bind_worker_files(sys.stdout, sys.stderr)


class _Tee:
    def __init__(self, stream, file):
        self._stream, self._file = stream, file

    def write(self, s):
        self._file.write(s)
        return self._stream.write(s)

    def flush(self):
        self._file.flush()
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _run_worker_function(fn, wants_context: bool) -> int:
    try:
        if wants_context:
            from daisy_nb.runtime.context import Context

            fn(context=Context.from_env())
        else:
            fn()
    except BaseException as e:  # noqa: BLE001 - any escape is a dirty exit
        from daisy_nb.runtime.common.run_block import format_exception

        sys.stderr.write(format_exception(e))
        sys.stderr.flush()
        return 1
    return 0


def _tracked(fn, pos: list):
    """``fn`` wrapped in ``profile_block``: each block's stats go to ``pos = [float view, word offset]``
    (the batch slot's stats region, reset per batch), written before the block's status."""
    from daisy_nb.profiling import measured_stats, profile_block

    def call(b):
        p = profile_block(b)
        try:
            with p:
                fn(b)
        finally:
            s = measured_stats(p, b)  # the block function's own profile_block wins
            v, j = pos
            v[j], v[j + 1], v[j + 2], v[j + 3], v[j + 4] = (
                float(s[0]),
                float(s[1]),
                float(s[2]),
                float(s[3]),
                float(s[4]),
            )
            pos[1] = j + 5

    return call


# Called once, as the first batch ends (before its "done" is sent): a worker forked by the template tells
# it what that batch imported (``_zygote``, ``_zygote_imports``) while this task still runs.
after_first_batch: Callable[[], None] | None = None


def _after_first_batch() -> None:
    global after_first_batch
    hook, after_first_batch = after_first_batch, None
    try:
        if hook is not None:
            hook()
    except Exception:  # noqa: BLE001, S110 - learning is an optimisation: never fail a block for it
        pass


NEXT_TASK = -1  # _run_block_loop's return when the pool moves this worker to another task


class _DropHandler:
    """The ``DROP_SIGNAL`` handler of a speculative task's block worker: raises ``BlockDropped`` in the
    body of the block the pool dropped (its copy lost to its twin: ``_shm``'s ``drop``), only while
    that block's own code runs; a signal that comes before or after it, or while this module's
    code runs, is ignored (the pool sends it again while the block still runs)."""

    def __init__(self) -> None:
        self.q = None  # the running batch's slot (int64 view) while a block body runs, else None
        self.i = -1  # the block's position in it
        self.exc: type[BaseException] | None = None
        self.h_drop = 0  # the slot header's drop word

    def arm(self) -> None:
        if self.exc is None:
            from daisy_nb.runtime.local._shm import H_DROP
            from daisy_nb.runtime.net.drops import DROP_SIGNAL, BlockDropped

            self.exc, self.h_drop = BlockDropped, H_DROP
            signal.signal(DROP_SIGNAL, self)

    def __call__(self, signum, frame) -> None:
        q, i = self.q, self.i
        if q is None or i < 0 or q[self.h_drop] != i + 1:
            return  # not for the block that runs (it ended, or this is another batch)
        if frame is not None and frame.f_code.co_filename == __file__:
            return  # between the block's code and ours: the next signal stops it
        self.q, self.i = None, -1
        assert self.exc is not None
        raise self.exc(f"block at position {i} of its batch: a copy of it elsewhere finished first")


_DROP = _DropHandler()


def _run_block_loop(conn, fn, setup: dict, shm) -> int:
    """Run the batches the pool sends; returns the exit code, or :data:`NEXT_TASK` (``Kind.TASK``)."""
    from daisy_nb.block import Block, BlockStatus
    from daisy_nb.runtime.local import _shm, wire

    CREATED, PROCESSING, SUCCESS, FAILED = (
        BlockStatus.CREATED,
        BlockStatus.PROCESSING,
        BlockStatus.SUCCESS,
        BlockStatus.FAILED,
    )
    RUN, TASK = wire.Kind.RUN, wire.Kind.TASK

    cap, nd = setup["capacity"], setup["ndim"]
    track = bool(setup.get("resource_tracking"))
    o = _shm.offsets(cap, nd, track)
    base = shm.buf.cast("q")
    w = _shm.words(cap, nd, track)
    n_slots = setup.get("slots", 1)
    slots = [base[k * w : (k + 1) * w] for k in range(n_slots)]
    q = slots[0]
    fbase, fslots, pos = None, [], None
    if track:  # the same words seen as float64, for the per-block stats
        fbase = shm.buf.cast("d")
        fslots = [fbase[k * w : (k + 1) * w] for k in range(n_slots)]
        pos = [fslots[0], o["stats"]]
        fn = _tracked(fn, pos)
    task_id = setup["task_id"]
    make = Block._make
    mono = time.monotonic_ns
    o_idx, o_sp, o_st = o["index"], o["spatial"], o["status"]
    o_ro, o_rs, o_wo, o_ws = o["read_offset"], o["read_shape"], o["write_offset"], o["write_shape"]
    o_secs = o["secs"]
    H_CUR, H_START, H_LIMIT = _shm.H_CUR, _shm.H_START, _shm.H_LIMIT
    drop = _DROP if setup.get("speculative") else None  # copies that lose are interrupted (_DropHandler)
    dropped: tuple = ()  # what a drop raises in the block body
    if drop is not None:
        drop.arm()
        dropped = (drop.exc,)
    try:
        conn.send_bytes(wire.ready())
        while True:
            try:
                msg = conn.recv_bytes()
            except (EOFError, OSError):
                return 0  # parent gone
            if msg[:1] != RUN:  # QUIT, or TASK
                return NEXT_TASK if msg[:1] == TASK else 0
            slot = msg[1] if len(msg) > 1 else 0
            q = slots[slot]
            if pos is not None:  # once per batch; untracked workers pay nothing per block
                pos[0], pos[1] = fslots[slot], o["stats"]
            n = q[_shm.H_N]
            m = n * nd
            idx = q[o_idx : o_idx + n].tolist()
            sp = q[o_sp : o_sp + n].tolist()
            ro = q[o_ro : o_ro + m].tolist()
            rs = q[o_rs : o_rs + m].tolist()
            wo = q[o_wo : o_wo + m].tolist()
            ws = q[o_ws : o_ws + m].tolist()
            err = None  # the block that raised (wire.Raised)
            t0 = mono()
            dropped_at = None  # when the block the pool dropped started (its time is not the batch's)
            for i in range(n):
                if i >= q[H_LIMIT]:  # the pool gave the rest back (a straggler ran before them)
                    break
                j, k = i * nd, (i + 1) * nd
                b = make(task_id, sp[i], (tuple(ro[j:k]), tuple(rs[j:k])), (tuple(wo[j:k]), tuple(ws[j:k])), idx[i])
                b._status = PROCESSING
                q[o_st + i] = PROCESSING
                q[H_START] = t_start = mono()  # before cur: the parent reads cur, then its start
                q[H_CUR] = i
                try:
                    if drop is not None:
                        drop.q, drop.i = q, i
                    fn(b)
                    if drop is not None:
                        drop.q = None
                        q[o_secs + i] = mono() - t_start  # the block's own time, for the backups' rule
                    s = FAILED if b._status == FAILED else SUCCESS
                except dropped:  # its twin won (the pool cut it from the batch): the worker runs on
                    q[o_st + i] = CREATED
                    dropped_at = t_start
                    break
                except Exception as e:
                    if drop is not None:
                        drop.q = None
                    # daisy 2.0: an exception ends the worker (a dirty exit, counted toward
                    # max_worker_restarts); the blocks after it were never started
                    from daisy_nb.runtime.common.run_block import cap_traceback, exception_message, format_exception

                    tb = format_exception(e)
                    sys.stderr.write(f"block {b.block_id} failed:\n{tb}")
                    sys.stderr.flush()
                    err = wire.Raised(type(e).__name__, exception_message(e), cap_traceback(tb), sp[i])
                    q[o_st + i] = FAILED
                    break
                except BaseException:
                    q[o_st + i] = FAILED
                    raise
                q[o_st + i] = s
            q[H_CUR] = -1
            q[_shm.H_ELAPSED] = (mono() if dropped_at is None else dropped_at) - t0
            try:
                sys.stdout.flush()
            except (OSError, ValueError):  # a closed or broken stdout: the block's output is lost, not the block
                pass
            if err is not None:  # this batch ended with a raising block; the worker exits with 1
                conn.send_bytes(wire.raised(slot, err))
                return 1
            if after_first_batch is not None:  # before "done": the template has the report before any fork it causes
                _after_first_batch()
            conn.send_bytes(wire.done(slot))
    finally:
        if pos is not None:
            pos.clear()
        for v in (*slots, *fslots):
            v.release()
        base.release()
        if fbase is not None:
            fbase.release()
        del q, slots, base, fslots, fbase


def serve(fd: int, shm_fd: int | None = None) -> int:
    """Run one worker over its end ``fd`` of the socket pair; returns the exit code.

    ``shm_fd``: where this process holds its segment's memfd when that differs from
    the number in the setup (a worker forked by the template, :mod:`._zygote`).
    """
    from daisy_nb.runtime.local._pipe import Pipe

    conn = Pipe(fd)
    try:
        setup = pickle.loads(conn.recv_bytes())
        if shm_fd is not None and "shm_fd" in setup:
            setup["shm_fd"] = shm_fd
        _apply_setup(setup)
        payload = conn.recv_bytes()
    except (EOFError, OSError):
        return 0
    from daisy_nb.runtime.local import wire

    problem = wire.version_error(setup.get("wire"))
    if problem is not None:
        sys.stderr.write(problem + "\n")
        sys.stderr.flush()
        return wire.VERSION_MISMATCH_EXIT
    fn, init_fn = pickle.loads(payload)  # cloudpickle output loads with pickle
    if setup["arity"] == 0:
        # A worker function ends by SIGTERM, a short grace, then SIGKILL (the pool's end of it, and
        # its death signal when the run's process dies): a launcher (daisy_nb.launch) cancels its
        # job in that grace. SIGINT as in a fresh interpreter (this is its own session: no terminal
        # Ctrl-C reaches it), so that programs it starts get KeyboardInterrupt from a Client.
        _die_with_parent(os.getppid(), signal.SIGTERM)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from daisy_nb.runtime.common.worker_state import bind_report

        os.set_inheritable(conn.fd, False)
        bind_report(conn)  # the launchers tell the pool their job ids on the socket pair
        return _run_worker_function(fn, setup.get("wants_context", False))
    from daisy_nb.runtime.local import _shm

    shm = _shm.attach(setup.get("shm_name"), setup.get("shm_fd"))
    try:
        while True:  # one turn per task this worker serves (runtime/local/reuse.py)
            if init_fn is not None:
                from daisy_nb.runtime.common.worker_state import set_worker_state

                set_worker_state(setup["task_id"], init_fn())  # raising is a dirty exit
            code = _run_block_loop(conn, fn, setup, shm)
            if code != NEXT_TASK:
                return code
            try:
                setup, fn, init_fn = _next_task(conn, setup)
            except (EOFError, OSError):
                return 0
            from daisy_nb.runtime.common.worker_state import forget_worker_states

            forget_worker_states()  # worker_state() is the new task's (its init_fn runs next)
    finally:
        shm.close()


def _next_task(conn, old: dict):
    """The pool moved this worker to another task: its setup (the shared memory stays), log files,
    ``DAISY_CONTEXT`` and function."""
    setup = pickle.loads(conn.recv_bytes())
    payload = conn.recv_bytes()
    for key in ("shm_name", "shm_fd", "slots", "resource_tracking"):  # the same segment and layout
        if key in old:
            setup[key] = old[key]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for name in ("stdout", "stderr"):  # log mode "both": the earlier task's copies end
        stream = getattr(sys, name)
        if isinstance(stream, _Tee):
            stream._file.close()
            setattr(sys, name, stream._stream)
    for target, path in zip((1, 2), setup.get("log_files") or ()):  # log mode "file": fds 1/2 are the files
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    _apply_setup(setup)
    if setup.get("context"):
        from daisy_nb import config

        os.environ[config.CONTEXT.name] = setup["context"]
    fn, init_fn = pickle.loads(payload)
    return setup, fn, init_fn


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends workers
    fd, parent_pid = int(argv[0]), int(argv[1])
    _die_with_parent(parent_pid)
    from daisy_nb import config
    from daisy_nb.runtime.local import _heap

    _heap.keep_freed_memory(config.WORKER_HEAP_MIB.get())  # (a forked worker has it from the template)
    return serve(fd)


def run_as_main() -> None:
    """``main()``, then exit with its code after flushing the standard streams (a closed or
    broken stream is no reason to lose the exit code); both ``python -m`` paths call this."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)


if __name__ == "__main__":
    run_as_main()
