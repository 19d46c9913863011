"""``daisy.v2``: daisy 2.0's native surface, without the daisy 1.x aliases.

``import daisy_nb.v2 as daisy`` gives the same objects as ``daisy_nb`` except:
``Task`` rejects ``num_workers=`` and ``upstream_tasks=`` with ``TypeError`` (use
``max_workers=`` and ``a + b``), there is no ``SerialServer`` (use
``run_blockwise(..., multiprocessing=False)``), and ``BlockStats`` is exported.
"""

from typing import Any

from daisy_nb.v1_compat import _NAMES as _V1_NAMES
from daisy_nb.v1_compat import _lazy_surface

# v1_compat's names without SerialServer, plus BlockStats (Task is v2's own, below)
_NAMES = (*(n for n in _V1_NAMES if n != "SerialServer"), "BlockStats")
__all__ = list(_NAMES)  # loaded lazily by __getattr__

_V1_ONLY = ("num_workers", "upstream_tasks")
_MAX_WORKERS_ARG = (
    8  # Task(task_id, total_roi, read_roi, write_roi, process_function, check_function, rwc, fit, max_workers)
)


def _make_task_class() -> type:
    from daisy_nb.task import Task as _Task

    class _NativeTaskType(type):
        # every daisy_nb Task is a daisy.v2 Task, as v1_compat.Task subclasses v2.Task in daisy
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, _Task)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, _Task)

    class Task(_Task, metaclass=_NativeTaskType):
        __doc__ = _Task.__doc__

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            for name in _V1_ONLY:
                if name in kwargs:
                    hint = "max_workers=" if name == "num_workers" else "Pipeline composition (upstream + downstream)"
                    raise TypeError(
                        f"Task() got an unexpected keyword argument {name!r}: daisy.v2 has no daisy 1.x aliases; "
                        f"use {hint}, or import daisy_nb (the v1-compatible surface)"
                    )
            given = (
                kwargs["max_workers"]
                if "max_workers" in kwargs
                else (args[_MAX_WORKERS_ARG] if len(args) > _MAX_WORKERS_ARG else 1)
            )
            if given is None:
                raise TypeError("max_workers must be an int, got NoneType")
            return super().__new__(cls)

    Task.__module__ = __name__
    Task.__qualname__ = "Task"
    return Task


__getattr__, __dir__ = _lazy_surface(globals(), __all__, {"Task": _make_task_class})
