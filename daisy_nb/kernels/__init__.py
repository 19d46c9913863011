"""Numba kernels: plain arrays in, plain arrays out. Imports only numpy and numba."""

from . import block_id, graph  # noqa: F401
