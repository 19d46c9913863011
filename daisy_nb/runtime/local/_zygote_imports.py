"""What the worker template learns from its workers' imports (see :mod:`._zygote`).

A pipeline's tasks run one after another, and each task's block workers are forked from
the run's template: without this, every worker of every task imports what its block
functions need (zarr, scipy: ~0.4 s each on the 2-core test machine, 11 workers in the
demo). So each forked worker, when it leaves, tells the template (one pipe per worker,
written once at exit, read when the template reaps it) which modules it imported that the
template does not hold, and the template imports them before it forks the next worker:
the next task's workers start with them loaded.

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

Imports only the standard library: the template never holds numpy, numba or zarr unless a
worker did.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading

__all__ = ["Learner", "installed_roots"]

MAX_REPORT = 60_000  # bytes a worker writes at exit: under a pipe's buffer, so the write never blocks


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


class Learner:
    """The template's side: one report pipe per forked worker, the names learned, the preload."""

    def __init__(self) -> None:
        self.roots = installed_roots()
        self.pipes: dict[int, int] = {}  # worker pid -> read end of its report pipe
        self.pending: list[str] = []  # learned, not yet imported
        self.enabled = _python_threads() == 1
        self.preloaded: list[str] = []  # imported into the template (in order)

    # -- around a fork
    def pipe(self) -> tuple[int, int] | None:
        """A report pipe for the next worker (``(read, write)``), or None when not learning."""
        if not self.enabled:
            return None
        r, w = os.pipe()
        os.set_blocking(r, False)
        return r, w

    def forked(self, pid: int, pipe: tuple[int, int] | None) -> None:
        """In the template, after the fork: keep the read end, close the write end."""
        if pipe is not None:
            os.close(pipe[1])
            self.pipes[pid] = pipe[0]

    def reaped(self, pid: int) -> None:
        """Worker ``pid`` has exited: read what it reported."""
        fd = self.pipes.pop(pid, None)
        if fd is None:
            return
        data = b""
        try:
            while chunk := os.read(fd, 65536):
                data += chunk
        except (BlockingIOError, OSError):
            pass
        finally:
            os.close(fd)
        if self.enabled and data:
            seen = set(self.pending)
            for name in data.decode("utf-8", "replace").split("\n"):
                if name and name not in sys.modules and name not in seen:
                    self.pending.append(name)
                    seen.add(name)

    def preload(self) -> None:
        """Before a fork: import what workers reported (in their import order)."""
        if not self.pending or not self.enabled:
            return
        names, self.pending = self.pending, []
        import importlib

        for name in names:
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001, S112 - a worker imported it: it will again
                continue
            self.preloaded.append(name)
            if _python_threads() != 1:  # forking beside a Python thread is unsafe: learn no more
                self.enabled = False
                break

    def close_all(self) -> None:
        for fd in self.pipes.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.pipes.clear()


def report(fd: int, before: set, roots: tuple[str, ...]) -> None:
    """In the forked worker, as it leaves: write the learnable modules it imported to ``fd``."""
    try:
        names = [
            n for n, m in list(sys.modules.items()) if n not in before and m is not None and learnable(n, m, roots)
        ]
        data = "\n".join(names).encode()[:MAX_REPORT]
        data = data[: data.rfind(b"\n") + 1] if len(data) == MAX_REPORT else data
        os.set_blocking(fd, False)
        os.write(fd, data)
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
