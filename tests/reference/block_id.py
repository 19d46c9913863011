"""Spatial block IDs: the generalised Cantor number of a block's grid index.

Implements CORE.md section 2.2 (daisy 2.0 flavour: exact integers, negative
grid components clamped to 0). Deliberately does *not* model daisy 1.x's float
arithmetic (which loses precision beyond 2**53) or its missing clamp.
"""

from __future__ import annotations

from math import comb

__all__ = ["binomial_pyramid", "block_grid_index", "block_spatial_id", "cantor"]

Roi = tuple[tuple[int, ...], tuple[int, ...]]


def binomial_pyramid(n: int, s: int) -> int:
    """``P(n, s)`` of CORE 2.2: ``0`` if ``s == 0``, else ``s(s+1)...(s+n-1) / n!``.

    This is the number of non-negative integer ``n``-tuples with component sum
    ``< s`` (the "volume" of an ``n``-dimensional pyramid), i.e. the binomial
    coefficient ``C(s + n - 1, n)``.
    """
    if s == 0:
        return 0
    return comb(s + n - 1, n)


def cantor(index: tuple[int, ...]) -> int:
    """Generalised Cantor ("pyramid volume") number of a grid index (CORE 2.2).

    Recursive definition, written out literally: ``cantor((x0,)) = x0`` and
    ``cantor((x0, ..., x_{N-1})) = P(N, x0 + ... + x_{N-1}) + cantor((x0, ..., x_{N-2}))``.
    The *last* axis is dropped first; the 1-D base case is the *first* axis.
    Exact (Python ints). Defined for non-negative components; an empty index
    gives 0.

    >>> [cantor((0, 0)), cantor((0, 1)), cantor((1, 0)), cantor((3, 3))]
    [0, 1, 2, 24]
    >>> cantor((3, 2, 1))
    74
    """
    index = tuple(int(v) for v in index)
    if len(index) == 0:
        return 0
    if len(index) == 1:
        return index[0]
    return binomial_pyramid(len(index), sum(index)) + cantor(index[:-1])


def block_grid_index(total_roi: Roi, write_roi: Roi) -> tuple[int, ...]:
    """Grid index ``x = (W.begin - T.begin) div W.shape`` of CORE 2.2 step 1.

    ``T`` is the origin ROI (for graph blocks: the task's total *read* ROI) and
    the stride is the write ROI's own shape. ``div`` is floor division; the
    shape is positive. Negative components are returned as they are (the
    clamp of step 2 is applied by :func:`block_spatial_id`).
    """
    (t_begin, _), (w_begin, w_shape) = total_roi, write_roi
    return tuple((w - t) // s for w, t, s in zip(w_begin, t_begin, w_shape, strict=True))


def block_spatial_id(total_roi: Roi, write_roi: Roi) -> int:
    """Spatial ID of a block with write ROI ``write_roi`` in ``total_roi`` (CORE 2.2).

    Grid index (step 1), every negative component clamped to 0 (step 2,
    daisy 2 only), then :func:`cantor` (step 3).
    """
    return cantor(tuple(max(0, x) for x in block_grid_index(total_roi, write_roi)))
