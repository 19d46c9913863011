"""``Task`` and ``Pipeline``: what a user describes (daisy 2.0.0's API, plus 1.x aliases).

Everything a task needs is validated at construction, with errors that name the
parameter and the task (daisy 2.0 accepts bad input here and panics later): its geometry
and run options by its base, :class:`daisy_nb.task_params.TaskParams` (their checks and
read-only properties); its id, its functions (also when set) and its upstream tasks here.
Pipelines are validated (duplicate task ids, cycles) when they are scheduled or run.
"""

from __future__ import annotations

import contextlib
import copy as _copy
import datetime
import heapq
import inspect
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

from .layout import BlockLayout
from .task_params import DEFAULT_BLOCK_TIMEOUT_SECS, TaskParams, init_fn_param

if TYPE_CHECKING:
    import numpy.typing as npt
    from funlib.geometry import Roi

    from .block import Block

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
# scheduler loads numpy (docs/explanation/architecture.md#core).

__all__ = [
    "DEFAULT_BLOCK_TIMEOUT_SECS",
    "Pipeline",
    "Task",
    "Tasks",
    "as_pipeline",
    "check_task_id",
    "function_arity",
    "task_errors",
]


def function_arity(fn: object, name: str = "process_function") -> int:
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


Tasks = Union["Task", "Pipeline", Sequence["Task"]]
"""What ``run_blockwise``, ``Scheduler`` and ``Server.run_blockwise`` take: a Pipeline, a
Task, or a list of tasks (daisy 1.x form, upstream tasks followed)."""


@contextlib.contextmanager
def task_errors(task_id: object) -> Iterator[None]:
    """Prefix the ``ValueError``/``TypeError`` raised inside with ``Task '<task_id>': ``.

    The one prefix of configuration errors: in a pipeline of many tasks built by a helper,
    ``write_roi ... must lie inside read_roi`` alone does not say which task is wrong.
    A message that already names the task this way is re-raised as is.
    """
    prefix = f"Task {task_id!r}: "
    try:
        yield
    except (TypeError, ValueError) as e:
        msg = str(e)
        if msg.startswith(prefix):
            raise
        cls = TypeError if isinstance(e, TypeError) else ValueError
        raise cls(prefix + msg).with_traceback(e.__traceback__) from None


def _upstream_param(upstream_tasks: Any) -> list[Task]:
    """daisy 1.x ``upstream_tasks`` (a Task or a sequence of them), with a DeprecationWarning
    pointing at the ``Task(...)`` call."""
    if upstream_tasks is None:
        return []
    warnings.warn(
        "upstream_tasks is deprecated; compose tasks into a Pipeline (a + b)", DeprecationWarning, stacklevel=3
    )
    ups = list(upstream_tasks) if isinstance(upstream_tasks, (list, tuple)) else [upstream_tasks]
    for u in ups:
        if not isinstance(u, Task):
            raise TypeError(f"upstream_tasks must contain Tasks, got {type(u).__name__}")
    return ups


class Task(TaskParams):
    """A blockwise task: tile ``total_roi`` into blocks and run a function on each.

    Signature and defaults of daisy 2.0.0's ``Task``; ``num_workers=`` and
    ``upstream_tasks=`` (daisy 1.x) are accepted with a ``DeprecationWarning``, as is
    ``done_marker_path=`` (the old name of ``tracking_path``). Everything is validated
    here, before any run: errors start with ``Task '<task_id>': `` and name the parameter.

    Parameters
    ----------
    task_id : str
        The task's name, unique in a pipeline. A ``/`` nests its log and tracking
        directories; ids that leave them (``..``, absolute) are refused.
    total_roi : funlib.geometry.Roi
        The total *read* ROI: every block's read ROI lies inside it.
    read_roi : funlib.geometry.Roi
        The read ROI of one block (a template: only its shape and its placement
        relative to ``write_roi`` matter).
    write_roi : funlib.geometry.Roi
        The write ROI of one block; it must lie inside ``read_roi`` (the difference is
        the context) and its shape is the block grid's step.
    process_function : callable, optional
        ``f(block)``, called once per block, or ``f()``, a worker function that runs its
        own :class:`daisy_nb.Client` loop. None is refused by a run on worker processes;
        serial and dask runs accept it for a task with no block; dry runs always.
    check_function : callable, optional
        ``check(block) -> bool``: True means the block is already done and is skipped
        (daisy 1.x); block tracking usually makes it unnecessary.
    read_write_conflict : bool, default True
        Whether blocks whose read ROI overlaps another's write ROI must not run at the
        same time (they are then scheduled in levels).
    fit : {"valid", "overhang", "shrink"}, default "valid"
        What to do with blocks that cross the border of ``total_roi``: drop them, keep
        them whole, or shrink them to fit.
    max_workers : int, optional
        Worker processes for this task (default 1).
    max_retries : int, default 2
        How often a failed block is tried again (0 to 255).
    timeout : float or datetime.timedelta, optional
        Seconds a block may run before the runtime takes it back and counts a failed
        attempt (default 600).
    tracking_path : str or pathlib.Path or False, optional
        Where block tracking (the record of done blocks, for resuming) lives: None for
        ``<tracking basedir>/<task_id>``, False for no tracking.
    requires : dict of str to int, optional
        Resources one worker of this task uses (e.g. ``{"gpu": 1}``), counted against
        ``run_blockwise``'s ``resources``.
    max_worker_restarts : int, default 10
        How many times the task's workers may be restarted after dying before the task
        is abandoned.
    skip_mask : array_like, optional
        One cell per block (shape :attr:`block_grid_shape`); a nonzero cell skips the
        block in this run (reported as skipped, not recorded as done).
    num_workers : int, optional
        Deprecated (daisy 1.x) name of ``max_workers``.
    upstream_tasks : Task or sequence of Task, optional
        Deprecated (daisy 1.x): tasks this one depends on; compose a Pipeline instead.
    done_marker_path : str or pathlib.Path or False, optional
        Deprecated name of ``tracking_path``.
    resource_tracking : bool, default False
        Measure each block's wall time, CPU, peak RSS and IO in the worker and report
        them per task.
    init_fn : callable, optional
        ``init_fn()``, run once per worker process of the task before its first block of
        the task (a local worker that moves on from another task runs it as it arrives); its
        result is :func:`daisy_nb.worker_state` there.
    retry_backoff : float or datetime.timedelta, optional
        Seconds a failed block waits before it is tried again (daisy_nb extension; None or
        0, the default: retried at once, as daisy does). The wait after a block's ``k``-th
        failure is ``min(retry_backoff * 2**(k-1), 32 * retry_backoff)`` times a random
        factor in [0.5, 1.5), so retries of blocks that failed together (a file server down)
        are spread out; a waiting block counts as pending. See
        :mod:`daisy_nb.scheduling.backoff`.
    speculative : bool or float, optional
        Backup copies of stragglers (daisy_nb extension; None or False, the default: off).
        True (factor 3) or a factor ``k > 1``: once about two blocks per worker (twice as many
        as run; or 64, or half of the task's blocks) have succeeded, a block running longer than
        ``k`` times the median block time and, in the bulk of the task, longer than 99 in 100
        blocks of its usual spread (at the task's tail, where every block left is in flight and
        a worker would idle, 1.5 times the median if ``k`` is larger) gets a second copy on the
        next free worker (a copy that runs ``2k`` medians itself, and past the usual spread's
        far end, is stopped: the block is slow), the first to finish winning, so the block
        function must be idempotent (as chunk-aligned zarr writes are). The local worker pool
        and the ``Client`` jobs of a 0-argument worker function launch copies (a local worker or
        a ``Client`` whose copy lost has its block body interrupted, and runs on with what its
        ``init_fn`` loaded: ``daisy_nb.runtime.net.client.BlockDropped``;
        docs/explanation/pool.md#backups; the rule: :mod:`daisy_nb.scheduling.speculation`);
        dask and serial runs ignore it, with a ``UserWarning`` naming the task.

    Raises
    ------
    TypeError
        A parameter of the wrong type (a ROI that is not a Roi, a function that does
        not take one argument or none, ``max_workers="4"``, ...).
    ValueError
        A value out of range: geometry that does not fit (``write_roi`` outside
        ``read_roi``, a non-positive write shape, dimensions that differ), an unknown
        ``fit``, a negative count, a ``skip_mask`` of the wrong shape, a negative, NaN or
        infinite ``retry_backoff``, a ``speculative`` factor <= 1, NaN or infinite.

    Examples
    --------
    >>> from funlib.geometry import Roi
    >>> t = Task("smooth", Roi((0, 0), (100, 100)), Roi((0, 0), (30, 30)), Roi((10, 10), (10, 10)),
    ...          process_function=lambda block: None)
    >>> t.block_grid_shape
    [8, 8]
    """

    def __init__(
        self,
        task_id: str,
        total_roi: Roi,
        read_roi: Roi,
        write_roi: Roi,
        process_function: Callable[..., object] | None = None,
        check_function: Callable[[Block], bool] | None = None,
        read_write_conflict: bool = True,
        fit: str = "valid",
        max_workers: int | None = None,
        max_retries: int = 2,
        timeout: float | datetime.timedelta | None = None,
        tracking_path: str | os.PathLike[str] | Literal[False] | None = None,
        requires: dict[str, int] | None = None,
        max_worker_restarts: int = 10,
        skip_mask: npt.ArrayLike | None = None,
        *,
        num_workers: int | None = None,
        upstream_tasks: Task | Sequence[Task] | None = None,
        done_marker_path: str | os.PathLike[str] | Literal[False] | None = None,
        resource_tracking: bool = False,
        init_fn: Callable[[], object] | None = None,
        retry_backoff: float | datetime.timedelta | None = None,
        speculative: bool | float | None = None,
    ) -> None:
        with task_errors(task_id):
            check_task_id(task_id)
        self._task_id = task_id
        with task_errors(task_id):
            # checked in this order: the geometry, the functions, the run options (TaskParams)
            layout = BlockLayout(total_roi, read_roi, write_roi, read_write_conflict, fit)
            self._process_function: Callable[..., object] | None = None
            self._arity: int | None = None
            self.process_function = process_function
            self.check_function = check_function
            if check_function is not None:  # daisy 2.0.0 warns so (its text), pointing to done markers
                warnings.warn(CHECK_FUNCTION_WARNING, UserWarning, stacklevel=2)
            super().__init__(
                layout, total_roi, read_roi, write_roi, max_workers=max_workers, num_workers=num_workers,
                max_retries=max_retries, max_worker_restarts=max_worker_restarts, timeout=timeout,
                requires=requires, tracking_path=tracking_path, done_marker_path=done_marker_path,
                skip_mask=skip_mask, retry_backoff=retry_backoff, speculative=speculative,
            )  # fmt: skip
            self.init_fn = init_fn_param(init_fn)
            # per-block wall/CPU/RSS/IO measured by the runtimes (daisy_nb.profiling), summed per task
            self.resource_tracking = bool(resource_tracking)
            self._v1_upstream_tasks: list[Task] = _upstream_param(upstream_tasks)

    # -- what the Task adds to its parameters (TaskParams: the geometry and run options) ------
    @property
    def task_id(self) -> str:
        """The task's name (``task_id=``)."""
        return self._task_id

    @property
    def upstream_tasks(self) -> list[Task]:
        """The tasks given with the deprecated ``upstream_tasks=``; a copy."""
        return list(self._v1_upstream_tasks)

    @property
    def process_function(self) -> Callable[..., object] | None:
        """The function run per block (one argument) or per worker (none); settable, checked when set."""
        return self._process_function

    @process_function.setter
    def process_function(self, fn: Callable[..., object] | None) -> None:
        with task_errors(self._task_id):
            self._arity = None if fn is None else function_arity(fn, "process_function")
        self._process_function = fn

    @property
    def arity(self) -> int | None:
        """0 (worker function running its own Client loop), 1 (block function) or None."""
        return self._arity

    @property
    def check_function(self) -> Callable[[Block], bool] | None:
        """``check(block) -> bool`` (True: already done, skip); settable, checked when set."""
        return self._check_function

    @check_function.setter
    def check_function(self, fn: Callable[[Block], bool] | None) -> None:
        with task_errors(self._task_id):
            if fn is not None and function_arity(fn, "check_function") != 1:
                raise TypeError(f"check_function must take one argument (a block), got {fn!r}")
        self._check_function = fn

    def requires_v1(self) -> list[Task]:
        """daisy 1.x ``Task.requires()``: the upstream tasks given with ``upstream_tasks=``.

        Returns
        -------
        list of Task
            A copy of the list (empty without ``upstream_tasks=``).
        """
        return list(self._v1_upstream_tasks)

    # -- tracking -----------------------------------------------------------------
    def resolved_tracking_path(self) -> Path | None:
        """Where this task's block tracking lives.

        Returns
        -------
        pathlib.Path or None
            :attr:`tracking_path`, or ``<tracking basedir>/<task_id>`` when it is None;
            None when tracking is off (``tracking_path=False``).
        """
        from .tracking import resolve_tracking_path

        return resolve_tracking_path(self._task_id, self.tracking_path)

    def reset(self) -> str | None:
        """Delete this task's block tracking, so that the next run does every block again.

        Returns
        -------
        str or None
            The path deleted, or None if the task has no tracking (off or never written).
        """
        p = self.resolved_tracking_path()
        if p is None:
            return None
        from .tracking import reset

        return reset(p)

    def failed_blocks(self) -> list[Block]:
        """Blocks recorded as failed and not done in this task's tracking store.

        Returns
        -------
        list of Block
            Empty when the task has no tracking store.
        """
        return _failed_blocks(self)

    # -- composition --------------------------------------------------------------
    def __add__(self, other: Task | Pipeline) -> Pipeline:
        """``a + b``: a pipeline where ``other``'s sources depend on this task."""
        return Pipeline.from_task(self) + other

    def __radd__(self, other: Task | Pipeline) -> Pipeline:
        return _coerce(other, "+") + Pipeline.from_task(self)

    def __or__(self, other: Task | Pipeline) -> Pipeline:
        """``a | b``: a pipeline of both, with no dependency between them."""
        return Pipeline.from_task(self) | other

    def __ror__(self, other: Task | Pipeline) -> Pipeline:
        return _coerce(other, "|") | Pipeline.from_task(self)

    def __copy__(self) -> Task:
        new = object.__new__(Task)
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, object]) -> Task:
        return self.__copy__()

    def __repr__(self) -> str:
        return f"Task({self._task_id!r}, blocks={self.layout.num_blocks}, fit={self.fit!r}, conflict={self.read_write_conflict})"


def _failed_blocks(task: Task) -> list[Block]:
    """The blocks that ``task``'s tracking store records as failed and not done, rebuilt from
    their grid cells (:meth:`Task.failed_blocks`)."""
    import numpy as np

    from .tracking import read_tracking

    p = task.resolved_tracking_path()
    if p is None or not Path(p).exists():
        return []
    info = read_tracking(p)
    mask = (np.asarray(info["failures"]) > 0) & (np.asarray(info["done"]) == 0)
    cells = np.argwhere(mask)
    from .graph import BlockwiseDependencyGraph

    g = BlockwiseDependencyGraph(
        task.task_id,
        task.read_roi,
        task.write_roi,
        task.read_write_conflict,
        task.fit,
        total_read_roi=task.total_roi,
    )
    out = []
    lay = task.layout
    for c in cells:
        grid = c - lay.id_offset
        if np.any(grid < 0) or np.any(grid >= lay.grid_shape):
            continue
        woff = lay.tw_offset + grid * lay.write_shape
        from .block import Block
        from .layout import roi_tuple

        wr = roi_tuple(task.write_roi, "write_roi")
        fake = Block(
            task.total_roi,
            (tuple(int(v) for v in woff - lay.cul), tuple(lay.read_shape.tolist())),
            (tuple(woff.tolist()), wr[1]),
            task_id=task.task_id,
        )
        row = g.block_row(fake)
        out.extend(g._blocks([row]))
    return out


def _coerce(x: object, op: str) -> Pipeline:
    if isinstance(x, Pipeline):
        return x
    if isinstance(x, Task):
        return Pipeline.from_task(x)
    raise TypeError(f"unsupported operand for {op}: {type(x).__name__} (expected a Task or a Pipeline)")


class Pipeline:
    """A DAG of tasks. ``a + b`` chains (every output of a feeds every source of b),
    ``a | b`` unions. Tasks are deduplicated by identity; composition never mutates.

    Usually made by composing tasks (``extract + (smooth | mask) + merge``) rather than
    called. Duplicate task ids and cycles are checked by :meth:`validate`, when the
    pipeline is scheduled or run.

    Parameters
    ----------
    tasks : sequence of Task, optional
        The tasks (the same object twice counts once).
    edges : sequence of (Task, Task), optional
        ``(upstream, downstream)`` pairs: each block of ``downstream`` waits for the
        blocks of ``upstream`` that its read ROI overlaps.

    Raises
    ------
    TypeError
        A task that is not a Task, an edge that is not a pair.
    ValueError
        An edge naming a task that is not in ``tasks``.
    """

    def __init__(self, tasks: Sequence[Task] | None = None, edges: Sequence[tuple[Task, Task]] | None = None) -> None:
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
        """A pipeline of one task (``Pipeline([task])``)."""
        return cls([task], [])

    @property
    def tasks(self) -> list[Task]:
        """The tasks, in the order given; a copy."""
        return list(self._tasks)

    @property
    def edges(self) -> list[tuple[Task, Task]]:
        """The ``(upstream, downstream)`` pairs; a copy."""
        return list(self._edges)

    @property
    def sources(self) -> list[Task]:
        """Tasks that depend on no other task of the pipeline."""
        down = {id(d) for _, d in self._edges}
        return [t for t in self._tasks if id(t) not in down]

    @property
    def outputs(self) -> list[Task]:
        """Tasks that no other task of the pipeline depends on."""
        up = {id(u) for u, _ in self._edges}
        return [t for t in self._tasks if id(t) not in up]

    def __add__(self, other: Task | Pipeline) -> Pipeline:
        """``a + b``: every output of this pipeline feeds every source of ``other``."""
        other = _coerce(other, "+")
        new_edges = [(o, s) for o in self.outputs for s in other.sources]
        return Pipeline(self._tasks + other._tasks, self._edges + other._edges + new_edges)

    def __radd__(self, other: Task | Pipeline) -> Pipeline:
        return _coerce(other, "+") + self

    def __or__(self, other: Task | Pipeline) -> Pipeline:
        """``a | b``: both pipelines side by side, no edge added."""
        other = _coerce(other, "|")
        return Pipeline(self._tasks + other._tasks, self._edges + other._edges)

    def __ror__(self, other: Task | Pipeline) -> Pipeline:
        return _coerce(other, "|") | self

    def reset(self) -> list[str | None]:
        """:meth:`Task.reset` on every task.

        Returns
        -------
        list of (str or None)
            Each task's deleted tracking path (None where there was none), in task order.
        """
        return [t.reset() for t in self._tasks]

    def run_blockwise(self, **kwargs: Any) -> Any:
        """``daisy_nb.run_blockwise(self, **kwargs)`` (through the package: the runner sits above this module).

        Parameters
        ----------
        **kwargs
            :func:`daisy_nb.run_blockwise`'s keyword arguments.

        Returns
        -------
        bool or dict or daisy_nb.Plan
            What :func:`daisy_nb.run_blockwise` returns for these arguments.
        """
        import daisy_nb

        return daisy_nb.run_blockwise(self, **kwargs)

    def validate(self) -> list[str]:
        """Check the pipeline and return its task ids in display order.

        Returns
        -------
        list of str
            Task ids in topological order, ties broken by id.

        Raises
        ------
        ValueError
            Two tasks with one id, or a cycle.
        """
        ids = {}
        for t in self._tasks:
            if t.task_id in ids:
                raise ValueError(f"Task {t.task_id!r}: duplicate task_id in pipeline (two tasks have this id)")
            ids[t.task_id] = t
        return topo_order([t.task_id for t in self._tasks], [(u.task_id, d.task_id) for u, d in self._edges])

    def __repr__(self) -> str:
        q = lambda ts: "[" + ", ".join(f'"{t.task_id}"' for t in ts) + "]"  # noqa: E731
        edges = ", ".join(f'("{u.task_id}", "{d.task_id}")' for u, d in self._edges)
        return (
            f"Pipeline(tasks={q(self._tasks)}, sources={q(self.sources)}, outputs={q(self.outputs)}, edges=[{edges}])"
        )

    def __copy__(self) -> Pipeline:
        return Pipeline(self._tasks, self._edges)


def check_task_id(task_id: object) -> None:
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


def as_pipeline(x: Tasks) -> Pipeline:
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
