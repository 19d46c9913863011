"""Starting a worker process: its shared memory, socket pair, setup, the template fork or exec.

A part of the pool (:mod:`daisy_nb.runtime.local.pool`), owned by :class:`.processes.Processes`, which
decides when a worker starts and what becomes of it; this module only starts it.

* **Processes, never a fork of the scheduler.** On Linux each worker is forked by the
  run's worker template (:mod:`._zygote`: exec'd once per run, imported only the
  worker side, single-threaded), which hands back a pidfd and later the exit code;
  elsewhere, after the template died, or with ``DAISY_NB_WORKER_START=exec``, it is
  ``python -m daisy_nb.runtime.local.worker`` started with :class:`subprocess.Popen`. Either
  way in its own session (process group), with ``.out``/``.err`` as fd 1/2. This is
  the ``spawn`` start method without ``multiprocessing``'s re-import of the user's
  ``__main__``: daisy 2.0 scripts often have no ``if __name__ == "__main__"`` guard.
  Never ``fork`` the scheduler process: it runs numba and zarr threads. The user's
  function is serialized once per task at run start (:mod:`.policy`).

:class:`Starter` owns the run's worker template (started on first use unless
``run._execute`` started it early), which workers it forked, and the process group
of every worker started. Its methods, called by :class:`.processes.Processes`:
:meth:`Starter.start_many` (new workers' processes (:mod:`.records` records), shared memory, socket pairs,
setup and pidfds), each in two halves so that several start at once (:meth:`Starter._begin` asks
the template for the fork and sends the setup, :meth:`Starter._finish` collects the
worker: ``docs/explanation/pool.md#workers``), :meth:`Starter.retask`, :meth:`Starter.died_with_template`, :meth:`Starter.template_gone`
and :meth:`Starter.close` (the run's end: the template closed, every process group
killed).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from daisy_nb import logging as dlog
from daisy_nb.runtime.common.payload import payload_imports
from daisy_nb.runtime.context import Context
from daisy_nb.runtime.local import _shm, _zygote, wire
from daisy_nb.runtime.local._pipe import pipe_pair
from daisy_nb.runtime.local.pool_parts import PoolTaskRun

__all__ = ["CAPACITY", "Starter"]

logger = logging.getLogger("daisy")

_WORKER_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")  # a forked worker's argv[0]

CAPACITY = 4096  # blocks per shared-memory batch


class Starter:
    """Starts worker processes (see the module docstring)."""

    def __init__(self, tasks: Mapping[str, PoolTaskRun], template=None):
        self.trs = tasks  # the pool's run records: a worker function among them preloads the Client
        # the worker template (_zygote): started early by run._execute, else by the first start
        self.template = template
        self.template_failed = False
        self.forked_wids: set[int] = set()  # workers forked by the template (they die with it)
        self.pgids: list[int] = []  # the process group of every worker started

    def start_many(self, items: list, started: Callable[[Any], None]) -> None:
        """Start the process of each ``(worker, context)`` of ``items``: its shared memory (block
        functions), socket pair (``w.conn``), log files, setup and function sent, ``w.pidfd``
        when this platform has one; every fork asked of the template before the first is
        collected. ``started(worker)`` for each one started, also when another failed to start
        (the first error is raised once every worker asked for is collected)."""
        begun = []
        try:
            for w, context in items:
                begun.append(self._begin(w, context))
        finally:
            error = None
            for st in begun:
                try:
                    self._finish(st)
                except BaseException as e:  # noqa: BLE001 - raised below, once the others are in
                    error = error or e
                    continue
                started(st.w)
            if error is not None:
                raise error

    def _begin(self, w, context: Context) -> _Starting:
        """The first half of a worker's start: everything up to asking the template for the fork
        (or, without a template, the whole exec). :meth:`_finish` must follow, for every ``_begin``
        that returned, in the same order (:meth:`start_many`)."""
        tr = w.tr
        setup = _setup(w)
        keep_fds = []
        if tr.arity:
            w.shm = _shm.Segment(_shm.segment_bytes(CAPACITY, tr.ndim, tr.track))
            nw = _shm.words(CAPACITY, tr.ndim, tr.track)
            arr = np.ndarray((_shm.SLOTS, nw), dtype=np.int64, buffer=w.shm.buf)
            arr[:, : _shm.HDR] = 0
            arr[:, _shm.H_CUR] = -1
            w.bufs = list(arr)
            w.off = _shm.offsets(CAPACITY, tr.ndim, tr.track)
            if tr.track:
                w.fbufs = list(np.ndarray((_shm.SLOTS, nw), dtype=np.float64, buffer=w.shm.buf))
                setup["resource_tracking"] = True
            setup.update(w.shm.worker_setup())
            setup["slots"] = _shm.SLOTS
            if w.shm.fd >= 0:
                keep_fds.append(w.shm.fd)
        parent_end, child_end = pipe_pair()
        logs = dlog.open_worker_logs(tr.tid, w.slot)
        if logs:  # where this life's output starts: now, before the worker exists (the file's
            # offset is shared with the worker's fds and moves with its writes)
            w.err_path, w.err_offset = logs[1].name, logs[1].tell()
        tee = logs is not None and dlog.get_log_mode() == "both"
        if tee:  # console stays fd 1/2; the worker copies Python-level writes into the files
            setup["tee_files"] = (logs[0].name, logs[1].name)
        env = _zygote.worker_env()
        env[Context.ENV_VARIABLE] = context.to_env()
        fd_logs = logs if logs and not tee else None
        st = _Starting(w, pickle.dumps(setup), parent_end, child_end, logs, fd_logs, keep_fds, env)
        try:
            st.asked = self._ask(st)
            if not st.asked:
                w.proc = self._exec(st)
            elif len(st.setup) + len(tr.payload or b"") <= EARLY_SEND_BYTES:
                _send_setup(st)  # the worker reads them as it starts, not after our collect
        except BaseException:
            st.close()
            st.parent_end.close()
            raise
        return st

    def _finish(self, st: _Starting) -> None:
        """The second half of a worker's start: the forked worker collected from the template (or
        started by exec if the template died meanwhile), its setup and function sent."""
        w = st.w
        try:
            if st.asked:
                try:
                    w.proc = self.template.collect()
                except _zygote.TemplateDied:
                    self.template_gone()
                    # a fresh socket pair: a worker forked before the template died may have read the frames sent
                    st.parent_end.close()
                    st.child_end.close()
                    st.parent_end, st.child_end = pipe_pair()
                    st.sent = False
                    w.proc = self._exec(st)
        except BaseException:
            st.parent_end.close()
            raise
        finally:
            st.close()
        self.pgids.append(w.proc.pid)
        w.conn = st.parent_end
        if not st.sent:
            _send_setup(st)
        if isinstance(w.proc, _zygote.ForkedProcess):  # the template opened it before it could reap
            self.forked_wids.add(w.wid)
            w.pidfd = w.proc.pidfd
        elif hasattr(os, "pidfd_open"):
            try:
                w.pidfd = os.pidfd_open(w.proc.pid)
            except OSError:
                w.pidfd = None

    def retask(self, w, context: Context) -> None:
        """Send block worker ``w``, moved to the task ``w.tr`` (:mod:`.reuse`), that task's set-up: its
        log files (the worker points its fds 1/2, or its copies, at them), ``DAISY_CONTEXT`` and its
        function; its shared memory stays (the same layout: the same ``ndim`` and tracking)."""
        tr = w.tr
        setup = _setup(w)
        setup["context"] = context.to_env()
        logs = dlog.open_worker_logs(tr.tid, w.slot)
        if logs:
            key = "tee_files" if dlog.get_log_mode() == "both" else "log_files"
            setup[key] = (logs[0].name, logs[1].name)
            w.err_path, w.err_offset = logs[1].name, logs[1].tell()
            logs[0].close()
            logs[1].close()
        try:
            w.conn.send_bytes(wire.Kind.TASK)
            w.conn.send_bytes(pickle.dumps(setup))
            w.conn.send_bytes(tr.payload or b"")
        except OSError:
            pass  # died already: its pidfd says so

    def _ask(self, st: _Starting) -> bool:
        """Ask the run's template (started on first use) for the fork; False: no template (exec)."""
        if self.template is None and not self.template_failed:
            trs = list(self.trs.values())
            memory = _zygote.memory_path([tr.task for tr in trs])
            self.template = _zygote.start_early(any(t.arity == 0 for t in trs), memory)
            self.template_failed = self.template is None
        if self.template is None or self.template.dead:
            return False
        fd = st.child_end.fileno()
        fds = {"conn": fd}
        logs = st.fd_logs
        outs = (logs[0].fileno(), logs[1].fileno()) if logs else (1, 2)  # else: this process's console
        for name, x in zip(("out", "err"), outs):
            try:
                os.fstat(x)
                fds[name] = x
            except OSError:
                pass
        if st.keep_fds:
            fds["shm"] = st.keep_fds[0]
        try:
            argv = [_WORKER_PY, str(fd), str(os.getpid())]
            self.template.ask(st.env, fds, argv, st.w.tr.tid, _fork_imports(st.w.tr))
        except _zygote.TemplateDied:
            self.template_gone()
            return False
        return True

    def _exec(self, st: _Starting):
        """``python -m daisy_nb.runtime.local.worker`` (no template, or it died)."""
        fd, logs = st.child_end.fileno(), st.fd_logs
        return subprocess.Popen(
            [sys.executable, "-m", "daisy_nb.runtime.local.worker", str(fd), str(os.getpid())],
            pass_fds=(fd, *st.keep_fds),
            stdin=subprocess.DEVNULL,
            stdout=logs[0] if logs else None,
            stderr=logs[1] if logs else None,
            env=st.env,
            start_new_session=True,  # own process group: Ctrl-C is ours to handle, killpg reaps helpers
        )

    def died_with_template(self, wid: int) -> bool:
        """Worker ``wid`` was forked by the run's template, and the template has died (taking it along)."""
        t = self.template
        return wid in self.forked_wids and t is not None and (t.dead or t.proc.poll() is not None)

    def template_gone(self) -> None:
        if not self.template_failed:
            self.template_failed = True
            logger.warning(
                "daisy_nb: the worker template process died; its workers' unfinished blocks are "
                "given back and new workers start by exec"
            )

    def close(self) -> None:
        """The run's end: close the template, kill the helpers worker functions launched and left behind."""
        if self.template is not None:
            self.template.close()
        for pgid in self.pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _setup(w) -> dict:
    """What worker ``w`` is told of its task ``w.tr`` and the run (the first frame of :mod:`.wire`)."""
    tr = w.tr
    return {
        "sys_path": list(sys.path),
        "log_basedir": None if dlog.get_log_basedir() is None else str(dlog.get_log_basedir()),
        "log_mode": dlog.get_log_mode(),
        "log_level": dlog.get_log_level(),
        "task_id": tr.tid,
        "worker_id": w.wid,
        "arity": tr.arity,
        "wants_context": tr.wants_context,
        "speculative": tr.speculative,
        "capacity": CAPACITY,
        "ndim": tr.ndim,
        "wire": wire.VERSION,
    }


# what a speculative task's block worker imports to be interrupted when its copy of a block loses
# (``worker._DropHandler.arm``): named in its fork request, the template imports it once before the
# fork instead of every worker after it (~1 ms of CPU each: a 32-worker start ~6 ms later on 2 cores)
DROP_HANDLER_IMPORTS = ("daisy_nb.runtime.net.drops",)


def _fork_imports(tr: PoolTaskRun) -> tuple[str, ...]:
    """The modules the template loads before forking a worker of ``tr`` (``ForkRequest.imports``):
    what its function's payload needs, and a speculative task's drop handler."""
    return payload_imports(tr.payload) + (DROP_HANDLER_IMPORTS if tr.speculative else ())


# a worker's setup and function are sent with its fork's request when this small (a socket's buffer holds them)
EARLY_SEND_BYTES = 48 << 10


def _send_setup(st: _Starting) -> None:
    """The worker's first two frames: its setup, its function (serialized by the pool's prepare).
    Sent when the fork is asked if they fit the socket's buffer (nothing can block then, even if
    the template dies before it forks), else once the worker exists."""
    st.sent = True
    try:
        st.parent_end.send_bytes(st.setup)
        st.parent_end.send_bytes(st.w.tr.payload or b"")
    except OSError:
        pass  # died already: its pidfd says so


class _Starting:
    """A worker between :meth:`Starter._begin` and :meth:`Starter._finish`: what the start holds
    open until the worker has its copies (the child's end of the socket pair, the segment's fd,
    the log files)."""

    __slots__ = (
        "w", "setup", "parent_end", "child_end", "logs", "fd_logs", "keep_fds", "env", "asked",
        "sent", "closed",
    )  # fmt: skip

    def __init__(self, w, setup: bytes, parent_end, child_end, logs, fd_logs, keep_fds: list, env: dict):
        self.w, self.setup, self.env = w, setup, env  # setup: pickled, the worker's first frame
        self.parent_end, self.child_end = parent_end, child_end
        self.logs = logs  # the slot's .out/.err files, or None
        self.fd_logs = fd_logs  # the same when they become the worker's fds 1/2 (not in log mode "both")
        self.keep_fds = keep_fds
        self.asked = False  # a fork was asked of the template
        self.sent = False  # the setup and function are in the socket
        self.closed = False

    def close(self) -> None:
        """Close what the worker has its own copies of (idempotent)."""
        if self.closed:
            return
        self.closed = True
        w, logs = self.w, self.logs
        self.child_end.close()
        if w.shm is not None:
            w.shm.close_fd()  # the worker has its own
        if logs:
            logs[0].close()
            logs[1].close()
