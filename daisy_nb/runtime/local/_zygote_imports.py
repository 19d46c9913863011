"""What the worker template learns from its workers' imports (see :mod:`._zygote`).

A pipeline's tasks run one after another, and each task's block workers are forked from
the run's template: without this, every worker of every task imports what its block
functions need (zarr, scipy: ~0.4 s each on the 2-core test machine, 11 workers in the
demo). So each forked worker tells the template (one pipe per worker) which modules it
imported that the template does not hold: once after its first batch of blocks (so a
task's workers teach the template while they still run: the next task's workers often
fork before the previous task's workers leave), and once more as it leaves (what it
imported later). The template reads a report as soon as it arrives and imports the
modules while it waits for the next fork request: the next task's workers start with
them loaded.

What a user can rely on:

* Only **installed** modules are learned: the standard library and what lives in the
  interpreter's ``site-packages`` (``sysconfig``'s ``stdlib``, ``purelib``, ``platlib``).
  A user's own modules (a script's directory, a project on ``PYTHONPATH``, an editable
  checkout) are never imported into the template: their import-time side effects still
  happen in each worker, as before.
* An installed library's import-time code runs once in the template instead of once per
  worker; module state it sets up is inherited by every later worker, as with the fork
  start method of :mod:`multiprocessing`.
* A task's ``init_fn`` (daisy's per-worker set-up) still runs once in every worker of that
  task: nothing of a worker's run (``init_fn`` results, open arrays) reaches the template,
  only module names.
* The template runs no Python thread: a module whose import starts one stops the learning
  (the modules loaded so far stay); later workers import the rest themselves. Native
  thread pools that numerical libraries start on import (OpenBLAS under numpy and scipy:
  one thread each on a 2-core machine unless ``OPENBLAS_NUM_THREADS=1``) are fork-aware
  (they stop their threads around a fork, ``pthread_atfork``), as :mod:`multiprocessing`'s
  fork start method relies on; a Python thread is not (it may hold a lock at the fork).
* A module that fails to import in the template is skipped (the worker imported it, so it
  will again). Private submodules (a ``_`` part after the first) are left to their packages.

**Memory from one run to the next** (``DAISY_NB_IMPORT_MEMORY``, on by default): within a run
the first worker of every task still imports what the template has not learned yet (the
first task's zarr, the second task's scipy), and that import is a gap before the task's
first block. So as the run ends the template writes down what it imported and for which task
(the task whose worker reported it first), in a file named by the program's identity (each
task's id and function, and the file and modification time of the module defining it:
an edited program starts over). The next run's template reads it when it starts: before it
forks a worker of task *T* it imports what *T* and the tasks remembered before *T* needed,
and while no fork is asked for it imports the rest, one module at a time, in the order
they were learned (before its first fork, only the first remembered task's: that fork
request comes soon and must not wait for a later task's imports). The same rules hold (installed modules only, no Python thread, a module
that fails is skipped and forgotten).

Imports only the standard library: the template never holds numpy, numba or zarr unless a
worker did.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading

__all__ = ["Learner", "Reporter", "installed_roots", "prune_memories", "read_memory", "write_memory"]

MEMORY_VERSION = 1
MAX_MEMORIES = 256  # memory files kept in their directory: those of the programs run last (see write_memory)

MAX_REPORT = 30_000  # bytes per report, two reports per worker: under a pipe's buffer, so a write never blocks


def installed_roots() -> tuple[str, ...]:
    """Directories whose modules count as installed (the standard library and site-packages)."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.realpath(p) + os.sep)
    return tuple(sorted(roots))


def learnable(name: str, module, roots: tuple[str, ...]) -> bool:
    """A module the template may import: public name, loaded from a file under ``roots``."""
    if name == "__main__" or any(part.startswith("_") for part in name.split(".")[1:]):
        return False
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not os.path.isabs(origin):
        return False
    return os.path.realpath(origin).startswith(roots)


def _python_threads() -> int:
    return threading.active_count()


def _module_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and all(part.isidentifier() for part in name.split("."))


def read_memory(path: str) -> list[tuple[str, str]]:
    """What a previous run's template imported, as ``(module, task id)`` in import order;
    ``[]`` when there is no memory or it cannot be read (it is only ever a hint)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("version") != MEMORY_VERSION:
            return []
        return [(m, t) for m, t in data["modules"] if _module_name(m) and isinstance(t, str)]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


def write_memory(path: str, modules: list[tuple[str, str]]) -> None:
    """Replace the memory at ``path`` atomically (a temporary file renamed over it); errors are
    ignored (a read-only home, a full disk: the next run learns again). Every run writes its
    program's memory as it ends, and an edited program has another one, so the directory keeps
    the ``MAX_MEMORIES`` written last (:func:`prune_memories`) rather than one per edit for ever."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": MEMORY_VERSION, "modules": [list(x) for x in modules]}, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return
    prune_memories(os.path.dirname(path), MAX_MEMORIES)


def is_memory_name(name: str) -> bool:
    """A memory file's name (:func:`daisy_nb.runtime.local._zygote.memory_path`): 16 hexadecimal
    digits, or 32 (as named before), and ``.json``. Nothing else in the directory is touched: it
    may be one a user chose (``DAISY_NB_IMPORT_MEMORY``), holding other files."""
    stem, dot, ext = name.partition(".")
    return ext == "json" and len(stem) in (16, 32) and all(c in "0123456789abcdef" for c in stem)


def prune_memories(where: str, keep: int) -> None:
    """Delete all but the ``keep`` memory files of ``where`` (:func:`is_memory_name`) modified
    last; errors (another run pruning at the same time, a file gone) are ignored."""
    try:
        stamped = []
        with os.scandir(where) as it:
            for e in it:
                if is_memory_name(e.name):
                    try:
                        stamped.append((e.stat().st_mtime_ns, e.path))
                    except OSError:
                        pass
    except OSError:
        return
    if len(stamped) <= keep:
        return
    stamped.sort()
    for _, p in stamped[: len(stamped) - keep]:
        try:
            os.unlink(p)
        except OSError:
            pass


class Learner:
    """The template's side: one report pipe per forked worker, the names learned, the preload,
    and the memory of a previous run (``remembered``)."""

    def __init__(self, remembered: list[tuple[str, str]] | None = None) -> None:
        self.roots = installed_roots()
        self.pipes: dict[int, int] = {}  # worker pid -> read end of its report pipe
        self.partial: dict[int, bytes] = {}  # worker pid -> a report's last line, not yet complete
        self.ended: set[int] = set()  # pids whose pipe is at end of file (nothing more to watch)
        self.task_of: dict[int, str] = {}  # worker pid -> its task id
        self.pending: list[tuple[str, str]] = []  # learned, not yet imported: (module, task)
        self.enabled = _python_threads() == 1
        self.preloaded: list[str] = []  # imported into the template (in order)
        self.owner: dict[str, str] = {}  # preloaded module -> the task it was imported for
        self.remembered = list(remembered or [])  # a previous run's imports, not yet made here
        self.rank: dict[str, int] = {}  # task id -> its place in the remembered order
        self.forks = 0  # workers forked so far
        for _, task in self.remembered:
            self.rank.setdefault(task, len(self.rank))

    # -- around a fork
    def pipe(self) -> tuple[int, int] | None:
        """A report pipe for the next worker (``(read, write)``), or None when not learning."""
        if not self.enabled:
            return None
        r, w = os.pipe()
        os.set_blocking(r, False)
        return r, w

    def forked(self, pid: int, pipe: tuple[int, int] | None, task: str = "") -> None:
        """In the template, after the fork: keep the read end, close the write end."""
        self.forks += 1
        self.task_of[pid] = task
        if pipe is not None:
            os.close(pipe[1])
            self.pipes[pid] = pipe[0]

    def watched(self) -> list[int]:
        """Read ends to wait on: those of workers that may still report."""
        return [fd for pid, fd in self.pipes.items() if pid not in self.ended]

    def poll(self) -> None:
        """Read what any worker has reported so far (never blocks)."""
        for pid in list(self.pipes):
            if pid not in self.ended:
                self._read(pid)

    def _read(self, pid: int) -> None:
        fd = self.pipes[pid]
        data = self.partial.pop(pid, b"")
        try:
            while chunk := os.read(fd, 65536):
                data += chunk
            self.ended.add(pid)  # end of file: the worker has left (or closed its end)
        except BlockingIOError:
            pass
        except OSError:
            self.ended.add(pid)
        cut = data.rfind(b"\n") + 1  # reports end with a newline: a name is whole once it is seen
        if cut < len(data):
            self.partial[pid] = data[cut:]
        self._learn(data[:cut], self.task_of.get(pid, ""))

    def _learn(self, data: bytes, task: str) -> None:
        if self.enabled and data:
            seen = {name for name, _ in self.pending}
            for name in data.decode("utf-8", "replace").split("\n"):
                if name and name not in sys.modules and name not in seen:
                    self.pending.append((name, task))
                    seen.add(name)

    def reaped(self, pid: int) -> None:
        """Worker ``pid`` has exited: read the rest of what it reported."""
        if pid not in self.pipes:
            self.task_of.pop(pid, None)
            return
        if pid not in self.ended:
            self._read(pid)
        self.partial.pop(pid, None)  # a line cut short (a report over MAX_REPORT): not a name
        self.ended.discard(pid)
        self.task_of.pop(pid, None)
        os.close(self.pipes.pop(pid))

    def preload(self) -> None:
        """Import what workers reported (in their import order): as a report arrives, and
        before a fork."""
        if not self.pending or not self.enabled:
            return
        names, self.pending = self.pending, []
        for name, task in names:
            if not self._import(name, task):
                break

    def recall(self, task: str) -> None:
        """Before forking a worker of ``task``: import what the memory says it and the tasks
        remembered before it imported (nothing when the memory does not know ``task``)."""
        last = self.rank.get(task)
        if last is None or not self.remembered or not self.enabled:
            return
        now = [(m, t) for m, t in self.remembered if self.rank[t] <= last]
        self.remembered = [(m, t) for m, t in self.remembered if self.rank[t] > last]
        for name, owner in now:
            if not self._import(name, owner):
                break

    def require(self, names, task: str) -> None:
        """Before forking a worker of ``task``: import what its fork request names (its payload
        needs it: cloudpickle for a function sent by value), with the same rules."""
        for name in names:
            if not self._import(name, task):
                break

    def idle_work(self) -> bool:
        """Whether :meth:`recall_one` has a module to import while no fork is asked for. Before
        the first fork only the first remembered task's: the run's first fork request comes
        within a fraction of a second, and must not wait for a later task's imports."""
        if not self.enabled:
            self.remembered = []
        if not self.remembered:
            return False
        return self.forks > 0 or self.rank[self.remembered[0][1]] == 0

    def recall_one(self) -> None:
        """No fork asked for: import the next remembered module."""
        if self.idle_work():
            self._import(*self.remembered.pop(0))

    def _import(self, name: str, task: str) -> bool:
        """Import ``name`` here, for ``task``; False once learning has stopped (a Python thread)."""
        if name in sys.modules:
            return True
        import importlib

        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a worker imported it: it will again
            return True
        self.preloaded.append(name)
        self.owner[name] = task
        if _python_threads() != 1:  # forking beside a Python thread is unsafe: learn no more
            self.enabled = False
            self.remembered = []
            return False
        return True

    def memory(self) -> list[tuple[str, str]]:
        """What to remember for the next run: the modules imported here, each with its task."""
        return [(name, self.owner[name]) for name in self.preloaded]

    def close_all(self) -> None:
        for fd in self.pipes.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.pipes.clear()
        self.partial.clear()
        self.ended.clear()


class Reporter:
    """The forked worker's side: what it imported since the fork, sent once after its first
    batch and once as it leaves (only what the first report did not name)."""

    def __init__(self, fd: int, before: frozenset[str] | set[str]) -> None:
        self.fd = fd
        self.before = before  # the template's modules at the fork (held, not copied: see _zygote._child)
        self.sent: set[str] = set()  # what the reports named
        self.roots: tuple[str, ...] | None = None

    def send(self) -> None:
        """Write the learnable modules imported since the last report (newline-ended names)."""
        if self.fd < 0:
            return
        try:
            if self.roots is None:
                self.roots = installed_roots()
            names = [
                n
                for n, m in list(sys.modules.items())
                if n not in self.before and n not in self.sent and m is not None and learnable(n, m, self.roots)
            ]
            self.sent.update(names)
            if not names:
                return
            data = ("\n".join(names) + "\n").encode()
            if len(data) > MAX_REPORT:
                data = data[: data.rfind(b"\n", 0, MAX_REPORT) + 1]
            os.set_blocking(self.fd, False)
            os.write(self.fd, data)
        except OSError:
            pass

    def close(self) -> None:
        """As the worker leaves: the last report, then end of file for the template."""
        self.send()
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
