"""daisy_nb: a daisy-compatible blockwise task scheduler with Numba kernels.

``import daisy_nb as daisy`` runs daisy scripts. Heavy submodules (numba kernels,
the scheduler) load on first use, so worker processes that only need ``Block``
never import numba.
"""

from importlib import import_module

from funlib.geometry import Coordinate, Roi

from .block import Block, BlockStatus

__version__ = "0.1.0"

_LAZY = {
    "BlockwiseDependencyGraph": "daisy_nb.graph",
    "GraphArrays": "daisy_nb.graph",
    "Task": "daisy_nb.task",
    "Pipeline": "daisy_nb.task",
    "Scheduler": "daisy_nb.scheduler",
    "TaskState": "daisy_nb.scheduler",
    "DependencyGraph": "daisy_nb.scheduler",
    "BlockBatch": "daisy_nb.scheduler",
    "run_blockwise": "daisy_nb.run",
    "set_tracking_basedir": "daisy_nb.tracking",
    "get_tracking_basedir": "daisy_nb.tracking",
    "set_done_marker_basedir": "daisy_nb.tracking",
    "get_done_marker_basedir": "daisy_nb.tracking",
    "Client": "daisy_nb.runtime.client",
    "Context": "daisy_nb.runtime.context",
    "JsonProgressObserver": "daisy_nb.progress",
    "get_worker_log_basename": "daisy_nb.logging",
    "plot_block_states": "daisy_nb.plot",
    "worker_state": "daisy_nb.runtime.state",
    "profile_block": "daisy_nb.profiling",
    "BlockStats": "daisy_nb.profiling",
    "Server": "daisy_nb.server",
    "Plan": "daisy_nb.plan",
    "TaskPlan": "daisy_nb.plan",
    "SerialServer": "daisy_nb.server",
}

# daisy's submodules, importable as attributes (``daisy.v2``) as in the wheel
_SUBMODULES = ("block", "cl_monitor", "logging", "v1_compat", "v2")

__all__ = ["Block", "BlockStatus", "Coordinate", "Roi", "__version__", *_LAZY]


def __getattr__(name):
    if name in _SUBMODULES:  # e.g. daisy.logging (the submodule, not the stdlib)
        return import_module(f"daisy_nb.{name}")
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'daisy_nb' has no attribute {name!r}")
    value = getattr(import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
