"""The run policy that every runtime front-end shares (pool, dask, serial).

What a runtime needs to decide about a task, decided once, here:

* :func:`serialize_function`: the task's ``(process_function, init_fn)`` pickled
  once per run (cloudpickle, else pickle), with one clear error when that is
  impossible, before any worker starts;
* :func:`timeout_of`: the task's block timeout in seconds, or None for none;
* :func:`grow_batch`: the next batch size from the measured time per block (a
  batch carries about ``target`` seconds of work, growing at most ``MAX_GROWTH``
  times per batch);
* :func:`wants_context`: whether a 0-argument worker function asks for its
  ``Context`` as the keyword-only ``context`` (daisy 2.0 wheel).

The per-block work of each runtime stays in its own module; this is the policy
around it.
"""

from __future__ import annotations

import inspect
import pickle

__all__ = ["MAX_GROWTH", "grow_batch", "serialize_function", "timeout_of", "wants_context"]

MAX_GROWTH = 4


def serialize_function(fn, init_fn, task_id: str) -> bytes:
    """``(fn, init_fn)`` pickled once; a ``RuntimeError`` that says how to fix it if impossible."""
    try:
        import cloudpickle

        dumps, how = cloudpickle.dumps, "cloudpickle"
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        dumps, how = pickle.dumps, "pickle (cloudpickle is not installed: module-level functions only)"
    try:
        return dumps((fn, init_fn))
    except Exception as e:
        raise RuntimeError(
            f"daisy_nb could not serialize the process_function/init_fn of task '{task_id}' with {how}: every "
            "worker is a separate process (with dask, often on another machine), so the function travels there "
            "together with what it captures. Define it at module level, create locks/file handles/connections "
            "inside it (or in init_fn) rather than capturing them, or run in-process with "
            f"run_blockwise(..., multiprocessing=False). Underlying error: {e!r}"
        ) from e


def timeout_of(task) -> float | None:
    """The task's per-block timeout in seconds; None when it has none (unset, <= 0 or infinite)."""
    t = getattr(task, "timeout_secs", None)
    if t is None or t <= 0 or t == float("inf"):
        return None
    return float(t)


def grow_batch(k: int, elapsed_ns: int, n: int, target_secs: float, cap: int) -> int:
    """The next batch size after a batch of ``n`` blocks took ``elapsed_ns``."""
    per_block = elapsed_ns / n / 1e9 if n else 0.0
    want = int(target_secs / per_block) if per_block > 0 else cap
    return max(1, min(want, k * MAX_GROWTH, cap))


def wants_context(fn) -> bool:
    """A 0-argument worker function that takes its ``Context`` as keyword-only ``context``."""
    try:
        return "context" in (inspect.getfullargspec(fn).kwonlyargs or [])
    except TypeError:
        return False
