"""The numba internals the kernels rely on, checked in one place.

numba does not promise to keep these, so ``pyproject.toml`` bounds numba to the releases they
were tested with, and each has a fallback that keeps daisy_nb correct:

* ``nrt_option``: ``numba.njit``'s private ``_nrt=False`` option (``_jit.flat_kernel``), which
  compiles the scheduler's entry point without reference counting
  (``docs/explanation/architecture.md#fixed-costs``). Without it the kernel is compiled with
  reference counting: the same results, slower releases.
* ``cache_index``: a dispatcher's cache index (``_cache._cache_file._load_index()``), how
  ``_jit.cache_is_warm`` tells whether a run will compile. Without it, it answers "not warm".
* ``compile_event``: ``numba.core.event``'s listeners, for the one notice that kernels are
  compiling. Without it, no notice.

``tests/test_numba_features.py`` fails when an installed numba inside the bound lacks one.
"""

from __future__ import annotations

import functools

__all__ = ["features"]


@functools.cache
def features() -> dict[str, bool]:
    """``{"nrt_option", "cache_index", "compile_event"}``: which internals this numba has. Imports numba."""
    names = ("nrt_option", "cache_index", "compile_event")
    try:
        import numba.core  # noqa: F401
    except ImportError:  # a broken numba install: the kernels stay plain Python anyway
        return dict.fromkeys(names, False)
    out = {}
    try:
        from numba.core import cpu

        out["nrt_option"] = hasattr(cpu.CPUTargetOptions, "_nrt")
    except ImportError:
        out["nrt_option"] = False
    try:
        from numba.core import caching

        out["cache_index"] = hasattr(caching.IndexDataCacheFile, "_load_index") and (
            "_cache_file" in caching.Cache.__init__.__code__.co_names
        )
    except (ImportError, AttributeError):
        out["cache_index"] = False
    try:
        from numba.core import event

        out["compile_event"] = hasattr(event, "Listener") and hasattr(event, "register")
    except ImportError:
        out["compile_event"] = False
    return out
