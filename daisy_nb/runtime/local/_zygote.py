"""The worker template: one small process per run that forks block workers on demand.

Starting a worker by exec is a whole interpreter start-up plus the imports of the
worker side (cloudpickle alone is ~30 ms); with 16-32 workers on a 2-core machine
that is most of the first half second of a run. The template is started once per
run, exec'd like a worker (``python -m daisy_nb.runtime.local._zygote <fd> <pool_pid>``,
never forked from the scheduler process, which runs numba and zarr threads), imports
only the worker side (``worker``, ``block``, ``logging``, ``_shm``, cloudpickle, and
``client`` when a task has a 0-argument worker function; no numpy, numba or
``multiprocessing``) and stays single-threaded, so that forking it is safe.

Protocol: :mod:`.template_wire` (both ends): a fork request (environment, working
directory, ``argv`` and the descriptors sent with it: the worker's end of its socket pair,
its log files, its shared-memory segment) one way; "forked" (pid, with a pidfd of the new
worker, opened before the template can reap it, so the pid cannot have been reused) and
"exited" (pid and exit code) the other.

The forked worker keeps the exec'd worker's semantics: its own session (``killpg``
reaches helpers it launches), ``PR_SET_PDEATHSIG`` to the template, whose own
``PR_SET_PDEATHSIG`` is the pool (so workers die with the run), fd 0 is
``/dev/null``, fd 1/2 are its log files, the environment is the one an exec'd worker
would get (``DAISY_CONTEXT``), and the same :func:`daisy_nb.runtime.local.worker.serve`
runs. It leaves with ``os._exit`` after ``atexit`` handlers and a flush: no
interpreter teardown.

A template that dies (killed, crashed) takes its workers with it (their death
signal): the pool gives their unfinished blocks back without counting a worker
failure, and starts later workers by exec (:class:`Template` reports ``dead``).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from collections.abc import Iterable
from typing import Any

from daisy_nb import config
from daisy_nb.runtime.local import template_wire as twire

__all__ = ["Template", "available", "memory_path", "start_early", "template_env"]

MAX_FDS = 8
START_TIMEOUT_SECS = 20.0  # the first fork waits for the template's imports (slow under load)
FORK_TIMEOUT_SECS = 10.0
REPORT_GRACE_SECS = 5.0  # an exited worker whose exit code the (live) template never reports


def available() -> bool:
    """Linux with fork, SCM_RIGHTS and pidfds (for workers that are not our children)."""
    if not (hasattr(os, "fork") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")):
        return False
    if not hasattr(socket, "SOCK_SEQPACKET") or not hasattr(os, "waitstatus_to_exitcode"):
        return False
    return config.WORKER_START.get() != "exec"


# workers run ``python -m daisy_nb...``: make sure they import this very package
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def worker_env(environ=None) -> dict:
    """The environment of a worker (and of the template): ours, with this package first on PYTHONPATH."""
    env = dict(os.environ if environ is None else environ)
    config.WORKER_HEAP_MIB.get()  # a value the workers would not accept fails here, before any work
    path = config.PYTHONPATH.name
    env[path] = PKG_PARENT + (os.pathsep + env[path] if env.get(path) else "")
    return env


def template_env(env: dict) -> dict:
    """A worker's environment without its per-worker context (the fork request carries that)."""
    return {k: v for k, v in env.items() if k != config.CONTEXT.name}


def memory_path(tasks: Iterable[Any]) -> str | None:
    """The file of this program's import memory (:mod:`._zygote_imports`), or None when
    ``DAISY_NB_IMPORT_MEMORY`` switches it off.

    Named by the program's identity: the interpreter, and each task's id and function (its
    module, qualified name, and that module's file with its modification time and size), so
    that an edited program, or another program, starts with no memory.
    """
    where = config.IMPORT_MEMORY.get()
    if where is None:
        return None
    if not where:
        where = os.path.join(os.path.expanduser("~"), ".cache", "daisy_nb", "imports")
    import zlib

    # a file name, not a secret: two checksums (64 bits) rather than a digest of hashlib, whose
    # import loads OpenSSL's libcrypto (3-4 MiB in a small run's process) in a run with no other
    # use for it; _zygote_imports.is_memory_name knows the name's form
    key = "\0".join([sys.executable, sys.version, *(repr((t.task_id, _identity(t.process_function))) for t in tasks)])
    data = key.encode("utf-8", "surrogatepass")
    return os.path.join(where, f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}.json")


def _identity(fn: Any) -> tuple:
    """What names a process function across runs: module, qualified name, the module's file and its stamp."""
    import functools

    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__func__"):  # a bound method
            fn = fn.__func__
        else:
            break
    target = fn if hasattr(fn, "__qualname__") else type(fn)  # a callable object: its class
    module = getattr(target, "__module__", None) or ""
    path = getattr(sys.modules.get(module), "__file__", None)
    stamp = None
    if path:
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            pass
    return module, getattr(target, "__qualname__", ""), path, stamp


def start_early(preload_client: bool, memory: str | None = None) -> Template | None:
    """Start the run's template: before the scheduler is built (``run._execute``), else
    at the pool's first worker. ``memory``: the file of its import memory (:func:`memory_path`).

    Started early, the template's interpreter start-up and imports (~50 ms) overlap the
    scheduler's own set-up (numpy's import alone is ~85 ms) on another core, instead
    of following it. ``None`` where templates are unavailable or cannot start (logged
    with the reason; the pool then starts workers by exec).
    """
    if not available():
        return None
    try:
        return Template(template_env(worker_env()), preload_client, memory)
    except OSError as e:
        import logging

        logging.getLogger("daisy").warning("daisy_nb: no worker template (%s); workers start by exec", e)
        return None


# --------------------------------------------------------------------------- pool side
def _readable(fd: int, timeout: float | None) -> bool:
    """``poll`` rather than ``select``: the pool's descriptors may be numbered above FD_SETSIZE."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999))))


class TemplateDied(OSError):
    """The template process is gone: start workers by exec instead."""


class ForkedProcess:
    """A worker forked by the template: the subset of ``subprocess.Popen`` the pool uses.

    It is not this process's child, so its exit code comes from the template's
    "exited" report (:class:`.template_wire.Exited`). If the template died first, the worker died with it (death
    signal): ``orphaned`` is set and the code reads as ``-SIGKILL``.
    """

    def __init__(self, template: Template, pid: int, pidfd: int):
        self._t = template
        self.pid = pid
        self.pidfd: int | None = pidfd  # the pool owns it from here (selector sentinel), closes it in on_exit
        self.returncode: int | None = None
        self.orphaned = False

    def poll(self) -> int | None:
        if self.returncode is None:
            self._t.drain(0)
            if self.returncode is None and self._t.dead:
                self._settle_orphan(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._t.dead:
                self._settle_orphan(left)
            else:
                self._t.drain(min(left, 0.5) if left is not None else 0.5)
                if self.returncode is None and time.monotonic() - t0 > REPORT_GRACE_SECS and self._exited():
                    self.returncode = -signal.SIGKILL  # the template is alive but silent (stopped?)
            if self.returncode is None and deadline is not None and time.monotonic() >= deadline:
                import subprocess

                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
        return self.returncode

    def _exited(self) -> bool:
        try:
            return self.pidfd is None or _readable(self.pidfd, 0)
        except (OSError, ValueError):
            return True

    def _settle_orphan(self, timeout: float | None) -> None:
        """Template gone: the worker is dying of its death signal; done once its pidfd says so."""
        try:
            r = self.pidfd is None or _readable(self.pidfd, timeout)
        except (OSError, ValueError):
            r = True
        if r:
            self.returncode = -signal.SIGKILL
            self.orphaned = True

    def kill(self) -> None:
        if self.returncode is not None or self.pidfd is None:
            return  # reaped (the pid may be reused): nothing to signal
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except (OSError, ValueError):
            pass


class Template:
    """The pool's handle on the template process (one per run)."""

    def __init__(self, env: dict, preload_client: bool = False, memory: str | None = None):
        self.dead = False
        self.procs: dict[int, ForkedProcess] = {}
        self.asked = 0  # forks asked and not collected yet
        self._started = False
        import subprocess  # the pool's side only: the template (this module's main) never imports it

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daisy_nb.runtime.local._zygote",
                    str(theirs.fileno()),
                    str(os.getpid()),
                    "client" if preload_client else "blocks",
                    memory or "-",
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C on the terminal is the pool's to handle
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()

    def ask(self, env: dict, fds: dict[str, int], argv: list[str], task: str = "", imports: tuple = ()) -> None:
        """Ask for a worker of ``task`` forked with these descriptors (duplicated into the request: the
        caller may close its own after this); :meth:`collect` returns it. Several may be asked
        before the first is collected: the template forks them one after another while the pool
        goes on (each fork waited for in turn was a round trip of 1-15 ms on a busy 2-core
        machine, 32 of them most of a 32-worker start). ``imports``: modules the template loads
        before this fork (what the worker's payload needs). Raises TemplateDied."""
        if self.dead:
            raise TemplateDied("the worker template has exited")
        names = list(fds)
        req = twire.encode_request(twire.ForkRequest(env, os.getcwd(), argv, names, task, tuple(imports)))
        try:
            socket.send_fds(self.sock, [req], [fds[n] for n in names])
        except OSError:
            self._mark_dead()
            raise TemplateDied("the worker template has exited") from None
        self.asked += 1

    def collect(self) -> ForkedProcess:
        """The worker of the oldest request not collected yet (the template answers in the order
        asked); raises TemplateDied (then every request not collected is lost: its workers, if
        forked, die with the template)."""
        if self.asked <= 0:
            raise RuntimeError("internal error: no fork was asked of the worker template")
        try:
            if self.dead:
                raise TemplateDied("dead")
            timeout = FORK_TIMEOUT_SECS if self._started else START_TIMEOUT_SECS
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TemplateDied(f"the worker template did not fork within {timeout:g} s")
                got = self._recv(left)
                if isinstance(got, ForkedProcess):
                    self._started = True
                    return got
        except (OSError, TemplateDied):
            self._mark_dead()
            raise TemplateDied("the worker template has exited") from None
        finally:
            self.asked -= 1

    def drain(self, timeout: float | None) -> None:
        """Read exit reports (waiting up to ``timeout`` for the first one)."""
        if self.dead:
            return
        try:
            while self._recv(timeout) is not None:
                timeout = 0
        except (OSError, TemplateDied):
            self._mark_dead()

    def _recv(self, timeout: float | None) -> ForkedProcess | twire.Exited | None:
        """One report: the worker it forked, or an exit (its process record updated); None: none came."""
        if not _readable(self.sock.fileno(), timeout):
            return None
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, 256, MAX_FDS)
        if not msg:
            for fd in fds:
                os.close(fd)
            raise TemplateDied("EOF")
        report = twire.decode_report(msg)
        if isinstance(report, twire.Forked):
            p = ForkedProcess(self, report.pid, fds[0])
            for fd in fds[1:]:
                os.close(fd)
            self.procs[report.pid] = p
            return p
        for fd in fds:
            os.close(fd)
        done = self.procs.pop(report.pid, None)
        if done is not None:
            done.returncode = report.code
        return report

    def _mark_dead(self) -> None:
        if not self.dead:
            self.dead = True
            try:
                self.proc.kill()
            except OSError:
                pass

    def close(self) -> None:
        """End the template (after the pool has ended its workers): EOF, then wait (SIGKILL if needed).

        A template that never forked (a run with nothing to do) is killed at once
        rather than waited for while it finishes its imports. Idempotent.
        """
        try:
            self.sock.close()
        except OSError:
            pass
        if not self._started and self.proc.poll() is None:
            self.proc.kill()
        import subprocess

        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.dead = True


# ----------------------------------------------------------------------- template side
def _reap(sock, children: set, learner=None) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        if learner is not None:
            learner.reaped(pid)  # before the pool hears of the exit: its next fork sees what this worker loaded
        try:
            sock.send(twire.exited(pid, os.waitstatus_to_exitcode(status)))
        except OSError:
            pass


def _child(
    req: twire.ForkRequest,
    fds: list[int],
    closing: list[int],
    template_pid: int,
    report_fd: int | None = None,
    before: frozenset[str] = frozenset(),
) -> None:
    """In the forked worker: become an exec'd worker's twin, run it, leave. Never returns.

    ``report_fd``: where to write, after its first batch and as it leaves, the installed
    modules it imported (:mod:`._zygote_imports`) beyond ``before``, the template's modules at
    the fork (a set the template built: building it here touched every module name, and so
    copied the pages that hold them)."""
    code = 1
    reporter = None
    try:
        from daisy_nb.runtime.local import worker

        if report_fd is not None:
            from daisy_nb.runtime.local import _zygote_imports

            reporter = _zygote_imports.Reporter(report_fd, before)
            worker.after_first_batch = reporter.send  # the template learns while this task still runs

        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        worker._die_with_parent(template_pid)
        named = dict(zip(req.fds, fds))
        for target, name in ((1, "out"), (2, "err")):
            fd = named.pop(name, None)
            if fd is not None:
                os.dup2(fd, target)
                os.close(fd)
        config.replace_environment(req.env)
        try:
            os.chdir(req.cwd)
        except OSError:
            pass
        sys.argv = list(req.argv)
        try:
            code = worker.serve(named["conn"], named.get("shm"))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                sys.stderr.write(f"{e.code}\n")
        except BaseException:  # noqa: BLE001 - whatever escapes, this process must reach os._exit
            import traceback

            traceback.print_exc()
            code = 1
        try:
            import atexit

            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001, S110 - as above
            pass
        if reporter is not None:
            reporter.close()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:  # noqa: BLE001, S110 - as above
                pass
        os._exit(code & 0xFF)  # as an interpreter would: sys.exit(-1) is 255


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _reap_until(children: set[int], deadline: float) -> None:
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid:
            children.discard(pid)
        else:
            time.sleep(0.02)


def _end_children(children: set[int]) -> None:
    """Workers still alive when the pool's end closed (normally none: the pool ends its workers
    first; some when the run's process was killed and this template saw the socket close before
    its own death signal). As the pool ends them: SIGTERM to each one's process group, a grace in
    which a launcher cancels its job, then SIGKILL. A block worker ends on the SIGTERM at once."""
    if not children:
        return
    for pid in children:
        _signal_group(pid, signal.SIGTERM)
    _reap_until(children, time.monotonic() + twire.TERM_GRACE_SECS)
    for pid in children:
        _signal_group(pid, signal.SIGKILL)
    _reap_until(children, time.monotonic() + 2)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool ends the run
    ctrl_fd, pool_pid = int(argv[0]), int(argv[1])
    from daisy_nb.runtime.local import _heap, worker

    _heap.keep_freed_memory(config.WORKER_HEAP_MIB.get())  # before the imports: the forked workers inherit it

    worker._die_with_parent(pool_pid)
    # the worker side, once for every worker this template forks (every block worker imports
    # these before its first block: each one left to the workers cost every worker ~1 ms of CPU,
    # a 32-worker start ~40 ms on 2 cores)
    import mmap  # noqa: F401  (_shm.attach maps the segment)

    import daisy_nb.block
    import daisy_nb.logging
    import daisy_nb.runtime.context
    import daisy_nb.runtime.local._pipe  # worker.serve's end of the socket pair
    import daisy_nb.runtime.local._shm
    import daisy_nb.runtime.local.wire  # noqa: F401  (worker.serve reads the pool's frames)

    # not cloudpickle (12 ms, a sixth of the template's start): only a function sent by value needs
    # it, and its fork requests say so (``ForkRequest.imports``, loaded below before the fork)
    if len(argv) > 2 and argv[2] == "client":
        import daisy_nb.runtime.client  # noqa: F401
    from daisy_nb.runtime.local import _zygote_imports

    memory = argv[3] if len(argv) > 3 and argv[3] != "-" else None
    # what workers import, loaded here for the next ones (and what a previous run's did)
    learner = _zygote_imports.Learner(_zygote_imports.read_memory(memory) if memory else None)
    sock = socket.socket(fileno=ctrl_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: set[int] = set()
    # sys.modules's names at the last fork: what a worker's report leaves out
    modules: frozenset[str] = frozenset()
    me = os.getpid()
    try:
        while True:
            reports = learner.watched()
            idle = 0 if learner.idle_work() else None  # a remembered module to import while nothing is asked
            r, _, _ = select.select([sock.fileno(), wake_r, *reports], [], [], idle)
            if not r:
                learner.recall_one()
                continue
            if any(fd in r for fd in reports):
                learner.poll()  # a worker's report: import it now, while no fork is asked for
                learner.preload()
            if wake_r in r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            _reap(sock, children, learner)
            if ctrl_fd not in r:
                continue
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, MAX_FDS)
            if not msg:
                if memory:
                    _zygote_imports.write_memory(memory, learner.memory())
                break  # the pool closed its end: the run is over
            try:
                req = twire.decode_request(msg)
            except ValueError as e:  # another daisy_nb's pool: it starts its workers by exec
                sys.stderr.write(f"daisy_nb worker template: {e}\n")
                for fd in fds:
                    os.close(fd)
                break
            learner.poll()  # a report written before the pool asked for this fork
            learner.preload()
            learner.recall(req.task)  # what a previous run's workers of this task imported
            learner.require(req.imports, req.task)  # what the worker's payload needs (cloudpickle)
            pipe = learner.pipe()
            if pipe and len(modules) != len(sys.modules):  # sys.modules only grows here (a stale set: a report more)
                modules = frozenset(sys.modules)
            pid = os.fork()
            if pid == 0:
                closing = [ctrl_fd, wake_r, wake_w, *learner.pipes.values()]
                _child(req, fds, closing + ([pipe[0]] if pipe else []), me, pipe[1] if pipe else None, modules)
            learner.forked(pid, pipe, req.task)
            children.add(pid)
            pidfd = os.pidfd_open(pid)  # before any reaping: the pid is still this worker's
            for fd in fds:
                os.close(fd)
            try:
                socket.send_fds(sock, [twire.forked(pid)], [pidfd])
            finally:
                os.close(pidfd)
    except OSError:
        pass
    finally:
        _end_children(children)
    return 0


if __name__ == "__main__":
    main()
    os._exit(0)  # nothing to flush or finalize: the run's end waits for this process
