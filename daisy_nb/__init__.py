"""daisy_nb: a daisy-compatible blockwise task scheduler with Numba kernels.

``import daisy_nb as daisy`` runs daisy scripts. Heavy submodules (numba kernels,
the scheduler) load on first use, so worker processes that only need ``Block``
never import numba.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from funlib.geometry import Coordinate, Roi

from .block import Block, BlockStatus

if TYPE_CHECKING:  # what type checkers and IDEs see of the lazy names below (the same objects)
    from .graph import BlockwiseDependencyGraph as BlockwiseDependencyGraph
    from .graph import GraphArrays as GraphArrays
    from .logging import get_worker_log_basename as get_worker_log_basename
    from .plan import Plan as Plan
    from .plan import TaskPlan as TaskPlan
    from .plot import plot_block_states as plot_block_states
    from .profiling import BlockStats as BlockStats
    from .profiling import profile_block as profile_block
    from .progress import JsonProgressObserver as JsonProgressObserver
    from .run import run_blockwise as run_blockwise
    from .runtime.client import Client as Client
    from .runtime.common.worker_state import worker_state as worker_state
    from .runtime.context import Context as Context
    from .scheduler import BlockBatch as BlockBatch
    from .scheduler import DependencyGraph as DependencyGraph
    from .scheduler import Scheduler as Scheduler
    from .scheduler import TaskState as TaskState
    from .server import SerialServer as SerialServer
    from .server import Server as Server
    from .task import Pipeline as Pipeline
    from .task import Task as Task
    from .tracking import get_done_marker_basedir as get_done_marker_basedir
    from .tracking import get_tracking_basedir as get_tracking_basedir
    from .tracking import set_done_marker_basedir as set_done_marker_basedir
    from .tracking import set_tracking_basedir as set_tracking_basedir

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
    "worker_state": "daisy_nb.runtime.common.worker_state",
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


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:  # e.g. daisy.logging (the submodule, not the stdlib)
        return import_module(f"daisy_nb.{name}")
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'daisy_nb' has no attribute {name!r}")
    value = getattr(import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
