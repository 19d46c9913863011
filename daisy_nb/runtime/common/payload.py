"""The task's functions as the workers get them, and the options read with them.

* :func:`serialize_function`: ``(process_function, init_fn)`` pickled once per run,
  with one clear error when that is impossible, before any worker starts;
* :func:`timeout_of`: the task's block timeout in seconds, or None for none;
* :func:`wants_context`: whether a 0-argument worker function asks for its
  ``Context`` as the keyword-only ``context`` (daisy 2.0 wheel).
"""

from __future__ import annotations

import inspect
import pickle
import sys

__all__ = ["payload_imports", "serialize_function", "timeout_of", "wants_context"]


def serialize_function(fn, init_fn, task_id: str) -> bytes:
    """``(fn, init_fn)`` pickled once; a ``RuntimeError`` that says how to fix it if impossible.

    Functions of importable modules travel by reference (their workers import the module), as
    cloudpickle sends them too; so plain :mod:`pickle` is tried first, and its bytes are kept
    unless they name the program's ``__main__`` (a script's, a notebook's functions, which a
    worker cannot import: cloudpickle sends them by value). Anything plain pickle refuses
    (closures, lambdas, local classes) goes to cloudpickle, and so does everything once the
    program has loaded cloudpickle itself (it may have registered modules to go by value).
    A run of module-level functions thus never loads cloudpickle (~0.15 MB of code that stays
    in the program's process).
    """
    if "cloudpickle" not in sys.modules:
        try:
            data = pickle.dumps((fn, init_fn))
        except Exception:  # refused: cloudpickle below
            data = None
        if data is not None and b"__main__" not in data:  # (also __mp_main__: a spawned child's)
            return data
    try:
        import cloudpickle

        dumps, how = cloudpickle.dumps, "cloudpickle"
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        dumps, how = pickle.dumps, "pickle (cloudpickle is not installed: module-level functions only)"
    try:
        return dumps((fn, init_fn))
    except Exception as e:  # any error of the user's objects' __reduce__: re-raised with the fix
        raise RuntimeError(
            f"daisy_nb could not serialize the process_function/init_fn of task '{task_id}' with {how}: every "
            "worker is a separate process (with dask, often on another machine), so the function travels there "
            "together with what it captures. Define it at module level, create locks/file handles/connections "
            "inside it (or in init_fn) rather than capturing them, or run in-process with "
            f"run_blockwise(..., multiprocessing=False). Underlying error: {e!r}"
        ) from e


def payload_imports(payload: bytes | None) -> tuple[str, ...]:
    """The modules a worker needs to load ``payload`` beyond what a worker always holds:
    ``cloudpickle`` for a function sent by value (its pickle names functions of the module
    ``cloudpickle.cloudpickle``, which plain pickle imports as it loads them; a user's function
    named after cloudpickle has no dot in its name). A worker template loads them before it forks
    the worker (``daisy_nb/runtime/local/_zygote.py``), once for all of a run's workers."""
    return ("cloudpickle",) if payload is not None and b"cloudpickle.cloudpickle" in payload else ()


def timeout_of(task) -> float | None:
    """The task's per-block timeout in seconds; None when it has none (unset, <= 0 or infinite)."""
    t = getattr(task, "timeout_secs", None)
    if t is None or t <= 0 or t == float("inf"):
        return None
    return float(t)


def wants_context(fn) -> bool:
    """A 0-argument worker function that takes its ``Context`` as keyword-only ``context``."""
    try:
        return "context" in (inspect.getfullargspec(fn).kwonlyargs or [])
    except TypeError:
        return False
