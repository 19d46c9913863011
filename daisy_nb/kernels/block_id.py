"""Block IDs: daisy's generalised Cantor number of a grid index (docs/explanation/algorithms.md#block-ids).

Exact in int64: :class:`daisy_nb.layout.BlockLayout` refuses grids whose IDs (or the
intermediate products below) would not fit, so nothing here can overflow.
"""

import numpy as np

from ._jit import kernel


@kernel
def cantor(x, nd):
    """Cantor number of ``x[:nd]`` (int64[:] grid index, already shifted by the ID offset).

    ``id = x0 + sum_{n=2..nd} C(S_n + n - 1, n)``. Written with constant divisors for
    ``nd <= 4`` (the multiply-by-reciprocal is ~10x cheaper than an integer division);
    every intermediate is the same as the step-wise product, so it is as exact.
    """
    s = x[0]
    total = s
    if nd >= 2:
        s += x[1]
        total += s * (s + 1) // 2
    if nd >= 3:
        s += x[2]
        total += (s * (s + 1) // 2) * (s + 2) // 3
    if nd >= 4:
        s += x[3]
        total += ((s * (s + 1) // 2) * (s + 2) // 3) * (s + 3) // 4
    for n in range(5, nd + 1):
        s += x[n - 1]
        c = np.int64(1)
        for i in range(1, n + 1):
            c = c * (s + i - 1) // i
        total += c
    return total


@kernel
def cantor_ids(grid_index, out):
    """Cantor numbers of many grid indices.

    grid_index : int64[n, nd] (non-negative); out : int64[n], written. Returns n.
    """
    n, nd = grid_index.shape
    for i in range(n):
        out[i] = cantor(grid_index[i], nd)
    return n
