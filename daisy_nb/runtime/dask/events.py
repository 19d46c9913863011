"""The driver's channels to the cluster that must never stall its loop (:mod:`.dask`).

* :class:`RunTopic`: the run's event topic and the scheduler plugin that feeds it;
* :class:`WorkerCalls`: ``client.run`` calls to dask workers, made off the loop and
  never to a worker the scheduler has removed.


Every batch announces its start and end (worker address, pid) on the run's own
dask event topic (``log_event`` in :mod:`.worker`); a small scheduler plugin
forwards the cluster's ``add-worker``/``remove-worker`` events to the same topic, so
that the run never needs the ``"all"`` topic (whose one handler per client may be
the user's). Public ``distributed`` APIs only: ``subscribe_topic``/
``unsubscribe_topic``, ``register_plugin``/``unregister_scheduler_plugin`` and
``SchedulerPlugin``.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["RunTopic", "WorkerCalls"]

logger = logging.getLogger("daisy")


def _forwarder(topic: str):
    """A scheduler plugin that forwards the cluster's worker events to one run's topic.

    The scheduler logs ``add-worker``/``remove-worker`` (with ``expected``: retired on
    purpose) on its ``"all"`` topic; a client has one handler per topic, which may
    be the user's, so the run does not subscribe to ``"all"`` itself. The class is
    made here, not at module level, so that it is pickled by value: the dask
    scheduler process need not have daisy_nb installed.
    """
    from distributed.diagnostics.plugin import SchedulerPlugin

    class DaisyNbWorkerEvents(SchedulerPlugin):
        name = f"daisy_nb-events-{topic}"

        def __init__(self):
            self.topic = topic
            self.scheduler = None

        def start(self, scheduler):
            self.scheduler = scheduler

        def log_event(self, topic, msg):
            if topic != "all" or self.scheduler is None or not isinstance(msg, dict):
                return
            if msg.get("action") in ("add-worker", "remove-worker"):
                self.scheduler.log_event(self.topic, {"cluster": msg})

    return DaisyNbWorkerEvents()


class RunTopic:
    """The run's topic subscription and cluster-event plugin; ``on_event(event)`` gets both.

    ``unsubscribe_topic`` leaves the handler registered in the client, so the
    handler only reaches ``on_event`` (and the run) through a cell that
    :meth:`unsubscribe` empties.
    """

    def __init__(self, client, topic: str, on_event):
        self.client = client
        self.topic = topic
        self.cell = [on_event]
        self.plugin_name = None
        self.subscribed = False

    def subscribe(self) -> None:
        cell = self.cell

        def handler(event):
            fn = cell[0]
            if fn is not None:
                fn(event)

        self.client.subscribe_topic(self.topic, handler)
        self.subscribed = True
        plugin = _forwarder(self.topic)
        try:
            self.client.register_plugin(plugin, name=plugin.name)
            self.plugin_name = plugin.name
        except Exception as e:  # an old or locked-down scheduler: batches still run
            logger.warning("daisy_nb could not watch the dask cluster for lost workers: %r", e, exc_info=True)

    def unsubscribe(self) -> None:
        if not self.subscribed:
            return
        self.subscribed = False
        self.cell[0] = None
        try:
            self.client.unsubscribe_topic(self.topic)
        except Exception:  # a client closing with the run: nothing is delivered any more anyway
            logger.debug("daisy_nb could not unsubscribe from %s", self.topic, exc_info=True)
        if self.plugin_name is not None:
            try:
                self.client.unregister_scheduler_plugin(self.plugin_name)
            except Exception:  # the plugin only forwards events to a topic nobody reads now
                logger.debug("daisy_nb could not unregister %s", self.plugin_name, exc_info=True)
            self.plugin_name = None


class WorkerCalls:
    """``client.run`` calls to dask workers, off the driver's loop, never to a removed worker.

    ``client.run`` goes through the scheduler, which connects to each target worker
    and answers when all have; a worker that is gone (killed, preempted, its node
    lost) is retried until dask's connect timeout (``distributed.comm.timeouts.connect``,
    30 s by default). Made from the driver's loop, such a call froze the whole run
    for that long each time a worker that was running batches was lost. So:

    * workers the scheduler reported removed (:meth:`removed`) are left out of every
      call, and a call left with no worker is not made;
    * each call runs in a thread of its own (a worker that died and is not yet
      reported removed holds only that thread); ``done(result)`` is called from
      there, with ``{address: result}`` of the workers that answered (None if the
      call failed), so the driver takes results as events;
    * the driver waits for calls only at the end of the run, and at most
      :meth:`wait`'s bound.
    """

    def __init__(self, client):
        self.client = client
        self.gone: set[str] = set()  # addresses of workers the scheduler removed
        self.threads: list[threading.Thread] = []

    def removed(self, addr) -> None:
        if addr:
            self.gone.add(addr)

    def added(self, addr) -> None:
        self.gone.discard(addr)  # an address reused by a new worker

    def live(self, workers) -> list:
        return [w for w in workers if w and w not in self.gone]

    def run(self, fn, *args, workers=None, done=None, **kwargs) -> bool:
        """Start ``client.run(fn, *args, workers=..., **kwargs)`` in its own thread.

        ``workers=None``: every worker the scheduler knows (it leaves removed ones
        out itself). Returns False, calling nothing, when every target was removed.
        """
        if workers is not None:
            workers = self.live(workers)
            if not workers:
                return False
        self.threads = [t for t in self.threads if t.is_alive()]
        t = threading.Thread(
            target=self._call, args=(fn, args, workers, kwargs, done), name="daisy_nb-dask-run", daemon=True
        )
        t.start()
        self.threads.append(t)
        return True

    def _call(self, fn, args, workers, kwargs, done) -> None:
        try:
            result = self.client.run(fn, *args, workers=workers, on_error="ignore", **kwargs)
        except Exception:  # a worker or the scheduler going away: the caller gets None
            logger.debug("daisy_nb: client.run(%s) failed", getattr(fn, "__name__", fn), exc_info=True)
            result = None
        if done is not None:
            done(result)  # the driver's callbacks only queue an event

    def wait(self, timeout: float) -> None:
        """Let the calls still running finish, for at most ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.threads = [t for t in self.threads if t.is_alive()]
