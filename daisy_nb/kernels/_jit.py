"""The one place that spells numba's options for every kernel in daisy_nb.

No other module writes ``numba.njit(``: kernels are decorated with :data:`kernel`.
``nogil=True`` lets a kernel run beside Python threads; no ``fastmath`` (integer
kernels gain nothing) and no ``parallel`` (never combined with ``cache``).
``DAISY_NB_CACHE=0`` switches the on-disk cache off.

numba decides whether a cached kernel is stale from the stamp of the file that
defines it only, so a kernel that calls a kernel from another file (all of
``surface.py`` calls ``graph.py``) would keep running old code after an edit.
:func:`_drop_stale_cache` therefore keys the whole cache on a hash of every
kernel source file and empties it when any of them changed.
"""

import functools
import hashlib
import os
from pathlib import Path

import numba

CACHE = os.environ.get("DAISY_NB_CACHE", "1") != "0"


def _drop_stale_cache() -> None:
    here = Path(__file__).parent
    cache_dir = here / "__pycache__"
    if os.environ.get("NUMBA_CACHE_DIR"):
        return  # a custom cache location: its owner manages it
    digest = hashlib.sha256()
    for src in sorted(here.glob("*.py")):
        digest.update(src.name.encode())
        digest.update(src.read_bytes())
    key = digest.hexdigest()
    marker = cache_dir / "daisy_nb_kernels.hash"
    try:
        if marker.read_text() == key:
            return
    except OSError:
        pass
    try:
        cache_dir.mkdir(exist_ok=True)
        for f in list(cache_dir.glob("*.nbi")) + list(cache_dir.glob("*.nbc")):
            f.unlink(missing_ok=True)
        tmp = marker.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(key)
        os.replace(tmp, marker)
    except OSError:
        pass  # read-only install: numba falls back to its own cache handling


if CACHE:
    _drop_stale_cache()

kernel = functools.partial(numba.njit, nogil=True, cache=CACHE)

# Small helpers on the per-block hot path (level/counter arithmetic, FIFO, neighbour
# lists) are inlined into their callers at numba's IR level: a call between kernels
# passes every array as its expanded struct and touches reference counts, which cost
# more than these helpers' work.
inline_kernel = functools.partial(numba.njit, nogil=True, cache=CACHE, inline="always")

# The scheduler's per-call entry points (``kernels/surface.py``: ``acquire_packed``,
# ``release_packed``, ``acquire_one``, ``release_one``) are compiled without numba's
# reference-counting runtime: every array variable bound inside a loop (an inlined
# helper's argument, a row view) otherwise costs two atomic updates, and those were
# three quarters of a release. Such a kernel and everything it calls must not
# allocate; they work on views of buffers the caller owns for the whole call.
flat_kernel = functools.partial(numba.njit, nogil=True, cache=CACHE, _nrt=False)
