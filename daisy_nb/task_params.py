"""A task's parameters, checked and normalised once: :class:`TaskParams`, the base of :class:`daisy_nb.Task`.

What a ``Task(...)`` call says about where its blocks are (its ROIs, ``fit`` and
``read_write_conflict``, as a :class:`~daisy_nb.layout.BlockLayout`) and how they run
(workers, retries and their backoff, backup copies of stragglers, restarts, the block
timeout, resources, tracking, the skip mask).
Each parameter is checked here with an error that names it (the Task prefixes its id,
:func:`daisy_nb.task.task_errors`) and kept in one normalised form (a number of seconds,
a dict of ints, a str path, a uint8 mask), read through read-only properties: the
parameters do not change after construction.

Not here, but on the Task: its id, its functions (settable, checked when set), its place
in a pipeline (daisy 1.x ``upstream_tasks``, composition) and what is done with its
tracking store. No numpy at import: a ``skip_mask`` imports it when one is given.
"""

from __future__ import annotations

import datetime
import math
import numbers
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .kernels.tables import RETRIES_MAX
from .layout import BlockLayout

if TYPE_CHECKING:
    import numpy as np
    from funlib.geometry import Roi

__all__ = ["DEFAULT_BLOCK_TIMEOUT_SECS", "TaskParams", "init_fn_param"]

DEFAULT_BLOCK_TIMEOUT_SECS = 600.0


class TaskParams:
    """A task's geometry and run options, checked once, and their read-only views.

    The base of :class:`daisy_nb.Task`, which documents each parameter; ``Task.__init__``
    checks the task id, the geometry (building ``layout``) and the functions, then calls this
    (see the module docstring). Deprecated names warn with ``stacklevel=4``: at the
    ``Task(...)`` call, through this ``__init__`` and ``Task.__init__``.

    Parameters
    ----------
    layout : BlockLayout
        The task's geometry in blocks, already checked (from ``total_roi``, ``read_roi``,
        ``write_roi``, ``read_write_conflict`` and ``fit``).
    total_roi, read_roi, write_roi : funlib.geometry.Roi
        As given to the Task.
    max_workers, num_workers, max_retries, max_worker_restarts, timeout, retry_backoff, speculative : object
        The Task's parameters of these names, unchecked.
    requires, tracking_path, done_marker_path, skip_mask : object
        The Task's parameters of these names, unchecked.
    """

    def __init__(
        self,
        layout: BlockLayout,
        total_roi: Roi,
        read_roi: Roi,
        write_roi: Roi,
        *,
        max_workers: Any,
        num_workers: Any,
        max_retries: Any,
        max_worker_restarts: Any,
        timeout: Any,
        requires: Any,
        tracking_path: Any,
        done_marker_path: Any,
        skip_mask: Any,
        retry_backoff: Any = None,
        speculative: Any = None,
    ) -> None:
        self.layout = layout
        self._total_roi, self._read_roi, self._write_roi = total_roi, read_roi, write_roi
        self._max_workers = _worker_count(max_workers, num_workers)
        self._max_retries = _int_param(max_retries, "max_retries", 0, RETRIES_MAX)
        self._max_worker_restarts = _int_param(max_worker_restarts, "max_worker_restarts", 0)
        self._timeout_secs = _timeout_secs(timeout)
        self._timeout = timeout
        self._retry_backoff = _retry_backoff_secs(retry_backoff)
        self._speculative = _speculative_factor(speculative)
        self._requires = _requires_param(requires)
        self._tracking_path = _tracking_param(tracking_path, done_marker_path)
        self._skip_mask = _skip_mask_param(skip_mask, layout.block_grid_shape)

    # -- the geometry --------------------------------------------------------------------
    @property
    def total_roi(self) -> Roi:
        """The total read ROI (``total_roi=``), as given."""
        return self._total_roi

    @property
    def read_roi(self) -> Roi:
        """One block's read ROI template (``read_roi=``), as given."""
        return self._read_roi

    @property
    def write_roi(self) -> Roi:
        """One block's write ROI template (``write_roi=``), as given."""
        return self._write_roi

    @property
    def fit(self) -> str:
        """``"valid"``, ``"overhang"`` or ``"shrink"`` (``fit=``)."""
        return self.layout.fit

    @property
    def read_write_conflict(self) -> bool:
        """Whether overlapping blocks are kept from running at the same time (``read_write_conflict=``)."""
        return self.layout.read_write_conflict

    @property
    def block_grid_shape(self) -> list[int]:
        """Blocks per axis (daisy 2.0 wheel's ``block_grid_shape``)."""
        return self.layout.block_grid_shape

    @property
    def skip_mask(self) -> np.ndarray | None:
        """``skip_mask=`` as a contiguous uint8 array of shape :attr:`block_grid_shape`, or None."""
        return self._skip_mask

    # -- the run options -----------------------------------------------------------------
    @property
    def max_workers(self) -> int:
        """Worker processes for this task (``max_workers=``, default 1)."""
        return self._max_workers

    @property
    def num_workers(self) -> int:
        """daisy 1.x name of :attr:`max_workers`."""
        return self._max_workers

    @property
    def max_retries(self) -> int:
        """How often a failed block is tried again (``max_retries=``)."""
        return self._max_retries

    @property
    def retry_backoff(self) -> float:
        """Seconds a failed block waits before its first retry, doubling per failure, with jitter
        (``retry_backoff=``; 0.0: off, retried at once). See :mod:`daisy_nb.scheduling.backoff`."""
        return self._retry_backoff

    @property
    def speculative(self) -> float | None:
        """The factor of the median block time past which a running block is to get a backup copy
        (``speculative=``; True: 3.0; None: off). See :mod:`daisy_nb.scheduling.speculation`; the
        local pool launches copies, the other runtimes ignore it."""
        return self._speculative

    @property
    def max_worker_restarts(self) -> int:
        """Worker restarts allowed before the task is abandoned (``max_worker_restarts=``)."""
        return self._max_worker_restarts

    @property
    def timeout_secs(self) -> float:
        """The block timeout in seconds (``timeout=`` converted; 600 when it was None)."""
        return self._timeout_secs

    @property
    def timeout(self) -> float | datetime.timedelta | None:
        """``timeout=`` as given (None: the default of :attr:`timeout_secs`)."""
        return self._timeout

    @property
    def requires(self) -> dict[str, int]:
        """Resources one worker uses (``requires=``); a copy."""
        return dict(self._requires)

    @property
    def tracking_path(self) -> str | Literal[False] | None:
        """``tracking_path=`` (a Path given becomes a str); see :meth:`resolved_tracking_path`."""
        return self._tracking_path

    @property
    def done_marker_path(self) -> str | Literal[False] | None:
        """Deprecated name of :attr:`tracking_path`."""
        return self._tracking_path


def init_fn_param(init_fn: Any) -> Any:
    """``init_fn``: None or a callable (run once per worker process)."""
    if init_fn is not None and not callable(init_fn):
        raise TypeError(f"init_fn must be callable, got {type(init_fn).__name__}")
    return init_fn


# -- each parameter, checked (errors are prefixed with the task by the caller).
# stacklevel=4: warnings point at the Task(...) call (through TaskParams.__init__ and Task.__init__).
def _timeout_secs(timeout: object) -> float:
    if timeout is None:
        return DEFAULT_BLOCK_TIMEOUT_SECS
    if isinstance(timeout, datetime.timedelta):
        secs = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        secs = float(timeout)
    else:
        raise TypeError(f"timeout must be a number of seconds, a timedelta or None, got {type(timeout).__name__}")
    if not math.isfinite(secs) or secs <= 0:
        raise ValueError(f"timeout must be positive and finite (seconds), got {timeout!r}")
    return secs


def _retry_backoff_secs(retry_backoff: object) -> float:
    """``retry_backoff``: None or 0 (off), else a positive finite number of seconds or a timedelta."""
    if retry_backoff is None:
        return 0.0
    if isinstance(retry_backoff, datetime.timedelta):
        secs = retry_backoff.total_seconds()
    elif isinstance(retry_backoff, numbers.Real) and not isinstance(retry_backoff, bool):
        secs = float(retry_backoff)
    else:
        raise TypeError(
            f"retry_backoff must be a number of seconds, a timedelta or None, got {type(retry_backoff).__name__}"
        )
    if not math.isfinite(secs) or secs < 0:
        raise ValueError(f"retry_backoff must be >= 0 and finite (seconds; 0 or None: off), got {retry_backoff!r}")
    return secs


def _speculative_factor(speculative: object) -> float | None:
    """``speculative``: None or False (off), True (``DEFAULT_FACTOR``) or a finite factor > 1."""
    if speculative is None or speculative is False:
        return None
    if speculative is True:
        from .scheduling.speculation import DEFAULT_FACTOR  # (the backup rules load with the first such task)

        return DEFAULT_FACTOR
    if not isinstance(speculative, numbers.Real):
        raise TypeError(
            f"speculative must be True, False, None or a factor (a number > 1), got {type(speculative).__name__}"
        )
    factor = float(speculative)
    if not math.isfinite(factor) or factor <= 1:
        from .scheduling.speculation import DEFAULT_FACTOR

        raise ValueError(
            f"speculative must be a finite factor > 1 of the median block time (True: {DEFAULT_FACTOR}), "
            f"got {speculative!r}"
        )
    return factor


def _int_param(value: object, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ValueError(f"{name} must be {rng}, got {v}")
    return v


def _worker_count(max_workers: Any, num_workers: Any) -> int:
    """``max_workers`` (or its deprecated daisy 1.x name ``num_workers``), default 1."""
    if num_workers is not None:
        if max_workers is not None:
            raise TypeError("pass either max_workers or num_workers (deprecated), not both")
        warnings.warn("num_workers is deprecated; use max_workers", DeprecationWarning, stacklevel=4)
        max_workers = num_workers
    if max_workers is None:  # the default (daisy 1.x compatible Task)
        max_workers = 1
    return _int_param(max_workers, "max_workers", 1)


def _requires_param(requires: Any) -> dict[str, int]:
    """``requires``: resource name -> count one worker uses."""
    if requires is None:
        requires = {}
    if not isinstance(requires, dict):
        raise TypeError(f"requires must be a dict of resource name -> int, got {type(requires).__name__}")
    for k, v in requires.items():
        if not isinstance(k, str):
            raise TypeError(f"requires keys must be str, got {k!r}")
        _int_param(v, f"requires[{k!r}]", 0)
    return {k: int(v) for k, v in requires.items()}


def _tracking_param(tracking_path: Any, done_marker_path: Any) -> str | Literal[False] | None:
    """``tracking_path`` (or its deprecated name ``done_marker_path``): a str, None or False."""
    if done_marker_path is not None:
        if tracking_path is not None:
            raise TypeError("pass either tracking_path or done_marker_path (deprecated), not both")
        warnings.warn("done_marker_path is deprecated; use tracking_path", DeprecationWarning, stacklevel=4)
        tracking_path = done_marker_path
    if tracking_path is True:
        raise TypeError(
            "tracking_path=True is not a valid value; pass a path, None (use the tracking basedir) or False"
        )
    if tracking_path is not None and tracking_path is not False and not isinstance(tracking_path, (str, Path)):
        raise TypeError(f"tracking_path must be a str, a Path, None or False, got {type(tracking_path).__name__}")
    return str(tracking_path) if isinstance(tracking_path, Path) else tracking_path


def _skip_mask_param(skip_mask: Any, grid_shape: list[int]) -> np.ndarray | None:
    """``skip_mask`` as a C-contiguous uint8 array of the block grid's shape (nonzero: skip)."""
    if skip_mask is None:
        return None
    import numpy as np

    mask = np.ascontiguousarray(np.asarray(skip_mask) != 0, dtype=np.uint8)
    if tuple(mask.shape) != tuple(grid_shape):
        raise ValueError(f"skip_mask must have the task's block grid shape {grid_shape}, got {list(mask.shape)}")
    return mask
