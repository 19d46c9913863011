"""The event topic of one dask run, on the driver side (:mod:`.dask`).

Every batch announces its start and end (worker address, pid) on the run's own
dask event topic (``log_event`` in :mod:`.dask_worker`); a small scheduler plugin
forwards the cluster's ``add-worker``/``remove-worker`` events to the same topic, so
that the run never needs the ``"all"`` topic (whose one handler per client may be
the user's). Public ``distributed`` APIs only: ``subscribe_topic``/
``unsubscribe_topic``, ``register_plugin``/``unregister_scheduler_plugin`` and
``SchedulerPlugin``.
"""

from __future__ import annotations

import logging

__all__ = ["RunTopic"]

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
            logger.warning("daisy_nb could not watch the dask cluster for lost workers: %r", e)

    def unsubscribe(self) -> None:
        if not self.subscribed:
            return
        self.subscribed = False
        self.cell[0] = None
        try:
            self.client.unsubscribe_topic(self.topic)
        except Exception:
            pass
        if self.plugin_name is not None:
            try:
                self.client.unregister_scheduler_plugin(self.plugin_name)
            except Exception:
                pass
            self.plugin_name = None
