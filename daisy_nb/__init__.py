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
}

__all__ = ["Block", "BlockStatus", "Coordinate", "Roi", *_LAZY]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'daisy_nb' has no attribute {name!r}")
    value = getattr(import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
