"""The pool's ``Client`` side in a run no ``Client`` connects to.

A run listens for ``daisy_nb.Client`` connections only when a task's worker function takes
no argument (:meth:`daisy_nb.runtime.local.pool._Pool.prepare`). Every other run, most local
runs, never accepts a connection, so the pool holds this empty stand-in, answering as
:class:`daisy_nb.runtime.net.server.Clients` with no connection would, and loads the TCP
server (the hand-out core, its backups, tail and walltime rules, the listener and its frame
codec: 8 modules, about 0.35 MB of the main process's memory, ``benchmarks/README.md``) only
when it listens.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NoClients"]


class NoClients:
    """What :class:`daisy_nb.runtime.net.server.Clients` answers while no connection is open."""

    @property
    def clients(self) -> dict[Any, Any]:
        return {}

    def attach_timeline(self, timeline) -> None:
        pass

    def abort(self) -> None:
        pass

    def drop_task(self, tr) -> None:
        pass

    def check_timeouts(self, now: int) -> None:
        pass

    def check_heartbeats(self) -> None:
        pass

    def serve_parked(self) -> None:
        pass

    def drain(self) -> int:
        return 0

    def holding(self) -> bool:
        return False

    def running_blocks(self) -> list:
        return []

    def wait_timeout(self, limit: float) -> float:
        return limit

    def quiet_over(self) -> bool:
        return False

    def add(self, conn) -> None:
        raise AssertionError("a run that does not listen accepts no connection")

    def on_readable(self, _ready: list | None = None, quiet: bool = True) -> None:
        raise AssertionError("no Client connection is watched in a run that does not listen")

    def close_all(self) -> None:
        pass

    def has_client(self, wid: int, tr) -> bool:
        return False

    def idle_clients(self, tr) -> int:
        return 0

    def soon_free(self, tr) -> int:
        return 0
