"""``daisy.v1_compat``: the same surface as ``import daisy_nb`` (daisy 1.x aliases included).

daisy 2.0's bare ``import daisy`` re-exports this module; spelling it out says that
the code relies on the 1.x shims (``Task(num_workers=...)``, ``upstream_tasks=``,
``SerialServer``, list-of-tasks ``run_blockwise``/``Scheduler``). Names load lazily
from :mod:`daisy_nb`, so they are the very same objects.
"""

import daisy_nb as _top

_NAMES = (
    "Block",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Client",
    "Context",
    "Coordinate",
    "DependencyGraph",
    "JsonProgressObserver",
    "Pipeline",
    "Roi",
    "Scheduler",
    "SerialServer",
    "Server",
    "Task",
    "TaskState",
    "__version__",
    "profile_block",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "run_blockwise",
    "set_done_marker_basedir",
    "set_tracking_basedir",
)
__all__ = list(_NAMES)  # loaded lazily by __getattr__


def __getattr__(name):
    if name in __all__:
        value = getattr(_top, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'daisy_nb.v1_compat' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
