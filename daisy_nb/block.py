"""Blocks: the unit of work handed to a process function.

This module is imported by worker processes, so it must never import numba or
``daisy_nb.kernels``. A :class:`Block` made by the scheduler carries its ROIs as
plain integer tuples and builds funlib ``Roi`` objects only when someone asks
(one ``Roi`` costs ~17 µs, more than scheduling the block).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from funlib.geometry import Coordinate, Roi

if TYPE_CHECKING:
    from .profiling import BlockStats

    RoiLike = Roi | tuple[tuple[int, ...], tuple[int, ...]]

__all__ = ["Block", "BlockStatus", "cantor_number", "cantor_of_ints"]


class BlockStatus:
    """Block status codes, plain ints as in daisy 2.0 (1.x used an Enum).

    Attributes
    ----------
    CREATED : int
        0: not handed out yet.
    PROCESSING : int
        1: handed to a worker.
    SUCCESS : int
        2: set by a process function (or the runtime) when the block is done.
    FAILED : int
        3: set when the block failed; it is retried up to the task's ``max_retries``.
    """

    CREATED = 0
    PROCESSING = 1
    SUCCESS = 2
    FAILED = 3

    _NAMES = {0: "CREATED", 1: "PROCESSING", 2: "SUCCESS", 3: "FAILED"}

    @classmethod
    def name(cls, status: int) -> str:
        """The name of a status code (``"SUCCESS"``), or the code as a string if unknown.

        Parameters
        ----------
        status : int
            A status code.

        Returns
        -------
        str
        """
        return cls._NAMES.get(int(status), str(status))


def cantor_number(index: Iterable[int]) -> int:
    """Generalised Cantor ("pyramid volume") number of a non-negative grid index.

    Exact in Python integers (daisy 1.x loses precision past 2**53). See docs/explanation/algorithms.md#block-ids:
    ``id = x0 + sum_{n=2..N} C(S_n + n - 1, n)`` with ``S_n = x0 + ... + x_{n-1}``.
    """
    x = [int(v) for v in index]
    return cantor_of_ints(x) if x else 0


def cantor_of_ints(x: list[int]) -> int:
    """:func:`cantor_number` of a non-empty list of Python ints, taken as they are.

    For callers that hold plain ints already (the plain-mode ready surface,
    ``kernels/surface_plain.py``, once per block described): converting them again
    would cost as much as the arithmetic.
    """
    total = x[0]
    s = x[0]
    for n in range(2, len(x) + 1):
        s += x[n - 1]
        # C(s + n - 1, n) = s (s+1) ... (s+n-1) / n!, exact at every step.
        c = 1
        for i in range(1, n + 1):
            c = c * (s + i - 1) // i
        total += c
    return total


def _as_tuple(c: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(v) for v in c)


def _roi_tuple(roi: Any, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if isinstance(roi, tuple) and len(roi) == 2 and isinstance(roi[0], tuple):
        return roi
    try:
        offset, shape = roi.offset, roi.shape
    except AttributeError:
        raise TypeError(f"{name} must be a Roi (or have integer offset and shape), got {roi!r}") from None
    if offset is None or shape is None or any(v is None for v in offset) or any(v is None for v in shape):
        raise ValueError(f"{name} must be bounded, got {roi!r}")
    return _as_tuple(offset), _as_tuple(shape)


class Block:
    """One block of a task: a read ROI, a write ROI and an ID ``(task_id, spatial_id)``.

    ``Block(total_roi, read_roi, write_roi, block_id=None, task_id=None)`` (the
    daisy 1.x order; daisy 2.0 swapped the last two, so a string given as the
    fourth positional argument is taken as the task id). Equality and hash use
    ``block_id`` only. Process functions get blocks from the scheduler; building one
    is for tests and tools.

    Parameters
    ----------
    total_roi : funlib.geometry.Roi or (offset, shape)
        The task's total ROI (with ``block_id=None``, the grid origin of the block id).
    read_roi : funlib.geometry.Roi or (offset, shape)
        The block's read ROI.
    write_roi : funlib.geometry.Roi or (offset, shape)
        The block's write ROI.
    block_id : int or (str, int) or str, optional
        The spatial id (or a ``(task_id, id)`` pair); None computes it from the write
        ROI's grid position (a Cantor number, as daisy). A str is taken as ``task_id``.
    task_id : str, optional
        The task's id (default ``""``).

    Raises
    ------
    TypeError
        A ROI that is not a Roi, a ``task_id`` that is not a str, a ``block_id`` that is
        not an int.
    ValueError
        Unbounded ROIs, ROIs of different dimensions, a write ROI of non-positive shape.
    """

    __slots__ = (
        "_task_id",
        "_spatial_id",
        "_read",
        "_write",
        "_read_roi",
        "_write_roi",
        "_status",
        "index",
        "_stats",
        "__weakref__",
    )

    def __init__(
        self,
        total_roi: RoiLike,
        read_roi: RoiLike,
        write_roi: RoiLike,
        block_id: int | tuple[str, int] | str | None = None,
        task_id: str | None = None,
    ) -> None:
        if isinstance(block_id, str) and task_id is None:
            block_id, task_id = None, block_id  # daisy 2.0 positional order
        total = _roi_tuple(total_roi, "total_roi")
        self._read = _roi_tuple(read_roi, "read_roi")
        self._write = _roi_tuple(write_roi, "write_roi")
        if not (len(total[0]) == len(self._read[0]) == len(self._write[0])):
            raise ValueError("total_roi, read_roi and write_roi must have the same number of dimensions")
        self._read_roi: Roi | None = read_roi if isinstance(read_roi, Roi) else None
        self._write_roi: Roi | None = write_roi if isinstance(write_roi, Roi) else None
        if task_id is not None and not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str or None, got {type(task_id).__name__}")
        self._task_id = "" if task_id is None else task_id
        if block_id is None:
            woff, wshape = self._write
            grid = []
            for w, t, s in zip(woff, total[0], wshape):
                if s <= 0:
                    raise ValueError(f"write_roi must have a positive shape, got {wshape}")
                grid.append(max(0, (w - t) // s))  # negative components clamped (daisy 2.0)
            self._spatial_id = cantor_number(grid)
        else:
            if isinstance(block_id, tuple):
                block_id = block_id[1]
            try:
                self._spatial_id = operator.index(block_id)  # type: ignore[arg-type]  # a str: TypeError below
            except TypeError:
                raise TypeError(
                    f"block_id must be an int (or a (task_id, int) pair), got {type(block_id).__name__}"
                ) from None
        self._status = BlockStatus.CREATED
        self.index = -1

    @classmethod
    def _make(
        cls,
        task_id: str,
        spatial_id: int,
        read: tuple[tuple[int, ...], tuple[int, ...]],
        write: tuple[tuple[int, ...], tuple[int, ...]],
        index: int = -1,
    ) -> Block:
        """Build a block from trusted plain tuples (scheduler and workers; no validation)."""
        b = cls.__new__(cls)
        b._task_id = task_id
        b._spatial_id = spatial_id
        b._read = read
        b._write = write
        b._read_roi = None
        b._write_roi = None
        b._status = BlockStatus.CREATED
        b.index = index
        return b

    # --- identity -----------------------------------------------------------------
    @property
    def block_id(self) -> tuple[str, int]:
        """``(task_id, spatial_id)``: what equality and hash use."""
        return (self._task_id, self._spatial_id)

    @property
    def task_id(self) -> str:
        """The id of the block's task."""
        return self._task_id

    @property
    def spatial_id(self) -> int:
        """The block's number in its task (daisy's Cantor number of its grid position)."""
        return self._spatial_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Block):
            return NotImplemented
        return self._spatial_id == other._spatial_id and self._task_id == other._task_id

    def __hash__(self) -> int:
        return hash((self._task_id, self._spatial_id))

    # --- geometry (lazy Roi objects) ----------------------------------------------
    @property
    def read_roi(self) -> Roi:
        """The ROI the process function may read (the write ROI plus the context)."""
        if self._read_roi is None:
            self._read_roi = Roi(Coordinate(self._read[0]), Coordinate(self._read[1]))
        return self._read_roi

    @read_roi.setter
    def read_roi(self, roi: RoiLike) -> None:
        self._read = _roi_tuple(roi, "read_roi")
        self._read_roi = roi if isinstance(roi, Roi) else None

    @property
    def write_roi(self) -> Roi:
        """The ROI the process function writes; write ROIs of a task's blocks do not overlap."""
        if self._write_roi is None:
            self._write_roi = Roi(Coordinate(self._write[0]), Coordinate(self._write[1]))
        return self._write_roi

    @write_roi.setter
    def write_roi(self, roi: RoiLike) -> None:
        self._write = _roi_tuple(roi, "write_roi")
        self._write_roi = roi if isinstance(roi, Roi) else None

    # --- status -------------------------------------------------------------------
    @property
    def status(self) -> int:
        """A :class:`BlockStatus` code; a process function may set ``SUCCESS`` or ``FAILED``."""
        return self._status

    @status.setter
    def status(self, value: int) -> None:
        v = getattr(value, "value", value)  # accept a 1.x-style Enum member too
        if v not in (0, 1, 2, 3) or isinstance(v, bool):
            raise ValueError(f"invalid status value: {value!r}")
        self._status = int(v)

    # --- resource tracking (daisy 2.0 wheel) ----------------------------------------
    @property
    def stats(self) -> BlockStats | None:
        """The ``BlockStats`` attached by ``daisy.profile_block`` (first one wins), else None."""
        try:  # the slot stays unset until someone profiles: nothing to pay per block otherwise
            return self._stats
        except AttributeError:
            return None

    @stats.setter
    def stats(self, value: BlockStats | None) -> None:
        self._stats = value

    # --- misc ---------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        args = (self._task_id, self._spatial_id, self._read, self._write, self._status, self.index)
        s = self.stats
        return (_rebuild_block, args if s is None else (*args, s))

    def __repr__(self) -> str:
        # daisy 2.0.0's format: ``t/4 read=Roi((10, 10), (20, 20)) write=Roi((15, 15), (10, 10))``
        # (1-D: ``Roi((5), (10))``), not funlib's ``[10:30, 10:30] (20, 20)``
        return f"{self._task_id}/{self._spatial_id} read={_roi_repr(self._read)} write={_roi_repr(self._write)}"

    __str__ = __repr__


def _roi_repr(roi: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    offset, shape = roi
    return f"Roi(({', '.join(map(str, offset))}), ({', '.join(map(str, shape))}))"


def _rebuild_block(
    task_id: str,
    spatial_id: int,
    read: tuple[tuple[int, ...], tuple[int, ...]],
    write: tuple[tuple[int, ...], tuple[int, ...]],
    status: int,
    index: int,
    stats: BlockStats | None = None,
) -> Block:
    b = Block._make(task_id, spatial_id, read, write, index)
    b._status = status
    if stats is not None:
        b._stats = stats
    return b
