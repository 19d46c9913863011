"""Where a pool run's ``daisy_nb.Client`` connections arrive, and what every worker is told.

:class:`Listening` owns the run's secret, the TCP listener (started only when a task has a
0-argument worker function, and only then loaded: :mod:`daisy_nb.runtime.net.transport`, every connection
authenticated with the secret before any of its bytes are read, in the listener's
thread), the address it advertises (``host``, else detected as daisy 2.0.0 does:
:func:`daisy_nb.runtime.net.address.detect_address`), the liveness timeouts, the
connections handed over by the listener's thread, and the ``DAISY_CONTEXT`` of each
worker (:meth:`Listening.context`: where to connect, the timeouts, and only for a worker
function the secret; a block-function worker never connects, so it never gets it).
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from daisy_nb import logging as dlog
from daisy_nb.runtime.context import Context
from daisy_nb.runtime.local.pool_parts import PoolTaskRun
from daisy_nb.runtime.net import address, liveness

if TYPE_CHECKING:
    from daisy_nb.runtime.net import transport

__all__ = ["Listening"]

logger = logging.getLogger("daisy")


class Listening:
    """The run's listener, secret and address, and the workers' context (see the module docstring)."""

    def __init__(self, host, wake: Callable[[], None]):
        self._wake = wake  # the main loop's wake-up: a connection is waiting
        self.new_conns: queue.SimpleQueue = queue.SimpleQueue()
        self.authkey = os.urandom(32)  # secrets.token_bytes, without importing hmac and OpenSSL's hashlib
        self.port = 0
        self.bind_host, advertise = address.resolve_host(host)
        self.advertise: str = advertise or ""  # detected when the listener starts (None: detect)
        self.where = ""  # where Client connections go, for messages (see start)
        self.host_given = host not in (None, "")
        self.net = liveness.liveness()  # auth / heartbeat / peer_timeout seconds (DAISY_NB_* env)
        self.listener: transport.Listener | None = None

    def start(self) -> str:
        """Start listening; returns where Client connections go (for messages)."""

        from daisy_nb.runtime.net import transport  # a run that never listens does not load it

        def on_conn(conn):  # listener thread: an authenticated connection
            self.new_conns.put(conn)
            self._wake()

        self.listener = transport.Listener(self.bind_host, self.authkey, on_conn, self.net)
        self.port = self.listener.port
        if not self.advertise:  # no host=, or the wildcard: as daisy 2.0.0 (see address.detect_address)
            self.advertise = address.detect_address(self.listener)
        self.where = address.describe(self.bind_host, self.port, self.advertise)
        logger.info("daisy_nb scheduler %s", self.where)
        return self.where

    def check_host(self) -> None:
        """No Client will connect, but a ``host`` this machine does not have is an error all the same."""
        if self.host_given:
            from daisy_nb.runtime.net import transport

            transport.Listener.check_bindable(self.bind_host)

    def accepted(self) -> Iterator:
        """The connections the listener's thread has handed over since the last call."""
        while not self.new_conns.empty():
            yield self.new_conns.get()

    def context(self, tr: PoolTaskRun, wid: int) -> Context:
        """What worker ``wid`` of ``tr`` is told (``DAISY_CONTEXT``): where to connect, the timeouts,
        and, only for a worker function (its programs connect over TCP), the run's secret."""
        base = dlog.get_log_basedir()
        ctx = Context(
            hostname=self.advertise,
            port=self.port,
            task_id=tr.tid,
            worker_id=wid,
            logdir="" if base is None else str(base),
            resource_tracking=int(tr.track),
            heartbeat=f"{self.net['heartbeat']:g}",
            peer_timeout=f"{self.net['peer_timeout']:g}",
            auth=f"{self.net['auth']:g}",
        )
        if tr.arity == 0:
            ctx["authkey"] = self.authkey.hex()
        if getattr(tr.task, "speculative", None) is not None:  # a Client may be told to drop a block
            ctx["speculative"] = 1
        return ctx

    def close(self) -> None:
        """Stop listening; connections accepted but never taken are closed."""
        if self.listener is not None:
            self.listener.close()
        for conn in self.accepted():
            try:
                conn.close()
            except OSError:
                pass
