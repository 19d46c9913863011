"""The dask back-end: ``run_blockwise(pipeline, executor=client)`` on a ``dask.distributed`` cluster.

* :mod:`.driver`: the driver shell (the dask ``Client``, ``as_completed``, the run's
  topic, Ctrl-C) that executes the core's actions;
* :mod:`.core`: the submission and accounting core, without I/O (which ready blocks go
  into which batch, what results, lost workers, timeouts and abandonment do);
* :mod:`.events`: the run's event topic and the worker calls made off the loop;
* :mod:`.worker`: what runs inside the dask workers (:func:`.worker._run_batch`).

Kept import-light: dask workers import :mod:`.worker` (numpy and ``daisy_nb.block``
only) and with it this package. The public names are in :mod:`daisy_nb.dask`.
"""

from __future__ import annotations

__all__ = ["run_dask"]


def __getattr__(name):
    if name == "run_dask":
        from daisy_nb.runtime.dask.driver import run_dask

        return run_dask
    raise AttributeError(name)
