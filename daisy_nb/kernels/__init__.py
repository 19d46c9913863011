"""Numba kernels: plain arrays in, plain arrays out. Imports only numpy (numba once compiling pays off, see ``_jit``)."""

from . import block_id, graph, surface  # noqa: F401
