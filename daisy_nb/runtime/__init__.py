"""Parallel runtime: a pool of worker processes fed through shared memory.

Kept import-light on purpose: worker processes import ``daisy_nb.runtime.worker``,
which imports this package first, and workers must never pull in numba or the
scheduler. Heavy names are loaded lazily.
"""

from __future__ import annotations

__all__ = ["Client", "Context", "run_pool"]


def __getattr__(name):
    if name == "Client":
        from daisy_nb.runtime.client import Client

        return Client
    if name == "Context":
        from daisy_nb.runtime.context import Context

        return Context
    if name == "run_pool":
        from daisy_nb.runtime.local.pool import run_pool

        return run_pool
    raise AttributeError(name)
