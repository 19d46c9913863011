"""``run_blockwise(pipeline, executor=client)`` on a dask.distributed cluster.

The executor lives in :mod:`daisy_nb.runtime.dask` (driver) and
:mod:`daisy_nb.runtime.dask.worker` (what runs in the dask workers); this module
keeps the public names where users import them from.
"""

from daisy_nb.runtime.common.worker_state import set_worker_state, worker_state
from daisy_nb.runtime.dask import run_dask

__all__ = ["run_dask", "set_worker_state", "worker_state"]
