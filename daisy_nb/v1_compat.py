"""``daisy.v1_compat``: the same surface as ``import daisy_nb`` (daisy 1.x aliases included).

daisy 2.0's bare ``import daisy`` re-exports this module; spelling it out says that
the code relies on the 1.x shims (``Task(num_workers=...)``, ``upstream_tasks=``,
``SerialServer``, list-of-tasks ``run_blockwise``/``Scheduler``). Names load lazily
from :mod:`daisy_nb`, so they are the very same objects.
"""

from collections.abc import Callable, Collection
from typing import Any

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


def _lazy_surface(
    module_globals: dict[str, Any],
    names: Collection[str],
    special: dict[str, Callable[[], Any]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` of a module whose ``names`` load lazily from :mod:`daisy_nb`.

    ``special`` maps a name to a factory of its own value (v2's ``Task``); each value is
    cached in the module on first access.
    """
    module = module_globals["__name__"]
    factories = special or {}

    def __getattr__(name: str) -> Any:
        if name in factories:
            value = factories[name]()
        elif name in names:
            value = getattr(_top, name)
        else:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        module_globals[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(module_globals) | set(names))

    return __getattr__, __dir__


__getattr__, __dir__ = _lazy_surface(globals(), __all__)
