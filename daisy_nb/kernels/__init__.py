"""Numba kernels: plain arrays in, plain arrays out. Imports only numpy (numba once compiling pays off, see ``_jit``).

The submodules load on first use: :mod:`.tables` (constants, no numpy at import) is
read by ``layout`` while a Task is built, before anything needs numpy.
"""

from importlib import import_module

_SUBMODULES = ("block_id", "graph", "surface", "tables", "_jit")


def __getattr__(name):
    if name in _SUBMODULES:
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
