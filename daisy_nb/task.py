"""``Task`` and ``Pipeline``: what a user describes (daisy 2.0.0's API, plus 1.x aliases).

Everything a task needs is validated here, at construction, with errors that name
the parameter (daisy 2.0 accepts bad input here and panics later). Pipelines are
validated (duplicate task ids, cycles) when they are scheduled or run.
"""

from __future__ import annotations

import copy as _copy
import datetime
import heapq
import inspect
import math
import numbers
import warnings
from pathlib import Path

from .layout import BlockLayout

# daisy 2.0.0's words, as its Task says them
CHECK_FUNCTION_WARNING = (
    "Task(check_function=...) runs your callable on the server for EVERY block, and its result persists "
    "nowhere — every rerun pays the full check cost again. For resuming interrupted or repeated runs, prefer "
    "the built-in done markers (Task(tracking_path=...) or daisy.set_tracking_basedir(...)): one mmap'd byte "
    "per block, written on completion, checked in ~microseconds. Keep check_function only when the ground "
    "truth genuinely lives in your output data (e.g. verifying non-empty zarr chunks written by an earlier "
    "pipeline)."
)

# No numpy here, nor in ``layout`` until a task's arrays are used: building Tasks and
# Pipelines stays cheap, and ``run_blockwise`` starts its worker template before the
# scheduler loads numpy (issue 13, small runs).

__all__ = ["DEFAULT_BLOCK_TIMEOUT_SECS", "Pipeline", "Task", "as_pipeline", "check_task_id", "function_arity"]

DEFAULT_BLOCK_TIMEOUT_SECS = 600.0


def function_arity(fn, name: str = "process_function") -> int:
    """Number of required positional arguments of ``fn`` (``self`` excluded): 0 or 1.

    Raises TypeError for anything that cannot be called as ``fn()`` or ``fn(block)``.
    """
    if not callable(fn):
        raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1  # builtins without a signature: assume a block function
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 1:
        raise TypeError(
            f"{name} {fn!r} takes {len(required)} required arguments; it must take one argument (a block) or none"
        )
    kw_required = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty and p.name != "context"]
    if kw_required:
        raise TypeError(
            f"{name} {fn!r} has required keyword-only arguments {kw_required}; it must take one argument (a block) or none"
        )
    # like daisy (getfullargspec(f).args): any positional parameter makes a block function
    if positional or any(p.kind == p.VAR_POSITIONAL for p in params):
        return 1
    return 0


def _timeout_secs(timeout) -> float:
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


def _int_param(value, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ValueError(f"{name} must be {rng}, got {v}")
    return v


class Task:
    """A blockwise task: tile ``total_roi`` into blocks and run a function on each.

    Signature and defaults of daisy 2.0.0's ``Task``; ``num_workers=`` and
    ``upstream_tasks=`` (daisy 1.x) are accepted with a DeprecationWarning, as is
    ``done_marker_path=`` (the old name of ``tracking_path``).
    """

    def __init__(
        self,
        task_id,
        total_roi,
        read_roi,
        write_roi,
        process_function=None,
        check_function=None,
        read_write_conflict=True,
        fit="valid",
        max_workers=None,
        max_retries=2,
        timeout=None,
        tracking_path=None,
        requires=None,
        max_worker_restarts=10,
        skip_mask=None,
        *,
        num_workers=None,
        upstream_tasks=None,
        done_marker_path=None,
        resource_tracking=False,
        init_fn=None,
    ):
        check_task_id(task_id)
        self._task_id = task_id
        self.layout = BlockLayout(total_roi, read_roi, write_roi, read_write_conflict, fit)
        self._total_roi, self._read_roi, self._write_roi = total_roi, read_roi, write_roi

        self._process_function = None
        self._arity = None
        self.process_function = process_function
        self.check_function = check_function
        if check_function is not None:  # daisy 2.0.0 warns so (its text), pointing to done markers
            warnings.warn(CHECK_FUNCTION_WARNING, UserWarning, stacklevel=2)

        if num_workers is not None:
            if max_workers is not None:
                raise TypeError("pass either max_workers or num_workers (deprecated), not both")
            warnings.warn("num_workers is deprecated; use max_workers", DeprecationWarning, stacklevel=2)
            max_workers = num_workers
        if max_workers is None:  # the default (daisy 1.x compatible Task)
            max_workers = 1
        self._max_workers = _int_param(max_workers, "max_workers", 1)
        self._max_retries = _int_param(max_retries, "max_retries", 0, 255)
        self._max_worker_restarts = _int_param(max_worker_restarts, "max_worker_restarts", 0)
        self._timeout_secs = _timeout_secs(timeout)
        self._timeout = timeout

        if requires is None:
            requires = {}
        if not isinstance(requires, dict):
            raise TypeError(f"requires must be a dict of resource name -> int, got {type(requires).__name__}")
        for k, v in requires.items():
            if not isinstance(k, str):
                raise TypeError(f"requires keys must be str, got {k!r}")
            _int_param(v, f"requires[{k!r}]", 0)
        self._requires = {k: int(v) for k, v in requires.items()}

        if done_marker_path is not None:
            if tracking_path is not None:
                raise TypeError("pass either tracking_path or done_marker_path (deprecated), not both")
            warnings.warn("done_marker_path is deprecated; use tracking_path", DeprecationWarning, stacklevel=2)
            tracking_path = done_marker_path
        if tracking_path is True:
            raise TypeError(
                "tracking_path=True is not a valid value; pass a path, None (use the tracking basedir) or False"
            )
        if tracking_path is not None and tracking_path is not False and not isinstance(tracking_path, (str, Path)):
            raise TypeError(f"tracking_path must be a str, a Path, None or False, got {type(tracking_path).__name__}")
        self._tracking_path = str(tracking_path) if isinstance(tracking_path, Path) else tracking_path

        self._skip_mask = None
        if skip_mask is not None:
            import numpy as np

            mask = np.ascontiguousarray(np.asarray(skip_mask) != 0, dtype=np.uint8)
            if tuple(mask.shape) != tuple(self.block_grid_shape):
                raise ValueError(
                    f"skip_mask must have the task's block grid shape {self.block_grid_shape}, got {list(mask.shape)}"
                )
            self._skip_mask = mask

        if init_fn is not None and not callable(init_fn):
            raise TypeError(f"init_fn must be callable, got {type(init_fn).__name__}")
        self.init_fn = init_fn
        # per-block wall/CPU/RSS/IO measured by the runtimes (daisy_nb.profiling), summed per task
        self.resource_tracking = bool(resource_tracking)

        self._v1_upstream_tasks = []
        if upstream_tasks is not None:
            warnings.warn(
                "upstream_tasks is deprecated; compose tasks into a Pipeline (a + b)", DeprecationWarning, stacklevel=2
            )
            ups = list(upstream_tasks) if isinstance(upstream_tasks, (list, tuple)) else [upstream_tasks]
            for u in ups:
                if not isinstance(u, Task):
                    raise TypeError(f"upstream_tasks must contain Tasks, got {type(u).__name__}")
            self._v1_upstream_tasks = ups

    # -- properties ---------------------------------------------------------------
    task_id = property(lambda self: self._task_id)
    total_roi = property(lambda self: self._total_roi)
    read_roi = property(lambda self: self._read_roi)
    write_roi = property(lambda self: self._write_roi)
    fit = property(lambda self: self.layout.fit)
    read_write_conflict = property(lambda self: self.layout.read_write_conflict)
    max_workers = property(lambda self: self._max_workers)
    num_workers = property(lambda self: self._max_workers)
    max_retries = property(lambda self: self._max_retries)
    max_worker_restarts = property(lambda self: self._max_worker_restarts)
    timeout_secs = property(lambda self: self._timeout_secs)
    timeout = property(lambda self: self._timeout)
    requires = property(lambda self: dict(self._requires))
    tracking_path = property(lambda self: self._tracking_path)
    done_marker_path = property(lambda self: self._tracking_path)
    skip_mask = property(lambda self: self._skip_mask)
    upstream_tasks = property(lambda self: list(self._v1_upstream_tasks))

    @property
    def block_grid_shape(self) -> list[int]:
        """Blocks per axis (daisy 2.0 wheel's ``block_grid_shape``)."""
        return self.layout.block_grid_shape

    @property
    def process_function(self):
        return self._process_function

    @process_function.setter
    def process_function(self, fn):
        self._arity = None if fn is None else function_arity(fn, "process_function")
        self._process_function = fn

    @property
    def arity(self):
        """0 (worker function running its own Client loop), 1 (block function) or None."""
        return self._arity

    @property
    def check_function(self):
        return self._check_function

    @check_function.setter
    def check_function(self, fn):
        if fn is not None:
            if function_arity(fn, "check_function") != 1:
                raise TypeError(f"check_function must take one argument (a block), got {fn!r}")
        self._check_function = fn

    def requires_v1(self):
        """daisy 1.x ``Task.requires()``: the upstream tasks given with ``upstream_tasks=``."""
        return list(self._v1_upstream_tasks)

    # -- tracking -----------------------------------------------------------------
    def resolved_tracking_path(self) -> Path | None:
        from .tracking import resolve_tracking_path

        return resolve_tracking_path(self._task_id, self._tracking_path)

    def reset(self):
        """Delete this task's block tracking; return its path, or None if there was none."""
        p = self.resolved_tracking_path()
        if p is None:
            return None
        from .tracking import reset

        return reset(p)

    def failed_blocks(self):
        """Blocks recorded as failed and not done in this task's tracking store."""
        import numpy as np

        from .tracking import read_tracking

        p = self.resolved_tracking_path()
        if p is None or not Path(p).exists():
            return []
        info = read_tracking(p)
        mask = (np.asarray(info["failures"]) > 0) & (np.asarray(info["done"]) == 0)
        cells = np.argwhere(mask)
        from .graph import BlockwiseDependencyGraph

        g = BlockwiseDependencyGraph(
            self._task_id,
            self._read_roi,
            self._write_roi,
            self.read_write_conflict,
            self.fit,
            total_read_roi=self._total_roi,
        )
        out = []
        lay = self.layout
        for c in cells:
            grid = c - lay.id_offset
            if np.any(grid < 0) or np.any(grid >= lay.grid_shape):
                continue
            woff = lay.tw_offset + grid * lay.write_shape
            from .block import Block
            from .layout import roi_tuple

            wr = roi_tuple(self._write_roi, "write_roi")
            fake = Block(
                self._total_roi,
                (tuple(int(v) for v in woff - lay.cul), tuple(lay.read_shape.tolist())),
                (tuple(woff.tolist()), wr[1]),
                task_id=self._task_id,
            )
            row = g.block_row(fake)
            out.extend(g._blocks([row]))
        return out

    # -- composition --------------------------------------------------------------
    def __add__(self, other):
        return Pipeline.from_task(self) + other

    def __radd__(self, other):
        return _coerce(other, "+") + Pipeline.from_task(self)

    def __or__(self, other):
        return Pipeline.from_task(self) | other

    def __ror__(self, other):
        return _coerce(other, "|") | Pipeline.from_task(self)

    def __copy__(self):
        new = object.__new__(Task)
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __repr__(self):
        return f"Task({self._task_id!r}, blocks={self.layout.num_blocks}, fit={self.fit!r}, conflict={self.read_write_conflict})"


def _coerce(x, op: str) -> Pipeline:
    if isinstance(x, Pipeline):
        return x
    if isinstance(x, Task):
        return Pipeline.from_task(x)
    raise TypeError(f"unsupported operand for {op}: {type(x).__name__} (expected a Task or a Pipeline)")


class Pipeline:
    """A DAG of tasks. ``a + b`` chains (every output of a feeds every source of b),
    ``a | b`` unions. Tasks are deduplicated by identity; composition never mutates."""

    def __init__(self, tasks=None, edges=None):
        self._tasks: list[Task] = []
        seen = set()
        for t in tasks or []:
            if not isinstance(t, Task):
                raise TypeError(f"Pipeline tasks must be Tasks, got {type(t).__name__}")
            if id(t) not in seen:
                seen.add(id(t))
                self._tasks.append(t)
        self._edges: list[tuple[Task, Task]] = []
        eseen = set()
        for e in edges or []:
            try:
                u, d = e
            except (TypeError, ValueError):
                raise TypeError(f"Pipeline edges must be (upstream_task, downstream_task) pairs, got {e!r}") from None
            if id(u) not in seen:
                raise ValueError(f"edge upstream task {getattr(u, 'task_id', u)!r} is not in the pipeline's task list")
            if id(d) not in seen:
                raise ValueError(
                    f"edge downstream task {getattr(d, 'task_id', d)!r} is not in the pipeline's task list"
                )
            if (id(u), id(d)) not in eseen:
                eseen.add((id(u), id(d)))
                self._edges.append((u, d))

    @classmethod
    def from_task(cls, task: Task) -> Pipeline:
        return cls([task], [])

    @property
    def tasks(self) -> list[Task]:
        return list(self._tasks)

    @property
    def edges(self) -> list[tuple[Task, Task]]:
        return list(self._edges)

    @property
    def sources(self) -> list[Task]:
        down = {id(d) for _, d in self._edges}
        return [t for t in self._tasks if id(t) not in down]

    @property
    def outputs(self) -> list[Task]:
        up = {id(u) for u, _ in self._edges}
        return [t for t in self._tasks if id(t) not in up]

    def __add__(self, other):
        other = _coerce(other, "+")
        new_edges = [(o, s) for o in self.outputs for s in other.sources]
        return Pipeline(self._tasks + other._tasks, self._edges + other._edges + new_edges)

    def __radd__(self, other):
        return _coerce(other, "+") + self

    def __or__(self, other):
        other = _coerce(other, "|")
        return Pipeline(self._tasks + other._tasks, self._edges + other._edges)

    def __ror__(self, other):
        return _coerce(other, "|") | self

    def reset(self):
        return [t.reset() for t in self._tasks]

    def run_blockwise(self, **kwargs):
        """``daisy_nb.run_blockwise(self, **kwargs)`` (through the package: the runner sits above this module)."""
        import daisy_nb

        return daisy_nb.run_blockwise(self, **kwargs)

    def validate(self) -> list[str]:
        """Raise ValueError on duplicate task ids or cycles; return the display order."""
        ids = {}
        for t in self._tasks:
            if t.task_id in ids:
                raise ValueError(f"duplicate task_id in pipeline: {t.task_id}")
            ids[t.task_id] = t
        return topo_order([t.task_id for t in self._tasks], [(u.task_id, d.task_id) for u, d in self._edges])

    def __repr__(self):
        q = lambda ts: "[" + ", ".join(f'"{t.task_id}"' for t in ts) + "]"  # noqa: E731
        edges = ", ".join(f'("{u.task_id}", "{d.task_id}")' for u, d in self._edges)
        return (
            f"Pipeline(tasks={q(self._tasks)}, sources={q(self.sources)}, outputs={q(self.outputs)}, edges=[{edges}])"
        )

    def __copy__(self):
        return Pipeline(self._tasks, self._edges)


def check_task_id(task_id) -> None:
    """The ids daisy 2.0.0 accepts, except those that name a path outside their directory.

    A task's worker logs go to ``<log basedir>/<task_id>/`` and its default block
    tracking to ``<tracking basedir>/<task_id>``, as in daisy 2.0.0: a ``/`` nests them
    (dacapo's ``predict_/data/run1/pred.zarr_prediction``), and any other character
    (``:``, ``=``, ``%``, newlines, unicode) is kept as is. daisy 2.0.0 also accepts ids
    that leave that directory or replace it (``..`` segments, absolute ids, ``""``,
    ``"."``), and writes wherever they point; those raise ``ValueError`` here.
    """
    if not isinstance(task_id, str):
        raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
    parts = task_id.split("/")
    why = None
    if task_id.startswith("/"):
        why = "is an absolute path"
    elif ".." in parts:
        why = "has a '..' segment"
    elif all(p in ("", ".") for p in parts):
        why = "names the log and tracking directory itself"
    elif "\0" in task_id:
        why = "contains a NUL character"
    if why is not None:
        raise ValueError(
            f"task_id {task_id!r} {why}: a task's worker logs and block tracking live in "
            "<basedir>/<task_id>, which must stay inside <basedir> ('/' nests, '..' and a leading '/' "
            "are refused)"
        )


def topo_order(task_ids: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """Kahn's algorithm with ties broken by task id; ValueError if there is a cycle."""
    indeg = {t: 0 for t in task_ids}
    out: dict[str, list[str]] = {t: [] for t in task_ids}
    for u, d in edges:
        indeg[d] += 1
        out[u].append(d)
    heap = [t for t, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        t = heapq.heappop(heap)
        order.append(t)
        for d in out[t]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(heap, d)
    if len(order) != len(task_ids):
        raise ValueError("pipeline contains a cycle: " + ", ".join(sorted(t for t in task_ids if t not in order)))
    return order


def as_pipeline(x) -> Pipeline:
    """A Pipeline from a Pipeline, a Task, or a list/tuple of tasks (daisy 1.x form)."""
    if isinstance(x, Pipeline):
        return x
    if isinstance(x, Task):
        x = [x]
    if isinstance(x, (list, tuple)):
        if not x:
            raise ValueError("no tasks given")
        tasks: list[Task] = []
        seen = set()
        edges = []
        stack = list(x)
        while stack:
            t = stack.pop(0)
            if not isinstance(t, Task):
                raise TypeError(f"expected Tasks, got {type(t).__name__}")
            if id(t) in seen:
                continue
            seen.add(id(t))
            tasks.append(t)
            for u in t._v1_upstream_tasks:
                edges.append((u, t))
                stack.append(u)
        return Pipeline(tasks, edges)
    raise TypeError(f"expected a Pipeline, a Task or a list of Tasks, got {type(x).__name__}")


def copy_task(task: Task) -> Task:
    return _copy.copy(task)
